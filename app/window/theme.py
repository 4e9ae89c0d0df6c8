"""The app's colour theme: the light or dark palette, or the system's choice.

In a dark palette, Fusion draws a check box's and a radio button's frame in the window colour darkened, which is
about the colour of the dark base inside it: an unticked box all but vanished. :class:`IndicatorStyle` draws that
frame again in the text colour, half transparent, whenever the palette is dark.
"""

from __future__ import annotations

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QGuiApplication, QPainter, QPalette, QPen
from PySide6.QtWidgets import QApplication, QProxyStyle, QStyle, QStyleOption, QWidget

_SCHEMES = {"system": Qt.ColorScheme.Unknown, "light": Qt.ColorScheme.Light, "dark": Qt.ColorScheme.Dark}


def apply_theme(theme: str) -> None:
    """Switch to the light or dark palette, or back to the system's choice.

    Qt is asked first (``QStyleHints.setColorScheme``); where the platform cannot switch (X11
    without a desktop theme, the offscreen platform), Hearth sets a palette of its own.
    """
    _install_indicator_style()
    scheme = _SCHEMES.get(theme, Qt.ColorScheme.Unknown)
    hints = QGuiApplication.styleHints()
    hints.setColorScheme(scheme)
    if theme == "system" or hints.colorScheme() == scheme:
        QGuiApplication.setPalette(QPalette())  # drop a palette set below
    else:
        QGuiApplication.setPalette(dark_palette() if theme == "dark" else light_palette())


def dark_palette() -> QPalette:
    """A dark palette for platforms that cannot switch theme themselves."""
    palette = QPalette()
    colours = {
        QPalette.ColorRole.Window: "#2b2b2b", QPalette.ColorRole.WindowText: "#e6e6e6",
        QPalette.ColorRole.Base: "#1f1f1f", QPalette.ColorRole.AlternateBase: "#303030",
        QPalette.ColorRole.Text: "#e6e6e6", QPalette.ColorRole.Button: "#353535",
        QPalette.ColorRole.ButtonText: "#e6e6e6", QPalette.ColorRole.Highlight: "#3d7bd9",
        QPalette.ColorRole.HighlightedText: "#ffffff", QPalette.ColorRole.Link: "#7fb0ff",
        QPalette.ColorRole.ToolTipBase: "#3a3a3a", QPalette.ColorRole.ToolTipText: "#e6e6e6",
        QPalette.ColorRole.PlaceholderText: "#9a9a9a", QPalette.ColorRole.Mid: "#555555",
    }
    for role, colour in colours.items():
        palette.setColor(role, QColor(colour))
    for role in (QPalette.ColorRole.WindowText, QPalette.ColorRole.Text, QPalette.ColorRole.ButtonText):
        palette.setColor(QPalette.ColorGroup.Disabled, role, QColor("#7a7a7a"))
    return palette


def light_palette() -> QPalette:
    """A light palette for platforms that cannot switch theme themselves."""
    palette = QPalette(QColor("#efefef"), QColor("#fafafa"))
    palette.setColor(QPalette.ColorRole.Base, QColor("#ffffff"))
    palette.setColor(QPalette.ColorRole.Text, QColor("#1a1a1a"))
    palette.setColor(QPalette.ColorRole.WindowText, QColor("#1a1a1a"))
    return palette


#: How opaque the indicator's frame is drawn over a dark base (0 to 255).
INDICATOR_FRAME_ALPHA = 150
_INDICATORS = (QStyle.PrimitiveElement.PE_IndicatorCheckBox, QStyle.PrimitiveElement.PE_IndicatorRadioButton)


class IndicatorStyle(QProxyStyle):
    """The application's style, with check box and radio button frames that show in a dark palette."""

    def drawPrimitive(self, element: QStyle.PrimitiveElement, option: QStyleOption, painter: QPainter,
                      widget: QWidget | None = None) -> None:
        super().drawPrimitive(element, option, painter, widget)
        if element not in _INDICATORS or option.palette.color(QPalette.ColorRole.Base).lightness() >= 128:
            return
        frame = QColor(option.palette.color(QPalette.ColorRole.Text))
        frame.setAlpha(INDICATOR_FRAME_ALPHA)
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        painter.setPen(QPen(frame, 1.0))
        painter.setBrush(Qt.BrushStyle.NoBrush)
        rect = QRectF(option.rect).adjusted(0.5, 0.5, -0.5, -0.5)
        if element == QStyle.PrimitiveElement.PE_IndicatorRadioButton:
            painter.drawEllipse(rect)
        else:
            painter.drawRoundedRect(rect, 1.5, 1.5)
        painter.restore()


_indicator_style: IndicatorStyle | None = None  # the Python side of the installed style must stay alive


def _install_indicator_style() -> None:
    """Wrap the application's style in :class:`IndicatorStyle`, once (no-op without a QApplication)."""
    global _indicator_style
    app = QApplication.instance()
    if not isinstance(app, QApplication) or isinstance(app.style(), IndicatorStyle):
        return
    _indicator_style = IndicatorStyle(app.style().name())
    app.setStyle(_indicator_style)
