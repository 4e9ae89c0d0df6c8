"""The plan cache: each weight shape's kernel plan, kept on disk so that later loads measure nothing.

A plan (:class:`Plan`) says which kernel each batch bucket runs for one weight shape, with the timings, noise and
reason behind it; ``engine/model/autotune.py`` measures and chooses it. Plans are cached in
``data_dir()/autotune.json`` per CPU model, torch version, thread count, role, shape and candidate set (the key
also names :data:`PLAN_VERSION` and, for deterministic mode, the invariance check's version). ``python -m engine
info`` prints them, and ``python -m engine info MODEL --retune`` first removes this CPU's plans
(:meth:`PlanCache.forget_machine`), so that load measures every shape again.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.system import hardware
from engine.system.paths import data_dir

log = logging.getLogger("engine")

CACHE_FILENAME = "autotune.json"
#: Part of every cache key: bump it when the way plans are measured or chosen (``autotune.py``) changes.
PLAN_VERSION = "v6"


@dataclass(slots=True)
class Plan:
    """Which kernel each bucket runs for one weight shape, and why."""

    kernels: tuple[str, ...]  # one name per bucket
    timings_us: dict[str, list[float]]  # kernel -> time per bucket
    reason: str
    cached: bool = False
    row_multiple: int = 1  # calls are padded to a multiple of this many rows (deterministic mode)
    noise: float | None = None  # see autotune.Measurement.noise; None when nothing was timed
    trusted: bool = True  # its timings separate the candidates (autotune.judge); else it is provisional
    noisy_loads: int = 0  # loads in a row that measured it too noisily (provisional plans only)
    untimed: bool = False  # run unmeasured by this load, and measured after it for the next (never cached so)

    @property
    def used(self) -> list[str]:
        return list(dict.fromkeys(self.kernels))


class PlanCache:
    """Plans on disk, one JSON object keyed by machine, torch, threads, role, shape and candidates."""

    _lock = threading.Lock()

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else data_dir() / CACHE_FILENAME
        self._data: dict[str, Any] | None = None

    @staticmethod
    def key(
        role: str, shape: tuple[int, int], dtype: torch.dtype, candidates: list[str], deterministic: bool = False
    ) -> str:
        machine = f"{hardware.detect().cpu_model}|torch {torch.__version__}|{torch.get_num_threads()} threads"
        machine = f"{PLAN_VERSION}{'|invariant-v2' if deterministic else ''}|{machine}"
        return f"{machine}|{role}|{shape[0]}x{shape[1]}|{str(dtype).removeprefix('torch.')}|{','.join(candidates)}"

    def _load(self) -> dict[str, Any]:
        if self._data is None:
            try:
                self._data = json.loads(self.path.read_text())
            except (OSError, ValueError):
                self._data = {}
        return self._data

    def get(self, key: str) -> Plan | None:
        entry = self._load().get(key)
        try:
            if not entry:
                return None
            multiple = int(entry.get("row_multiple", 1))
            noise = None if entry.get("noise") is None else float(entry["noise"])
            noisy = int(entry.get("noisy_loads", 0))
            return Plan(
                tuple(entry["kernels"]), entry["timings_us"], entry["reason"], True, multiple, noise, not noisy, noisy
            )
        except (KeyError, TypeError, ValueError):
            return None

    def put(self, key: str, plan: Plan) -> None:
        data = self._load()
        data[key] = {"kernels": list(plan.kernels), "timings_us": plan.timings_us, "reason": plan.reason}
        if plan.row_multiple != 1:
            data[key]["row_multiple"] = plan.row_multiple
        if plan.noise is not None:
            data[key]["noise"] = round(plan.noise, 3)
        if not plan.trusted:
            data[key]["noisy_loads"] = max(plan.noisy_loads, 1)
        self._write(data)

    def forget_machine(self) -> int:
        """Remove every plan measured on this CPU model (any torch version, thread count or plan version).

        Returns:
            How many plans were removed; the next load measures their shapes again.
        """
        data = self._load()
        mine = f"|{hardware.detect().cpu_model}|torch "
        gone = [key for key in data if mine in key]
        for key in gone:
            del data[key]
        if gone:
            self._write(data)
        return len(gone)

    def _write(self, data: dict[str, Any]) -> None:
        with self._lock:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".autotune-")
                with os.fdopen(fd, "w") as fh:
                    json.dump(data, fh, indent=1, sort_keys=True)
                os.replace(tmp, self.path)
            except OSError as exc:  # a read-only data dir only costs the next load a re-measurement
                log.info("autotune cache not written (%s)", exc)
