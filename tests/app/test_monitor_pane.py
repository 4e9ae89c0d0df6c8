"""MonitorPane fed with synthetic ``metrics_updated`` dicts: graphs, headline, pausing, CSV export."""

from __future__ import annotations

import csv
import math
import types
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog

from app.monitor.monitor_pane import MonitorPane

GiB = 1 << 30


def system_sample(rss: float = 0.5 * GiB, gpus: int = 0) -> dict[str, Any]:
    sample: dict[str, Any] = {"time": 1.0, "process_rss_bytes": rss, "ram_used_bytes": 6 * GiB,
                              "ram_total_bytes": 16 * GiB, "cpu_percent": 25.0, "gpu_count": float(gpus)}
    for i in range(gpus):
        sample |= {f"gpu{i}_memory_used_bytes": 3 * GiB, f"gpu{i}_memory_total_bytes": 24 * GiB,
                   f"gpu{i}_utilization_percent": 87.0, f"gpu{i}_temperature_c": 61.0}
    if gpus:
        sample["torch_cuda_reserved_bytes"] = 2 * GiB
    return sample


def engine_metrics(used: int = 30, cached: int = 10, tok_s: float = 42.0) -> dict[str, Any]:
    return {"num_running": 3.0, "num_waiting": 1.0, "kv_cache_usage": used / 100, "kv_blocks_used": float(used),
            "kv_blocks_cached": float(cached), "kv_blocks_total": 100.0, "prefix_cache_hit_rate": 0.25,
            "throughput_tok_s": tok_s, "requests_per_s": 0.5, "ttft_p50": 0.12, "ttft_p90": 0.2,
            "ttft_p99": 0.3, "itl_p50": 0.02, "itl_p99": 0.05, "e2e_p50": 1.0, "e2e_p99": 2.0,
            "batch_efficiency": 0.1875, "mean_batch_size": 3.0, "num_preemptions": 2.0, "concurrency_limit": 12.0,
            "controller_adjustments_total": 5.0, "spec_acceptance_rate": 0.625, "spec_tokens_per_step": 2.5}


@pytest.fixture
def pane(qtbot: Any) -> MonitorPane:
    pane = MonitorPane(sample_interval_ms=3_600_000, stagger_ms=0)  # the tests take rows themselves
    qtbot.add_widget(pane)
    pane.resize(900, 700)
    pane.show()
    qtbot.wait_exposed(pane)
    return pane


def feed(pane: MonitorPane, *samples: dict[str, Any]) -> None:
    for sample in samples:
        pane._on_metrics_updated(sample)
        pane._on_sample_timeout()


def test_graphs_and_headline_follow_the_metrics(pane: MonitorPane) -> None:
    pane._on_model_loaded(types.SimpleNamespace(device="cpu", dtype="bfloat16"))
    feed(pane, system_sample() | engine_metrics(used=30), system_sample() | engine_metrics(used=50, tok_s=0.0))
    assert pane.kv_graph.curve_data("kv_used_pct") == [30.0, 50.0]
    assert pane.kv_graph.curve_data("kv_used_cached_pct") == [40.0, 60.0]  # stacked: used + cached
    assert pane.kv_graph.curve_data("kv_all_pct") == [100.0, 100.0]
    assert pane.kv_graph.curve_data("prefix_hit_pct") == [25.0, 25.0]
    assert pane.throughput_graph.curve_data("tokens_per_s") == [42.0, 0.0]
    assert pane.throughput_graph.curve_data("running") == [3.0, 3.0]
    assert pane.latency_graph.curve_data("ttft_tail") == pytest.approx([0.3, 0.3])
    assert pane.rss_graph.samples == [0.5 * GiB] * 2
    assert pane.headline["kv"].text() == "50 %"
    assert pane.headline["tok_s"].text() == "0.0 tok/s"
    assert pane.headline["ram"].text() == "512.0 MiB"
    assert pane.headline["device"].text() == "cpu"
    assert "bfloat16" in pane.headline["quantization"].text()
    assert pane._stat_labels["Batch efficiency"].text() == "19 %"
    assert pane._stat_labels["Preemptions"].text() == "2"
    assert pane._stat_labels["Concurrency limit / changes"].text() == "12 / 5"
    assert pane._stat_labels["Speculation: drafts accepted"].text() == "62 %"
    assert pane._stat_labels["Speculation: tokens per step"].text() == "2.50"
    assert "50 used · 10 cached · 40 free" in pane.kv_graph.value_label.text()


