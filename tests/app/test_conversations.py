from __future__ import annotations

import pytest

from app.conversations import (
    DEFAULT_TITLE,
    STATUS_ERROR,
    STATUS_STOPPED,
    STATUS_STREAMING,
    ConversationStore,
    Message,
    make_title,
)


def test_store_creates_lists_newest_first_and_deletes() -> None:
    store = ConversationStore()
    first = store.create()
    second = store.create()
    second.created_at = first.created_at + 1
    assert [c.id for c in store.list()] == [second.id, first.id]
    store.delete(first.id)
    assert first.id not in store and len(store) == 1
    with pytest.raises(KeyError):
        store.get(first.id)


def test_first_user_message_names_the_conversation() -> None:
    conversation = ConversationStore().create()
    assert conversation.title == DEFAULT_TITLE
    conversation.add("user", "  What is   the capital\nof France?  ")
    assert conversation.title == "What is the capital of France?"
    conversation.add("user", "something else")
    assert conversation.title == "What is the capital of France?"


def test_make_title_shortens_long_text() -> None:
    title = make_title("word " * 40)
    assert len(title) <= 40 and title.endswith("…")


def test_prompt_messages_skip_streaming_and_failed_replies() -> None:
    conversation = ConversationStore().create()
    conversation.add("user", "one")
    conversation.add("assistant", "partial", status=STATUS_STOPPED)
    conversation.add("user", "two")
    conversation.add("assistant", "", status=STATUS_ERROR, error="boom")
    conversation.add("user", "three")
    conversation.add("assistant", "", status=STATUS_STREAMING, request_id="r1")
    assert conversation.prompt_messages() == [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "partial"},
        {"role": "user", "content": "two"},
        {"role": "user", "content": "three"},
    ]
    assert conversation.is_streaming


def test_find_request() -> None:
    store = ConversationStore()
    conversation = store.create()
    reply = conversation.add("assistant", request_id="r7")
    assert store.find_request("r7") == (conversation, reply)
    assert store.find_request("nope") is None


def test_unknown_role_is_rejected() -> None:
    with pytest.raises(ValueError, match="role"):
        Message("robot")
