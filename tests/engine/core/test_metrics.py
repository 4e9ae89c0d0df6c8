"""The typed metrics: ``EngineMetrics``' dict form, the rolling statistics behind it, and the ``/metrics`` collector."""

from __future__ import annotations

import json
import math

from prometheus_client.parser import text_string_to_metric_families

from engine.api import EngineMetrics
from engine.core.controller import ConcurrencyController
from engine.core.metrics import EngineStats
from engine.serving.metrics import METRIC_PREFIX, ServerMetrics


def test_the_dict_form_round_trips_through_json() -> None:
    metrics = EngineMetrics(time=12.5, num_running=3, kv_cache_usage=0.25, spec_enabled=True, ttft_p50=0.04)
    data = json.loads(json.dumps(metrics.to_dict()))
    assert set(data) == set(EngineMetrics.__dataclass_fields__)
    assert EngineMetrics.from_dict(data) == metrics


def test_reading_another_versions_snapshot_keeps_what_it_can() -> None:
    """A remote server may send fields this version lacks, lack some, or send floats for counts."""
    read = EngineMetrics.from_dict({
        "num_running": 2.0, "kv_blocks_total": "20", "num_waiting": None, "ttft_p90": math.nan,
        "spec_enabled": 1.0, "a_future_field": 7, "time": 3,
    })
    assert read == EngineMetrics(num_running=2, spec_enabled=True, time=3.0)
    assert type(read.num_running) is int and type(read.time) is float and type(read.spec_enabled) is bool
    assert EngineMetrics.from_dict({}) == EngineMetrics()


def test_the_rolling_statistics_fill_the_window_figures() -> None:
    stats = EngineStats(max_batch_size=4, window_s=10.0)
    stats.record_step(batch_size=2, num_new_tokens=2, itls=[0.05, 0.07], now=100.0)
    stats.record_step(batch_size=4, num_new_tokens=4, itls=[], now=102.0)
    stats.record_first_token(0.2)
    stats.record_finish(1.5, now=102.0)
    stats.record_speculation(num_drafted=4, num_accepted=3, num_emitted=4)
    snap = stats.snapshot(now=102.0)
    assert snap.throughput_tok_s == 6 / 2.0
    assert snap.mean_batch_size == 3.0 and snap.batch_efficiency == 0.75
    assert snap.ttft_p50 == 0.2 and snap.e2e_p99 == 1.5 and snap.itl_p50 in (0.05, 0.07)
    assert (snap.num_generated_tokens_total, snap.num_requests_total) == (6, 1)
    assert snap.spec_acceptance_rate == 0.75 and snap.spec_tokens_per_step == 4.0
    assert snap.num_running == 0 and snap.time == 0.0  # the engine fills these
    stats.reset()
    assert stats.snapshot(now=200.0) == EngineMetrics()


def test_the_controller_adds_its_figures() -> None:
    c = ConcurrencyController(max_limit=8, max_token_budget=256)
    filled = c.metrics(EngineMetrics(num_running=5))
    assert (filled.num_running, filled.concurrency_limit, filled.controller_token_budget) == (5, 8, 256)
    assert filled.controller_adjustments_total == 0


def test_the_collector_exposes_the_engines_figures() -> None:
    snapshot = EngineMetrics(num_running=2, num_waiting=1, kv_blocks_used=7, prefix_cache_hits=40,
                             controller_adjustments_total=3, spec_enabled=True, throughput_tok_s=12.5)
    server = ServerMetrics(lambda: snapshot, "tiny")
    values = {
        sample.name: sample.value
        for family in text_string_to_metric_families(server.render().decode())
        for sample in family.samples
    }
    assert values[METRIC_PREFIX + "num_requests_running"] == 2
    assert values[METRIC_PREFIX + "num_requests_waiting"] == 1
    assert values[METRIC_PREFIX + "kv_blocks_used"] == 7
    assert values[METRIC_PREFIX + "generation_throughput_tok_s"] == 12.5
    assert values[METRIC_PREFIX + "spec_enabled"] == 1
    assert values[METRIC_PREFIX + "prefix_cache_hits_total"] == 40
    assert values[METRIC_PREFIX + "controller_adjustments_total"] == 3
