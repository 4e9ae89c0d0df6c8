"""The app's colour theme: the light or dark palette, or the system's choice."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette

_SCHEMES = {"system": Qt.ColorScheme.Unknown, "light": Qt.ColorScheme.Light, "dark": Qt.ColorScheme.Dark}


def apply_theme(theme: str) -> None:
    """Switch to the light or dark palette, or back to the system's choice.

    Qt is asked first (``QStyleHints.setColorScheme``); where the platform cannot switch (X11
    without a desktop theme, the offscreen platform), Hearth sets a palette of its own.
    """
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
