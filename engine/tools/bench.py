"""Benchmark: our engine against HF ``generate`` (one request after another) and HF's static padded batch.

Everything is measured in the same run, so the ratios hold even on a noisy machine. Prints one JSON object
per line, then a summary line with the ratios the targets are stated in::

    python -m engine.bench --model default --concurrency 1,4,16 --max-tokens 64

``--llama-server PATH`` adds llama.cpp's server on the same model's GGUF (``engine/tools/llama_server.py``), server
against server: ours is then ``python -m engine.serve``, both over HTTP, in rounds alternating at each concurrency
(``--repeats``, the median round of each side; llama.cpp in both its weight layouts,
``engine/tools/bench_servers.py``), and
``--level`` runs our engine at a quantization level instead of ``--dtype`` (e.g. ``--level int4`` beside the Q4_1
GGUF llama.cpp runs). A run with ``--llama-server`` ends with a ``machine_bounds`` row: the machine's read and int8
rates against the GGUF's bytes and multiplies per token (``engine/tools/machine_bounds.py``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from engine.api import COMPILE_REMOVED, SamplingParams
from engine.core.llm import LLM
from engine.loading.chat_render import apply_chat_template
from engine.system import hardware
from engine.tools.bench_cuda_graphs import bench_cuda_graphs
from engine.tools.fresh_verdicts import forget_verdicts
from engine.tools.timings import Timings

QUESTIONS = [
    "What is the capital of France?",
    "Write a short poem about autumn leaves.",
    "Explain what a hash table is in two sentences.",
    "Give me three tips for better sleep.",
    "How do I reverse a list in Python?",
    "What causes the seasons on Earth?",
    "Summarise the plot of Romeo and Juliet.",
    "Why is the sky blue?",
    "Name five programming languages and one strength of each.",
    "What is the difference between weather and climate?",
    "Describe a cat to someone who has never seen one.",
    "How does a bicycle stay upright?",
    "What is photosynthesis?",
    "Suggest a name for a bakery.",
    "Explain recursion to a child.",
    "What are prime numbers?",
]


def _messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]


def bench_engine(llm: LLM, concurrency: int, max_tokens: int) -> Timings:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    timings = Timings()
    start = time.perf_counter()
    handles = []
    for i in range(concurrency):
        timings.starts.append(time.perf_counter())
        handles.append(llm.engine.submit(_messages(i), params))
        timings.token_times.append([])
    index = {h.request_id: i for i, h in enumerate(handles)}
    while not all(h.done() for h in handles):
        for out in llm.engine.step():
            if out.new_token_ids:
                timings.token_times[index[out.request_id]].append(time.perf_counter())
    timings.wall_s = time.perf_counter() - start
    return timings


class _Clock:
    """A logits processor that only records when each generation step happens."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.times.append(time.perf_counter())
        return scores


def _hf_inputs(tokenizer: Any, indices: list[int]) -> dict[str, torch.Tensor]:
    texts = [str(apply_chat_template(tokenizer, _messages(i), add_generation_prompt=True, tokenize=False))
             for i in indices]  # fmt: skip
    tokenizer.padding_side = "left"
    return dict(tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False))


def _hf_generate(model: Any, tokenizer: Any, indices: list[int], max_tokens: int) -> list[float]:
    from transformers import LogitsProcessorList

    clock = _Clock()
    inputs = {k: v.to(model.device) for k, v in _hf_inputs(tokenizer, indices).items()}
    with torch.inference_mode():
        model.generate(
            **inputs,
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            logits_processor=LogitsProcessorList([clock]),
            pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
        )
    return clock.times


def bench_hf_sequential(model: Any, tokenizer: Any, concurrency: int, max_tokens: int) -> Timings:
    """All requests arrive at once; HF serves them one after another."""
    timings = Timings()
    start = time.perf_counter()
    for i in range(concurrency):
        timings.starts.append(start)
        timings.token_times.append(_hf_generate(model, tokenizer, [i], max_tokens))
    timings.wall_s = time.perf_counter() - start
    return timings


