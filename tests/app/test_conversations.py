"""ConversationStore: live conversations written through to the SQLite storage. No Qt."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.data.conversations import (
    DEFAULT_TITLE,
    STATUS_DONE,
    STATUS_ERROR,
    STATUS_STOPPED,
    STATUS_STREAMING,
    ConversationStore,
    Message,
)
from app.data.storage import Storage


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ConversationStore]:
    storage = Storage(tmp_path / "hearth.db")
    yield ConversationStore(storage)
    storage.close()


def reopen(store: ConversationStore) -> ConversationStore:
    return ConversationStore(Storage(store.storage.path))


def test_create_list_delete_and_undo(store: ConversationStore) -> None:
    first = store.create()
    second = store.create()
    assert {c.id for c in store.list()} == {first.id, second.id} and len(store) == 2
    store.delete(first.id)
    assert first.id not in store and len(store) == 1
    with pytest.raises(KeyError):
        store.get(first.id)
    store.undo_delete(first.id)
    assert first.id in store
    store.delete(second.id)
    assert store.purge_deleted() == 1
    assert [c.id for c in reopen(store).list()] == [first.id]


def test_first_question_titles_the_conversation_and_rename(store: ConversationStore) -> None:
    conversation = store.create()
    assert conversation.title == DEFAULT_TITLE
    store.add_user(conversation, "  What is   the capital\nof France?  ")
    assert conversation.title == "What is the capital of France?"
    store.add_user(conversation, "something else")
    assert conversation.title == "What is the capital of France?"
    store.rename(conversation.id, "Geography")
    assert conversation.title == "Geography" and store.list()[0].title == "Geography"
    with pytest.raises(ValueError):
        store.rename(conversation.id, "  ")


def test_reply_is_saved_partially_then_finished_with_metrics(store: ConversationStore) -> None:
    conversation = store.create()
    store.add_user(conversation, "Hi")
    reply = store.start_reply(conversation, model="tiny", quantization="bfloat16")
    assert reply.status == STATUS_STREAMING and reply.finish_reason is None
    reply.content = "Hel"
    store.save_partial(reply)
    crashed = reopen(store).get(conversation.id).messages[-1]
    assert crashed.content == "Hel" and crashed.status == STATUS_STOPPED  # incomplete shows as stopped
    reply.content = "Hello!"
    store.finish_reply(reply, "stop", {"ttft_s": 0.1, "tok_s": 20.0, "num_prompt_tokens": 5,
                                       "num_generated_tokens": 3, "e2e_s": 0.3})
    row = store.storage.get_message(reply.id or 0)
    assert (row.content, row.is_complete, row.finish_reason) == ("Hello!", True, "stop")
    assert (row.model, row.quantization, row.ttft_s, row.tok_s, row.num_prompt_tokens,
            row.num_generated_tokens) == ("tiny", "bfloat16", 0.1, 20.0, 5, 3)
    again = reopen(store).get(conversation.id).messages[-1]
    assert again.status == STATUS_DONE and again.stats == {"ttft_s": 0.1, "tok_s": 20.0,
                                                           "num_prompt_tokens": 5, "num_generated_tokens": 3}


def test_failed_reply_is_kept_as_an_error(store: ConversationStore) -> None:
    conversation = store.create()
    store.add_user(conversation, "Hi")
    reply = store.start_reply(conversation)
    store.fail_reply(reply, "boom")
    assert reply.status == STATUS_ERROR and reply.error == "boom"
    assert reopen(store).get(conversation.id).messages[-1].status == STATUS_ERROR


def test_regenerate_and_edit_branch_and_switch(store: ConversationStore) -> None:
    conversation = store.create()
    store.add_user(conversation, "Q1")
    first = store.start_reply(conversation)
    first.content = "A1"
    store.finish_reply(first, "stop", {})
    store.truncate(conversation, 1)  # regenerate the reply
    second = store.start_reply(conversation)
    second.content = "A1 again"
    store.finish_reply(second, "stop", {})
    assert [m.content for m in conversation.messages] == ["Q1", "A1 again"]
    assert (second.branch_index, second.branch_count) == (1, 2)
    assert store.switch_branch(conversation, 1, -1)
    assert [m.content for m in conversation.messages] == ["Q1", "A1"]
    assert not store.switch_branch(conversation, 1, -1)
    store.truncate(conversation, 0)  # edit the question
    store.add_user(conversation, "Q2")
    reply = store.start_reply(conversation)
    reply.content = "A2"
    store.finish_reply(reply, "stop", {})
    assert conversation.messages[0].branch_count == 2
    assert store.switch_branch(conversation, 0, -1)  # back to Q1, and its newest reply
    assert [m.content for m in conversation.messages] == ["Q1", "A1 again"]
    restored = reopen(store).get(conversation.id)
    assert [m.content for m in restored.messages] == ["Q1", "A1 again"]
    assert [(m.branch_index, m.branch_count) for m in restored.messages] == [(0, 2), (1, 2)]


def test_continued_reply_adds_up_tokens(store: ConversationStore) -> None:
    conversation = store.create()
    store.add_user(conversation, "Q")
    reply = store.start_reply(conversation)
    reply.content = "part one"
    store.finish_reply(reply, "length", {"num_generated_tokens": 8, "tok_s": 10.0})
    assert reply.can_continue
    store.resume_reply(reply)
    assert reply.status == STATUS_STREAMING and not reply.can_continue
    reply.content += " and two"
    store.finish_reply(reply, "stop", {"num_generated_tokens": 4, "tok_s": 12.0})
    assert reply.stats == {"num_generated_tokens": 12, "tok_s": 12.0}
    assert store.storage.get_message(reply.id or 0).content == "part one and two"


def test_prompt_messages_have_the_system_prompt_and_skip_unfinished(store: ConversationStore) -> None:
    conversation = store.create(preset_id=store.storage.list_presets()[1].id)
    assert conversation.system_prompt and conversation.preset_id
    conversation.messages = [
        Message("user", "one"), Message("assistant", "partial", status=STATUS_STOPPED),
        Message("user", "two"), Message("assistant", "", status=STATUS_ERROR, error="boom"),
        Message("user", "three"), Message("assistant", "", status=STATUS_STREAMING),
    ]
    assert conversation.prompt_messages() == [
        {"role": "system", "content": conversation.system_prompt},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "partial"},
        {"role": "user", "content": "two"},
        {"role": "user", "content": "three"},
    ]
    assert conversation.prompt_messages(upto=1)[-1] == {"role": "user", "content": "one"}
    assert conversation.is_streaming


def test_sampling_overrides_and_system_prompt_persist(store: ConversationStore) -> None:
    conversation = store.create()
    assert conversation.sampling_overrides() == {}
    store.set_sampling(conversation, 0.0, None, 64)
    store.set_system_prompt(conversation, "Be terse.", None)
    restored = reopen(store).get(conversation.id)
    assert restored.sampling_overrides() == {"temperature": 0.0, "max_tokens": 64}
    assert restored.system_prompt == "Be terse." and restored.preset_id is None


def test_search_finds_message_text(store: ConversationStore) -> None:
    conversation = store.create()
    store.add_user(conversation, "Tell me about penguins")
    store.create()
    hits = store.search("penguin")
    assert [c.id for c, _ in hits] == [conversation.id]


def test_unknown_role_is_rejected() -> None:
    with pytest.raises(ValueError, match="role"):
        Message("robot")
