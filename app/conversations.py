"""Conversations and their messages, kept in memory.

Plain Python on purpose: no Qt and no engine, so a SQLite-backed store can replace
:class:`ConversationStore` later without touching the widgets that read it.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

#: Message roles the engine understands.
ROLES = ("system", "user", "assistant")

#: Lifecycle of an assistant reply.
STATUS_DONE = "done"
STATUS_STREAMING = "streaming"
STATUS_STOPPED = "stopped"
STATUS_ERROR = "error"

DEFAULT_TITLE = "New chat"
_TITLE_MAX_CHARS = 40


@dataclass(slots=True)
class Message:
    """One turn of a conversation.

    Attributes:
        role: "system", "user" or "assistant".
        content: the message text (Markdown for assistant replies).
        status: one of the ``STATUS_*`` constants; user messages are always done.
        request_id: the bridge's request id while (and after) the reply streams.
        stats: the engine's metrics for a finished reply (ttft_s, tok_s, ...), else None.
        finish_reason: why the reply ended ("stop", "length", "abort"), else None.
        error: a readable message when ``status`` is ``STATUS_ERROR``.
    """

    role: str
    content: str = ""
    status: str = STATUS_DONE
    request_id: str | None = None
    stats: dict[str, Any] | None = None
    finish_reason: str | None = None
    error: str = ""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"unknown role {self.role!r}; expected one of {ROLES}")

    @property
    def is_streaming(self) -> bool:
        return self.status == STATUS_STREAMING


@dataclass(slots=True)
class Conversation:
    """An ordered list of messages with an id and a title."""

    id: str
    title: str = DEFAULT_TITLE
    messages: list[Message] = field(default_factory=list)
    created_at: float = field(default_factory=time.time)

    def add(self, role: str, content: str = "", **kwargs: Any) -> Message:
        """Append a message and return it; the first user message names an untitled conversation."""
        message = Message(role, content, **kwargs)
        self.messages.append(message)
        if role == "user" and self.title == DEFAULT_TITLE and content.strip():
            self.title = make_title(content)
        return message

    def find_request(self, request_id: str) -> Message | None:
        """Return the message whose reply has ``request_id``, if any."""
        for message in reversed(self.messages):
            if message.request_id == request_id:
                return message
        return None

    @property
    def is_streaming(self) -> bool:
        return any(m.is_streaming for m in self.messages)

    def prompt_messages(self) -> list[dict[str, str]]:
        """Return the history to send to the engine: finished turns with text, as role/content dicts."""
        return [
            {"role": m.role, "content": m.content}
            for m in self.messages
            if m.status in (STATUS_DONE, STATUS_STOPPED) and m.content.strip()
        ]


def make_title(text: str) -> str:
    """Turn a first user message into a one-line title."""
    line = " ".join(text.split())
    if len(line) <= _TITLE_MAX_CHARS:
        return line
    return line[: _TITLE_MAX_CHARS - 1].rstrip() + "…"


class ConversationStore:
    """All conversations of a session, newest first."""

    def __init__(self) -> None:
        self._conversations: dict[str, Conversation] = {}
        self._ids = itertools.count(1)

    def create(self, title: str = DEFAULT_TITLE) -> Conversation:
        conversation = Conversation(id=f"c{next(self._ids)}", title=title)
        self._conversations[conversation.id] = conversation
        return conversation

    def get(self, conversation_id: str) -> Conversation:
        """Return a conversation; raises KeyError for an unknown id."""
        return self._conversations[conversation_id]

    def delete(self, conversation_id: str) -> None:
        self._conversations.pop(conversation_id, None)

    def list(self) -> list[Conversation]:
        """Return all conversations, newest first."""
        return sorted(self._conversations.values(), key=lambda c: c.created_at, reverse=True)

    def find_request(self, request_id: str) -> tuple[Conversation, Message] | None:
        """Return the conversation and message that a request id belongs to."""
        for conversation in self._conversations.values():
            message = conversation.find_request(request_id)
            if message is not None:
                return conversation, message
        return None

    def __len__(self) -> int:
        return len(self._conversations)

    def __contains__(self, conversation_id: object) -> bool:
        return conversation_id in self._conversations