def test_no_gpu_hides_the_gpu_graph_and_gpus_are_drawn(pane: MonitorPane) -> None:
    feed(pane, system_sample(gpus=0))
    assert pane.gpu_graph.isHidden() and not pane.headline["vram"].isVisible()
    assert pane.kv_graph.placeholder_text == "No model loaded"

    pane._on_hardware_detected(types.SimpleNamespace(gpus=[types.SimpleNamespace(name="RTX 4090")]))
    feed(pane, system_sample(gpus=1) | engine_metrics())
    assert pane.gpu_graph.placeholder_text is None and not pane.gpu_graph.isHidden()
    assert pane.headline["vram"].isVisible()
    assert pane.gpu_graph.curve_data("gpu_memory_used_bytes")[-1] == 3 * GiB
    assert pane.gpu_graph.curve_data("torch_cuda_reserved_bytes")[-1] == 2 * GiB
    assert pane.headline["vram"].text() == "3.0 GiB / 24.0 GiB"
    assert "RTX 4090: 87 % busy, 61 °C" in pane.findChild(type(pane.headline["vram"]), "gpuDetailLabel").text()


def test_graphs_pause_while_hidden(qtbot: Any, pane: MonitorPane) -> None:
    feed(pane, system_sample() | engine_metrics(used=10))
    pane.hide()
    redraws = pane.num_redraws
    feed(pane, system_sample() | engine_metrics(used=20), system_sample() | engine_metrics(used=30))
    assert pane.num_redraws == redraws
    assert pane.kv_graph.curve_data("kv_used_pct") == [10.0]
    assert len(pane.history) == 3  # still recorded
    pane.show()
    qtbot.wait_until(lambda: pane.kv_graph.curve_data("kv_used_pct") == [10.0, 20.0, 30.0], timeout=2000)


def test_unload_clears_engine_values_but_keeps_memory(pane: MonitorPane) -> None:
    feed(pane, system_sample() | engine_metrics())
    pane._on_model_unloaded()
    feed(pane, system_sample())
    assert pane.kv_graph.placeholder_text == "No model loaded"
    assert math.isnan(pane.kv_graph.curve_data("kv_used_pct")[-1])
    assert pane.headline["tok_s"].text() == "–"
    assert len(pane.rss_graph.samples) == 2


def test_the_timer_takes_rows(qtbot: Any) -> None:
    pane = MonitorPane(sample_interval_ms=20, stagger_ms=0)
    qtbot.add_widget(pane)
    pane.show()
    assert pane.history == []  # nothing until the first metrics
    pane._on_metrics_updated(system_sample())
    qtbot.wait_until(lambda: len(pane.rss_graph.samples) >= 2, timeout=2000)


def test_export_csv_button_writes_the_history(qtbot: Any, pane: MonitorPane, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    feed(pane, system_sample(), system_sample() | engine_metrics(used=40))
    target = tmp_path / "monitor.csv"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(target), "CSV files (*.csv)"))
    qtbot.mouseClick(pane.export_button, Qt.MouseButton.LeftButton)
    with target.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    assert next(iter(rows[0])) == "time"
    assert float(rows[0]["process_rss_bytes"]) == 0.5 * GiB
    assert rows[0]["kv_blocks_used"] == "" and float(rows[1]["kv_blocks_used"]) == 40.0


def test_export_cancelled_writes_nothing(qtbot: Any, pane: MonitorPane, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    feed(pane, system_sample())
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: ("", ""))
    qtbot.mouseClick(pane.export_button, Qt.MouseButton.LeftButton)
    assert list(tmp_path.iterdir()) == []


def test_bridge_metrics_reach_the_graphs(qtbot: Any, loaded_bridge: Any) -> None:
    """Wired as MainWindow does: the bridge's monitor sends memory and engine figures together."""
    pane = MonitorPane(sample_interval_ms=50, stagger_ms=0)
    qtbot.add_widget(pane)
    pane.show()
    loaded_bridge.signals.metrics_updated.connect(pane._on_metrics_updated)
    loaded_bridge.signals.model_loaded.connect(pane._on_model_loaded)
    qtbot.wait_until(lambda: bool(pane.kv_graph.samples and pane.rss_graph.samples), timeout=4000)
    assert pane.rss_graph.samples[-1] > 10 * 1024 * 1024
    assert pane.kv_graph.placeholder_text is None
