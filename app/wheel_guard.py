"""Spin boxes, combos and sliders take the mouse wheel only when they have the keyboard focus.

Scrolling a pane (the Model pane is a scroll area full of settings) must scroll it, not change whichever setting
happens to pass under the pointer. :func:`install` puts one :class:`WheelGuard` on the application, so every such
widget of every window and dialog is covered, including those built later: when Qt polishes one it gets
``Qt.StrongFocus`` (a wheel no longer gives it the focus), and a wheel event reaching it while it lacks the focus
is ignored and not handled, so Qt passes it on to the parents and the enclosing scroll area scrolls.
"""

from __future__ import annotations

from PySide6.QtCore import QCoreApplication, QEvent, QObject, Qt
from PySide6.QtWidgets import QAbstractSlider, QAbstractSpinBox, QComboBox, QScrollBar, QWidget

_WHEEL = QEvent.Type.Wheel
_POLISH = QEvent.Type.Polish


def guards(widget: QObject) -> bool:
    """Whether ``widget`` is one whose value a stray wheel would change (scroll bars are meant to be wheeled)."""
    return isinstance(widget, (QAbstractSpinBox, QComboBox, QAbstractSlider)) and not isinstance(widget, QScrollBar)


class WheelGuard(QObject):
    """The application-wide event filter; see the module docstring."""

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        kind = event.type()
        if kind != _WHEEL and kind != _POLISH:
            return False
        if not guards(watched):
            return False
        assert isinstance(watched, QWidget)
        if kind == _POLISH:
            if watched.focusPolicy() == Qt.FocusPolicy.WheelFocus:
                watched.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
            return False
        if watched.hasFocus():
            return False
        event.ignore()  # not handled here: Qt offers a real wheel event to the parents, up to the scroll area
        return True


def install() -> WheelGuard | None:
    """Install the guard on the running application once; returns it (None without an application)."""
    app = QCoreApplication.instance()
    if app is None:
        return None
    existing = app.findChild(WheelGuard)
    if isinstance(existing, WheelGuard):
        return existing
    guard = WheelGuard(app)
    app.installEventFilter(guard)
    return guard
