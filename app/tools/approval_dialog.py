"""Asking the user before a tool runs: the server, the tool and the arguments the model gave, as formatted JSON
(plain text: nothing the model wrote is rendered as HTML or followed as a link), with Allow once, Always allow
this tool (remembered per server through :class:`engine.mcp.approvals.ApprovalStore`) and Deny. Closing the
dialog denies."""

from __future__ import annotations

import json

from PySide6.QtCore import Qt
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QDialog,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from engine.mcp.approvals import ApprovalRequest, ApprovalStore, Decision


def format_arguments(arguments: object) -> str:
    """The arguments as indented JSON (non-ASCII kept readable)."""
    try:
        return json.dumps(arguments, indent=2, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(arguments)


class ApprovalDialog(QDialog):
    """One call put to the user; :attr:`decision` holds the answer (DENY until another is chosen).

    Args:
        request: the server, the tool and the arguments.
        store: where "always" is remembered.
    """

    def __init__(self, request: ApprovalRequest, store: ApprovalStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("approvalDialog")
        self.setWindowTitle("Run a tool?")
        self.request, self.store = request, store
        self.decision = Decision.DENY
        question = QLabel(f"The model asks to run the tool “{request.tool}” of the MCP server “{request.server}”"
                          " with these arguments:")
        question.setObjectName("approvalQuestion")
        question.setTextFormat(Qt.TextFormat.PlainText)
        question.setWordWrap(True)
        self.arguments = QPlainTextEdit(format_arguments(request.arguments))
        self.arguments.setObjectName("approvalArguments")
        self.arguments.setReadOnly(True)
        self.arguments.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.arguments.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        buttons = QHBoxLayout()
        for name, text, decision in (("allowOnceButton", "Allow once", Decision.ALLOW_ONCE),
                                     ("alwaysAllowButton", "Always allow this tool", Decision.ALLOW_ALWAYS),
                                     ("denyButton", "Deny", Decision.DENY)):
            button = QPushButton(text)
            button.setObjectName(name)
            button.setAutoDefault(False)
            button.clicked.connect(lambda _=False, d=decision: self.answer(d))
            buttons.addWidget(button)
            if decision is Decision.ALLOW_ALWAYS:
                button.setToolTip(f"Run “{request.tool}” of “{request.server}” from now on without asking")
            if decision is Decision.DENY:
                button.setDefault(True)  # Enter never runs anything
        layout = QVBoxLayout(self)
        layout.addWidget(question)
        layout.addWidget(self.arguments, 1)
        layout.addLayout(buttons)
        self.resize(520, 320)

    def answer(self, decision: Decision) -> None:
        """Take ``decision`` (remembering "always") and close."""
        self.decision = decision
        if decision is Decision.ALLOW_ALWAYS:
            self.store.remember(self.request.server, self.request.tool)
        if decision is Decision.DENY:
            self.reject()
        else:
            self.accept()


def ask(request: ApprovalRequest, store: ApprovalStore, parent: QWidget | None = None) -> Decision:
    """The user's answer to ``request``; a tool the user allowed always is not asked about."""
    if store.is_always(request.server, request.tool):
        return Decision.ALLOW_ALWAYS
    dialog = ApprovalDialog(request, store, parent)
    dialog.exec()
    return dialog.decision
