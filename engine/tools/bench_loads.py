"""``python -m engine.bench --model FILE --loads N``: a model's first load and its warm starts, each in a process of
its own, loaded as the app loads it, and the memory the process then holds.

Run 1 uses an empty data folder (no kernel plans, native-step verdicts or converted tables cached: a user's first
load of the file; the machine-wide native build is kept). Runs 2..N reuse that folder: warm starts. Each run waits
for the kernels measured after its first answer, as the app's next start would find them. Every figure depends on
whether the file's pages are still in the OS's page cache, which the run cannot control; a run that read the file
from disk says so by its load time.

Each run prints one JSON row: the import of the engine, the ``LLM()`` call, both together, and the RSS after a short
answer against the file's size plus 400 MiB (the KV pool's pages that short answer wrote are a few MiB, counted
in the RSS and granted nothing). The last row judges the targets: first load ≤ 15 s, warm start ≤ 3 s (the
slowest warm ``LLM()`` call), RSS ≤ file + KV in use + 400 MiB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

FIRST_LOAD_TARGET_S = 15.0
WARM_START_TARGET_S = 3.0
RSS_ALLOWANCE_MIB = 400

_CHILD = """
import json, sys, time
t0 = time.perf_counter()
import psutil
from engine import LLM, SamplingParams
t1 = time.perf_counter()
llm = LLM(sys.argv[1], quantization=sys.argv[2], deterministic=True, speculative="ngram")
t2 = time.perf_counter()
llm.generate(["Tell me about the sea."], SamplingParams(max_tokens=16, temperature=0.0))
rss = psutil.Process().memory_info().rss
if llm.tuning is not None:
    llm.tuning.join()
level = llm.quantization
llm.close()
print(json.dumps({"import_s": round(t1 - t0, 3), "load_s": round(t2 - t1, 3), "rss_mib": round(rss / 2**20, 1),
                  "level": level}))
"""


def run_once(model: str, level: str, data_dir: Path) -> dict[str, Any]:
    """One fresh process that loads ``model`` at ``level`` with ``data_dir`` as its data folder."""
    env = {**os.environ, "HEARTH_DATA_DIR": str(data_dir)}
    done = subprocess.run([sys.executable, "-c", _CHILD, model, level], env=env, capture_output=True, text=True,
                          check=False, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"the load failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    row["ready_s"] = round(row["import_s"] + row["load_s"], 3)
    return row


def main(model: str, level: str, runs: int, emit: Callable[[dict[str, Any]], None]) -> None:
    """Emit ``runs`` load rows, the first in an empty data folder, then the verdicts."""
    file_mib = Path(model).stat().st_size / 2**20 if Path(model).is_file() else None
    with tempfile.TemporaryDirectory(prefix="hearth-loads-") as folder:
        rows = []
        for i in range(max(1, runs)):
            row = {"system": "loads", "run": i + 1, "kind": "first" if i == 0 else "warm",
                   **run_once(model, level, Path(folder))}
            emit(row)
            rows.append(row)
    warm = [r["load_s"] for r in rows[1:]]
    verdict: dict[str, Any] = {
        "system": "loads_verdict", "model": model, "file_mib": None if file_mib is None else round(file_mib, 1),
        "first_load_s": rows[0]["load_s"], "first_load_met": rows[0]["load_s"] <= FIRST_LOAD_TARGET_S,
        "warm_load_s_max": max(warm) if warm else None,
        "warm_start_met": bool(warm) and max(warm) <= WARM_START_TARGET_S,
        "warm_ready_s_max": max(r["ready_s"] for r in rows[1:]) if warm else None,
        "rss_mib_max": max(r["rss_mib"] for r in rows),
    }
    if file_mib is not None:
        verdict["rss_limit_mib"] = round(file_mib + RSS_ALLOWANCE_MIB, 1)
        verdict["rss_met"] = verdict["rss_mib_max"] <= verdict["rss_limit_mib"]
    emit(verdict)
