"""Approvals: what the user answered when a tool asked to run, and the "always" answers remembered.

Nothing runs without an answer unless the user chose "always" for that tool of that server. The remembered
answers live in ``mcp_approvals.json`` in the data folder (0600), ``{"always": {server: [tool, ...]}}``.
"""

from __future__ import annotations

import enum
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FILE_NAME = "mcp_approvals.json"


class Decision(enum.Enum):
    ALLOW_ONCE = "allow_once"
    ALLOW_ALWAYS = "allow_always"
    DENY = "deny"


@dataclass(frozen=True)
class ApprovalRequest:
    """What the user is shown: the tool, its server and the arguments the model gave."""

    server: str
    tool: str
    arguments: dict[str, Any]


class ApprovalStore:
    """The tools the user allowed always, per server; thread-safe, saved at each change."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._always: dict[str, set[str]] = {}
        if path is not None:
            self._always = _read(path)

    def is_always(self, server: str, tool: str) -> bool:
        with self._lock:
            return tool in self._always.get(server, set())

    def remember(self, server: str, tool: str) -> None:
        with self._lock:
            self._always.setdefault(server, set()).add(tool)
            self._save()

    def forget(self, server: str, tool: str | None = None) -> None:
        """Ask again for ``tool`` of ``server`` (every tool of it when ``tool`` is None)."""
        with self._lock:
            if tool is None:
                self._always.pop(server, None)
            else:
                self._always.get(server, set()).discard(tool)
            self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        data = {"always": {s: sorted(t) for s, t in sorted(self._always.items()) if t}}
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
        os.replace(tmp, self.path)


def _read(path: Path) -> dict[str, set[str]]:
    """The remembered answers; a missing or unreadable file remembers nothing (so every call asks again)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    always = data.get("always") if isinstance(data, dict) else None
    if not isinstance(always, dict):
        return {}
    return {str(s): {str(t) for t in tools if isinstance(t, str)} for s, tools in always.items()
            if isinstance(tools, list)}
