"""``python -m engine.tools.bench_weight_pass FILE``: every matmul of one decode step of a GGUF file, through the
"file" level's kernels (``torch.ops.hearth.gguf_mm``, ``engine/model/csrc/gguf_kernels.cpp``), against the rate at
which the machine reads memory, printed as one JSON object.

The file's own weight bytes (every 2-D quantized tensor but the token embedding, which is the output head only
when the file has no ``output.weight``), put in groups of eight rows as the "file" level loads them, are
multiplied by ``m`` activation rows one tensor after another: the weights come from memory, as in a decode step,
not from cache. Each pass is timed against a sum over a float32 buffer of the same size (torch, the same threads),
in alternating calls, so that the machine's drift falls on both. ``weight_gb_s`` over ``read_gb_s`` is how close
the step's matmuls come to reading their weights at the machine's read rate (one row), and ``rows_cost`` how
much longer ``m`` rows take than one (the bound on each of ``m`` streams' share of one stream's speed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from engine.tools.bench_gguf_kernels import start_kernels

#: ggml type numbers of the types the kernels multiply, by the names gguf's reader gives them
KINDS = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}


def step_weights(path: Path) -> list[tuple[torch.Tensor, int, int]]:
    """(uint8 [rows, row bytes], kernel type number, k) for each matmul of a decode step, grouped where the kernels
    have a grouped layout."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    names = {t.name for t in reader.tensors}
    out = []
    for t in reader.tensors:
        kind = KINDS.get(t.tensor_type.name)
        if kind is None or len(t.shape) != 2 or (t.name == "token_embd.weight" and "output.weight" in names):
            continue
        blocks = torch.from_numpy(np.array(t.data, dtype=np.uint8))  # a copy: anonymous memory, as a load holds it
        grouped = int(torch.ops.hearth.gguf_grouped_type(kind))
        if grouped >= 0:
            kind = int(torch.ops.hearth.gguf_repack_(blocks, kind))
        out.append((blocks, kind, int(t.shape[0])))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.tools.bench_weight_pass", description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path, help="a GGUF file")
    parser.add_argument("--rows", default="1,8", help="comma-separated row counts (m)")
    parser.add_argument("--repeats", type=int, default=9, help="passes timed per row count")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)
    if not start_kernels(args.threads):
        return 1
    from engine.system import hardware

    weights = step_weights(args.file)
    total = sum(w.numel() for w, _, _ in weights)
    flat = torch.ones(total // 4)
    flags, model = hardware.cpu_flags_and_model()
    report: dict[str, object] = {
        "file": args.file.name, "cpu": model, "flags": sorted(f for f in flags if f.startswith(("avx", "amx"))),
        "threads": torch.get_num_threads(), "family": str(torch.ops.hearth.gguf_kernel_family()),
        "tensors": len(weights), "weight_mb": round(total / 1e6, 1), "rows": [],
    }
    rows: list[dict[str, object]] = report["rows"]  # type: ignore[assignment]
    with torch.inference_mode():
        for m in (int(v) for v in args.rows.split(",")):
            xs = {k: torch.randn(m, k) for k in {k for _, _, k in weights}}
            passes: list[float] = []
            reads: list[float] = []
            for _ in range(max(1, args.repeats)):
                start = time.perf_counter()
                for w, kind, k in weights:
                    torch.ops.hearth.gguf_mm(xs[k], w, kind)
                passes.append(time.perf_counter() - start)
                start = time.perf_counter()
                flat.sum()
                reads.append(time.perf_counter() - start)
            step, read = statistics.median(passes), statistics.median(reads)
            rows.append({"m": m, "pass_ms": round(step * 1e3, 2), "weight_gb_s": round(total / step / 1e9, 1),
                         "read_ms": round(read * 1e3, 2), "read_gb_s": round(total / read / 1e9, 1)})
    one = next((r for r in rows if r["m"] == 1), None)
    if one is not None:
        for r in rows:
            r["rows_cost"] = round(float(r["pass_ms"]) / float(one["pass_ms"]), 2)  # type: ignore[arg-type]
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