def bench_hf_static(model: Any, tokenizer: Any, concurrency: int, max_tokens: int) -> Timings:
    """All requests in one left-padded batch."""
    timings = Timings()
    start = time.perf_counter()
    times = _hf_generate(model, tokenizer, list(range(concurrency)), max_tokens)
    timings.wall_s = time.perf_counter() - start
    timings.starts = [start] * concurrency
    timings.token_times = [list(times) for _ in range(concurrency)]
    return timings


def bench_multi_turn(llm: LLM, turns: int, max_tokens: int) -> list[float]:
    """TTFT of each turn of one growing chat."""
    messages: list[dict[str, str]] = []
    ttfts = []
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    for turn in range(turns):
        messages.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
        out = llm.chat(messages, params)
        ttfts.append(out.metrics.ttft_s or 0.0)
        messages.append({"role": "assistant", "content": out.text})
    return ttfts


def bench_quantization(model: str, levels: list[str], max_tokens: int) -> None:
    """Each level: weight bytes, 1- and 16-stream tok/s, perplexity vs bf16, greedy agreement with bf16."""
    from pathlib import Path

    from engine.tools.perplexity import perplexity

    text = (Path(__file__).resolve().parents[2] / "tests" / "data" / "gettysburg_and_austen.txt").read_text()
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    reference: dict[str, Any] = {}
    for level in levels:
        llm = LLM(model, quantization=level, start_loop=False, max_batch_size=16)
        bench_engine(llm, 1, 4)
        single = bench_engine(llm, 1, max_tokens).row("hearth", 1)
        bench_engine(llm, 16, 4)
        multi = bench_engine(llm, 16, max_tokens).row("hearth", 16)
        ppl = perplexity(llm, text)
        tokens = [llm.chat(_messages(i), greedy).token_ids for i in range(8)]
        if not reference:
            reference = {"ppl": ppl, "tokens": tokens, "level": level}
        same = sum(a == b for ref, out in zip(reference["tokens"], tokens, strict=True) for a, b in zip(ref, out, strict=False))
        total = sum(max(len(ref), len(out)) for ref, out in zip(reference["tokens"], tokens, strict=True))
        _emit(
            {
                "system": "quantization",
                "level": level,
                "dtype": llm.dtype,
                "weights_mb": round(llm.weights_bytes / 1e6, 1),
                "single_tok_s": single["tok_s"],
                "c16_tok_s": multi["tok_s"],
                "perplexity": round(ppl, 3),
                f"ppl_delta_vs_{reference['level']}_pct": round((ppl / reference["ppl"] - 1) * 100, 2),
                f"greedy_agreement_vs_{reference['level']}": round(same / max(total, 1), 3),
            }
        )
        llm.close()


