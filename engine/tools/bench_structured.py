"""Benchmark: grammar-constrained decoding (a nested JSON schema) against free text, in one run.

``python -m engine.bench --structured`` runs the same prompts with and without :data:`SCHEMA` at each concurrency
(1 and 4 streams by default). The two conditions alternate repetition by repetition, the first of each pair taking
turns, so machine noise falls on both alike. A constrained reply ends when its document closes; the free replies
then run with ``ignore_eos`` and each stream's ``max_tokens`` set to the token count its constrained twin produced
in the warm-up pass (greedy decoding repeats it), so both conditions generate the same number of tokens per stream. Prints one JSON
object per concurrency (tok/s for each condition and their ratio) and one for the mask itself: the time
``GrammarCompiler.fill_masks`` takes per call and per row, replayed along a real constrained reply.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

from engine.api import SamplingParams
from engine.core.llm import LLM

#: A nested schema: objects, arrays, enums, integers and numbers, strings of bounded length.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "category": {"enum": ["food", "tool", "toy", "book", "clothing"]},
        "price": {"type": "number", "minimum": 0},
        "in_stock": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3},
        "size": {
            "type": "object",
            "properties": {"width_cm": {"type": "number"}, "height_cm": {"type": "number"}},
            "required": ["width_cm", "height_cm"],
            "additionalProperties": False,
        },
        "reviews": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "stars": {"type": "integer", "minimum": 1, "maximum": 5},
                    "text": {"type": "string", "maxLength": 40},
                },
                "required": ["stars", "text"],
                "additionalProperties": False,
            },
            "maxItems": 2,
        },
    },
    "required": ["name", "category", "price", "in_stock", "tags", "size", "reviews"],
    "additionalProperties": False,
}

ITEMS = ["a loaf of sourdough bread", "a claw hammer", "a wooden train set", "a cookbook for beginners",
         "a wool winter hat", "a cast-iron pan", "a box of crayons", "a paperback mystery novel"]


def _messages(i: int) -> list[dict[str, str]]:
    item = ITEMS[i % len(ITEMS)]
    return [{"role": "user", "content": f"Describe {item} as a shop listing in JSON, with two short reviews."}]


def _run(llm: LLM, prompts: list[int], params: list[SamplingParams]) -> tuple[float, list[int], list[list[int]]]:
    """Run ``prompts`` together to the end; returns wall seconds, tokens per stream and their ids."""
    start = time.perf_counter()
    handles = [llm.engine.submit(_messages(i), p) for i, p in zip(prompts, params, strict=True)]
    index = {h.request_id: i for i, h in enumerate(handles)}
    ids: list[list[int]] = [[] for _ in handles]
    while not all(h.done() for h in handles):
        for out in llm.engine.step():
            ids[index[out.request_id]].extend(out.new_token_ids)
    wall = time.perf_counter() - start
    return wall, [len(t) for t in ids], ids


def _text_is_valid(llm: LLM, token_ids: list[int]) -> bool:
    try:
        json.loads(llm.tokenizer.decode(token_ids, skip_special_tokens=True))
    except ValueError:
        return False
    return True


def bench_concurrency(llm: LLM, concurrency: int, repeats: int, max_tokens: int) -> dict[str, Any]:
    """Constrained and free runs of the same prompts at ``concurrency``, alternating, with equal token counts."""
    prompts = list(range(concurrency))
    constrained = SamplingParams(max_tokens=max_tokens, temperature=0.0, json_schema=SCHEMA)
    # Warm-up pass: compiles the grammar, warms the batch shape, and fixes each stream's token count.
    _, counts, ids = _run(llm, prompts, [constrained] * concurrency)
    valid = sum(_text_is_valid(llm, t) for t in ids)
    free = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in counts]
    walls: dict[str, float] = {"constrained": 0.0, "free": 0.0}
    tokens: dict[str, int] = {"constrained": 0, "free": 0}
    per_repeat: dict[str, list[float]] = {"constrained": [], "free": []}
    mismatched = 0
    runs = [("constrained", [constrained] * concurrency), ("free", free)]
    for r in range(repeats):
        for name, params in runs if r % 2 == 0 else runs[::-1]:
            wall, num, _ = _run(llm, prompts, params)
            mismatched += num != counts
            walls[name] += wall
            tokens[name] += sum(num)
            per_repeat[name].append(sum(num) / wall)
    tok_s = {name: tokens[name] / walls[name] for name in walls}
    return {
        "system": "hearth_structured",
        "concurrency": concurrency,
        "repeats": repeats,
        "tokens_per_condition": tokens,
        "tokens_per_stream": counts,
        "runs_with_other_token_counts": mismatched,
        "valid_json": f"{valid}/{concurrency}",
        "free_tok_s": round(tok_s["free"], 2),
        "constrained_tok_s": round(tok_s["constrained"], 2),
        "constrained_over_free": round(tok_s["constrained"] / tok_s["free"], 3),
        "ratio_per_repeat": [round(c / f, 3) for c, f in zip(per_repeat["constrained"], per_repeat["free"],
                                                              strict=True)],
    }


def bench_mask(llm: LLM, rows: int, max_tokens: int) -> dict[str, Any]:
    """The time to fill ``rows`` grammar masks, replayed along a real constrained reply (what a step waits on
    when the mask is not ready before the logits)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, json_schema=SCHEMA)
    _, _, ids = _run(llm, [0], [params])
    grammars = llm.engine.grammars
    matchers = [grammars.matcher(params) for _ in range(rows)]
    times = []
    for token in ids[0]:
        start = time.perf_counter()
        grammars.fill_masks([m for m in matchers if m is not None])
        times.append(time.perf_counter() - start)
        for m in matchers:
            if m is not None and not m.is_finished:
                m.accept(token)
    per_call = statistics.mean(times)
    return {
        "system": "grammar_mask",
        "rows": rows,
        "calls": len(times),
        "vocab": grammars.vocab_size,
        "ms_per_call_mean": round(per_call * 1e3, 3),
        "ms_per_call_p50": round(statistics.median(times) * 1e3, 3),
        "ms_per_row_mean": round(per_call * 1e3 / rows, 3),
    }


def main(llm: LLM, levels: list[int], repeats: int, max_tokens: int) -> dict[str, Any]:
    """Print one JSON line per concurrency and per mask size, then a summary; returns the summary."""
    summary: dict[str, Any] = {"system": "structured_summary"}
    for c in levels:
        row = bench_concurrency(llm, c, repeats, max_tokens)
        print(json.dumps(row), flush=True)
        summary[f"c{c}_constrained_over_free"] = row["constrained_over_free"]
        summary[f"c{c}_tok_s"] = {"free": row["free_tok_s"], "constrained": row["constrained_tok_s"]}
    for rows in sorted({1, *levels}):
        row = bench_mask(llm, rows, max_tokens)
        print(json.dumps(row), flush=True)
        summary[f"mask_ms_per_row_at_{rows}_rows"] = row["ms_per_row_mean"]
    print(json.dumps(summary), flush=True)
    return summary
