"""Benchmark: speculative decoding against plain decoding, single stream, in one run.

``python -m engine.bench --speculative ngram,self-int4`` loads the model once per method (plus ``off``) and runs
two greedy tasks one stream at a time: a grounded one (repeat a given paragraph, edit a given code block: the
reply copies the prompt, where drafts are right) and an open chat one (drafts rarely are). Methods take turns
request by request, so machine noise falls on all alike. Prints one JSON object per method and task: tok/s
(generated tokens over each request's wall time), the ratio to ``off``, the acceptance rate, the tokens per
verification, and whether the reply equals ``off``'s.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

from engine.api import SamplingParams
from engine.core.llm import LLM

PARAGRAPH = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a small tin of oil and a "
    "soft cloth. He polished the great lens until it gleamed, then lit the lamp and watched its beam sweep across "
    "the dark water, counting the ships that passed the rocks in safety."
)
CODE = '''def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal = subtotal + item["price"] * item["quantity"]
    tax = subtotal * tax_rate
    return subtotal + tax
'''
TASKS: dict[str, list[list[dict[str, str]]]] = {
    "grounded": [
        [{"role": "user", "content": "Repeat this paragraph exactly, word for word:\n\n" + PARAGRAPH}],
        [{"role": "user", "content": "Rename the variable `subtotal` to `net` in this code and show the whole "
                                     "function:\n\n```python\n" + CODE + "```"}],
    ],
    "open": [
        [{"role": "user", "content": "Write a short story about a fox who learns to sail."}],
        [{"role": "user", "content": "What are three tips for sleeping better? Explain each."}],
    ],
}


def _run(llm: LLM, messages: list[dict[str, str]], max_tokens: int) -> tuple[list[int], float]:
    engine = llm.engine
    start = time.perf_counter()
    handle = engine.submit(messages, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    while not handle.done():
        engine.step()
    out = handle.result()
    return out.token_ids, len(out.token_ids) / (time.perf_counter() - start)


def bench_task(llms: dict[str, LLM], task: str, repeats: int, max_tokens: int) -> list[dict[str, Any]]:
    """One row per method for ``task``: its median tok/s over every prompt and repeat, and the spec counters."""
    rates: dict[str, list[float]] = {m: [] for m in llms}
    same: dict[str, bool] = dict.fromkeys(llms, True)
    for llm in llms.values():
        llm.engine.stats.reset()
    for r in range(repeats):
        for prompt in TASKS[task]:
            order = list(llms)[r % len(llms):] + list(llms)[: r % len(llms)]
            replies = {}
            for method in order:
                replies[method], rate = _run(llms[method], prompt, max_tokens)
                rates[method].append(rate)
            for method in llms:
                same[method] = same[method] and replies[method] == replies["off"]
    off = statistics.median(rates["off"])
    rows = []
    for method, llm in llms.items():
        m = llm.metrics()
        tok_s = statistics.median(rates[method])
        rows.append({
            "system": "speculative", "task": task, "method": method, "tok_s": round(tok_s, 2),
            "over_off": round(tok_s / off, 3), "acceptance_rate": round(m.spec_acceptance_rate, 3),
            "tokens_per_verification": round(m.spec_tokens_per_step, 2), "same_reply_as_off": same[method],
        })
    return rows


def main(model: str, methods: list[str], precision: dict[str, str], repeats: int, max_tokens: int,
         k: int = 4) -> dict[str, Any]:
    """Print one JSON line per method and task, then a summary; returns the summary."""
    llms = {m: LLM(model, start_loop=False, speculative=m, num_speculative_tokens=k, **precision)
            for m in ["off", *[m for m in methods if m != "off"]]}
    summary: dict[str, Any] = {"system": "speculative_summary", "k": k, "max_tokens": max_tokens}
    try:
        for llm in llms.values():
            _run(llm, TASKS["open"][0], 8)  # warm the draft and verification shapes
        for task in TASKS:
            for row in bench_task(llms, task, repeats, max_tokens):
                print(json.dumps(row), flush=True)
                summary[f"{task}_{row['method']}"] = {
                    "over_off": row["over_off"], "acceptance_rate": row["acceptance_rate"]
                }
    finally:
        for llm in llms.values():
            llm.close()
    print(json.dumps(summary), flush=True)
    return summary
