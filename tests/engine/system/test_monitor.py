"""engine.system.monitor.Sampler: psutil/pynvml/engine sampling, ring buffer, CSV, cost, and a real generation."""

from __future__ import annotations

import csv
import logging
import sys
import time
import types
from pathlib import Path
from typing import Any

import psutil
import pytest

from engine.api import EngineMetrics
from engine.system.monitor import Sampler


def wait_for(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_sampler_without_pynvml_reports_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # "import pynvml" raises ImportError
    sampler = Sampler(interval_s=0.02)
    sample = sampler.sample_once()
    assert sample["gpu_count"] == 0
    assert "pynvml" in sampler.gpu_reason
    assert sample["process_rss_bytes"] > 10 * 1024 * 1024
    assert 0 < sample["ram_used_bytes"] < sample["ram_total_bytes"]
    cores = psutil.cpu_count()
    assert sum(1 for key in sample if key.startswith("cpu") and key[3:4].isdigit()) == cores
    assert not any(key.startswith("torch_") for key in sample)  # no CUDA initialized here
    sampler.stop()


class _NvmlError(Exception):
    pass


def _fake_pynvml() -> types.ModuleType:
    """One 24 GB GPU whose board does not report power."""
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = _NvmlError  # type: ignore[attr-defined]
    nvml.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
    nvml.calls = []  # type: ignore[attr-defined]

    def power(handle: Any) -> int:
        raise _NvmlError("Not Supported")

    functions = {
        "nvmlInit": lambda: nvml.calls.append("init"),  # type: ignore[attr-defined]
        "nvmlShutdown": lambda: nvml.calls.append("shutdown"),  # type: ignore[attr-defined]
        "nvmlDeviceGetCount": lambda: 1,
        "nvmlDeviceGetHandleByIndex": lambda i: f"gpu{i}",
        "nvmlDeviceGetMemoryInfo": lambda h: types.SimpleNamespace(used=3 << 30, total=24 << 30, free=21 << 30),
        "nvmlDeviceGetUtilizationRates": lambda h: types.SimpleNamespace(gpu=87, memory=40),
        "nvmlDeviceGetTemperature": lambda h, sensor: 61,
        "nvmlDeviceGetPowerUsage": power,
    }
    for name, fn in functions.items():
        setattr(nvml, name, fn)
    return nvml


def test_sampler_reads_each_gpu_through_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = _fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    sampler = Sampler(interval_s=0.02)
    sample = sampler.sample_once()
    assert sample["gpu_count"] == 1 and sampler.gpu_reason == ""
    assert sample["gpu0_memory_used_bytes"] == 3 << 30
    assert sample["gpu0_memory_total_bytes"] == 24 << 30
    assert sample["gpu0_utilization_percent"] == 87
    assert sample["gpu0_temperature_c"] == 61
    assert "gpu0_power_w" not in sample  # not supported: left out, not an error
    sampler.stop()
    assert nvml.calls == ["init", "shutdown"]  # type: ignore[attr-defined]


def test_sampler_with_the_installed_pynvml_runs() -> None:
    """With or without an NVIDIA driver on this machine, sampling works."""
    sampler = Sampler(interval_s=0.02)
    sample = sampler.sample_once()
    assert sample["gpu_count"] >= 0
    assert (sample["gpu_count"] == 0) == bool(sampler.gpu_reason)
    sampler.stop()


def test_engine_metrics_are_merged_and_a_failing_source_is_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    metrics = {"num_running": 2, "kv_blocks_used": 5, "kv_blocks_cached": 3, "kv_blocks_total": 20,
               "label": "not a number"}
    sampler = Sampler(interval_s=0.02, metrics_source=lambda: metrics)
    sample = sampler.sample_once()
    assert sample["num_running"] == 2.0 and sample["kv_blocks_free"] == 12.0
    assert "label" not in sample

    def broken() -> dict[str, float]:
        raise RuntimeError("engine closed")

    sampler = Sampler(interval_s=0.02, metrics_source=broken)
    with caplog.at_level(logging.ERROR, logger="engine"):
        sampler.sample_once()
        sample = sampler.sample_once()
    assert "process_rss_bytes" in sample and "num_running" not in sample
    assert len([r for r in caplog.records if "engine metrics" in r.getMessage()]) == 1
    sampler.stop()


def test_an_engine_metrics_source_is_merged_by_field_name() -> None:
    metrics = EngineMetrics(time=1.0, num_running=2, kv_blocks_used=5, kv_blocks_cached=3, kv_blocks_total=20,
                            spec_enabled=True)
    sample = Sampler(interval_s=0.02, metrics_source=lambda: metrics).sample_once()
    assert sample["num_running"] == 2.0 and sample["kv_blocks_free"] == 12.0 and sample["spec_enabled"] == 1.0
    assert sample["time"] != 1.0  # the sample's own time, not the snapshot's
    assert set(EngineMetrics.__dataclass_fields__) - {"time"} <= sample.keys()


def test_thread_ring_buffer_series_and_snapshot() -> None:
    seen: list[dict[str, float]] = []
    sampler = Sampler(interval_s=0.01, history_s=0.05, on_sample=seen.append)
    assert sampler.snapshot() == {}
    sampler.start()
    wait_for(lambda: sampler.num_samples >= 12)
    sampler.stop()
    assert not sampler.is_running
    samples = sampler.samples()
    assert len(samples) == 6  # 0.05 s of history at 0.01 s, plus the newest
    assert sampler.snapshot() == samples[-1] == seen[-1]
    times = [t for t, _ in sampler.series("process_rss_bytes")]
    assert times == sorted(times) and len(times) == 6
    assert sampler.series("no_such_key") == []


def test_to_csv_parses(tmp_path: Path) -> None:
    sampler = Sampler(interval_s=0.02, metrics_source=lambda: {"num_running": 1.0})
    sampler.sample_once()
    sampler.sample_once()
    path = tmp_path / "monitor.csv"
    assert sampler.to_csv(path) == 2
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and next(iter(rows[0])) == "time"
    assert float(rows[1]["num_running"]) == 1.0
    assert float(rows[0]["process_rss_bytes"]) > 0
    sampler.stop()


def test_sampling_costs_under_one_percent_of_a_core() -> None:
    """Thread CPU time per sample, scaled to the default one-second interval."""
    sampler = Sampler(interval_s=0.02)
    sampler.start()
    wait_for(lambda: sampler.num_samples >= 40)
    sampler.stop()
    per_sample_s = sampler.cpu_s / sampler.num_samples
    print(f"sampling: {per_sample_s * 1000:.2f} ms CPU per sample = {per_sample_s * 100:.3f} % of a core at 1 Hz")
    assert per_sample_s < 0.01  # 10 ms per one-second interval = 1 % of a core


def test_ranges_are_checked() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        Sampler(interval_s=0)
    with pytest.raises(ValueError, match="history_s"):
        Sampler(interval_s=1.0, history_s=0.5)


@pytest.mark.slow
def test_kv_occupancy_and_throughput_during_a_real_generation(default_model_dir: Path) -> None:
    from engine import LLM, SamplingParams

    llm = LLM("default", start_loop=True)
    sampler = Sampler(interval_s=0.05, metrics_source=llm.metrics)
    try:
        sampler.start()
        wait_for(lambda: sampler.num_samples >= 2)
        prompts = ["Name three colours.", "What is 2 + 2?", "Say hello in French.", "Count to five."]
        llm.generate(prompts, SamplingParams(max_tokens=32, temperature=0.0))
        after = sampler.num_samples
        wait_for(lambda: sampler.num_samples >= after + 3)
    finally:
        sampler.stop()
        llm.close()
    used = [v for _, v in sampler.series("kv_blocks_used")]
    cached = [v for _, v in sampler.series("kv_blocks_cached")]
    throughput = [v for _, v in sampler.series("throughput_tok_s")]
    occupancy = [u + c for u, c in zip(used, cached, strict=True)]  # blocks holding KV, live or cached
    assert used[0] == 0
    assert max(used) > 0, "KV occupancy never rose during generation"
    assert max(occupancy) >= cached[-1]
    # Afterwards no sequence holds a block; the full blocks, and each request's last block (never full), stay behind
    # as cached prefixes (engine/core/block_manager.py).
    assert used[-1] == 0 and occupancy[-1] == cached[-1] > 0
    assert max(throughput) > 0
    print(f"KV blocks used peak {max(used):.0f}, cached after {cached[-1]:.0f}; "
          f"throughput peak {max(throughput):.1f} tok/s; sampler {sampler.cpu_fraction * 100:.2f} % of a core "
          f"at 20 Hz with llm.metrics()")
