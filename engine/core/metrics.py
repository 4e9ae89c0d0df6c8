"""The engine's rolling statistics: latency percentiles, sliding-window throughput, batch efficiency.

:class:`EngineStats` records them as the engine steps; :meth:`EngineStats.snapshot` fills the window's fields of
an :class:`engine.api.EngineMetrics`, and ``LLMEngine.metrics()`` adds the scheduler's, the KV cache's and the
controller's.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

from engine.api import EngineMetrics


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile; 0.0 for no data."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, round(q / 100.0 * (len(ordered) - 1))))
    return ordered[rank]


@dataclass(slots=True)
class EngineStats:
    """Rolling statistics the engine updates once per step and reads from any thread."""

    max_batch_size: int
    window_s: float = 10.0
    max_samples: int = 2000
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _tokens: deque[tuple[float, int]] = field(default_factory=deque)  # (time, tokens generated in a step)
    _finished: deque[float] = field(default_factory=deque)  # finish times
    _ttft: deque[float] = field(default_factory=deque)
    _itl: deque[float] = field(default_factory=deque)
    _e2e: deque[float] = field(default_factory=deque)
    _batch_sizes: deque[int] = field(default_factory=deque)
    num_generated_tokens_total: int = 0
    num_requests_total: int = 0
    num_steps: int = 0
    #: speculative decoding: draft tokens proposed and accepted, verifications, tokens they emitted
    num_spec_drafted: int = 0
    num_spec_accepted: int = 0
    num_spec_verifications: int = 0
    num_spec_emitted: int = 0

    def _trim(self, now: float) -> None:
        while self._tokens and self._tokens[0][0] < now - self.window_s:
            self._tokens.popleft()
        while self._finished and self._finished[0] < now - self.window_s:
            self._finished.popleft()
        for d in (self._ttft, self._itl, self._e2e, self._batch_sizes):
            while len(d) > self.max_samples:
                d.popleft()

    def record_step(self, batch_size: int, num_new_tokens: int, itls: list[float], now: float) -> None:
        with self._lock:
            self.num_steps += 1
            self.num_generated_tokens_total += num_new_tokens
            self._tokens.append((now, num_new_tokens))
            self._batch_sizes.append(batch_size)
            self._itl.extend(itls)
            self._trim(now)

    def record_speculation(self, num_drafted: int, num_accepted: int, num_emitted: int) -> None:
        """One sequence verified a draft of ``num_drafted`` tokens, kept ``num_accepted`` and emitted
        ``num_emitted`` (the accepted ones plus the target's own next token)."""
        with self._lock:
            self.num_spec_drafted += num_drafted
            self.num_spec_accepted += num_accepted
            self.num_spec_verifications += 1
            self.num_spec_emitted += num_emitted

    def record_first_token(self, ttft: float) -> None:
        with self._lock:
            self._ttft.append(ttft)

    def record_finish(self, e2e: float, now: float) -> None:
        with self._lock:
            self.num_requests_total += 1
            self._e2e.append(e2e)
            self._finished.append(now)

    def reset(self) -> None:
        with self._lock:
            for d in (self._tokens, self._finished, self._ttft, self._itl, self._e2e, self._batch_sizes):
                d.clear()
            self.num_generated_tokens_total = self.num_requests_total = self.num_steps = 0
            self.num_spec_drafted = self.num_spec_accepted = self.num_spec_verifications = self.num_spec_emitted = 0

    def snapshot(self, now: float | None = None) -> EngineMetrics:
        """The window's figures (the fields the engine's other parts fill stay at their defaults)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self._trim(now)
            span = self.window_s
            if self._tokens:
                span = max(1.0, min(self.window_s, now - self._tokens[0][0]))  # >= 1 s: no spike on step one
            tokens = sum(n for _, n in self._tokens)
            ttft, itl, e2e = list(self._ttft), list(self._itl), list(self._e2e)
            sizes = list(self._batch_sizes)
            return EngineMetrics(
                throughput_tok_s=tokens / span if self._tokens else 0.0,
                requests_per_s=len(self._finished) / self.window_s,
                ttft_p50=percentile(ttft, 50),
                ttft_p90=percentile(ttft, 90),
                ttft_p99=percentile(ttft, 99),
                itl_p50=percentile(itl, 50),
                itl_p99=percentile(itl, 99),
                e2e_p50=percentile(e2e, 50),
                e2e_p99=percentile(e2e, 99),
                batch_efficiency=(sum(sizes) / len(sizes) / self.max_batch_size) if sizes else 0.0,
                mean_batch_size=(sum(sizes) / len(sizes)) if sizes else 0.0,
                num_generated_tokens_total=self.num_generated_tokens_total,
                num_requests_total=self.num_requests_total,
                spec_acceptance_rate=self.num_spec_accepted / self.num_spec_drafted if self.num_spec_drafted else 0.0,
                spec_tokens_per_step=(
                    self.num_spec_emitted / self.num_spec_verifications if self.num_spec_verifications else 0.0
                ),
            )
