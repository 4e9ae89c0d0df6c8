"""Per-request token timestamps, turned into the figures each benchmark JSON line carries."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.core.metrics import percentile


@dataclass(slots=True)
class Timings:
    """When each request started and when each of its tokens arrived (``time.perf_counter``)."""

    starts: list[float] = field(default_factory=list)
    token_times: list[list[float]] = field(default_factory=list)
    wall_s: float = 0.0

    def row(self, name: str, concurrency: int) -> dict[str, Any]:
        tokens = sum(len(t) for t in self.token_times)
        ttft = [t[0] - s for s, t in zip(self.starts, self.token_times, strict=True) if t]
        itl = [b - a for t in self.token_times for a, b in itertools.pairwise(t)]
        per_stream = [len(t) / (t[-1] - s) for s, t in zip(self.starts, self.token_times, strict=True) if t]
        return {
            "system": name,
            "concurrency": concurrency,
            "tokens": tokens,
            "wall_s": round(self.wall_s, 3),
            "tok_s": round(tokens / self.wall_s, 2),
            "min_stream_tok_s": round(min(per_stream, default=0.0), 2),
            "ttft_p50_ms": round(percentile(ttft, 50) * 1e3, 1),
            "ttft_p99_ms": round(percentile(ttft, 99) * 1e3, 1),
            "itl_p50_ms": round(percentile(itl, 50) * 1e3, 2),
            "itl_p99_ms": round(percentile(itl, 99) * 1e3, 2),
        }


def time_concurrent_streams(prompts: Sequence[Any], stream: Callable[[Any, list[float]], None]) -> Timings:
    """Every prompt at once, one client thread each; ``stream(prompt, times)`` appends a timestamp per token.

    The first error of any stream is raised here, after all threads have ended.
    """
    timings = Timings()
    errors: list[BaseException] = []
    threads = []
    start = time.perf_counter()
    for prompt in prompts:
        times: list[float] = []
        timings.starts.append(time.perf_counter())
        timings.token_times.append(times)

        def run(prompt: Any = prompt, times: list[float] = times) -> None:
            try:
                stream(prompt, times)
            except BaseException as exc:  # noqa: BLE001 (re-raised in the caller's thread)
                errors.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    timings.wall_s = time.perf_counter() - start
    if errors:
        raise errors[0]
    return timings
