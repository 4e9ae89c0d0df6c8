"""``python -m engine.soak --requests 1000``: many requests through one engine, printing RSS as it goes.

A benchmark, not a test: it shows whether memory stays flat under a long mixed workload with a fixed KV pool.
Requests run ``--concurrency`` at a time with varied prompts, lengths and sampling settings; a tenth of them are
cancelled mid-stream. Every ``--every`` requests it prints one JSON line with the process RSS; at the end a summary
with the growth after warm-up (the first report), which should stay within a few percent.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import psutil

from engine.api import SamplingParams


def _params(rng: random.Random, max_tokens: int) -> SamplingParams:
    if rng.random() < 0.5:
        return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return SamplingParams(max_tokens=max_tokens, temperature=0.8, top_p=0.9, seed=rng.randrange(2**32))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--every", type=int, default=100, help="print RSS every this many finished requests")
    parser.add_argument("--kv-cache-mb", type=int, default=64)
    parser.add_argument("--quantization", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=400,
                        help="requests before the baseline: the KV pool's pages are first written and allocator "
                             "caches fill during these")
    args = parser.parse_args(argv)

    from engine.core.llm import LLM

    rng = random.Random(args.seed)
    proc = psutil.Process()
    llm = LLM(args.model, quantization=args.quantization, kv_cache_bytes=args.kv_cache_mb << 20,
              max_batch_size=args.concurrency)
    words = ["the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not", "he", "this", "are", "or", "his", "from", "at"]
    reports: list[tuple[int, int]] = []
    start = time.perf_counter()
    done = 0
    try:
        while done < args.requests:
            wave = min(args.concurrency, args.requests - done)
            handles = []
            for _ in range(wave):
                text = " ".join(rng.choice(words) for _ in range(rng.randint(3, 120)))
                handles.append(llm.engine.submit([{"role": "user", "content": text}], _params(rng, args.max_tokens)))
            for handle in handles:
                if rng.random() < 0.1:
                    handle.cancel()
            for handle in handles:
                handle.result(timeout=600)
                done += 1
                if done % args.every == 0:
                    rss = proc.memory_info().rss
                    reports.append((done, rss))
                    print(json.dumps({"requests": done, "rss_mib": round(rss / 2**20, 1),
                                      "kv_blocks_used": llm.metrics().kv_blocks_used,
                                      "elapsed_s": round(time.perf_counter() - start, 1)}), flush=True)
    finally:
        llm.close()
    after = [rss for n, rss in reports if n >= args.warmup]
    if len(after) >= 2:
        growth = (max(after[1:]) - after[0]) / after[0]
        print(json.dumps({"summary": f"rss after {args.warmup} warm-up requests",
                          "baseline_mib": round(after[0] / 2**20, 1), "max_after_mib": round(max(after[1:]) / 2**20, 1),
                          "growth_pct": round(100 * growth, 2), "flat_within_5pct": growth <= 0.05}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
