"""Asking the user before a tool runs: the server, the tool and the arguments the model gave, as formatted JSON
(plain text: nothing the model wrote is rendered as HTML or followed as a link), with Allow once, Always allow
this tool (remembered per server through :class:`engine.mcp.approvals.ApprovalStore`) and Deny. Closing the
dialog denies. :class:`GuiApprover` is the tool loop's ``approve`` callback for a loop run off the GUI thread."""

from __future__ import annotations

import json
import threading

from PySide6.QtCore import QObject, Qt, QThread, Signal, Slot
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


class _Pending:
    def __init__(self, request: ApprovalRequest) -> None:
        self.request = request
        self.decision = Decision.DENY
        self.answered = threading.Event()


class GuiApprover(QObject):
    """``approve`` for :func:`engine.mcp.loop.run_tool_loop` on a worker thread: each call shows an
    :class:`ApprovalDialog` on the GUI thread (through a queued signal) and blocks the worker until it is answered.
    :meth:`deny_all` answers every open question with Deny (the chat stopped, the window closes).

    Signals:
        asked(ApprovalDialog): a dialog was opened (for tests and the chat's status line).
    """

    asked = Signal(object)
    _ask = Signal(object)  # _Pending, from a worker thread

    def __init__(self, store: ApprovalStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self._parent = parent
        self._pending: list[_Pending] = []
        self._dialogs: list[ApprovalDialog] = []
        self._ask.connect(self._on_ask)

    def __call__(self, request: ApprovalRequest) -> Decision:
        if self.store.is_always(request.server, request.tool):
            return Decision.ALLOW_ALWAYS
        if QThread.currentThread() is self.thread():
            return ask(request, self.store, self._parent)
        pending = _Pending(request)
        self._pending.append(pending)
        self._ask.emit(pending)
        pending.answered.wait()
        return pending.decision

    @Slot(object)
    def _on_ask(self, pending: _Pending) -> None:
        if pending.answered.is_set():  # denied before it could be shown
            return
        dialog = ApprovalDialog(pending.request, self.store, self._parent)
        self._dialogs.append(dialog)

        def done() -> None:
            self._answer(pending, dialog.decision)
            self._dialogs.remove(dialog)
            dialog.deleteLater()

        dialog.finished.connect(done)
        dialog.open()
        self.asked.emit(dialog)

    def _answer(self, pending: _Pending, decision: Decision) -> None:
        pending.decision = decision
        pending.answered.set()
        if pending in self._pending:
            self._pending.remove(pending)

    def deny_all(self) -> None:
        for pending in list(self._pending):
            self._answer(pending, Decision.DENY)
        for dialog in list(self._dialogs):
            dialog.reject()
