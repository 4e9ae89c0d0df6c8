"""Each reply's tool steps and each chat's tools choice, in the conversation database.

No Qt here. Two tables of schema 6 (:mod:`app.data.migrations`): ``tool_steps`` (one row per call a reply's tool
loop made: the tool, its server, the arguments as JSON text, the outcome and the result's text, so the steps show
again after a restart) and ``conversation_tools`` (whether a chat uses tools, and the servers turned off for it).
The rows go through :class:`~app.data.storage.Storage`'s own lock and transactions, like
:mod:`app.data.attachments`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from app.data.storage import Storage

#: A step's outcome: the tool ran and answered, it ran and failed (or the call was invalid), or the user said no.
OUTCOMES = ("ok", "error", "denied")


@dataclass(frozen=True, slots=True)
class ToolStepRecord:
    """One call of a reply's tool loop, as the transcript shows it."""

    server: str
    tool: str
    arguments: str  # JSON text (as the model wrote it when it was not valid JSON)
    outcome: str  # one of OUTCOMES
    result: str  # the text the model was given back

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"unknown tool step outcome {self.outcome!r}; expected one of {OUTCOMES}")


@dataclass(frozen=True, slots=True)
class ToolsChoice:
    """Whether a chat's replies may call tools, and the MCP servers turned off for it (the others are on)."""

    enabled: bool = False
    servers_off: frozenset[str] = frozenset()


class ToolStepStore:
    """Reads and writes tool steps and tools choices through an open :class:`Storage` (which it does not close)."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    def add(self, message_id: int, step: ToolStepRecord) -> None:
        """Append ``step`` to reply ``message_id``'s steps."""
        with self.storage.batch():
            row = self.storage._one("SELECT COUNT(*) FROM tool_steps WHERE message_id = ?", (message_id,))
            position = int(row[0]) if row is not None else 0
            self.storage._write(
                "INSERT INTO tool_steps (message_id, position, server, tool, arguments, outcome, result) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (message_id, position, step.server, step.tool, step.arguments, step.outcome, step.result),
            )

    def steps(self, message_id: int) -> list[ToolStepRecord]:
        """Reply ``message_id``'s steps in the order they ran ([] when it called no tool)."""
        rows = self.storage._all(
            "SELECT server, tool, arguments, outcome, result FROM tool_steps WHERE message_id = ? ORDER BY position",
            (message_id,),
        )
        return [ToolStepRecord(server, tool, arguments, outcome if outcome in OUTCOMES else "error", result)
                for server, tool, arguments, outcome, result in rows]

    def choice(self, conversation_id: int) -> ToolsChoice:
        """The chat's tools choice (off when it never made one)."""
        row = self.storage._one(
            "SELECT enabled, servers_off FROM conversation_tools WHERE conversation_id = ?", (conversation_id,)
        )
        if row is None:
            return ToolsChoice()
        try:
            off = json.loads(row[1])
        except ValueError:
            off = []
        return ToolsChoice(bool(row[0]), frozenset(str(s) for s in off if isinstance(s, str))
                           if isinstance(off, list) else frozenset())

    def set_choice(self, conversation_id: int, choice: ToolsChoice) -> None:
        self.storage._write(
            "INSERT OR REPLACE INTO conversation_tools (conversation_id, enabled, servers_off) VALUES (?, ?, ?)",
            (conversation_id, int(choice.enabled), json.dumps(sorted(choice.servers_off), ensure_ascii=False)),
        )
