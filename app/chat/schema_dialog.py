"""The JSON schema dialog: paste or type the schema a chat's JSON replies must follow, checked as it is typed."""

from __future__ import annotations

import json
from typing import Any

from PySide6.QtCore import Slot
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.chat.json_schema import parse_schema

_ERROR_STYLE = "color: #c62828"


class SchemaDialog(QDialog):
    """Edits one chat's JSON schema. Save is enabled only while the text is a usable schema (or empty).

    Accepted, :attr:`schema` holds the schema, or None when the box was left empty (replies are then any JSON
    object).

    Args:
        schema: the chat's current schema, shown indented.
    """

    def __init__(self, schema: dict[str, Any] | None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("schemaDialog")
        self.setWindowTitle("JSON schema for replies")
        self.resize(560, 420)
        self.schema: dict[str, Any] | None = schema
        intro = QLabel("Replies will be JSON that matches this schema. Leave it empty to allow any JSON object.")
        intro.setWordWrap(True)
        self._edit = QPlainTextEdit()
        self._edit.setObjectName("jsonSchemaEdit")
        self._edit.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self._edit.setPlaceholderText('{"type": "object", "properties": {"answer": {"type": "string"}}}')
        self._status = QLabel()
        self._status.setObjectName("jsonSchemaStatus")
        self._status.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        self._save_button = buttons.button(QDialogButtonBox.StandardButton.Save)
        self._save_button.setObjectName("saveSchemaButton")
        clear = QPushButton("Clear")
        clear.setObjectName("clearSchemaButton")
        clear.setToolTip("Remove the schema: replies may be any JSON object")
        buttons.addButton(clear, QDialogButtonBox.ButtonRole.ResetRole)
        clear.clicked.connect(self._edit.clear)
        buttons.accepted.connect(self._on_save)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(self._edit, 1)
        layout.addWidget(self._status)
        layout.addWidget(buttons)
        self._edit.textChanged.connect(self._on_text_changed)
        self._edit.setPlainText(json.dumps(schema, indent=2) if schema is not None else "")
        self._on_text_changed()

    @property
    def text(self) -> str:
        return self._edit.toPlainText()

    def set_text(self, text: str) -> None:
        """Replace the schema text (as pasting it would)."""
        self._edit.setPlainText(text)

    @property
    def status_text(self) -> str:
        """What the dialog says about the text: that it is usable, or what is wrong with it."""
        return self._status.text()

    @Slot()
    def _on_text_changed(self) -> None:
        try:
            schema = parse_schema(self._edit.toPlainText())
        except ValueError as exc:
            self._status.setText(str(exc))
            self._status.setStyleSheet(_ERROR_STYLE)
            self._save_button.setEnabled(False)
            return
        self._status.setText("No schema: replies may be any JSON object." if schema is None
                             else "The schema is valid.")
        self._status.setStyleSheet("")
        self._save_button.setEnabled(True)

    @Slot()
    def _on_save(self) -> None:
        try:
            self.schema = parse_schema(self._edit.toPlainText())
        except ValueError as exc:  # Save is disabled then; kept for a click that races the check
            self._status.setText(str(exc))
            return
        self.accept()
