"""The monitor's graph: a titled pyqtgraph plot of a few series over time, with a current-value line and a legend.

The legend is a line of text above the plot, not pyqtgraph's legend box, so it never covers the data;
the plot's colours follow the window's palette (:meth:`Graph.apply_palette`).
"""

from __future__ import annotations

import html
import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt, Slot
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QSizePolicy, QStackedLayout, QVBoxLayout, QWidget

from app.monitor.readings import Reading, series_values

GRAPH_HEIGHT = 240
#: Axis units drawn in binary multiples, as the rest of the app writes sizes (pyqtgraph's own prefixes are decimal).
_BINARY_UNITS = {"GiB": 1 << 30}


def steady_label(min_width: int = 0) -> QLabel:
    """A label whose changing text never changes the layout: a new width would resize (and fully repaint)
    every graph once a second."""
    label = QLabel("–")
    label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
    label.setMinimumWidth(min_width)
    return label


class Graph(QFrame):
    """A titled pyqtgraph plot of a few series over time, with a current-value line.

    Args:
        title: what is shown, e.g. "CPU memory".
        left_label: the left axis' label and unit, e.g. ("memory", "GiB"); byte series are drawn in GiB.
    """

    def __init__(self, title: str, left_label: tuple[str, str], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self._title = QLabel(f"<b>{title}</b>")
        self.value_label = steady_label()
        self.value_label.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.value_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        header = QHBoxLayout()
        header.addWidget(self._title)
        header.addWidget(self.value_label, 1)
        self._legend_items: list[tuple[str, str, bool]] = []
        self.legend_label = QLabel("")
        self.legend_label.setObjectName("graphLegend")
        self.legend_label.setWordWrap(True)
        self.legend_label.setTextFormat(Qt.TextFormat.RichText)

        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setFixedHeight(GRAPH_HEIGHT)
        self.plot = pg.PlotWidget(axisItems={"bottom": pg.DateAxisItem(orientation="bottom")})
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.showGrid(x=True, y=True, alpha=0.15)
        self._scale = float(_BINARY_UNITS.get(left_label[1], 1))
        if self._scale != 1:
            self.plot.getPlotItem().getAxis("left").enableAutoSIPrefix(False)
            self.plot.setLabel("left", f"{left_label[0]} ({left_label[1]})")
        else:
            self.plot.setLabel("left", left_label[0], units=left_label[1])
        self.plot.getPlotItem().vb.setLimits(yMin=0)
        self._placeholder = QLabel("Waiting for data…")
        self._placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self._stack = QStackedLayout()
        self._stack.addWidget(self.plot)
        self._stack.addWidget(self._placeholder)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 4, 6, 6)
        layout.addLayout(header)
        layout.addWidget(self.legend_label)
        layout.addLayout(self._stack)
        self._curves: dict[str, pg.PlotDataItem] = {}
        self._right: pg.ViewBox | None = None
        self._right_fixed = False
        #: The series :attr:`samples` reports; the first one added unless set.
        self.primary: str | None = None
        self.apply_palette(self.palette())

    # -- building ---------------------------------------------------------------------------------

    def add_curve(self, name: str, label: str, colour: str, *, fill: int = 0, right: bool = False,
                  dashed: bool = False, scales: bool = True) -> None:
        """Add the series ``name``: a ``readings.SERIES`` name or a resource figure's.

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
        else:
            self.plot.addItem(curve, ignoreBounds=not scales)
        self._curves[name] = curve
        self.primary = self.primary or name
        self._legend_items.append((colour, label, dashed))
        self._update_legend()

    def _update_legend(self) -> None:
        swatches = [f"<span style='color: {colour}'>{'┅' if dashed else '━━'}</span>&nbsp;{html.escape(label)}"
                    for colour, label, dashed in self._legend_items]
        self.legend_label.setText("<small>" + " &nbsp; ".join(swatches) + "</small>")

    @property
    def legend(self) -> list[str]:
        """The series' labels, as the legend shows them."""
        return [label for _, label, _ in self._legend_items]

    def apply_palette(self, palette: QPalette) -> None:
        """Draw the plot in the palette's colours: its background, axes, tick labels and grid."""
        background = palette.color(QPalette.ColorRole.Base)
        foreground = palette.color(QPalette.ColorRole.WindowText)
        self.plot.setBackground(background)
        item = self.plot.getPlotItem()
        for name in ("left", "bottom", "right"):
            axis = item.getAxis(name)
            axis.setPen(pg.mkPen(foreground))
            axis.setTextPen(pg.mkPen(foreground))

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

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self.apply_palette(self.palette())

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

    def update_from(self, times: np.ndarray, rows: list[Reading]) -> None:
        for name, curve in self._curves.items():
            curve.setData(times, series_values(rows, name) / self._scale)
        if self._right is not None:
            if not self._right_fixed:
                self._right.enableAutoRange(axis=pg.ViewBox.YAxis)
            self._on_resized()

    def clear(self) -> None:
        for curve in self._curves.values():
            curve.setData([], [])

    def curve_data(self, name: str) -> list[float]:
        """The values of one series as drawn, in the series' own unit (NaN where missing)."""
        y = self._curves[name].yData
        return [] if y is None else [float(v) * self._scale for v in y]

    @property
    def samples(self) -> list[float]:
        """The finite values of the :attr:`primary` series, as drawn."""
        return [] if self.primary is None else [v for v in self.curve_data(self.primary) if not math.isnan(v)]
