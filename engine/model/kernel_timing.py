"""Timing kernels: one kernel's calls at a row count within a budget, the caches flushed between them, every
candidate over every bucket in interleaved rounds, and the thread that measures a load's pending shapes after the
model has answered (``engine/model/autotune.py`` chooses plans from these timings; its docstring says why each
budget and rule is as it is).

A measurement on the background thread stops at a checkpoint before each timed call: it waits while the model is
wanted and raises :class:`TuningStopped` when asked to stop, so a reply waits for one kernel call at most.
"""

from __future__ import annotations

import functools
import logging
import os
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from engine.model.row_invariance import Kernel

log = logging.getLogger("engine")

#: The row count timed for each bucket: 1, 2-4, 5-16 and 17+ rows.
BUCKETS = (1, 4, 16, 64)
BUCKET_NAMES = ("1", "2-4", "5-16", "17+")
_WARMUP, _REPEATS, _ROUNDS = 5, 5, 3
#: Seconds of calls per kernel and bucket: warm-up calls (first round only) stop once they took the first, timed
#: calls (each round) once they took the second; one of each runs at least. A long call is timed once a round, short
#: ones up to :data:`_REPEATS` times: the big buckets of a large matrix (the lm_head) cost most of a load's measuring.
_WARMUP_BUDGET_S, _REPEAT_BUDGET_S = 0.03, 0.1
#: After the first round, a kernel whose best call at a bucket is :data:`_OUTPACED` times the fastest kernel's
#: there, and at least :data:`_LONG_CALL_US` long, is not timed at that bucket again: it cannot win it.
_OUTPACED, _LONG_CALL_US = 3.0, 10_000.0
#: A warm-up call at least this long (the timed calls' whole budget) is kept as its round's timed call: only one
#: would follow, and one-off costs and a warm cache are small beside it (they could only make it look slower).
_LONG_WARM_UP_US = _REPEAT_BUDGET_S * 1e6

def bucket_index(rows: int) -> int:
    """The bucket a step of ``rows`` token rows falls in."""
    return 0 if rows <= 1 else 1 if rows <= 4 else 2 if rows <= 16 else 3


@functools.cache
def _cache_bytes() -> int:
    """The last-level cache size (Linux sysfs), or 32 MiB where unknown."""
    size = 32 << 20
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"), reverse=True):
        try:
            text = (index / "size").read_text().strip().upper()
            size = int(text.rstrip("KMG")) << {"K": 10, "M": 20, "G": 30}.get(text[-1], 0)
            break
        except (OSError, ValueError, IndexError):
            continue
    return size


_flush_buffer: torch.Tensor | None = None


