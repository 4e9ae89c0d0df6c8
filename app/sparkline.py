"""A small hand-drawn line graph of recent samples."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFont, QPainter, QPainterPath, QPaintEvent, QPalette, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

#: How many samples a sparkline keeps (two minutes at one a second).
HISTORY = 120


class Sparkline(QWidget):
    """Title, current value and a filled line of the last ``HISTORY`` samples.

    Args:
        title: what is measured, e.g. "Process memory".
        formatter: turns a sample into text for the value label.
        maximum: a fixed top of the scale (e.g. total RAM); None scales to the largest sample.
        colour: the line colour.
    """

    def __init__(self, title: str, formatter: Callable[[float], str], *, maximum: float | None = None,
                 colour: str = "#e4572e", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._title = title
        self._formatter = formatter
        self._maximum = maximum
        self._colour = QColor(colour)
        self._samples: deque[float] = deque(maxlen=HISTORY)
        self._placeholder = "Waiting for data…"
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setMinimumWidth(160)

    def sizeHint(self) -> QSize:
        return QSize(260, 74)

    def minimumSizeHint(self) -> QSize:
        return QSize(160, 74)

    # -- data -------------------------------------------------------------------------------------

    def add_sample(self, value: float) -> None:
        self._samples.append(float(value))
        self.update()

    def set_maximum(self, maximum: float | None) -> None:
        self._maximum = maximum
        self.update()

    def set_placeholder(self, text: str) -> None:
        """Text shown instead of a graph while there are no samples."""
        self._placeholder = text
        self.update()

    def clear(self) -> None:
        self._samples.clear()
        self.update()

    @property
    def samples(self) -> list[float]:
        return list(self._samples)

    @property
    def value_text(self) -> str:
        return self._formatter(self._samples[-1]) if self._samples else "–"

    # -- painting ---------------------------------------------------------------------------------

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        palette = self.palette()
        frame = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        border = QColor(palette.color(QPalette.ColorRole.Mid))
        border.setAlpha(120)
        painter.setPen(QPen(border, 1))
        painter.setBrush(palette.color(QPalette.ColorRole.Base))
        painter.drawRoundedRect(frame, 6, 6)

        text_rect = frame.adjusted(8, 4, -8, 0)
        small = QFont(self.font())
        small.setPointSizeF(max(self.font().pointSizeF() * 0.9, 7.0))
        painter.setFont(small)
        painter.setPen(palette.color(QPalette.ColorRole.PlaceholderText))
        painter.drawText(text_rect, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop, self._title)
        bold = QFont(self.font())
        bold.setBold(True)
        painter.setFont(bold)
        painter.setPen(palette.color(QPalette.ColorRole.Text))
        painter.drawText(text_rect, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignTop, self.value_text)

        plot = frame.adjusted(6, 26, -6, -6)
        if not self._samples:
            painter.setFont(small)
            painter.setPen(palette.color(QPalette.ColorRole.PlaceholderText))
            painter.drawText(plot, Qt.AlignmentFlag.AlignCenter, self._placeholder)
            return
        top = self._maximum if self._maximum else max(max(self._samples), 1e-9) * 1.15
        step = plot.width() / max(HISTORY - 1, 1)
        x0 = plot.right() - step * (len(self._samples) - 1)
        points = [QPointF(x0 + i * step, plot.bottom() - min(v / top, 1.0) * plot.height())
                  for i, v in enumerate(self._samples)]
        line = QPainterPath(points[0])
        for point in points[1:]:
            line.lineTo(point)
        area = QPainterPath(line)
        area.lineTo(points[-1].x(), plot.bottom())
        area.lineTo(points[0].x(), plot.bottom())
        area.closeSubpath()
        fill = QColor(self._colour)
        fill.setAlpha(50)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(fill)
        painter.drawPath(area)
        painter.setPen(QPen(self._colour, 1.6))
        painter.setBrush(Qt.BrushStyle.NoBrush)
        painter.drawPath(line)
