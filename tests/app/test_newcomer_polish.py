"""What a newcomer sees at once: wheels that scroll panes, button texts, honest labels, the Models list, dates, Help."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import QApplication, QScrollArea, QSpinBox


def _wheel(widget: Any, steps: int = 3) -> QWheelEvent:
    centre = QPointF(widget.rect().center())
    return QWheelEvent(centre, QPointF(widget.mapToGlobal(centre.toPoint())), QPoint(0, 0), QPoint(0, 120 * steps),
                       Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False)


def test_wheel_over_an_unfocused_spin_box_in_the_model_pane_leaves_its_value(window: Any, qtbot: Any) -> None:
    pane = window.model_pane
    spin = pane.findChild(QSpinBox, "maxBatchSizeSpin")
    assert spin is not None
    assert isinstance(pane.findChild(QScrollArea), QScrollArea)
    assert spin.focusPolicy() == Qt.FocusPolicy.StrongFocus  # a wheel does not give it the focus
    window.chat_pane.focus_input()
    assert not spin.hasFocus()
    before = spin.value()
    QApplication.sendEvent(spin, _wheel(spin))
    assert spin.value() == before
    spin.setFocus()
    qtbot.waitUntil(spin.hasFocus, timeout=2000)
    QApplication.sendEvent(spin, _wheel(spin))  # focused, it takes the wheel as before
    assert spin.value() != before