def _evict_caches() -> None:
    """Read twice the last-level cache, so the next call reads its weights from memory, as in a real step.

    Reading (not writing) leaves no dirty lines whose write-back would be charged to the timed call.
    """
    global _flush_buffer
    if _flush_buffer is None:
        _flush_buffer = torch.ones(2 * _cache_bytes() // 4, dtype=torch.float32)
    _flush_buffer.sum()


def _release_flush_buffer() -> None:
    global _flush_buffer
    _flush_buffer = None


def _caller(kernel: Kernel, rows: int, in_features: int, dtype: torch.dtype) -> Callable[[], float]:
    """One call of ``kernel`` on ``rows`` random rows, as run (its input cast included); returns its seconds.
    Call it in inference mode."""
    x = torch.randn(rows, in_features).to(dtype)
    cast = getattr(kernel, "input_dtype", None)

    def call() -> float:
        start = time.perf_counter()
        if cast is not None and cast != dtype:
            kernel(x.to(cast)).to(dtype)
        else:
            kernel(x)
        return time.perf_counter() - start

    return call


def warm_up(kernel: Kernel, rows: int, in_features: int, dtype: torch.dtype) -> float:
    """Up to :data:`_WARMUP` untimed calls, until they took :data:`_WARMUP_BUDGET_S` (one at least): the first
    calls at a row count pay one-off costs (allocations, packing, the kernel's own set-up). Returns the last
    call's microseconds."""
    call, spent, last = _caller(kernel, rows, in_features, dtype), 0.0, 0.0
    with torch.inference_mode():
        for _ in range(_WARMUP):
            _checkpoint()
            last = call()
            spent += last
            if spent >= _WARMUP_BUDGET_S:
                break
    return last * 1e6


def time_kernel(kernel: Kernel, rows: int, in_features: int, dtype: torch.dtype) -> list[float]:
    """The times of up to :data:`_REPEATS` calls on ``rows`` random rows, in microseconds (casts included, as run).

    The calls stop once they took :data:`_REPEAT_BUDGET_S` (one runs at least). The caches are flushed before
    every call: a model's layers together outgrow them, so in a real step each weight comes from memory, and a
    warm-cache timing would flatter small matrices. Weights twice the last-level cache need no flush: each call
    reads them from memory anyway (a scan of more bytes than the cache holds leaves none of its start there).
    """
    call, times = _caller(kernel, rows, in_features, dtype), list[float]()
    flush = kernel.nbytes < 2 * _cache_bytes()
    with torch.inference_mode():
        while len(times) < _REPEATS and sum(times) < _REPEAT_BUDGET_S:
            _checkpoint()
            if flush:
                _evict_caches()
            times.append(call())
    return [t * 1e6 for t in times]


@dataclass(slots=True)
class Measurement:
    """Each candidate's best and median call per bucket (microseconds, :data:`BUCKETS` order), over all rounds."""

    best: dict[str, list[float]]
    median: dict[str, list[float]]

    @property
    def noise(self) -> float:
        """How far the median call is from the best one (``median / best - 1``), the worst over all timings."""
        pairs = (zip(self.best[name], self.median[name], strict=True) for name in self.best)
        return max(m / max(b, 1e-9) - 1 for pair in pairs for b, m in pair)


def measure(kernels: Mapping[str, Kernel], in_features: int, dtype: torch.dtype) -> Measurement:
    """Time every kernel at every bucket's row count, :data:`_ROUNDS` times.

    The rounds interleave the candidates, so a passing disturbance does not decide the plan alone; the median
    is taken over the calls of all rounds, so a disturbance lasting most of them shows in it. A kernel outpaced at
    a bucket by the first round (:func:`outpaced`) is not timed there again. Only the first round warms a kernel
    up (:func:`warm_up`): later ones find its one-off costs paid; a warm-up call as long as :data:`_LONG_WARM_UP_US`
    is kept as the first round's timed call.
    """
    samples: dict[str, list[list[float]]] = {name: [[] for _ in BUCKETS] for name in kernels}
    for round_ in range(_ROUNDS):
        for name, kernel in kernels.items():
            for b, rows in enumerate(BUCKETS):
                if round_ and outpaced(samples, name, b):
                    continue
                if not round_ and (last := warm_up(kernel, rows, in_features, dtype) or 0.0) >= _LONG_WARM_UP_US:
                    samples[name][b].append(last)  # it stands for the one timed call that would follow
                    continue
                samples[name][b].extend(time_kernel(kernel, rows, in_features, dtype))
    _release_flush_buffer()
    best = {name: [min(times) for times in by_bucket] for name, by_bucket in samples.items()}
    return Measurement(best, {name: [statistics.median(t) for t in by_b] for name, by_b in samples.items()})


def outpaced(samples: Mapping[str, list[list[float]]], name: str, bucket: int) -> bool:
    """Whether ``name``'s calls at ``bucket`` are long, and :data:`_OUTPACED` times the fastest kernel's there
    (best calls so far): timing it again cannot change which kernel wins that bucket, and would cost the most."""
    mine = min(samples[name][bucket])
    fastest = min(min(by_bucket[bucket]) for by_bucket in samples.values())
    return mine >= _LONG_CALL_US and mine >= _OUTPACED * fastest


def machine_quiet() -> bool:
    """Whether the cores look free for measuring: the last minute's load average is under half the CPU count
    (where the system reports none, the machine is taken as quiet)."""
    try:
        return os.getloadavg()[0] < 0.5 * (os.cpu_count() or 1)
    except (AttributeError, OSError):
        return True


class TuningStopped(Exception):
    """Raised inside a background measurement that was asked to stop (:meth:`BackgroundTuning.stop`)."""


_background = threading.local()


def _checkpoint() -> None:
    """Before each timed call: on a background tuning's thread, wait while the model is wanted (a reply is being
    generated) and stop when asked to; elsewhere nothing. A reply then waits for one kernel call at most."""
    hold = getattr(_background, "hold", None)
    if hold is not None:
        hold()


class PendingShapes(Protocol):
    """What :class:`BackgroundTuning` measures: ``engine.model.autotune.Tuner``'s shapes not measured at load."""

    pending: list[Any]

    def tune_pending(self, wait: Callable[[], bool]) -> int: ...


class BackgroundTuning:
    """Measures a tuner's pending shapes (``engine.model.autotune.Tuner.tune_pending``) on a thread of its own, while the
    model is idle, and caches their plans for the next load (the running layers keep their kernels: a kernel
    swapped under a conversation could change a greedy reply's tokens).

    Args:
        tuner: whose pending shapes to measure (an ``engine.model.autotune.Tuner``).
        busy: whether the model is wanted now (a request queued or running): measuring waits until it is not,
            checked before every timed call.
        poll_s: how often a waiting measurement looks again.
    """

    def __init__(self, tuner: PendingShapes, busy: Callable[[], bool], poll_s: float = 0.05) -> None:
        self.tuner = tuner
        self._busy = busy
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: shapes measured so far
        self.measured = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hearth-tune", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop measuring (within one timed call) and let go of the candidates; shapes not measured yet are
        measured by a later load."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def join(self, timeout_s: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _hold(self) -> None:
        while not self._stop.is_set() and self._busy():
            self._stop.wait(self._poll_s)
        if self._stop.is_set():
            raise TuningStopped

    def _wait(self) -> bool:
        try:
            self._hold()
        except TuningStopped:
            return False
        return True

    def _run(self) -> None:
        _background.hold = self._hold
        start = time.perf_counter()
        try:
            self.measured = self.tuner.tune_pending(self._wait)
        except TuningStopped:
            log.info("kernel measurement stopped; the shapes left are measured by a later load")
        except Exception:  # a failed measurement costs only the next load's speed
            log.exception("measuring kernels after the load failed")
        finally:
            self.tuner.pending.clear()
            _background.hold = None
        if self.measured:
            log.info("measured %d kernel shapes after the load in %.1f s", self.measured, time.perf_counter() - start)
