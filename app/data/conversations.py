"""Conversations as the chat pane sees them, kept in the SQLite database of :mod:`app.data.storage`.

No Qt and no engine here. :class:`ConversationStore` wraps :class:`~app.data.storage.Storage` and hands
out *live* :class:`Conversation` objects: the branch the user sees (``messages``, root first), whose
:class:`Message` objects the chat pane mutates while a reply streams. Every change that matters goes
to the database at once, except the text of a streaming reply, which the chat pane saves with
:meth:`ConversationStore.save_partial` every few seconds and :meth:`ConversationStore.finish_reply`
at the end.

Branches: editing a user message or regenerating a reply adds a sibling in the message tree (see
``app/data/storage.py``); :meth:`ConversationStore.switch_branch` shows another sibling.
"""

from __future__ import annotations

import builtins  # ConversationStore.list hides the builtin in its annotations
import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from app.data import records as db
from app.data.records import DEFAULT_TITLE, ROLES, make_title
from app.data.reply_context import LeftOut, conversation_left_out, set_left_out
from app.data.storage import Storage

__all__ = [
    "DEFAULT_TITLE", "ROLES", "STATUS_DONE", "STATUS_ERROR", "STATUS_STOPPED", "STATUS_STREAMING",
    "Conversation", "ConversationStore", "Message", "make_title",
]

#: Lifecycle of an assistant reply.
STATUS_DONE = "done"
STATUS_STREAMING = "streaming"
STATUS_STOPPED = "stopped"
STATUS_ERROR = "error"

#: ``finish_reason`` stored for a reply that failed (the database has no error column).
FINISH_ERROR = "error"
#: The instruction sent to a remote server after a reply cut off by its token limit (the local engine continues
#: the trailing assistant message itself, with no instruction).
CONTINUE_PROMPT = "Continue exactly where your previous reply stopped. Do not repeat anything."

_METRIC_KEYS = ("num_prompt_tokens", "num_generated_tokens", "ttft_s", "tok_s")
#: The stats keys of a reply whose chat was cut to fit the context: the messages left out, and the context (tokens)
#: they were left out of (the ``reply_context`` table keeps them).
LEFT_OUT_KEY = "num_dropped_messages"
CONTEXT_KEY = "context_length"


@dataclass(slots=True)
class Message:
    """One turn of the shown branch.

    Attributes:
        role: "system", "user" or "assistant".
        content: the message text (Markdown for assistant replies).
        status: one of the ``STATUS_*`` constants; user messages are always done.
        request_id: the bridge's request id while (and after) the reply streams.
        stats: the engine's metrics for a finished reply (ttft_s, tok_s, ...), else None.
        finish_reason: why the reply ended ("stop", "length", "abort"), else None.
        error: a readable message when ``status`` is ``STATUS_ERROR``.
        id: the message's row in the database (None only for messages never stored).
        parent_id: the message it answers (None for the first one).
        model, quantization: what wrote the reply.
        branch_index, branch_count: its place among its siblings (edits, regenerations).
    """

    role: str
    content: str = ""
    status: str = STATUS_DONE
    request_id: str | None = None
    stats: dict[str, Any] | None = None
    finish_reason: str | None = None
    error: str = ""
    id: int | None = None
    parent_id: int | None = None
    model: str | None = None
    quantization: str | None = None
    branch_index: int = 0
    branch_count: int = 1

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"unknown role {self.role!r}; expected one of {ROLES}")

    @property
    def is_streaming(self) -> bool:
        return self.status == STATUS_STREAMING

    @property
    def can_continue(self) -> bool:
        """Whether this is a reply cut off by its token limit."""
        return self.role == "assistant" and self.status == STATUS_DONE and self.finish_reason == "length"


