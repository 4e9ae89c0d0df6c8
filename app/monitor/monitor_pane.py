"""The monitor pane: headline numbers and live graphs of memory, KV cache, throughput and latency.

Data arrive as ``metrics_updated`` dicts from the bridge: the engine's resource monitor sends memory,
CPU and GPU figures (with a remote server's figures while one is in use) about once a second, and the
engine loop sends the engine's figures alone (``EngineMetrics.to_dict()``).
:meth:`MonitorPane._on_metrics_updated` keeps the latest of each: the engine's as an ``EngineMetrics``,
the resource sample by name. A one-second timer turns those into one :class:`~app.monitor.readings.Reading`
of a ten-minute history, which feeds the graphs (pyqtgraph) and "Export CSV". While the pane is hidden the
history keeps growing but nothing is redrawn.

The readings stay true when nothing happens: throughput drops to 0 once no token has arrived for
:data:`THROUGHPUT_IDLE_S`, latencies read "–" until a request has one, and without a GPU the GPU graph
and the VRAM figure are hidden. The graphs sit in two columns when the pane is wide, else in one.

The plot widget is :class:`app.monitor.graph.Graph`; the series and numbers it draws from a row are in
:mod:`app.monitor.readings`.
"""

from __future__ import annotations

import csv
import dataclasses
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QSize, Qt, QTimer, Slot
from PySide6.QtGui import QPalette, QResizeEvent, QShowEvent
from PySide6.QtWidgets import (
    QFileDialog,
    QFormLayout,
    QFrame,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from app import log
from app.bridge.types import SAMPLE_TIME, engine_metrics_in, resource_figures_in
from app.formatting import format_bytes, format_percent, format_rate, format_seconds
from app.monitor.graph import Graph, steady_label
from app.monitor.readings import STAT_ROWS, STAT_TOOLTIPS, Reading, gpu_sum, gpu_text, latency
from engine.api import EngineMetrics

SAMPLE_INTERVAL_MS = 1000
#: Rows of history: ten minutes at one a second.
HISTORY_ROWS = 600
#: Milliseconds between the graphs' repaints in a periodic redraw.
STAGGER_MS = 60
#: Seconds without a new token after which the throughput reads 0 (the engine's figure is a sliding window).
THROUGHPUT_IDLE_S = 3.0
#: The pane's width from which the graphs sit in two columns.
TWO_COLUMN_WIDTH = 760
#: Columns of the headline figures.
HEADLINE_COLUMNS = 3
_COLOURS = {"red": "#e4572e", "blue": "#4c6ef5", "green": "#2f9e44", "orange": "#f08c00",
            "purple": "#862e9c", "teal": "#1098ad", "grey": "#adb5bd", "pink": "#d6336c"}


class MonitorPane(QWidget):
    """Headline numbers, five graphs and the engine's figures, from ``metrics_updated`` dicts.

    Args:
        sample_interval_ms: how often a history row is taken (and the graphs redrawn).
    """

    def __init__(
        self,
        parent: QWidget | None = None,
        *,
        sample_interval_ms: int = SAMPLE_INTERVAL_MS,
        stagger_ms: int = STAGGER_MS,
    ) -> None:
        super().__init__(parent)
        self.setObjectName("monitorPaneWidget")
        self.stagger_ms = stagger_ms  # 0: periodic redraws update every graph at once
        #: The latest figures: the engine's (None without an engine) and the resource sample's.
        self._engine: EngineMetrics | None = None
        self._resources: dict[str, float] = {}
        self._history: deque[Reading] = deque(maxlen=HISTORY_ROWS)
        self._model: dict[str, str] = {}
        self._gpu_names: list[str] = []
        self._needs_redraw = False
        self.num_redraws = 0
        #: The time source for the idle check (tests replace it).
        self.clock: Callable[[], float] = time.monotonic
        self._last_token_time: float | None = None
        self._tokens_total: int | None = None
        self._has_gpu: bool | None = None
        self._num_columns = 0
        self._build()
        self._timer = QTimer(self)
        self._timer.setObjectName("monitor-sample-timer")
        self._timer.setInterval(sample_interval_ms)
        self._timer.timeout.connect(self._on_sample_timeout)
        self._timer.start()

    # -- building ---------------------------------------------------------------------------------

    def _build(self) -> None:
        pg.setConfigOptions(antialias=False, background=self.palette().color(QPalette.ColorRole.Base),
                            foreground=self.palette().color(QPalette.ColorRole.WindowText))

        self.gpu_graph = Graph("GPU memory", ("memory", "GiB"))
        self.gpu_graph.add_curve("gpu_memory_total_bytes", "total", _COLOURS["grey"], dashed=True)
        self.gpu_graph.add_curve("gpu_memory_used_bytes", "used", _COLOURS["purple"], fill=90)
        self.gpu_graph.add_curve("torch_cuda_reserved_bytes", "model (reserved)", _COLOURS["orange"], fill=110)
        self.gpu_graph.set_placeholder("Waiting for the first sample…")

        self.ram_graph = Graph("CPU memory", ("memory", "GiB"))
        self.ram_graph.add_curve("process_rss_bytes", "Hearth (RSS)", _COLOURS["red"], fill=110)
        self.ram_graph.add_curve("ram_used_bytes", "system used", _COLOURS["blue"])
        self.ram_graph.add_curve("ram_total_bytes", "system total", _COLOURS["grey"], dashed=True)
        self.rss_graph = self.ram_graph  # the first series is the process' RSS

        # Stacked: each filled curve is a running total (used, used + cached, all blocks), drawn back to
        # front. The axis scales to the blocks in use, so a large, mostly free cache still shows them;
        # "free" fills whatever lies above.
        self.kv_graph = Graph("KV cache", ("blocks", "%"))
        self.kv_graph.add_curve("kv_all_pct", "free", _COLOURS["grey"], fill=45, scales=False)
        self.kv_graph.add_curve("kv_used_cached_pct", "cached prefixes", _COLOURS["teal"], fill=120)
        self.kv_graph.add_curve("kv_used_pct", "used", _COLOURS["green"], fill=170)
        self.kv_graph.add_curve("prefix_hit_pct", "prefix hit rate", _COLOURS["pink"], right=True, dashed=True)
        self.kv_graph.set_right_label("prefix hits", "%")
        self.kv_graph.plot.getPlotItem().vb.setLimits(yMin=0, minYRange=5)
        self.kv_graph.set_right_range(0, 100)
        self.kv_graph.primary = "kv_used_pct"

        self.throughput_graph = Graph("Throughput and requests", ("throughput", "tok/s"))
        self.throughput_graph.add_curve("tokens_per_s", "tok/s", _COLOURS["orange"], fill=110)
        self.throughput_graph.add_curve("running", "running", _COLOURS["blue"], right=True)
        self.throughput_graph.add_curve("waiting", "waiting", _COLOURS["red"], right=True, dashed=True)
        self.throughput_graph.set_right_label("requests")

        self.latency_graph = Graph("Latency", ("time", "s"))  # pyqtgraph shows ms where that reads better
        self.latency_graph.add_curve("ttft_median", "TTFT p50", _COLOURS["blue"])
        self.latency_graph.add_curve("ttft_tail", "TTFT p99", _COLOURS["blue"], dashed=True)
        self.latency_graph.add_curve("itl_median", "ITL p50", _COLOURS["green"])
        self.latency_graph.add_curve("itl_tail", "ITL p99", _COLOURS["green"], dashed=True)

        for graph in (self.kv_graph, self.throughput_graph, self.latency_graph):
            graph.set_placeholder("No model loaded")
        self.graphs = (self.gpu_graph, self.ram_graph, self.kv_graph, self.throughput_graph, self.latency_graph)

        self._grid = QGridLayout()
        self._grid.setSpacing(8)
        self._place_graphs(1)

        self._stat_labels: dict[str, QLabel] = {}
        stats = QGroupBox("Engine")
        form = QFormLayout(stats)
        for title, _, _ in STAT_ROWS:
            label = steady_label()
            self._stat_labels[title] = label
            caption = QLabel(title)
            if title in STAT_TOOLTIPS:
                caption.setToolTip(STAT_TOOLTIPS[title])
                caption.setCursor(Qt.CursorShape.WhatsThisCursor)  # says that hovering explains it
                label.setToolTip(STAT_TOOLTIPS[title])
            form.addRow(caption, label)
        self._gpu_detail = QLabel("–")
        self._gpu_detail.setObjectName("gpuDetailLabel")
        self._gpu_detail.setWordWrap(True)
        form.addRow("GPUs", self._gpu_detail)

        content = QWidget()
        layout = QVBoxLayout(content)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addLayout(self._grid)
        layout.addWidget(stats)
        layout.addStretch(1)
        scroll = self._scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(content)

        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addLayout(self._build_headline())
        outer.addWidget(scroll, 1)

    def _build_headline(self) -> QVBoxLayout:
        """The headline figures in a grid of :data:`HEADLINE_COLUMNS`, and the Export button under them."""
        self.headline: dict[str, QLabel] = {}
        self._headline_boxes: dict[str, QWidget] = {}
        grid = QGridLayout()
        grid.setHorizontalSpacing(12)
        grid.setVerticalSpacing(4)
        for i, (key, caption) in enumerate((("tok_s", "Throughput"), ("kv", "KV cache"), ("ram", "RAM"),
                                            ("device", "Device"), ("quantization", "Precision"),
                                            ("vram", "VRAM"))):  # last: hidden without a GPU
            value = steady_label(min_width=90)
            value.setObjectName(f"headline_{key}")
            font = value.font()
            font.setPointSizeF(font.pointSizeF() * 1.25)
            font.setBold(True)
            value.setFont(font)
            cap = QLabel(caption)
            cap.setForegroundRole(QPalette.ColorRole.PlaceholderText)  # follows a theme change
            box = QWidget()
            box_layout = QVBoxLayout(box)
            box_layout.setContentsMargins(0, 0, 0, 0)
            box_layout.setSpacing(0)
            box_layout.addWidget(cap)
            box_layout.addWidget(value)
            grid.addWidget(box, i // HEADLINE_COLUMNS, i % HEADLINE_COLUMNS)
            self.headline[key] = value
            self._headline_boxes[key] = box
        self.export_button = QPushButton("Export CSV…")
        self.export_button.setObjectName("exportCsvButton")
        self.export_button.setToolTip("Save the last ten minutes of samples as a CSV file")
        self.export_button.clicked.connect(self._on_export_clicked)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.export_button)
        column = QVBoxLayout()
        column.setContentsMargins(8, 6, 8, 2)
        column.addLayout(grid)
        column.addLayout(buttons)
        return column

    def _place_graphs(self, num_columns: int) -> None:
        """Lay the shown graphs out in ``num_columns`` columns (the GPU graph is left out without a GPU)."""
        self._num_columns = num_columns
        for graph in self.graphs:
            self._grid.removeWidget(graph)
        shown = [g for g in self.graphs if not (g is self.gpu_graph and self._has_gpu is False)]
        for i, graph in enumerate(shown):
            self._grid.addWidget(graph, i // num_columns, i % num_columns)
        for column in range(2):
            self._grid.setColumnStretch(column, 1 if column < num_columns else 0)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        columns = 2 if event.size().width() >= TWO_COLUMN_WIDTH else 1
        if columns != self._num_columns:
            self._place_graphs(columns)

    def _show_gpu(self, has_gpu: bool) -> None:
        """Show the GPU graph and VRAM figure only where there is a GPU."""
        if has_gpu == self._has_gpu:
            return
        self._has_gpu = has_gpu
        self.gpu_graph.setVisible(has_gpu)
        self._headline_boxes["vram"].setVisible(has_gpu)
        self._place_graphs(self._num_columns)

    def minimumSizeHint(self) -> QSize:
        """As narrow as the content allows without scrolling sideways (the scroll area alone would allow less)."""
        hint = super().minimumSizeHint()
        widget = self._scroll.widget()
        content = (widget.minimumSizeHint().width() if widget is not None else 0) \
            + self._scroll.verticalScrollBar().sizeHint().width()
        return QSize(max(hint.width(), content), hint.height())

    # -- data -------------------------------------------------------------------------------------

    @property
    def snapshot(self) -> dict[str, Any]:
        """The latest values by name ({} before the first ``metrics_updated``)."""
        latest = self._latest()
        return {} if latest is None else latest.as_row()

    @property
    def history(self) -> list[Reading]:
        """The rows behind the graphs and the CSV export, oldest first."""
        return list(self._history)

    def _latest(self) -> Reading | None:
        if self._engine is None and not self._resources:
            return None
        return Reading(time.time(), self._engine, dict(self._resources))

    def export_csv(self, path: str) -> int:
        """Write the history to ``path``: a ``time`` column, then one per figure. Returns the row count."""
        rows = [reading.as_row() for reading in self._history]
        columns: dict[str, None] = {SAMPLE_TIME: None}
        for row in rows:
            columns.update(dict.fromkeys(row))
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(columns), restval="")
            writer.writeheader()
            writer.writerows(rows)
        return len(rows)

    def redraw(self, staggered: bool = False) -> None:
        """Redraw graphs and numbers from the history.

        Args:
            staggered: hand the graphs their new data one at a time, ``stagger_ms`` apart, so that their
                repaints land in separate event-loop turns. Painting all five plots at once can stall a slow
                CPU's event loop while a reply streams; one at a time, none blocks it for long.
        """
        self._needs_redraw = False
        self.num_redraws += 1
        self._decay_idle_throughput()  # a snapshot may have brought the stale figure back since the last row
        rows = list(self._history)
        latest = self._latest() or Reading(time.time())
        times = np.array([r.time for r in rows], dtype=float)
        has_engine = latest.engine is not None and latest.engine.kv_blocks_total > 0
        for graph in (self.kv_graph, self.throughput_graph, self.latency_graph):
            graph.set_placeholder(None if has_engine else "No model loaded")
        gpu_count = latest.resources.get("gpu_count")
        if gpu_count is None:
            self.gpu_graph.set_placeholder("Waiting for the first sample…")
        else:
            self._show_gpu(gpu_count > 0)
            self.gpu_graph.set_placeholder(None)
        self._update_numbers(latest)
        if not staggered:
            for graph in self.graphs:
                graph.update_from(times, rows)
            return
        for i, graph in enumerate(self.graphs):
            QTimer.singleShot(i * self.stagger_ms, self, lambda g=graph: g.update_from(times, rows))

    def _update_numbers(self, latest: Reading) -> None:
        m, resources = latest.engine, latest.resources
        get = resources.get
        tok_s = None if m is None else m.throughput_tok_s
        self.headline["tok_s"].setText(format_rate(tok_s))
        self.headline["kv"].setText(format_percent(None if m is None else m.kv_cache_usage))
        self.headline["ram"].setText(format_bytes(get("process_rss_bytes")))
        gpu_used, gpu_total = gpu_sum(resources, "memory_used_bytes"), gpu_sum(resources, "memory_total_bytes")
        if gpu_used is not None:
            self.headline["vram"].setText(f"{format_bytes(gpu_used)} / {format_bytes(gpu_total)}")
        else:
            self.headline["vram"].setText("–")
        self.headline["device"].setText(self._model.get("device", "–"))
        self.headline["quantization"].setText(self._model.get("quantization", "–"))

        self.ram_graph.value_label.setText(
            f"Hearth {format_bytes(get('process_rss_bytes'))} · system {format_bytes(get('ram_used_bytes'))}"
            f" of {format_bytes(get('ram_total_bytes'))}")
        reserved = get("torch_cuda_reserved_bytes")
        self.gpu_graph.value_label.setText(
            "–" if gpu_used is None else f"{format_bytes(gpu_used)} of {format_bytes(gpu_total)}"
            + ("" if reserved is None else f" · model {format_bytes(reserved)}"))
        if m is None or not m.kv_blocks_total:
            self.kv_graph.value_label.setText("–")
        else:
            free = m.kv_blocks_total - m.kv_blocks_used - m.kv_blocks_cached
            self.kv_graph.value_label.setText(
                f"{m.kv_blocks_used:.0f} used · {m.kv_blocks_cached:.0f} cached · {free:.0f} free · "
                f"hits {format_percent(m.prefix_cache_hit_rate)}")
        running, waiting = (0, 0) if m is None else (m.num_running, m.num_waiting)
        self.throughput_graph.value_label.setText(
            f"{format_rate(tok_s)} · {running:.0f} running · {waiting:.0f} waiting")
        ttft, itl = (None, None) if m is None else (latency(m.ttft_p50), latency(m.itl_p50))
        self.latency_graph.value_label.setText(f"TTFT {format_seconds(ttft)} · ITL {format_seconds(itl)}")

        for title, figures, formatter in STAT_ROWS:
            values = figures(latest)
            self._stat_labels[title].setText(" / ".join("–" if v is None else formatter(v) for v in values))
        self._gpu_detail.setText(gpu_text(resources, self._gpu_names))

    # -- events -----------------------------------------------------------------------------------

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if self._needs_redraw:
            self.redraw()

    @Slot()
    def _on_sample_timeout(self) -> None:
        self._decay_idle_throughput()
        latest = self._latest()
        if latest is None:
            return
        self._history.append(latest)
        if self.isVisible():
            self.redraw(staggered=self.stagger_ms > 0)
        else:
            self._needs_redraw = True  # paused: no drawing while hidden

    @Slot(object)
    def _on_metrics_updated(self, snapshot: dict[str, Any]) -> None:
        resources = resource_figures_in(snapshot)
        if resources:  # a resource sample: each is whole, so it replaces the last
            self._resources = resources
        metrics = engine_metrics_in(snapshot)
        if metrics is None:
            return
        self._engine = metrics
        total = metrics.num_generated_tokens_total
        if total:
            if total != self._tokens_total:
                self._tokens_total = total
                self._last_token_time = self.clock()
        elif metrics.num_running:  # a backend without a token count: busy means tokens arrive
            self._last_token_time = self.clock()

    def _decay_idle_throughput(self) -> None:
        """Read 0 tok/s once no token has arrived for :data:`THROUGHPUT_IDLE_S`, not the last busy figure."""
        if self._engine is None or not self._engine.throughput_tok_s:
            return
        if self._last_token_time is None or self.clock() - self._last_token_time > THROUGHPUT_IDLE_S:
            self._engine = dataclasses.replace(self._engine, throughput_tok_s=0.0)

    @Slot(object)
    def _on_model_loaded(self, info: Any) -> None:
        dtype = str(getattr(info, "dtype", "") or "")
        quantization = str(getattr(info, "quantization", "") or "")
        self._model = {"device": str(getattr(info, "device", "") or "–"),
                       "quantization": quantization or dtype or "–"}

    @Slot()
    def _on_model_unloaded(self) -> None:
        self._model = {}
        self._tokens_total = self._last_token_time = None
        self._engine = None
        if self.isVisible():
            self.redraw()

    @Slot(object)
    def _on_hardware_detected(self, info: Any) -> None:
        self._gpu_names = [str(getattr(gpu, "name", f"GPU {i}")) for i, gpu in enumerate(
            getattr(info, "gpus", None) or [])]

    @Slot()
    def _on_export_clicked(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export monitor samples", "hearth-monitor.csv",
                                              "CSV files (*.csv)")
        if not path:
            return
        try:
            rows = self.export_csv(path)
        except OSError as exc:
            log.ui.warning("CSV export to %s failed: %s", path, exc)
            self.export_button.setToolTip(f"Export failed: {exc}")
            return
        log.ui.info("exported %d monitor rows to %s", rows, path)
