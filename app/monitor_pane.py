"""The monitor pane: live graphs of memory, KV cache and throughput, plus latency figures."""

from __future__ import annotations

from typing import Any

import psutil
from PySide6.QtCore import QTimer, Slot
from PySide6.QtWidgets import (
    QFormLayout,
    QFrame,
    QGridLayout,
    QGroupBox,
    QLabel,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from app.formatting import format_bytes, format_percent, format_rate, format_seconds
from app.sparkline import Sparkline

SAMPLE_INTERVAL_MS = 1000

#: (label, metrics key, formatter) rows under the graphs.
_STAT_ROWS: tuple[tuple[str, str, Any], ...] = (
    ("Time to first token (p50 / p90)", ("ttft_p50", "ttft_p90"), format_seconds),
    ("Time between tokens (p50 / p99)", ("itl_p50", "itl_p99"), format_seconds),
    ("Whole reply (p50 / p99)", ("e2e_p50", "e2e_p99"), format_seconds),
    ("Requests per second", ("requests_per_s",), lambda v: f"{v:.2f}"),
    ("Prefix cache hits", ("prefix_cache_hit_rate",), format_percent),
    ("Batch efficiency", ("batch_efficiency",), format_percent),
    ("Preemptions", ("num_preemptions",), lambda v: f"{v:.0f}"),
)


class MonitorPane(QWidget):
    """Samples process/system memory with psutil and shows the engine's metrics snapshots.

    The bridge emits ``metrics_updated`` about once a second while a model is loaded; this pane
    keeps the latest snapshot and adds one point per graph on its own one-second timer, so the
    memory graphs keep moving while no model is loaded.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("monitorPaneWidget")
        self._process = psutil.Process()
        self._snapshot: dict[str, Any] | None = None
        self._build()
        self._timer = QTimer(self)
        self._timer.setObjectName("sample-timer")
        self._timer.setInterval(SAMPLE_INTERVAL_MS)
        self._timer.timeout.connect(self._on_sample_timeout)
        self._timer.start()
        self._on_sample_timeout()

    def _build(self) -> None:
        total_ram = float(psutil.virtual_memory().total)
        self.rss_graph = Sparkline("Hearth memory (RSS)", format_bytes, colour="#e4572e")
        self.ram_graph = Sparkline("System RAM in use", format_bytes, maximum=total_ram, colour="#4c6ef5")
        self.kv_graph = Sparkline("KV cache in use", format_percent, maximum=1.0, colour="#2f9e44")
        self.throughput_graph = Sparkline("Throughput", format_rate, colour="#f08c00")
        self.gpu_graph = Sparkline("GPU memory", format_bytes, colour="#862e9c")
        for graph in (self.kv_graph, self.throughput_graph):
            graph.set_placeholder("No model loaded")
        self.gpu_graph.set_placeholder("No GPU in use")

        graphs = QGridLayout()
        graphs.setSpacing(8)
        for i, graph in enumerate((self.rss_graph, self.ram_graph, self.kv_graph, self.throughput_graph,
                                   self.gpu_graph)):
            graphs.addWidget(graph, i // 2, i % 2)

        self._running_label = QLabel("–")
        self._running_label.setObjectName("runningLabel")
        self._kv_blocks_label = QLabel("–")
        self._stat_labels: dict[str, QLabel] = {}
        stats = QGroupBox("Engine")
        form = QFormLayout(stats)
        form.addRow("Running / waiting", self._running_label)
        form.addRow("KV blocks", self._kv_blocks_label)
        for title, _, _ in _STAT_ROWS:
            label = QLabel("–")
            self._stat_labels[title] = label
            form.addRow(title, label)

        content = QWidget()
        layout = QVBoxLayout(content)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addLayout(graphs)
        layout.addWidget(stats)
        layout.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(content)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(scroll)

    @property
    def snapshot(self) -> dict[str, Any] | None:
        """The latest engine metrics snapshot, or None while no model is loaded."""
        return self._snapshot

    # -- events -----------------------------------------------------------------------------------

    @Slot()
    def _on_sample_timeout(self) -> None:
        self.rss_graph.add_sample(self._process.memory_info().rss)
        memory = psutil.virtual_memory()
        self.ram_graph.set_maximum(float(memory.total))
        self.ram_graph.add_sample(memory.total - memory.available)
        snapshot = self._snapshot
        if snapshot is None:
            return
        self.kv_graph.add_sample(float(snapshot.get("kv_cache_usage") or 0.0))
        self.throughput_graph.add_sample(float(snapshot.get("throughput_tok_s") or 0.0))
        if snapshot.get("gpu_memory_used_bytes") is not None:
            self.gpu_graph.set_maximum(snapshot.get("gpu_memory_total_bytes"))
            self.gpu_graph.add_sample(float(snapshot["gpu_memory_used_bytes"]))

    @Slot(object)
    def _on_metrics_updated(self, snapshot: dict[str, Any]) -> None:
        self._snapshot = snapshot
        running, waiting = snapshot.get("num_running") or 0, snapshot.get("num_waiting") or 0
        self._running_label.setText(f"{running:.0f} / {waiting:.0f}")
        used, total = snapshot.get("kv_blocks_used") or 0, snapshot.get("kv_blocks_total")
        self._kv_blocks_label.setText(f"{used:.0f} of {total:.0f}" if total else "–")
        for title, keys, formatter in _STAT_ROWS:
            values = [snapshot.get(key) for key in keys]
            self._stat_labels[title].setText(
                " / ".join("–" if v is None else formatter(v) for v in values))

    @Slot()
    def _on_model_unloaded(self) -> None:
        self._snapshot = None
        for graph in (self.kv_graph, self.throughput_graph, self.gpu_graph):
            graph.clear()
        self._running_label.setText("–")
        self._kv_blocks_label.setText("–")
        for label in self._stat_labels.values():
            label.setText("–")

    @Slot(object)
    def _on_hardware_detected(self, info: Any) -> None:
        gpus = getattr(info, "gpus", None) or []
        if gpus:
            self.gpu_graph.set_placeholder(f"{gpus[0].name}: waiting for the engine")
        else:
            self.gpu_graph.set_placeholder("No GPU in use")
