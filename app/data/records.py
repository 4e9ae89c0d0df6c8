"""The rows of the conversation database as Python values: presets, conversations and messages.

Plain frozen dataclasses, with no SQL and no Qt; :class:`~app.data.storage.Storage` reads and writes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_TITLE = "New chat"
MAX_TITLE_CHARS = 40
ROLES = ("system", "user", "assistant")


@dataclass(slots=True, frozen=True)
class Preset:
    """A named system prompt the user can start a conversation from."""

    id: int
    name: str
    system_prompt: str
    created_at: float


@dataclass(slots=True, frozen=True)
class Conversation:
    """One chat. Sampling fields left ``None`` mean "use the app's default"."""

    id: int
    title: str
    created_at: float
    updated_at: float
    system_prompt: str | None
    preset_id: int | None
    temperature: float | None
    top_p: float | None
    max_tokens: int | None
    model: str | None
    deleted_at: float | None
    active_leaf_id: int | None
    #: "json" when replies must be a JSON document; None for free text.
    response_format: str | None = None
    #: The JSON schema replies must validate against (JSON text), or None for any JSON object.
    json_schema: str | None = None

    @property
    def is_deleted(self) -> bool:
        """Whether the conversation sits in the trash (soft-deleted, undoable)."""
        return self.deleted_at is not None


@dataclass(slots=True, frozen=True)
class Message:
    """One node of a conversation's message tree, with the generation metrics of a reply."""

    id: int
    conversation_id: int
    parent_id: int | None
    role: str
    content: str
    model: str | None
    quantization: str | None
    num_prompt_tokens: int | None
    num_generated_tokens: int | None
    ttft_s: float | None
    tok_s: float | None
    finish_reason: str | None
    created_at: float
    is_complete: bool


@dataclass(slots=True)
class MessageNode:
    """One message of a tree about to be written at once (an import), before it has an id.

    ``key`` names it in the tree (an imported file's own id); ``parent_key`` is its parent's key, None for a root.
    ``metadata`` holds the optional :class:`Message` fields (model, quantization, token counts, ttft_s, tok_s,
    finish_reason).
    """

    key: object
    parent_key: object
    role: str
    content: str
    created_at: float | None
    is_complete: bool
    metadata: dict[str, Any]


def make_title(text: str, max_chars: int = MAX_TITLE_CHARS) -> str:
    """Turn a first question into a short title, cut at a word boundary.

    Args:
        text: The user's first message.
        max_chars: The most characters kept before the ellipsis.

    Returns:
        The title, or :data:`DEFAULT_TITLE` when ``text`` is blank.
    """
    words = " ".join(text.split())
    if not words:
        return DEFAULT_TITLE
    if len(words) <= max_chars:
        return words
    head = words[: max_chars + 1]
    cut = head.rsplit(" ", 1)[0].rstrip(" ,.;:!?-") if " " in head else ""
    return (cut or words[:max_chars]) + "…"  # no usable word boundary: cut mid-word
