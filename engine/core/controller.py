"""The adaptive concurrency controller: how much runs at once, tuned from what each step measures.

Goal: the most urgent running request (lowest priority value: the app's own chat) keeps a p90 time between
tokens within ``target_ratio`` × its solo figure (measured whenever it runs alone), while it shares the engine with
less urgent work (API clients). Among requests of equal priority only memory pressure backs off: batching them is
the point. The controller sets

* ``limit``: the most sequences in the running batch (at most ``EngineConfig.max_batch_size``);
* ``token_budget``: the step's token budget, which bounds how long one prefill chunk can stall decodes;
* ``window_scale``: a factor on the batching window (0 while the target is missed: no waiting to batch).

It backs off fast (halves) when the target is missed or memory is short (few free KV blocks, or process RSS
high against available RAM) and grows slowly (one step of each knob per ``grow_interval_s`` while the target is
met and the batch is full), and starts afresh at full size once the engine is idle. Each decision is logged at debug level and counted (``controller_adjustments_total``).
No torch in here.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, replace

from engine.api import EngineMetrics

log = logging.getLogger("engine")

#: Smallest token budget the controller sets: a chunk still makes steady progress on a long prompt.
MIN_TOKEN_BUDGET = 64


def p90(values: list[float]) -> float:
    """Nearest-rank 90th percentile (0.0 for no data)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]


@dataclass(slots=True)
class StepReport:
    """What one engine step measured, as the controller needs it."""

    now: float
    num_running: int
    num_waiting: int
    #: Time since the previous token of the most urgent running request that got a token this step, if any.
    top_itl_s: float | None
    #: Whether that request was the only one running (its ITL then counts as its solo figure).
    top_alone: bool
    kv_free_fraction: float
    #: Process RSS over (RSS + available RAM); None where unknown.
    memory_fraction: float | None = None
    #: Whether the most urgent request outranks something else running or waiting. Only then is there a chat
    #: to protect: among equals, latency is not traded for throughput.
    top_outranks: bool = True


class ConcurrencyController:
    """AIMD control of the running-batch size, the token budget and the batching window."""

    def __init__(
        self,
        max_limit: int,
        max_token_budget: int,
        target_ratio: float = 2.0,
        grow_interval_s: float = 1.0,
        decide_interval_s: float = 0.25,
        min_kv_free: float = 0.05,
        max_memory: float = 0.92,
        samples: int = 32,
    ) -> None:
        if max_limit < 1 or max_token_budget < 1:
            raise ValueError("max_limit and max_token_budget must be positive")
        self.max_limit = max_limit
        self.max_token_budget = max_token_budget
        self.target_ratio = target_ratio
        self.grow_interval_s = grow_interval_s
        self.decide_interval_s = decide_interval_s
        self.min_kv_free = min_kv_free
        self.max_memory = max_memory
        self.limit = max_limit
        self.token_budget = max_token_budget
        self.window_scale = 1.0
        self.adjustments_total = 0
        self.solo_itl_s: float | None = None
        self._itls: deque[float] = deque(maxlen=samples)
        self._last_decision = -math.inf
        self._last_change = -math.inf

    @property
    def target_itl_s(self) -> float | None:
        return None if self.solo_itl_s is None else self.target_ratio * self.solo_itl_s

    def observe(self, report: StepReport) -> None:
        """Take one step's measurements; adjust the knobs at most every ``decide_interval_s``."""
        if report.top_itl_s is not None and report.top_itl_s > 0:
            if report.top_alone:
                solo = self.solo_itl_s
                self.solo_itl_s = report.top_itl_s if solo is None else 0.9 * solo + 0.1 * report.top_itl_s
            elif report.top_outranks:
                self._itls.append(report.top_itl_s)
        if report.num_running == 0 and report.num_waiting == 0:
            self._reset(report.now)  # idle: nothing left to protect, the next burst starts at full size
            return
        if report.now - self._last_decision < self.decide_interval_s:
            return
        self._last_decision = report.now
        pressure = self._memory_pressure(report)
        missed = self._target_missed()
        if pressure or missed:
            self._back_off(report, pressure or "p90 time between tokens above target")
        elif self._can_grow(report):
            self._grow(report)

    # --- decisions -------------------------------------------------------------------------------------------
    def _memory_pressure(self, report: StepReport) -> str | None:
        if report.kv_free_fraction < self.min_kv_free and report.num_waiting:
            return f"KV cache {100 * (1 - report.kv_free_fraction):.0f} % full"
        if report.memory_fraction is not None and report.memory_fraction > self.max_memory:
            return f"process memory at {100 * report.memory_fraction:.0f} % of what is available"
        return None

    def _target_missed(self) -> bool:
        target = self.target_itl_s
        if target is None or len(self._itls) < 4:
            return False
        return p90(list(self._itls)) > target

    def _can_grow(self, report: StepReport) -> bool:
        if report.now - self._last_change < self.grow_interval_s:
            return False
        saturated = report.num_running >= self.limit and report.num_waiting > 0
        return saturated or self.token_budget < self.max_token_budget or self.window_scale < 1.0

    def _back_off(self, report: StepReport, why: str) -> None:
        limit = max(1, min(self.limit, report.num_running) // 2)
        budget = max(MIN_TOKEN_BUDGET, self.token_budget // 2)
        if (limit, budget, 0.0) == (self.limit, self.token_budget, self.window_scale):
            return
        log.debug("controller backs off (%s): limit %d -> %d, token budget %d -> %d", why, self.limit, limit,
                  self.token_budget, budget)
        self.limit, self.token_budget, self.window_scale = limit, min(budget, self.max_token_budget), 0.0
        self._changed(report.now)

    def _grow(self, report: StepReport) -> None:
        limit = min(self.max_limit, self.limit + 1)
        budget = min(self.max_token_budget, self.token_budget * 2)
        scale = min(1.0, self.window_scale + 0.25)
        if (limit, budget, scale) == (self.limit, self.token_budget, self.window_scale):
            return
        log.debug("controller grows: limit %d -> %d, token budget %d -> %d", self.limit, limit, self.token_budget,
                  budget)
        self.limit, self.token_budget, self.window_scale = limit, budget, scale
        self._changed(report.now)

    def _reset(self, now: float) -> None:
        if (self.limit, self.token_budget, self.window_scale) != (self.max_limit, self.max_token_budget, 1.0):
            log.debug("controller resets: the engine is idle")
            self.limit, self.token_budget, self.window_scale = self.max_limit, self.max_token_budget, 1.0
            self._changed(now)

    def _changed(self, now: float) -> None:
        self.adjustments_total += 1
        self._last_change = now
        self._itls.clear()  # judge the new setting on its own samples

    def metrics(self, base: EngineMetrics) -> EngineMetrics:
        """``base`` with the controller's figures filled in."""
        return replace(
            base,
            concurrency_limit=self.limit,
            controller_adjustments_total=self.adjustments_total,
            controller_token_budget=self.token_budget,
            controller_target_itl_s=float(self.target_itl_s or 0.0),
        )
