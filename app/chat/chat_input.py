"""The message box: Enter sends, Shift+Enter starts a new line."""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, Signal, Slot
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit, QSizePolicy, QWidget

_MIN_LINES = 2
_MAX_LINES = 8


class ChatInput(QPlainTextEdit):
    """A plain-text editor that grows with its text, up to a few lines.

    Signals:
        submitted(): Enter (or Ctrl+Enter) was pressed without Shift.
    """

    submitted = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("chatInput")
        self.setTabChangesFocus(True)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.document().setDocumentMargin(6)
        self.textChanged.connect(self._on_text_changed)
        self._on_text_changed()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        is_enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if is_enter and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            event.accept()
            self.submitted.emit()
            return
        if is_enter:  # Shift+Enter: a plain newline, not a Qt line separator
            self.insertPlainText("\n")
            event.accept()
            return
        super().keyPressEvent(event)

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.FontChange:
            self._on_text_changed()  # a larger font needs taller lines

    @Slot()
    def _on_text_changed(self) -> None:
        """Grow or shrink to fit the text."""
        line = self.fontMetrics().lineSpacing()
        lines = min(max(self.document().lineCount(), _MIN_LINES), _MAX_LINES)
        margins = self.contentsMargins()
        frame = int(self.document().documentMargin() * 2) + margins.top() + margins.bottom()
        self.setFixedHeight(lines * line + frame + 4)