def _bench_prefill(llm: LLM, n: int, repeats: int) -> dict[str, Any]:
    """Prompt tokens per second of the engine in this process on fresh ``n``-token prompts (no prefix reuse: every
    round's prompt is new); the median round."""
    import random

    vocab = int(llm.engine.runner.config.vocab_size)
    rng = random.Random(0)
    params = SamplingParams(max_tokens=1, temperature=0.0)

    def seconds(prompt: list[int]) -> float:
        start = time.perf_counter()
        llm.generate([prompt], params)
        return time.perf_counter() - start

    seconds([rng.randrange(1000, vocab) for _ in range(min(n, 64))])  # warm
    mine = [n / seconds([rng.randrange(1000, vocab) for _ in range(n)]) for _ in range(max(1, repeats))]
    row: dict[str, Any] = {"system": "prefill", "path": "in_process", "prompt_tokens": n, "level": llm.quantization,
                           "hearth_tok_s": round(sorted(mine)[(len(mine) - 1) // 2], 1),
                           "hearth_rounds": [round(v, 1) for v in mine]}
    _emit(row)
    return row


def _bench_servers(llm: LLM, args: argparse.Namespace, levels: list[int],
                   precision: dict[str, Any]) -> dict[tuple[str, int], Any]:
    """Our server (and, with ``--llama-server``, llama.cpp's) over HTTP: the prefill row, then decode rows."""
    from engine.tools import bench_servers

    llama = None
    if args.llama_server:
        gguf = _gguf_of(args)
        if gguf is None:
            raise SystemExit("--llama-server needs --gguf for a model that is not a GGUF file")
        llama = (Path(args.llama_server), gguf, torch.get_num_threads())
    prompts = [llm.engine.tokenize(_messages(i)) for i in range(max(levels))]
    vocab = int(llm.engine.runner.config.vocab_size)
    repeats = max(1, args.repeats)
    with bench_servers.hearth_server(str(args.model), precision, max(levels + [16]), args.device,
                                      torch.get_num_threads()) as port:
        if args.prefill:
            bench_servers.bench_prefill(port, args.prefill, vocab, repeats, _emit, llama)
        return bench_servers.bench_decode(port, prompts, levels, args.max_tokens, repeats, _emit, llama)


def _gguf_of(args: argparse.Namespace) -> Path | None:
    """The GGUF llama-server runs: ``--gguf``, the model itself, or the default model's source file."""
    from engine.loading.default_model import source_gguf_path

    if args.gguf:
        return Path(args.gguf)
    if str(args.model).endswith(".gguf"):
        return Path(args.model)
    if args.model == "default":
        return source_gguf_path()
    return None


def _emit_bounds(gguf: Path, levels: list[int], results: dict[tuple[str, int], dict[str, Any]]) -> None:
    """The machine's bounds for ``gguf`` and the share ceiling they leave this run (``engine/tools/machine_bounds.py``)."""
    from engine.model import native
    from engine.tools.machine_bounds import bounds_row

    if native.EXTENSION.start(wait=True) is None:
        _emit(bounds_row(gguf, levels, results))


def _emit(row: dict[str, Any]) -> None:
    print(json.dumps(row), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--concurrency", default=None, help="default 1,4,16 (1,4 with --structured)")
    parser.add_argument("--max-tokens", type=int, default=None, help="default 64 (160 with --structured)")
    parser.add_argument("--dtype", default="bfloat16", help="ours and HF's (default bfloat16)")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--skip-hf", action="store_true", help="measure only our engine")
    parser.add_argument("--skip-multi-turn", action="store_true")
    parser.add_argument(
        "--quantization", default=None, help="'all' or a comma list (bf16,int8,int4,none): compare levels only"
    )
    parser.add_argument("--level", default=None, help="our quantization level (int4, int8, bf16, ...) instead of --dtype")
    parser.add_argument("--llama-server", default=None, metavar="PATH", help="also measure this llama-server binary")
    parser.add_argument("--gguf", default=None, help="the GGUF llama-server runs (default: the model's own)")
    parser.add_argument("--compile", nargs="?", const="", default=None, help=argparse.SUPPRESS)  # removed: refused
    parser.add_argument("--device", default="auto", help="ours and HF's: auto, cpu, cuda or cuda:N (default: auto)")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="also measure our engine with CUDA graphs off, in rounds alternating with on (a GPU)")
    parser.add_argument("--structured", action="store_true",
                        help="only constrained (JSON schema) against free decoding (engine/tools/bench_structured.py)")
    parser.add_argument("--repeats", type=int, default=4,
                        help="alternating rounds per condition (--structured, and ours against --llama-server)")
    parser.add_argument("--prefill", type=int, default=0, metavar="N",
                        help="also time prompt reading of a fresh N-token prompt (no prefix reuse), ours and, with "
                             "--llama-server, its server's, in --repeats alternating rounds")
    parser.add_argument("--speculative", default=None, metavar="METHODS",
                        help="only speculative decoding (e.g. ngram,self-int4) against off, single stream "
                             "(engine/tools/bench_speculative.py)")
    parser.add_argument("--fresh-verdicts", action="store_true",
                        help="forget this machine's cached kernel plans and native-step verdicts before loading, and "
                             "wait (up to --quiet-wait seconds) for the machine to look quiet, so that the load times "
                             "them again rather than running ones timed on a busy machine")
    parser.add_argument("--quiet-wait", type=float, default=120.0, metavar="S",
                        help="with --fresh-verdicts, the longest wait for a quiet machine (default 120)")
    parser.add_argument("--server", action="store_true",
                        help="time our engine through its server (python -m engine.serve) over HTTP, as "
                             "--llama-server always does (engine/tools/bench_servers.py)")
    parser.add_argument("--paths", action="store_true",
                        help="only the engine stepped by hand against its loop thread and Hearth's server "
                             "(engine/tools/bench_paths.py)")
    parser.add_argument("--loads", type=int, default=0, metavar="N",
                        help="only N loads of --model, each in a fresh process, the first in an empty data folder: "
                             "load times and RSS (engine/tools/bench_loads.py)")
    args = parser.parse_args(argv)
    if args.compile is not None:
        parser.error(f"--compile: {COMPILE_REMOVED}")
    if args.loads:  # before the setting below: each load measures its kernels as the app does, after its answer
        from engine.tools import bench_loads

        bench_loads.main(args.model, args.level or "auto", args.loads, _emit)
        return 0
    # kernel plans not cached yet are measured during the load, not beside the benchmark's own timings
    os.environ.setdefault("HEARTH_AUTOTUNE", "load")
    args.concurrency = args.concurrency or ("1,4" if args.structured else "1,4,16")
    args.max_tokens = args.max_tokens or (160 if args.structured else 64)
    logging.basicConfig(level=logging.WARNING)
    levels = [int(c) for c in args.concurrency.split(",")]
    hardware.configure_threads()
    if args.fresh_verdicts:
        _emit(forget_verdicts(args.quiet_wait))
    _emit({"system": "machine", "threads": torch.get_num_threads(), "torch": torch.__version__, "dtype": args.dtype})
    if args.quantization:
        names = ["bf16", "fp32", "int8", "int4"] if args.quantization == "all" else args.quantization.split(",")
        bench_quantization(args.model, names, args.max_tokens)
        return 0

    precision = {"quantization": args.level} if args.level else {"dtype": args.dtype}
    if args.speculative:
        from engine.tools import bench_speculative

        bench_speculative.main(args.model, args.speculative.split(","), precision, max(1, args.repeats // 2),
                               args.max_tokens)
        return 0
    if args.paths:
        from engine.tools import bench_paths

        bench_paths.main(args.model, precision, levels, args.max_tokens, _messages, bench_engine, _emit)
        return 0
    if args.structured:
        from engine.tools import bench_structured

        llm = LLM(args.model, start_loop=False, max_batch_size=max(levels), **precision)
        bench_structured.main(llm, levels, args.repeats, args.max_tokens)
        llm.close()
        return 0
    llm = LLM(args.model, start_loop=False, max_batch_size=max(levels + [16]), device=args.device, **precision)
    # kernels this load ran untimed are measured on a thread of the load's own while the model is idle: between
    # the timed rounds, ours and llama.cpp's, unless they are done first. Their plans are cached, so a server
    # started after this loads with them, as a user's next start of the app does
    start = time.perf_counter()
    if llm.tuning is not None:
        llm.tuning.join()
    flags, cpu_model = hardware.cpu_flags_and_model()
    simd = sorted(f for f in flags if f.startswith(("avx", "amx")) or f in ("fma", "f16c"))
    _emit({"system": "hearth_setup", "device": llm.device, "dtype": llm.dtype, "level": llm.quantization,
           "decode_steps": llm.decode_status, "cpu": cpu_model, "cpu_flags": simd, "threads": torch.get_num_threads(),
           "weights_mib": round(llm.weights_bytes / 2**20), "kernels_measured_s": round(time.perf_counter() - start, 1)})
    results: dict[tuple[str, int], dict[str, Any]] = {}
    if args.server or args.llama_server:
        results.update(_bench_servers(llm, args, levels, precision))
    elif args.cuda_graphs:
        results.update(bench_cuda_graphs(llm, levels, args.max_tokens, args.repeats, bench_engine, _emit))
    else:
        if args.prefill:
            _bench_prefill(llm, args.prefill, args.repeats)
        for c in levels:
            bench_engine(llm, c, 4)  # warm this batch shape
            results[("hearth", c)] = row = bench_engine(llm, c, args.max_tokens).row("hearth", c)
            row["level"] = llm.quantization
            _emit(row)

    if not args.skip_hf:
        from transformers import AutoModelForCausalLM

        path = llm.path
        tokenizer = llm.tokenizer
        device = llm.device
        llm.close()
        hf_dtype = getattr(torch, args.dtype)
        for dtype_name, dtype in {args.dtype: hf_dtype, "float32": torch.float32}.items():
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval().to(device)
            _hf_generate(model, tokenizer, [0], 4)  # warm up
            for c in levels:
                name = f"hf_sequential_{dtype_name}"
                if c <= 4 and dtype_name == args.dtype:
                    results[(name, c)] = row = bench_hf_sequential(model, tokenizer, c, args.max_tokens).row(name, c)
                    _emit(row)
                name = f"hf_static_batch_{dtype_name}"
                results[(name, c)] = row = bench_hf_static(model, tokenizer, c, args.max_tokens).row(name, c)
                _emit(row)
            del model
        llm = LLM(args.model, dtype=args.dtype, start_loop=False, device=args.device)

    if not args.skip_multi_turn:
        for cached in (True, False):
            run = llm if cached else LLM(args.model, dtype=args.dtype, start_loop=False, enable_prefix_caching=False,
                                         device=args.device)
            ttfts = bench_multi_turn(run, args.turns, 32)
            _emit(
                {
                    "system": "hearth_multi_turn",
                    "prefix_cache": cached,
                    "ttft_ms_per_turn": [round(t * 1e3, 1) for t in ttfts],
                    "turn_last_over_first": round(ttfts[-1] / ttfts[0], 2),
                }
            )
            if not cached:
                run.close()

    if args.llama_server and (gguf := _gguf_of(args)) is not None:
        _emit_bounds(gguf, levels, results)
    summary: dict[str, Any] = {"system": "summary"}
    single = results.get(("hearth", 1))
    hf_single = results.get((f"hf_sequential_{args.dtype}", 1))
    if single and hf_single:
        summary["single_stream_vs_hf_generate"] = round(single["tok_s"] / hf_single["tok_s"], 2)
    top = max(levels)
    ours = results.get(("hearth", top))
    statics = [r["tok_s"] for (name, c), r in results.items() if name.startswith("hf_static") and c == top]
    if ours and statics:
        summary[f"c{top}_vs_best_hf_static_batch"] = round(ours["tok_s"] / max(statics), 2)
    for c in levels:
        theirs, mine = results.get(("llama_server", c)), results.get(("hearth", c))
        if theirs and mine:
            summary[f"c{c}_vs_llama_server"] = round(mine["tok_s"] / theirs["tok_s"], 2)
        eager = results.get(("hearth_no_cuda_graphs", c))
        if eager and mine:
            summary[f"c{c}_cuda_graphs_vs_eager"] = round(mine["tok_s"] / eager["tok_s"], 2)
    if len(summary) > 1:
        _emit(summary)
    llm.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
