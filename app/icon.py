"""Hearth's application icon: a flame over a hearth stone.

``resources/hearth.svg`` and ``resources/hearth.png`` hold the icon; :func:`draw_icon` draws the
same picture with QPainter, which is how the PNG was made and the fallback when ``resources/``
is not shipped next to the package.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QIcon, QImage, QLinearGradient, QPainter, QPainterPath, QPixmap

RESOURCES_DIR = Path(__file__).resolve().parent.parent / "resources"


def _flame(size: float, scale: float, lift: float) -> QPainterPath:
    """A teardrop flame centred horizontally, its base at 78 % of the height."""
    cx, base = size / 2, size * (0.78 - lift)
    w, h = size * 0.30 * scale, size * 0.62 * scale
    path = QPainterPath(QPointF(cx, base - h))
    path.cubicTo(QPointF(cx + w * 0.35, base - h * 0.62), QPointF(cx + w * 1.15, base - h * 0.45),
                 QPointF(cx + w * 0.95, base - h * 0.18))
    path.cubicTo(QPointF(cx + w * 0.85, base + h * 0.02), QPointF(cx + w * 0.35, base + h * 0.06),
                 QPointF(cx, base))
    path.cubicTo(QPointF(cx - w * 0.35, base + h * 0.06), QPointF(cx - w * 0.85, base + h * 0.02),
                 QPointF(cx - w * 0.95, base - h * 0.18))
    path.cubicTo(QPointF(cx - w * 1.05, base - h * 0.42), QPointF(cx - w * 0.2, base - h * 0.55),
                 QPointF(cx, base - h))
    return path


def draw_icon(size: int = 256) -> QImage:
    """Draw the Hearth icon into a transparent ``size`` x ``size`` image."""
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    s = float(size)
    # Rounded tile.
    tile = QLinearGradient(0, 0, 0, s)
    tile.setColorAt(0, QColor("#3b2a24"))
    tile.setColorAt(1, QColor("#1f1614"))
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(tile)
    painter.drawRoundedRect(QRectF(s * 0.04, s * 0.04, s * 0.92, s * 0.92), s * 0.2, s * 0.2)
    # Hearth stone.
    painter.setBrush(QColor("#8d6e63"))
    painter.drawRoundedRect(QRectF(s * 0.2, s * 0.76, s * 0.6, s * 0.09), s * 0.03, s * 0.03)
    # Outer and inner flame.
    outer = QLinearGradient(0, s * 0.16, 0, s * 0.78)
    outer.setColorAt(0, QColor("#ffb300"))
    outer.setColorAt(1, QColor("#e64a19"))
    painter.setBrush(outer)
    painter.drawPath(_flame(s, 1.0, 0.0))
    inner = QLinearGradient(0, s * 0.4, 0, s * 0.76)
    inner.setColorAt(0, QColor("#fff8e1"))
    inner.setColorAt(1, QColor("#ffca28"))
    painter.setBrush(inner)
    painter.drawPath(_flame(s, 0.48, 0.02))
    painter.end()
    return image


def app_icon() -> QIcon:
    """Return the application icon from ``resources/``, or a drawn one if the files are missing."""
    icon = QIcon()
    for name in ("hearth.svg", "hearth.png"):
        path = RESOURCES_DIR / name
        if path.is_file():
            icon.addFile(str(path))
    if icon.isNull():
        icon = QIcon(QPixmap.fromImage(draw_icon(256)))
    return icon


def write_resources(folder: Path = RESOURCES_DIR) -> None:
    """Regenerate ``hearth.png`` (run ``python -m app.icon``); ``hearth.svg`` is the same drawing."""
    folder.mkdir(parents=True, exist_ok=True)
    draw_icon(256).save(str(folder / "hearth.png"))


if __name__ == "__main__":
    from PySide6.QtGui import QGuiApplication

    _app = QGuiApplication([])
    write_resources()
