"""``python -m engine.bench --fresh-verdicts``: this machine's timed kernel choices forgotten before a run."""

from __future__ import annotations

import os
import time
from typing import Any

from engine.model import layer_spec, plan_cache
from engine.model.kernel_timing import machine_quiet
from engine.system.paths import data_dir


def forget_verdicts(quiet_wait_s: float) -> dict[str, Any]:
    """Delete the data folder's kernel plans and native-step verdicts, then wait for a quiet machine.

    A plan or verdict timed while the machine was busy is cached as provisional and timed again only by a load that
    starts on a quiet machine (``engine/model/autotune.py``); a bench that runs servers and loads back to back keeps
    the load average up, so stale ones would stick and the bench would measure the kernels a busy moment chose.
    """
    removed = []
    for name in (plan_cache.CACHE_FILENAME, layer_spec.CACHE_FILENAME):
        path = data_dir() / name
        if path.is_file():
            path.unlink()
            removed.append(str(path))
    start = time.monotonic()
    while not machine_quiet() and time.monotonic() - start < quiet_wait_s:
        time.sleep(2.0)
    return {"system": "fresh_verdicts", "removed": removed, "waited_s": round(time.monotonic() - start, 1),
            "quiet": machine_quiet(), "load_1min": round(_load_average(), 2)}


def _load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0
