"""The monitor pane: headline numbers and live graphs of memory, KV cache, throughput and latency.

Data arrive as ``metrics_updated`` dicts from the bridge: the engine's resource monitor sends memory,
CPU and GPU figures with the loaded model's metrics about once a second, and the engine loop sends
engine metrics alone. :meth:`MonitorPane._on_metrics_updated` merges them into the latest values; a
one-second timer turns those into one row of a ten-minute history, which feeds the graphs (pyqtgraph)
and "Export CSV". While the pane is hidden the history keeps growing but nothing is redrawn.
"""

from __future__ import annotations

import csv
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer, Slot
from PySide6.QtGui import QColor, QShowEvent
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
    QSizePolicy,
    QStackedLayout,
    QVBoxLayout,
    QWidget,
)

from app import log
from app.formatting import format_bytes, format_percent, format_rate, format_seconds

SAMPLE_INTERVAL_MS = 1000
GRAPH_HEIGHT = 230
#: Rows of history: ten minutes at one a second.
HISTORY_ROWS = 600
#: Engine keys dropped from the latest values when the model is unloaded.
_ENGINE_PREFIXES = ("num_", "kv_", "prefix_", "throughput", "requests_", "ttft_", "itl_", "e2e_", "batch_",
                    "mean_batch")

#: (label, metrics keys, formatter) rows of the "Engine" box.
_STAT_ROWS: tuple[tuple[str, tuple[str, ...], Callable[[float], str]], ...] = (
    ("Running / waiting", ("num_running", "num_waiting"), lambda v: f"{v:.0f}"),
    ("Batch efficiency", ("batch_efficiency",), format_percent),
    ("Mean batch size", ("mean_batch_size",), lambda v: f"{v:.1f}"),
    ("Preemptions", ("num_preemptions",), lambda v: f"{v:.0f}"),
    ("KV blocks used / cached / total", ("kv_blocks_used", "kv_blocks_cached", "kv_blocks_total"),
     lambda v: f"{v:.0f}"),
    ("Prefix cache hits", ("prefix_cache_hit_rate",), format_percent),
    ("Time to first token (p50 / p90 / p99)", ("ttft_p50", "ttft_p90", "ttft_p99"), format_seconds),
    ("Time between tokens (p50 / p99)", ("itl_p50", "itl_p99"), format_seconds),
    ("Whole reply (p50 / p99)", ("e2e_p50", "e2e_p99"), format_seconds),
    ("Requests per second", ("requests_per_s",), lambda v: f"{v:.2f}"),
    ("CPU (all cores)", ("cpu_percent",), lambda v: f"{v:.0f} %"),
)

_COLOURS = {"red": "#e4572e", "blue": "#4c6ef5", "green": "#2f9e44", "orange": "#f08c00",
            "purple": "#862e9c", "teal": "#1098ad", "grey": "#adb5bd", "pink": "#d6336c"}

def _steady_label(min_width: int = 0) -> QLabel:
    """A label whose changing text never changes the layout: a new width would resize (and fully repaint)
    every graph once a second."""
    label = QLabel("–")
    label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
    label.setMinimumWidth(min_width)
    return label


#: Milliseconds between the graphs' repaints in a periodic redraw.
STAGGER_MS = 60


def _gpu_sum(row: dict[str, Any], name: str) -> float | None:
    """Sum of ``gpu{i}_{name}`` over the GPUs in ``row``; None without GPUs."""
    count = int(row.get("gpu_count") or 0)
    values = [row[f"gpu{i}_{name}"] for i in range(count) if f"gpu{i}_{name}" in row]
    return float(sum(values)) if values else None


def _kv_percent(row: dict[str, Any], *keys: str) -> float | None:
    total = row.get("kv_blocks_total")
    if not total or any(row.get(k) is None for k in keys):
        return None
    return 100.0 * sum(float(row[k]) for k in keys) / float(total)