@dataclass(slots=True)
class Conversation:
    """A conversation and the branch of it that is shown."""

    id: int
    title: str = DEFAULT_TITLE
    messages: list[Message] = field(default_factory=list)
    created_at: float = 0.0
    system_prompt: str | None = None
    preset_id: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    #: Replies must be a JSON document ("Reply as JSON"), and validate against ``json_schema`` when it is set.
    is_json_reply: bool = False
    json_schema: dict[str, Any] | None = None

    @property
    def is_streaming(self) -> bool:
        return any(m.is_streaming for m in self.messages)

    def index_of(self, message: Message) -> int:
        """The position of ``message`` (by identity) in the shown branch, or -1."""
        return next((i for i, m in enumerate(self.messages) if m is message), -1)

    def last_reply_index(self) -> int:
        """The position of the newest reply (assistant message) in the shown branch, or -1."""
        return next((i for i in range(len(self.messages) - 1, -1, -1) if self.messages[i].role == "assistant"), -1)

    def prompt_messages(self, upto: int | None = None) -> list[dict[str, str]]:
        """The history to send to the engine: the system prompt, then finished turns with text.

        Args:
            upto: only the messages before this index (None: all).
        """
        history = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return history + [
            {"role": m.role, "content": m.content}
            for m in self.messages[:upto]
            if m.status in (STATUS_DONE, STATUS_STOPPED) and m.content.strip()
        ]

    def sampling_overrides(self) -> dict[str, Any]:
        """The sampling parameters this conversation sets; the others come from the app's defaults."""
        values = {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens}
        return {name: value for name, value in values.items() if value is not None}

    def reply_format(self) -> dict[str, Any]:
        """The ``SamplingParams`` fields of the conversation's reply format (empty for free text)."""
        if not self.is_json_reply:
            return {}
        return {"response_format": "json", "json_schema": self.json_schema}


def _status(row: db.Message) -> tuple[str, str | None, str]:
    """Map a stored message to (status, finish_reason, error) for the view."""
    if row.finish_reason == FINISH_ERROR:
        return STATUS_ERROR, None, "The reply failed."
    if not row.is_complete:  # cut off by a crash or a close while streaming
        return STATUS_STOPPED, "abort", ""
    if row.finish_reason == "abort":
        return STATUS_STOPPED, "abort", ""
    return STATUS_DONE, row.finish_reason, ""


def _reply_format(record: db.Conversation) -> tuple[bool, dict[str, Any] | None]:
    """(is the reply JSON, its schema) from a stored conversation; a schema that no longer parses is dropped."""
    schema = None
    if record.json_schema is not None:
        try:
            schema = json.loads(record.json_schema)
        except ValueError:
            schema = None
    return record.response_format == "json", schema if isinstance(schema, dict) else None


def _message(row: db.Message, branch_index: int, branch_count: int,
             left_out: tuple[int, int] | None = None) -> Message:
    status, finish_reason, error = _status(row)
    stats: dict[str, Any] = {key: getattr(row, key) for key in _METRIC_KEYS if getattr(row, key) is not None}
    if left_out is not None:
        stats[LEFT_OUT_KEY], stats[CONTEXT_KEY] = left_out
    return Message(row.role, row.content, status, stats=stats or None, finish_reason=finish_reason,
                   error=error, id=row.id, parent_id=row.parent_id, model=row.model,
                   quantization=row.quantization, branch_index=branch_index, branch_count=branch_count)


