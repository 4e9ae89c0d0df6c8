"""Add or edit one MCP server: a name, and either a program to start (command, arguments, environment) or a
Streamable HTTP address (with headers). The entry is checked by :func:`engine.mcp.config.parse_server`, so the
dialog refuses what ``mcp.json`` could not load, and says why in the same words."""

from __future__ import annotations

import shlex
from collections.abc import Collection

from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QVBoxLayout,
    QWidget,
)

from engine.mcp.config import ServerConfig, parse_server


def _pairs(text: str, what: str) -> dict[str, str]:
    """``NAME=VALUE`` lines as a dict; blank lines are skipped, a line without ``=`` is an error in words."""
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{what} line {number} must read NAME=VALUE")
        out[key.strip()] = value
    return out


class ServerDialog(QDialog):
    """Edits one server; :attr:`server` holds the checked entry once accepted.

    Args:
        server: the entry to edit, or None to add one.
        taken: the names other servers already use.
    """

    def __init__(self, server: ServerConfig | None, taken: Collection[str], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("mcpServerDialog")
        self.setWindowTitle("Edit MCP server" if server else "Add MCP server")
        self.server: ServerConfig | None = None
        self._taken = set(taken)
        self._was_enabled = server.enabled if server else True
        self._cwd = server.cwd if server else None  # no field of its own, but kept
        self._name = QLineEdit(server.name if server else "")
        self._name.setObjectName("mcpNameEdit")
        self._command = QLineEdit(server.command if server else "")
        self._command.setObjectName("mcpCommandEdit")
        self._command.setPlaceholderText("a program, e.g. uvx or npx")
        self._args = QLineEdit(shlex.join(server.args) if server else "")
        self._args.setObjectName("mcpArgsEdit")
        self._args.setPlaceholderText("arguments, quoted as in a shell: mcp-server-time --local-timezone UTC")
        self._url = QLineEdit(server.url if server else "")
        self._url.setObjectName("mcpUrlEdit")
        self._url.setPlaceholderText("or a Streamable HTTP address: https://host/mcp")
        pairs = (server.headers if server.transport == "http" else server.env) if server else {}
        self._env = QPlainTextEdit("\n".join(f"{k}={v}" for k, v in pairs.items()))
        self._env.setObjectName("mcpEnvEdit")
        self._env.setPlaceholderText("NAME=VALUE, one a line: environment (a program) or headers (an address)")
        self._env.setTabChangesFocus(True)
        self._error = QLabel()
        self._error.setObjectName("mcpServerError")
        self._error.setWordWrap(True)
        self._error.setStyleSheet("color: #c0392b")
        form = QFormLayout()
        form.addRow("Name", self._name)
        form.addRow("Command", self._command)
        form.addRow("Arguments", self._args)
        form.addRow("URL", self._url)
        form.addRow("Environment or headers", self._env)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self._error)
        layout.addWidget(buttons)

    def entry(self) -> ServerConfig:
        """The fields as a checked entry; ValueError says what is wrong."""
        name = self._name.text().strip()
        if not name:
            raise ValueError("a server needs a name")
        if name in self._taken:
            raise ValueError(f"a server named {name!r} exists already")
        command, url = self._command.text().strip(), self._url.text().strip()
        if command and url:
            raise ValueError("give a command or a URL, not both")
        raw: dict[str, object] = {}
        if url:
            raw = {"type": "http", "url": url, "headers": _pairs(self._env.toPlainText(), "headers")}
        elif command:
            try:
                args = shlex.split(self._args.text())
            except ValueError as exc:
                raise ValueError(f"the arguments cannot be split: {exc}") from exc
            raw = {"command": command, "args": args, "env": _pairs(self._env.toPlainText(), "environment")}
            if self._cwd:
                raw["cwd"] = self._cwd
        raw["disabled"] = not self._was_enabled
        return parse_server(name, raw)

    def accept(self) -> None:
        try:
            self.server = self.entry()
        except ValueError as exc:
            self._error.setText(str(exc)[:1].upper() + str(exc)[1:] + ".")
            return
        super().accept()
