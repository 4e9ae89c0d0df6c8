"""Each reply's tool steps and each chat's tools choice, in the conversation database.

No Qt here. Two tables of schema 6 (:mod:`app.data.migrations`): ``tool_steps`` (one row per call a reply's tool
loop made: the tool, its server, the arguments as JSON text, the outcome and the result's text, so the steps show
again after a restart) and ``conversation_tools`` (whether a chat uses tools, and the servers and single tools
turned off for it). The rows go through :class:`~app.data.storage.Storage`'s own lock and transactions, like
:mod:`app.data.attachments`.

``conversation_tools.servers_off`` holds JSON: a list of server names, or, once a chat turned single tools off, an
object ``{"servers": [...], "tools": [[server, tool], ...]}`` (a list still reads as servers alone).

:func:`steps_to_json` and :func:`steps_from_json` carry a reply's steps in an exported conversation
(:mod:`app.data.export`), checked field by field on the way in.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

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
    """Whether a chat's replies may call tools, the MCP servers turned off for it (the others are on), and the
    single tools turned off for it, as (server, tool) pairs (the others of a server that is on are on)."""

    enabled: bool = False
    servers_off: frozenset[str] = frozenset()
    tools_off: frozenset[tuple[str, str]] = frozenset()

    def uses(self, server: str, tool: str) -> bool:
        """Whether the chat's replies may call ``tool`` of ``server``."""
        return self.enabled and server not in self.servers_off and (server, tool) not in self.tools_off


class ToolStepStore:
    """Reads and writes tool steps and tools choices through an open :class:`Storage` (which it does not close)."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    def add(self, message_id: int, step: ToolStepRecord) -> None:
        """Append ``step`` to reply ``message_id``'s steps."""
        self.add_all(message_id, [step])

    def add_all(self, message_id: int, steps: Iterable[ToolStepRecord]) -> None:
        """Append ``steps`` to reply ``message_id``'s steps, in one transaction."""
        with self.storage.batch():
            row = self.storage._one("SELECT COUNT(*) FROM tool_steps WHERE message_id = ?", (message_id,))
            position = int(row[0]) if row is not None else 0
            for step in steps:
                self.storage._write(
                    "INSERT INTO tool_steps (message_id, position, server, tool, arguments, outcome, result) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (message_id, position, step.server, step.tool, step.arguments, step.outcome, step.result),
                )
                position += 1

    def steps(self, message_id: int) -> list[ToolStepRecord]:
        """Reply ``message_id``'s steps in the order they ran ([] when it called no tool)."""
        rows = self.storage._all(
            "SELECT server, tool, arguments, outcome, result FROM tool_steps WHERE message_id = ? ORDER BY position",
            (message_id,),
        )
        return [ToolStepRecord(server, tool, arguments, outcome if outcome in OUTCOMES else "error", result)
                for server, tool, arguments, outcome, result in rows]

    def conversation_steps(self, conversation_id: int) -> dict[int, list[ToolStepRecord]]:
        """Every reply's steps in a conversation, all branches, by message id (replies without steps left out)."""
        rows = self.storage._all(
            "SELECT s.message_id, s.server, s.tool, s.arguments, s.outcome, s.result FROM tool_steps s "
            "JOIN messages m ON m.id = s.message_id WHERE m.conversation_id = ? ORDER BY s.message_id, s.position",
            (conversation_id,),
        )
        steps: dict[int, list[ToolStepRecord]] = {}
        for message_id, server, tool, arguments, outcome, result in rows:
            steps.setdefault(int(message_id), []).append(
                ToolStepRecord(server, tool, arguments, outcome if outcome in OUTCOMES else "error", result))
        return steps

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
        servers, tools = (off, []) if isinstance(off, list) else (
            (off.get("servers", []), off.get("tools", [])) if isinstance(off, dict) else ([], []))
        servers_off = frozenset(s for s in servers if isinstance(s, str)) if isinstance(servers, list) else frozenset()
        tools_off = frozenset((p[0], p[1]) for p in tools if isinstance(p, list) and len(p) == 2
                              and all(isinstance(x, str) for x in p)) if isinstance(tools, list) else frozenset()
        return ToolsChoice(bool(row[0]), servers_off, tools_off)

    def set_choice(self, conversation_id: int, choice: ToolsChoice) -> None:
        servers = sorted(choice.servers_off)
        off: object = servers if not choice.tools_off else {
            "servers": servers, "tools": [list(pair) for pair in sorted(choice.tools_off)]}
        self.storage._write(
            "INSERT OR REPLACE INTO conversation_tools (conversation_id, enabled, servers_off) VALUES (?, ?, ?)",
            (conversation_id, int(choice.enabled), json.dumps(off, ensure_ascii=False)),
        )


# --- export and import ----------------------------------------------------------------------------

_STEP_FIELDS = ("server", "tool", "arguments", "outcome", "result")


def _wrong(where: str, kind: str, value: object) -> ValueError:
    """A malformed file's error (ValueError, as :mod:`app.data.export` raises for every malformed field)."""
    return ValueError(f"{where} must be {kind}, got {type(value).__name__}")


def steps_to_json(steps: list[ToolStepRecord]) -> list[dict[str, Any]]:
    """A reply's steps as JSON-ready objects (one per call, in the order they ran)."""
    return [asdict(step) for step in steps]


def steps_from_json(value: object, where: str) -> list[ToolStepRecord]:
    """A reply's steps read back from :func:`steps_to_json`'s form.

    Raises:
        ValueError: ``value`` is not a list of such objects; the message names the field (``where``, then
            ``[i].field``).
    """
    if not isinstance(value, list):
        raise _wrong(where, "a list", value)
    steps = []
    for index, item in enumerate(value):
        at = f"{where}[{index}]"
        if not isinstance(item, dict):
            raise _wrong(at, "an object", item)
        unknown = sorted(str(key)[:40] for key in set(item) - set(_STEP_FIELDS))
        if unknown:
            raise ValueError(f"{at} has unknown keys: {', '.join(unknown[:5])}")
        fields = {}
        for name in _STEP_FIELDS:
            text = item.get(name)
            if not isinstance(text, str):
                raise _wrong(f"{at}.{name}", "str", text)
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"{at}.{name} holds a character that is not valid text") from None
            fields[name] = text
        if fields["outcome"] not in OUTCOMES:
            raise ValueError(f"{at}.outcome must be one of {', '.join(OUTCOMES)}, got {fields['outcome'][:40]!r}")
        steps.append(ToolStepRecord(**fields))
    return steps