class ConversationStore:
    """The conversations in one database, as live objects for the chat pane.

    Args:
        storage: the open database; the store does not close it.
    """

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._live: dict[int, Conversation] = {}

    # -- conversations ----------------------------------------------------------------------------

    def create(self, preset_id: int | None = None) -> Conversation:
        """Start an empty conversation, with the system prompt of ``preset_id`` if given."""
        return self._adopt(self.storage.create_conversation(preset_id=preset_id))

    def get(self, conversation_id: int) -> Conversation:
        """Return the live conversation; raises KeyError for an unknown or deleted id."""
        if conversation_id in self._live:
            return self._live[conversation_id]
        try:
            record = self.storage.get_conversation(conversation_id)
        except ValueError:
            raise KeyError(conversation_id) from None
        if record.is_deleted:
            raise KeyError(conversation_id)
        return self._adopt(record)

    def list(self) -> list[db.Conversation]:
        """Return the conversations not in the trash, most recently updated first."""
        return self.storage.list_conversations()

    def search(self, text: str) -> builtins.list[tuple[db.Conversation, str]]:
        """Conversations whose title or messages contain ``text``, with a snippet of the match."""
        return self.storage.search(text)

    def rename(self, conversation_id: int, title: str) -> None:
        """Rename; raises ValueError for a blank title."""
        record = self.storage.rename_conversation(conversation_id, title)
        if conversation_id in self._live:
            self._live[conversation_id].title = record.title

    def delete(self, conversation_id: int) -> None:
        """Move a conversation to the trash (see :meth:`undo_delete`)."""
        self.storage.delete_conversation(conversation_id)
        self._live.pop(conversation_id, None)

    def undo_delete(self, conversation_id: int) -> Conversation:
        """Bring a conversation back from the trash."""
        return self._adopt(self.storage.undo_delete(conversation_id))

    def purge_deleted(self) -> int:
        """Erase the conversations in the trash; returns how many."""
        return self.storage.purge_deleted()

    def set_system_prompt(self, conversation: Conversation, system_prompt: str | None,
                          preset_id: int | None) -> None:
        record = self.storage.set_system_prompt(conversation.id, system_prompt or None, preset_id)
        conversation.system_prompt, conversation.preset_id = record.system_prompt, record.preset_id

    def set_sampling(self, conversation: Conversation, temperature: float | None, top_p: float | None,
                     max_tokens: int | None) -> None:
        """Store the conversation's own sampling parameters; None means the app's default."""
        record = self.storage.set_sampling(conversation.id, temperature, top_p, max_tokens)
        conversation.temperature, conversation.top_p = record.temperature, record.top_p
        conversation.max_tokens = record.max_tokens

    def set_reply_format(self, conversation: Conversation, is_json: bool,
                         schema: dict[str, Any] | None = None) -> None:
        """Store whether replies are JSON, and the schema they must follow (None: any JSON object); the schema
        is kept while JSON is off."""
        text = json.dumps(schema) if schema is not None else None
        record = self.storage.set_reply_format(conversation.id, "json" if is_json else None, text)
        conversation.is_json_reply, conversation.json_schema = _reply_format(record)

    def reload(self, conversation: Conversation) -> None:
        """Re-read the shown branch from the database (after a branch switch)."""
        record = self.storage.get_conversation(conversation.id)
        conversation.messages = self._branch(record)

    # -- messages ---------------------------------------------------------------------------------

    def add_user(self, conversation: Conversation, text: str) -> Message:
        """Append a user message to the shown branch; the first one titles the conversation."""
        parent = conversation.messages[-1].id if conversation.messages else None
        row = self.storage.add_message(conversation.id, "user", text, parent)
        message = self._append(conversation, row)
        if not any(m.role == "user" for m in conversation.messages[:-1]):
            conversation.title = self.storage.auto_title(conversation.id, text).title
        return message

    def start_reply(self, conversation: Conversation, model: str | None = None,
                    quantization: str | None = None) -> Message:
        """Append an empty, streaming assistant reply (stored as incomplete)."""
        parent = conversation.messages[-1].id if conversation.messages else None
        row = self.storage.add_message(conversation.id, "assistant", "", parent, model=model,
                                       quantization=quantization, is_complete=False)
        message = self._append(conversation, row)
        message.status, message.finish_reason = STATUS_STREAMING, None
        return message

    def resume_reply(self, message: Message) -> None:
        """Mark a finished reply as streaming again (to continue it)."""
        message.status, message.finish_reason = STATUS_STREAMING, None
        if message.id is not None:
            self.storage.update_message(message.id, is_complete=False)

    def set_left_out(self, message: Message, num_dropped: int, context_length: int) -> None:
        """Note on a reply that its chat was cut to fit the context: ``num_dropped`` messages left out of
        ``context_length`` tokens (0: not known); kept with the reply, so its line shows after a restart too."""
        left_out = LeftOut(num_dropped, context_length).check()
        message.stats = {**(message.stats or {}), LEFT_OUT_KEY: num_dropped, CONTEXT_KEY: context_length}
        if message.id is not None:
            set_left_out(self.storage, message.id, left_out)

    def save_partial(self, message: Message) -> None:
        """Save the text a streaming reply has so far."""
        if message.id is not None:
            self.storage.update_message(message.id, content=message.content)

    def finish_reply(self, message: Message, finish_reason: str | None, metrics: dict[str, Any]) -> None:
        """Save a reply that ended (stop, length or abort) with its metrics."""
        stats = {key: metrics[key] for key in _METRIC_KEYS if metrics.get(key) is not None}
        if message.stats and "num_generated_tokens" in stats:  # a continued reply counts both parts
            stats["num_generated_tokens"] += message.stats.get("num_generated_tokens", 0)
        message.status = STATUS_STOPPED if finish_reason == "abort" else STATUS_DONE
        message.finish_reason = finish_reason
        message.stats = {**(message.stats or {}), **stats} or None
        if message.id is not None:
            self.storage.update_message(message.id, content=message.content, is_complete=True,
                                        finish_reason=finish_reason or None, **stats)

    def save_ended(self, message: Message) -> None:
        """Write an ended reply as it stands: again, after :meth:`finish_reply` or :meth:`fail_reply` could not
        save it (the live message was already updated)."""
        if message.id is None:
            return
        finish_reason = FINISH_ERROR if message.status == STATUS_ERROR else message.finish_reason
        stats = {key: value for key, value in (message.stats or {}).items() if key in _METRIC_KEYS}
        self.storage.update_message(message.id, content=message.content, is_complete=True,
                                    finish_reason=finish_reason or None, **stats)

    def fail_reply(self, message: Message, error: str) -> None:
        """Save a reply that could not be generated."""
        message.status, message.error = STATUS_ERROR, error
        if message.id is not None:
            self.storage.update_message(message.id, content=message.content, is_complete=True,
                                        finish_reason=FINISH_ERROR)

    def truncate(self, conversation: Conversation, index: int) -> None:
        """Show only the messages before ``index``; the next message added branches there."""
        del conversation.messages[index:]

    def switch_branch(self, conversation: Conversation, index: int, step: int) -> bool:
        """Show the sibling ``step`` places from message ``index`` (and that branch's newest leaf).

        Returns:
            Whether another branch is now shown.
        """
        message = conversation.messages[index]
        if message.id is None:
            return False
        siblings = self.storage.siblings(message.id)
        target = message.branch_index + step
        if not 0 <= target < len(siblings):
            return False
        leaf = self.storage.latest_leaf(siblings[target].id)
        self.storage.set_active_leaf(conversation.id, leaf.id)
        self.reload(conversation)
        return True

    # -- helpers ----------------------------------------------------------------------------------

    def _adopt(self, record: db.Conversation) -> Conversation:
        conversation = Conversation(
            id=record.id, title=record.title, created_at=record.created_at,
            system_prompt=record.system_prompt, preset_id=record.preset_id,
            temperature=record.temperature, top_p=record.top_p, max_tokens=record.max_tokens,
            messages=self._branch(record),
        )
        conversation.is_json_reply, conversation.json_schema = _reply_format(record)
        self._live[record.id] = conversation
        return conversation

    def _branch(self, record: db.Conversation) -> builtins.list[Message]:
        """The messages from the root to the active leaf, with their places among siblings."""
        if record.active_leaf_id is None:
            return []
        rows = self.storage.messages(record.id)
        by_id = {row.id: row for row in rows}
        left_out = conversation_left_out(self.storage, record.id)
        siblings: dict[int | None, list[int]] = defaultdict(list)
        for row in rows:
            siblings[row.parent_id].append(row.id)
        path: list[Message] = []
        node: db.Message | None = by_id.get(record.active_leaf_id)
        while node is not None:
            group = siblings[node.parent_id]
            path.append(_message(node, group.index(node.id), len(group), left_out.get(node.id)))
            node = by_id.get(node.parent_id) if node.parent_id is not None else None
        return path[::-1]

    def _append(self, conversation: Conversation, row: db.Message) -> Message:
        count = len(self.storage.siblings(row.id))
        message = _message(row, count - 1, count)
        conversation.messages.append(message)
        return message

    def __len__(self) -> int:
        return len(self.list())

    def __contains__(self, conversation_id: object) -> bool:
        if not isinstance(conversation_id, int):
            return False
        try:
            self.get(conversation_id)
        except KeyError:
            return False
        return True
