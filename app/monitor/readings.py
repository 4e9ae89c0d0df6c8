"""The monitor's numbers, without Qt: a history row (:class:`Reading`), the series the graphs draw from it, and the
"Engine" box's rows.

A reading holds the engine's figures as an ``engine.api.EngineMetrics`` (None without an engine) and the resource
monitor's sample by name (memory, CPU, GPUs), as ``metrics_updated`` brought them (see
:mod:`app.monitor.monitor_pane`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.bridge.types import SAMPLE_TIME
from app.formatting import format_percent, format_seconds
from engine.api import EngineMetrics


@dataclass(slots=True)
class Reading:
    """One row of the monitor's history, or its latest values."""

    time: float
    engine: EngineMetrics | None = None
    resources: dict[str, float] = field(default_factory=dict)

    def as_row(self) -> dict[str, Any]:
        """Every figure by name, as "Export CSV" writes it."""
        engine = self.engine.to_dict() if self.engine is not None else {}
        return {**self.resources, **engine, SAMPLE_TIME: self.time}


Series = Callable[[Reading], float | None]
#: An "Engine" box row's figures (None shows "–").
Figures = Callable[[Reading], tuple[float | None, ...]]


def latency(value: float) -> float | None:
    """A latency; None when it is 0: the engine reports 0 until a request has been timed (not "0 ms")."""
    return value or None


def hearth_only(metrics: EngineMetrics, value: float) -> float | None:
    """A figure of Hearth's own scheduler; None from a server that reports no concurrency limit (one that is not
    Hearth), where the 0 would be a default, not a reading."""
    return value if metrics.concurrency_limit else None


def engine_series(figure: Callable[[EngineMetrics], float | None]) -> Series:
    """A series of one engine figure; no value where there is no engine."""
    return lambda r: None if r.engine is None else figure(r.engine)


def kv_percent(blocks: Callable[[EngineMetrics], int]) -> Series:
    """Some of the KV blocks, as a percentage of all blocks; no value without a KV cache."""
    return lambda r: None if r.engine is None or not r.engine.kv_blocks_total \
        else 100.0 * blocks(r.engine) / r.engine.kv_blocks_total


def gpu_sum(resources: Mapping[str, float], name: str) -> float | None:
    """Sum of ``gpu{i}_{name}`` over the GPUs in a resource sample; None without GPUs."""
    count = int(resources.get("gpu_count") or 0)
    values = [resources[f"gpu{i}_{name}"] for i in range(count) if f"gpu{i}_{name}" in resources]
    return float(sum(values)) if values else None


def gpu_text(resources: Mapping[str, float], names: list[str]) -> str:
    """One line per GPU in a resource sample: how busy, how hot, how much power; ``names`` from the hardware."""
    count = int(resources.get("gpu_count") or 0)
    if not count:
        return "None found" if "gpu_count" in resources else "–"
    parts = []
    for i in range(count):
        name = names[i] if i < len(names) else f"GPU {i}"
        figures = ((f"gpu{i}_utilization_percent", "{:.0f} % busy"), (f"gpu{i}_temperature_c", "{:.0f} °C"),
                   (f"gpu{i}_power_w", "{:.0f} W"))
        parts.append(f"{name}: " + ", ".join(form.format(resources[key]) for key, form in figures
                                             if key in resources))
    return "\n".join(parts)


#: The graphs' series by name, besides the resource sample's own figures (read by name).
SERIES: dict[str, Series] = {
    "gpu_memory_used_bytes": lambda r: gpu_sum(r.resources, "memory_used_bytes"),
    "gpu_memory_total_bytes": lambda r: gpu_sum(r.resources, "memory_total_bytes"),
    "kv_used_pct": kv_percent(lambda m: m.kv_blocks_used),
    "kv_used_cached_pct": kv_percent(lambda m: m.kv_blocks_used + m.kv_blocks_cached),
    "kv_all_pct": kv_percent(lambda m: m.kv_blocks_total),
    "prefix_hit_pct": engine_series(lambda m: 100.0 * m.prefix_cache_hit_rate),
    "tokens_per_s": engine_series(lambda m: m.throughput_tok_s),
    "running": engine_series(lambda m: m.num_running),
    "waiting": engine_series(lambda m: m.num_waiting),
    "ttft_median": engine_series(lambda m: latency(m.ttft_p50)),
    "ttft_tail": engine_series(lambda m: latency(m.ttft_p99)),
    "itl_median": engine_series(lambda m: latency(m.itl_p50)),
    "itl_tail": engine_series(lambda m: latency(m.itl_p99)),
}