#: Derived series: name -> function of one history row (None where it has no value).
_DERIVED: dict[str, Callable[[dict[str, Any]], float | None]] = {
    "gpu_memory_used_bytes": lambda r: _gpu_sum(r, "memory_used_bytes"),
    "gpu_memory_total_bytes": lambda r: _gpu_sum(r, "memory_total_bytes"),
    "kv_used_pct": lambda r: _kv_percent(r, "kv_blocks_used"),
    "kv_used_cached_pct": lambda r: _kv_percent(r, "kv_blocks_used", "kv_blocks_cached"),
    "kv_all_pct": lambda r: 100.0 if r.get("kv_blocks_total") else None,
    "prefix_hit_pct": lambda r: None if r.get("prefix_cache_hit_rate") is None
    else 100.0 * float(r["prefix_cache_hit_rate"]),
}


def series_values(rows: Iterable[dict[str, Any]], name: str) -> np.ndarray:
    """One value per row for a raw key or a ``_DERIVED`` name; NaN where a row has none."""
    derive = _DERIVED.get(name)
    values = [derive(r) if derive is not None else r.get(name) for r in rows]
    return np.array([math.nan if v is None else float(v) for v in values], dtype=float)


class Graph(QFrame):
    """A titled pyqtgraph plot of a few series over time, with a current-value line.

    Args:
        title: what is shown, e.g. "CPU memory".
        left_label: the left axis' label and unit, e.g. ("memory", "B").
    """

    def __init__(self, title: str, left_label: tuple[str, str], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self._title = QLabel(f"<b>{title}</b>")
        self.value_label = _steady_label()
        self.value_label.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.value_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        header = QHBoxLayout()
        header.addWidget(self._title)
        header.addStretch(1)
        header.addWidget(self.value_label)

        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setFixedHeight(GRAPH_HEIGHT)
        self.plot = pg.PlotWidget(axisItems={"bottom": pg.DateAxisItem(orientation="bottom")})
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.showGrid(x=True, y=True, alpha=0.15)
        self.plot.setLabel("left", left_label[0], units=left_label[1])
        self.plot.addLegend(offset=(6, 4), labelTextSize="8pt", brush=pg.mkBrush(255, 255, 255, 170))
        self.plot.getPlotItem().vb.setLimits(yMin=0)
        self._placeholder = QLabel("Waiting for data…")
        self._placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self._stack = QStackedLayout()
        self._stack.addWidget(self.plot)
        self._stack.addWidget(self._placeholder)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 4, 6, 6)
        layout.addLayout(header)
        layout.addLayout(self._stack)
        self._curves: dict[str, pg.PlotDataItem] = {}
        self._right: pg.ViewBox | None = None
        self._right_fixed = False
        #: The series :attr:`samples` reports; the first one added unless set.
        self.primary: str | None = None

    # -- building ---------------------------------------------------------------------------------

    def add_curve(self, name: str, label: str, colour: str, *, fill: int = 0, right: bool = False,
                  dashed: bool = False, scales: bool = True) -> None:
        """Add a series drawn from history key (or ``_DERIVED`` name) ``name``.

        Args:
            fill: alpha (0-255) of the area under the curve; 0 draws the line only.
            right: draw it against the right-hand axis.
            scales: whether the axis' automatic range includes it.
        """
        pen = pg.mkPen(colour, width=1.6, style=Qt.PenStyle.DashLine if dashed else Qt.PenStyle.SolidLine)
        brush = None
        if fill:
            brush = QColor(colour)
            brush.setAlpha(fill)
        curve = pg.PlotDataItem(pen=pen, name=label, connect="finite", clipToView=True, autoDownsample=True,
                                fillLevel=0.0 if fill else None, brush=brush)
        curve.setZValue(len(self._curves))  # later curves in front
        if right:
            self._right_view().addItem(curve, ignoreBounds=not scales)
            self.plot.getPlotItem().legend.addItem(curve, label)
        else:
            self.plot.addItem(curve, ignoreBounds=not scales)
        self._curves[name] = curve
        self.primary = self.primary or name

    def set_right_label(self, text: str, units: str | None = None) -> None:
        self._right_view()
        self.plot.setLabel("right", text, units=units)

    def set_right_range(self, low: float, high: float) -> None:
        """Fix the right-hand axis' range (it scales to its curves otherwise)."""
        self._right_fixed = True
        self._right_view().setYRange(low, high, padding=0.02)

    def _right_view(self) -> pg.ViewBox:
        """A second y axis on the right, sharing the x axis (pyqtgraph's MultiplePlotAxes example)."""
        if self._right is None:
            item = self.plot.getPlotItem()
            self._right = pg.ViewBox()
            self._right.setMouseEnabled(x=False, y=False)
            self._right.setMenuEnabled(False)
            self._right.setLimits(yMin=0)
            item.showAxis("right")
            item.scene().addItem(self._right)
            item.getAxis("right").linkToView(self._right)
            self._right.setXLink(item)
            item.vb.sigResized.connect(self._on_resized)
        return self._right

    @Slot()
    def _on_resized(self) -> None:
        if self._right is not None:
            main = self.plot.getPlotItem().vb
            self._right.setGeometry(main.sceneBoundingRect())
            self._right.linkedViewChanged(main, self._right.XAxis)

    # -- data -------------------------------------------------------------------------------------

    def set_placeholder(self, text: str | None) -> None:
        """Show ``text`` instead of the plot (e.g. "No GPU"); None shows the plot."""
        if text is None:
            self._stack.setCurrentWidget(self.plot)
        else:
            self._placeholder.setText(text)
            self._stack.setCurrentWidget(self._placeholder)

    @property
    def placeholder_text(self) -> str | None:
        return self._placeholder.text() if self._stack.currentWidget() is self._placeholder else None

    def update_from(self, times: np.ndarray, rows: list[dict[str, Any]]) -> None:
        for name, curve in self._curves.items():
            curve.setData(times, series_values(rows, name))
        if self._right is not None:
            if not self._right_fixed:
                self._right.enableAutoRange(axis=pg.ViewBox.YAxis)
            self._on_resized()

    def clear(self) -> None:
        for curve in self._curves.values():
            curve.setData([], [])

    def curve_data(self, name: str) -> list[float]:
        """The values of one series as drawn (NaN where missing)."""
        y = self._curves[name].yData
        return [] if y is None else [float(v) for v in y]

    @property
    def samples(self) -> list[float]:
        """The finite values of the :attr:`primary` series, as drawn."""
        return [] if self.primary is None else [v for v in self.curve_data(self.primary) if not math.isnan(v)]


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
        self._latest: dict[str, Any] = {}
        self._history: deque[dict[str, Any]] = deque(maxlen=HISTORY_ROWS)
        self._model: dict[str, str] = {}
        self._gpu_names: list[str] = []
        self._needs_redraw = False
        self.num_redraws = 0
        self._build()
        self._timer = QTimer(self)
        self._timer.setObjectName("monitor-sample-timer")
        self._timer.setInterval(sample_interval_ms)
        self._timer.timeout.connect(self._on_sample_timeout)
        self._timer.start()

    # -- building ---------------------------------------------------------------------------------

    def _build(self) -> None:
        pg.setConfigOptions(antialias=False, background=self.palette().color(self.backgroundRole()),
                            foreground=self.palette().color(self.foregroundRole()))

        self.gpu_graph = Graph("GPU memory", ("memory", "B"))
        self.gpu_graph.add_curve("gpu_memory_total_bytes", "total", _COLOURS["grey"], dashed=True)
        self.gpu_graph.add_curve("gpu_memory_used_bytes", "used", _COLOURS["purple"], fill=90)
        self.gpu_graph.add_curve("torch_cuda_reserved_bytes", "model (reserved)", _COLOURS["orange"], fill=110)
        self.gpu_graph.set_placeholder("Waiting for the first sample…")

        self.ram_graph = Graph("CPU memory", ("memory", "B"))
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
        self.throughput_graph.add_curve("throughput_tok_s", "tok/s", _COLOURS["orange"], fill=110)
        self.throughput_graph.add_curve("num_running", "running", _COLOURS["blue"], right=True)
        self.throughput_graph.add_curve("num_waiting", "waiting", _COLOURS["red"], right=True, dashed=True)
        self.throughput_graph.set_right_label("requests")

        self.latency_graph = Graph("Latency", ("time", "s"))  # pyqtgraph shows ms where that reads better
        self.latency_graph.add_curve("ttft_p50", "TTFT p50", _COLOURS["blue"])
        self.latency_graph.add_curve("ttft_p99", "TTFT p99", _COLOURS["blue"], dashed=True)
        self.latency_graph.add_curve("itl_p50", "ITL p50", _COLOURS["green"])
        self.latency_graph.add_curve("itl_p99", "ITL p99", _COLOURS["green"], dashed=True)

        for graph in (self.kv_graph, self.throughput_graph, self.latency_graph):
            graph.set_placeholder("No model loaded")
        self.graphs = (self.gpu_graph, self.ram_graph, self.kv_graph, self.throughput_graph, self.latency_graph)

        grid = QGridLayout()
        grid.setSpacing(8)
        for i, graph in enumerate(self.graphs):
            grid.addWidget(graph, i // 2, i % 2)

        self._stat_labels: dict[str, QLabel] = {}
        stats = QGroupBox("Engine")
        form = QFormLayout(stats)
        for title, _, _ in _STAT_ROWS:
            label = _steady_label()
            self._stat_labels[title] = label
            form.addRow(title, label)
        self._gpu_detail = QLabel("–")
        self._gpu_detail.setObjectName("gpuDetailLabel")
        self._gpu_detail.setWordWrap(True)
        form.addRow("GPUs", self._gpu_detail)

        content = QWidget()
        layout = QVBoxLayout(content)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addLayout(grid)
        layout.addWidget(stats)
        layout.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(content)

        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addLayout(self._build_headline())
        outer.addWidget(scroll, 1)

    def _build_headline(self) -> QHBoxLayout:
        self.headline: dict[str, QLabel] = {}
        row = QHBoxLayout()
        row.setContentsMargins(8, 6, 8, 2)
        for key, caption in (("tok_s", "Throughput"), ("kv", "KV cache"), ("ram", "RAM"), ("vram", "VRAM"),
                             ("device", "Device"), ("quantization", "Quantization")):
            value = _steady_label(min_width=110)
            value.setObjectName(f"headline_{key}")
            font = value.font()
            font.setPointSizeF(font.pointSizeF() * 1.35)
            font.setBold(True)
            value.setFont(font)
            cap = QLabel(caption)
            cap.setStyleSheet("color: palette(placeholder-text);")
            box = QVBoxLayout()
            box.setSpacing(0)
            box.addWidget(cap)
            box.addWidget(value)
            row.addLayout(box)
            row.addSpacing(10)
            self.headline[key] = value
        row.addStretch(1)
        self.export_button = QPushButton("Export CSV…")
        self.export_button.setObjectName("exportCsvButton")
        self.export_button.setToolTip("Save the last ten minutes of samples as a CSV file")
        self.export_button.clicked.connect(self._on_export_clicked)
        row.addWidget(self.export_button, 0, Qt.AlignmentFlag.AlignVCenter)
        return row

    # -- data -------------------------------------------------------------------------------------

    @property
    def snapshot(self) -> dict[str, Any]:
        """The latest merged values ({} before the first ``metrics_updated``)."""
        return dict(self._latest)

    @property
    def history(self) -> list[dict[str, Any]]:
        """The rows behind the graphs and the CSV export, oldest first."""
        return list(self._history)

    def export_csv(self, path: str) -> int:
        """Write the history to ``path``: a ``time`` column, then one per key. Returns the row count."""
        rows = list(self._history)
        columns: dict[str, None] = {"time": None}
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
                repaints land in separate event-loop turns. Painting all five plots at once takes over 100 ms
                on a slow CPU while a reply streams; one at a time, none blocks the loop for long.
        """
        self._needs_redraw = False
        self.num_redraws += 1
        rows = list(self._history)
        latest = self._latest
        times = np.array([r["time"] for r in rows], dtype=float)
        has_engine = latest.get("kv_blocks_total") is not None
        for graph in (self.kv_graph, self.throughput_graph, self.latency_graph):
            graph.set_placeholder(None if has_engine else "No model loaded")
        gpu_count = latest.get("gpu_count")
        if gpu_count is None:
            self.gpu_graph.set_placeholder("Waiting for the first sample…")
        elif gpu_count == 0:
            self.gpu_graph.set_placeholder("No GPU")
        else:
            self.gpu_graph.set_placeholder(None)
        self._update_numbers(latest)
        if not staggered:
            for graph in self.graphs:
                graph.update_from(times, rows)
            return
        for i, graph in enumerate(self.graphs):
            QTimer.singleShot(i * self.stagger_ms, self, lambda g=graph: g.update_from(times, rows))

    def _update_numbers(self, m: dict[str, Any]) -> None:
        def get(key: str) -> float | None:
            value = m.get(key)
            return None if value is None else float(value)

        self.headline["tok_s"].setText(format_rate(get("throughput_tok_s")))
        self.headline["kv"].setText(format_percent(get("kv_cache_usage")))
        self.headline["ram"].setText(format_bytes(get("process_rss_bytes")))
        gpu_used, gpu_total = _gpu_sum(m, "memory_used_bytes"), _gpu_sum(m, "memory_total_bytes")
        if m.get("gpu_count") == 0:
            self.headline["vram"].setText("no GPU")
        elif gpu_used is not None:
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
        used, cached, total = get("kv_blocks_used"), get("kv_blocks_cached"), get("kv_blocks_total")
        self.kv_graph.value_label.setText(
            "–" if total is None else f"{used or 0:.0f} used · {cached or 0:.0f} cached · "
            f"{total - (used or 0) - (cached or 0):.0f} free · hits {format_percent(get('prefix_cache_hit_rate'))}")
        self.throughput_graph.value_label.setText(
            f"{format_rate(get('throughput_tok_s'))} · {get('num_running') or 0:.0f} running · "
            f"{get('num_waiting') or 0:.0f} waiting")
        self.latency_graph.value_label.setText(
            f"TTFT {format_seconds(get('ttft_p50'))} · ITL {format_seconds(get('itl_p50'))}")

        for title, keys, formatter in _STAT_ROWS:
            values = [get(key) for key in keys]
            self._stat_labels[title].setText(" / ".join("–" if v is None else formatter(v) for v in values))
        self._gpu_detail.setText(self._gpu_text(m))

    def _gpu_text(self, m: dict[str, Any]) -> str:
        count = int(m.get("gpu_count") or 0)
        if not count:
            return "No GPU" if "gpu_count" in m else "–"
        parts = []
        for i in range(count):
            name = self._gpu_names[i] if i < len(self._gpu_names) else f"GPU {i}"
            bits = [f"{m[f'gpu{i}_utilization_percent']:.0f} % busy" if f"gpu{i}_utilization_percent" in m else "",
                    f"{m[f'gpu{i}_temperature_c']:.0f} °C" if f"gpu{i}_temperature_c" in m else "",
                    f"{m[f'gpu{i}_power_w']:.0f} W" if f"gpu{i}_power_w" in m else ""]
            parts.append(f"{name}: " + ", ".join(b for b in bits if b))
        return "\n".join(parts)

    # -- events -----------------------------------------------------------------------------------

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if self._needs_redraw:
            self.redraw()

    @Slot()
    def _on_sample_timeout(self) -> None:
        if not self._latest:
            return
        self._history.append(dict(self._latest, time=time.time()))
        if self.isVisible():
            self.redraw(staggered=self.stagger_ms > 0)
        else:
            self._needs_redraw = True  # paused: no drawing while hidden

    @Slot(object)
    def _on_metrics_updated(self, snapshot: dict[str, Any]) -> None:
        self._latest.update(snapshot)

    @Slot(object)
    def _on_model_loaded(self, info: Any) -> None:
        dtype = str(getattr(info, "dtype", "") or "")
        quantization = str(getattr(info, "quantization", "") or "")
        self._model = {"device": str(getattr(info, "device", "") or "–"),
                       "quantization": quantization or dtype or "–"}

    @Slot()
    def _on_model_unloaded(self) -> None:
        self._model = {}
        for key in [k for k in self._latest if k.startswith(_ENGINE_PREFIXES)]:
            del self._latest[key]
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
