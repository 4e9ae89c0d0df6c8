"""The monitor's numbers, without Qt: series derived from the metrics rows, and the "Engine" box's rows.

A row is one merged ``metrics_updated`` snapshot with its ``time`` (see :mod:`app.monitor.monitor_pane`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from app.formatting import format_percent, format_seconds

#: Engine keys dropped from the latest values when the model is unloaded.
ENGINE_PREFIXES = ("num_", "kv_", "prefix_", "throughput", "requests_", "ttft_", "itl_", "e2e_", "batch_",
                   "mean_batch", "concurrency_", "controller_", "spec_")

#: (label, metrics keys, formatter) rows of the "Engine" box.
STAT_ROWS: tuple[tuple[str, tuple[str, ...], Callable[[float], str]], ...] = (
    ("Running / waiting", ("num_running", "num_waiting"), lambda v: f"{v:.0f}"),
    ("Batch efficiency", ("batch_efficiency",), format_percent),
    ("Mean batch size", ("mean_batch_size",), lambda v: f"{v:.1f}"),
    ("Preemptions", ("num_preemptions",), lambda v: f"{v:.0f}"),
    ("Concurrency limit / changes", ("concurrency_limit", "controller_adjustments_total"), lambda v: f"{v:.0f}"),
    ("Speculation: drafts accepted", ("spec_acceptance_rate",), format_percent),
    ("Speculation: tokens per step", ("spec_tokens_per_step",), lambda v: f"{v:.2f}"),
    ("KV blocks used / cached / total", ("kv_blocks_used", "kv_blocks_cached", "kv_blocks_total"),
     lambda v: f"{v:.0f}"),
    ("Prefix cache hits", ("prefix_cache_hit_rate",), format_percent),
    ("Time to first token (p50 / p90 / p99)", ("ttft_p50", "ttft_p90", "ttft_p99"), format_seconds),
    ("Time between tokens (p50 / p99)", ("itl_p50", "itl_p99"), format_seconds),
    ("Whole reply (p50 / p99)", ("e2e_p50", "e2e_p99"), format_seconds),
    ("Requests per second", ("requests_per_s",), lambda v: f"{v:.2f}"),
    ("CPU (all cores)", ("cpu_percent",), lambda v: f"{v:.0f} %"),
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

#: Latency figures: the engine reports 0 for these until a request has been timed.
LATENCY_PREFIXES = ("ttft_", "itl_", "e2e_")


def known_latency(key: str, value: Any) -> float | None:
    """``value`` as a float; None when missing, or a latency of 0 (nothing timed yet, not "0 ms")."""
    if value is None:
        return None
    number = float(value)
    return None if number == 0.0 and key.startswith(LATENCY_PREFIXES) else number


def gpu_sum(row: dict[str, Any], name: str) -> float | None:
    """Sum of ``gpu{i}_{name}`` over the GPUs in ``row``; None without GPUs."""
    count = int(row.get("gpu_count") or 0)
    values = [row[f"gpu{i}_{name}"] for i in range(count) if f"gpu{i}_{name}" in row]
    return float(sum(values)) if values else None


def kv_percent(row: dict[str, Any], *keys: str) -> float | None:
    """The KV blocks counted in ``keys``, as a percentage of all blocks; None without an engine."""
    total = row.get("kv_blocks_total")
    if not total or any(row.get(k) is None for k in keys):
        return None
    return 100.0 * sum(float(row[k]) for k in keys) / float(total)


#: Derived series: name -> function of one history row (None where it has no value).
DERIVED: dict[str, Callable[[dict[str, Any]], float | None]] = {
    "gpu_memory_used_bytes": lambda r: gpu_sum(r, "memory_used_bytes"),
    "gpu_memory_total_bytes": lambda r: gpu_sum(r, "memory_total_bytes"),
    "kv_used_pct": lambda r: kv_percent(r, "kv_blocks_used"),
    "kv_used_cached_pct": lambda r: kv_percent(r, "kv_blocks_used", "kv_blocks_cached"),
    "kv_all_pct": lambda r: 100.0 if r.get("kv_blocks_total") else None,
    "prefix_hit_pct": lambda r: None if r.get("prefix_cache_hit_rate") is None
    else 100.0 * float(r["prefix_cache_hit_rate"]),
}


def series_values(rows: Iterable[dict[str, Any]], name: str) -> np.ndarray:
    """One value per row for a raw key or a ``DERIVED`` name; NaN where a row has none."""
    derive = DERIVED.get(name)
    values = [derive(r) if derive is not None else known_latency(name, r.get(name)) for r in rows]
    return np.array([math.nan if v is None else float(v) for v in values], dtype=float)
