"""What no engine can beat on this machine: a GGUF file's decode step against the CPU's read and int8 rates.

``python -m engine.tools.machine_bounds FILE [--rows 1,8]`` prints one JSON object, and ``python -m engine.bench
--llama-server`` adds it as its ``machine_bounds`` row, with a ceiling from the run's own times:

* ``read_gb_s``: every thread reading 512 MiB at once (the fastest of five sums over a float32 buffer);
* ``int8_gmac_s``: every thread's rate of VPDPBUSD on 512-bit vectors with nothing else in the loop
  (``torch.ops.hearth.int8_peak_gmacs``), the instruction the GGUF kernels' VNNI tiles are built on; null in a build
  without AVX512-VNNI;
* ``bytes_per_token`` and ``macs_per_token``: the file's matrices that one row of a decode step reads and multiplies
  (every 2-D tensor but the token embedding, of which a step reads one row, unless the file has no output matrix and
  the embedding is also the head);
* ``read_floor_ms``: one step of any row count reads the matrices once: their bytes at the read rate;
* ``int8_floor_ms`` {rows: ms}: a step of that many rows multiplies them that many times: at the int8 rate.

A step takes at least the larger of the two; attention, norms and sampling come on top. The int8 rate holds still
from minute to minute, the read rate does not: on the shared development machine it moved between 29 and 62 GB/s
within an hour, so ``read_floor_ms`` holds for the moment it was measured only.

With a bench run's rows (:func:`bounds_row`), ``share_ceiling`` {streams: share} follows: our one-stream time
between tokens over the int8 floor at that many rows, the most that each of that many streams can keep of one
stream's speed in that run, however fast the step's kernels.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from engine.api import ModelLoadError
from engine.loading.gguf_reader import read_tensor_table

_READ_BYTES = 512 << 20
_READ_ROUNDS = 5
_INT8_ITERATIONS = 4_000_000


def file_work(path: Path) -> tuple[int, int]:
    """``(bytes, multiply-adds)`` of the matrices one row of a decode step of ``path`` reads."""
    _, tensors = read_tensor_table(path)
    has_head = any(t.name == "output.weight" for t in tensors)
    nbytes = macs = 0
    for t in tensors:
        if len(t.dims) != 2 or (t.name == "token_embd.weight" and has_head):
            continue
        nbytes += t.nbytes
        macs += t.dims[0] * t.dims[1]
    return nbytes, macs


def read_rate() -> float:
    """GB/s of every thread reading memory at once: the fastest of a few sums over a float32 buffer of 512 MiB (as
    ``engine/tools/bench_weight_pass.py`` times its passes against; torch's sum reads faster than a plain loop)."""
    buffer = torch.ones(_READ_BYTES // 4)
    best = float("inf")
    for _ in range(_READ_ROUNDS):
        start = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - start)
    return _READ_BYTES / best / 1e9


def machine_rates() -> tuple[float, float | None]:
    """``(read GB/s, int8 GMAC/s or None)`` of every thread at once (the native extension must be loaded)."""
    int8 = float(torch.ops.hearth.int8_peak_gmacs(_INT8_ITERATIONS))
    return read_rate(), (int8 or None)


def bounds(path: Path, rows: list[int]) -> dict[str, Any]:
    """The machine's rates and ``path``'s floors at each row count (see the module's docstring)."""
    nbytes, macs = file_work(path)
    read, int8 = machine_rates()
    return {"system": "machine_bounds", "gguf": path.name, "threads": torch.get_num_threads(),
            "read_gb_s": round(read, 1), "int8_gmac_s": None if int8 is None else round(int8, 1),
            "bytes_per_token": nbytes, "macs_per_token": macs, "read_floor_ms": round(nbytes / read / 1e6, 3),
            "int8_floor_ms": {str(r): round(r * macs / int8 / 1e6, 3) for r in rows} if int8 else None}


def bounds_row(path: Path, levels: list[int], results: dict[tuple[str, int], dict[str, Any]]) -> dict[str, Any]:
    """:func:`bounds` with the share ceiling that a bench run's rows (``results[(system, streams)]``) leave."""
    row = bounds(path, levels)
    floors, mine = row["int8_floor_ms"], results.get(("hearth", 1))
    if floors and mine and mine.get("itl_p50_ms"):
        row["share_ceiling"] = {str(c): round(min(1.0, mine["itl_p50_ms"] / floors[str(c)]), 2)
                                for c in levels if c > 1 and floors[str(c)] > 0}
    return row


def main(argv: list[str] | None = None) -> int:
    from engine.model import native
    from engine.system import hardware

    parser = argparse.ArgumentParser(prog="python -m engine.tools.machine_bounds", description=__doc__.splitlines()[0])
    parser.add_argument("gguf", type=Path)
    parser.add_argument("--rows", default="1,8", help="row counts of the floors (default 1,8)")
    args = parser.parse_args(argv)
    hardware.configure_threads()
    problem = native.EXTENSION.start(wait=True)
    if problem:
        raise SystemExit(f"the native extension is needed to measure the machine: {problem}")
    try:
        report = bounds(args.gguf, [int(r) for r in args.rows.split(",")])
    except ModelLoadError as exc:  # a missing, truncated or corrupt file: its message says which and what to do
        raise SystemExit(str(exc)) from None
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