def series_values(readings: Iterable[Reading], name: str) -> np.ndarray:
    """One value per reading for a :data:`SERIES` name or a resource figure; NaN where a reading has none."""
    series = SERIES.get(name)
    values = [series(r) if series is not None else r.resources.get(name) for r in readings]
    return np.array([math.nan if v is None else float(v) for v in values], dtype=float)


def _engine_row(figures: Callable[[EngineMetrics], tuple[float | None, ...]]) -> Figures:
    """An "Engine" box row of engine figures: as many "–" as it has figures where there is no engine."""
    missing = (None,) * len(figures(EngineMetrics()))
    return lambda r: missing if r.engine is None else figures(r.engine)


def _kv_blocks(m: EngineMetrics) -> tuple[float | None, ...]:
    return (m.kv_blocks_used, m.kv_blocks_cached, m.kv_blocks_total) if m.kv_blocks_total else (None,) * 3


#: (label, figures, formatter) rows of the "Engine" box.
STAT_ROWS: tuple[tuple[str, Figures, Callable[[float], str]], ...] = (
    ("Running / waiting", _engine_row(lambda m: (m.num_running, m.num_waiting)), lambda v: f"{v:.0f}"),
    ("Batch efficiency", _engine_row(lambda m: (hearth_only(m, m.batch_efficiency),)), format_percent),
    ("Mean batch size", _engine_row(lambda m: (hearth_only(m, m.mean_batch_size),)), lambda v: f"{v:.1f}"),
    ("Preemptions", _engine_row(lambda m: (m.num_preemptions,)), lambda v: f"{v:.0f}"),
    ("Concurrency limit / changes", _engine_row(lambda m: (hearth_only(m, m.concurrency_limit),
                                                           hearth_only(m, m.controller_adjustments_total))),
     lambda v: f"{v:.0f}"),
    ("Speculation: drafts accepted", _engine_row(lambda m: (hearth_only(m, m.spec_acceptance_rate),)),
     format_percent),
    ("Speculation: tokens per step", _engine_row(lambda m: (hearth_only(m, m.spec_tokens_per_step),)),
     lambda v: f"{v:.2f}"),
    ("KV blocks used / cached / total", _engine_row(_kv_blocks), lambda v: f"{v:.0f}"),
    ("Prefix cache hits", _engine_row(lambda m: (m.prefix_cache_hit_rate,)), format_percent),
    ("Time to first token (p50 / p90 / p99)",
     _engine_row(lambda m: (latency(m.ttft_p50), latency(m.ttft_p90), latency(m.ttft_p99))), format_seconds),
    ("Time between tokens (p50 / p99)", _engine_row(lambda m: (latency(m.itl_p50), latency(m.itl_p99))),
     format_seconds),
    ("Whole reply (p50 / p99)", _engine_row(lambda m: (latency(m.e2e_p50), latency(m.e2e_p99))), format_seconds),
    ("Requests per second", _engine_row(lambda m: (m.requests_per_s,)), lambda v: f"{v:.2f}"),
    ("CPU (all cores)", lambda r: (r.resources.get("cpu_percent"),), lambda v: f"{v:.0f} %"),
)

#: What the less obvious rows of the "Engine" box mean (their tooltips).
STAT_TOOLTIPS = {
    "Batch efficiency": "How full the engine's batches are: the mean number of requests per step (over the last "
                        "10 seconds) as a share of the maximum batch size set under Engine settings. Four "
                        "requests at a time with a maximum of 16 reads 25 %.",
    "Mean batch size": "The mean number of requests the engine ran together per step, over the last 10 seconds.",
    "Preemptions": "Replies paused because the KV cache was full; they resume when memory frees up.",
    "Prefix cache hits": "The share of prompt tokens found already computed in the KV cache.",
    "Concurrency limit / changes": "How many replies the engine lets run at once right now, and how often it has "
                                   "changed that. It lowers the limit when your chat's time between tokens grows "
                                   "past twice its solo figure or memory runs short, and raises it slowly again.",
    "Speculation: drafts accepted": "With speculative decoding on (Engine settings), the share of drafted tokens "
                                    "the model confirmed.",
    "Speculation: tokens per step": "Tokens each reply gains per engine step: 1 without speculation, more when "
                                    "drafts are accepted.",
}
