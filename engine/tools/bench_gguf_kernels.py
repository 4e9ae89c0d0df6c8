"""``python -m engine.tools.bench_gguf_kernels``: the GGUF block kernels (``torch.ops.hearth.gguf_mm``,
``engine/model/csrc/gguf_kernels.cpp``) per block type, shape and row count, against torch's int4 kernel
(:class:`engine.model.quantization.Int4Linear`) on the same shapes, printed as one JSON object.

Each entry is the median of repeated calls on random valid blocks: microseconds per call, the weights' bytes read
per second for one row (decode, where the weights' bandwidth is the limit), and GFLOP/s for many rows (prefill,
where arithmetic is). Where the build runs the 512-bit tiles (``"family": "avx512"``), each entry also times the
AVX2 tiles (``gguf_mm_avx2``, the same bits) in calls alternating with it, as ``avx2_us`` and ``avx2_ratio``. Q4_0,
Q8_0, Q4_K and Q6_K also get an entry for their rows in groups of eight (``Q4_0x8``, ``Q6_Kx8``, ...: ``gguf_repack``, as the
"file" level loads them), timed in calls alternating with the file's row order, as ``file_order_us`` and
``grouped_ratio`` (above 1: the groups are faster). Only ratios between entries of one run mean much on a shared
machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from functools import partial

import numpy as np
import torch

#: ggml type name -> (number, weights per block, bytes per block, offset of the fp16 scale(s), how many)
TYPES = {
    "Q4_0": (2, 32, 18, 0, 1),
    "Q4_1": (3, 32, 20, 0, 2),
    "Q8_0": (8, 32, 34, 0, 1),
    "Q4_K": (12, 256, 144, 0, 2),
    "Q5_K": (13, 256, 176, 0, 2),
    "Q6_K": (14, 256, 210, 208, 1),
}
SHAPES = ((2048, 2048), (8192, 2048), (2048, 8192))
#: the types with a grouped layout (engine/model/csrc/gguf_kernels.cpp); its type number is 128 + the ggml type's
GROUPED = ("Q4_0", "Q8_0", "Q4_K", "Q6_K")
ROWS = (1, 8, 512)


def random_blocks(name: str, n: int, k: int, rng: np.random.Generator) -> torch.Tensor:
    """uint8 [n, row bytes]: random quant bytes with small positive fp16 scales, as valid blocks of the type."""
    _, weights, size, at, halves = TYPES[name]
    count = n * k // weights
    raw = rng.integers(0, 256, size=(count, size), dtype=np.uint8)
    scales = rng.uniform(1e-4, 1e-3, size=(count, halves)).astype(np.float16)
    raw[:, at : at + 2 * halves] = scales.view(np.uint8).reshape(count, 2 * halves)
    return torch.from_numpy(raw.reshape(n, -1))


def median_us(call: Callable[[], object], budget_s: float) -> float:
    """The median time of one call, over as many calls as fit in the budget (at least 3, after a warm-up); a call
    longer than the whole budget is timed once."""
    start = time.perf_counter()
    call()
    first = time.perf_counter() - start
    if first > budget_s:
        return first * 1e6
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < budget_s and len(times) < 100):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def paired_us(first: Callable[[], object], second: Callable[[], object], budget_s: float) -> tuple[float, float]:
    """The median times of two calls timed in alternation (so a change in the machine's load falls on both), over
    about twice ``budget_s``."""
    first(), second()
    a: list[float] = []
    b: list[float] = []
    start = time.perf_counter()
    while len(a) < 3 or (time.perf_counter() - start < 2 * budget_s and len(a) < 100):
        for call, times in ((first, a), (second, b)):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
    return statistics.median(a) * 1e6, statistics.median(b) * 1e6


def entry(kernel: str, n: int, k: int, m: int, us: float, weight_bytes: int) -> dict[str, object]:
    out: dict[str, object] = {"kernel": kernel, "n": n, "k": k, "m": m, "us": round(us, 1)}
    if m == 1:
        out["weight_gb_s"] = round(weight_bytes / us / 1e3, 2)
    else:
        out["gflop_s"] = round(2 * m * n * k / us / 1e3, 1)
    return out


def start_kernels(threads: int) -> bool:
    """Set torch's threads (0: its default) and load the native kernels (building them if need be); False, with a
    JSON line saying why, where they cannot run."""
    if threads:
        torch.set_num_threads(threads)
    from engine.model import native

    problem = native.EXTENSION.start(wait=True)
    if problem is not None:
        print(json.dumps({"error": problem}))
    return problem is None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.tools.bench_gguf_kernels", description=__doc__.splitlines()[0])
    parser.add_argument("--types", default=",".join(TYPES), help="comma-separated block types")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated row counts (m)")
    parser.add_argument("--budget", type=float, default=0.1, help="seconds of calls per entry")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)
    if not start_kernels(args.threads):
        return 1
    from engine.model.quantization import Int4Linear
    from engine.system import hardware

    gguf_mm, avx2_mm = torch.ops.hearth.gguf_mm, torch.ops.hearth.gguf_mm_avx2
    family = str(torch.ops.hearth.gguf_kernel_family())
    wide = family == "avx512"
    rows = [int(m) for m in args.rows.split(",")]
    flags, model = hardware.cpu_flags_and_model()
    report: dict[str, object] = {
        "cpu": model,
        "flags": sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "f16c"))),
        "threads": torch.get_num_threads(),
        "family": family,
        "results": [],
    }
    results: list[dict[str, object]] = report["results"]  # type: ignore[assignment]
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    with torch.inference_mode():
        for n, k in SHAPES:
            xs = {m: torch.randn(m, k) for m in rows}
            for name in args.types.split(","):
                w = random_blocks(name, n, k, rng)
                for m in rows:
                    if wide:
                        us, narrow = paired_us(partial(gguf_mm, xs[m], w, TYPES[name][0]),
                                               partial(avx2_mm, xs[m], w, TYPES[name][0]), args.budget)
                        results.append({**entry(name, n, k, m, us, w.nbytes), "avx2_us": round(narrow, 1),
                                        "avx2_ratio": round(narrow / us, 2)})
                    else:
                        us = median_us(partial(gguf_mm, xs[m], w, TYPES[name][0]), args.budget)
                        results.append(entry(name, n, k, m, us, w.nbytes))
                if name in GROUPED and hasattr(torch.ops.hearth, "gguf_repack"):
                    kind = TYPES[name][0]
                    groups = torch.ops.hearth.gguf_repack(w, kind)
                    for m in rows:
                        us, file_order = paired_us(partial(gguf_mm, xs[m], groups, 128 + kind),
                                                   partial(gguf_mm, xs[m], w, kind), args.budget)
                        results.append({**entry(f"{name}x8", n, k, m, us, w.nbytes),
                                        "file_order_us": round(file_order, 1), "grouped_ratio": round(file_order / us, 2)})
            int4 = Int4Linear.quantize(torch.randn(n, k) * 0.02)
            for m in rows:
                us = median_us(partial(int4, xs[m]), args.budget)
                results.append(entry("torch_int4", n, k, m, us, int4.nbytes))
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
