"""Tests for app/export.py: Markdown, JSON export, and import back into a fresh database."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.data.conversations import ConversationStore
from app.data.export import from_json, to_json, to_markdown
from app.data.records import Message
from app.data.reply_context import LeftOut, conversation_left_out, set_left_out
from app.data.storage import Storage


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[Storage]:
    with Storage(tmp_path / "hearth.db") as opened:
        yield opened


@pytest.fixture
def branched(storage: Storage) -> int:
    """A conversation with a regenerated reply and an edited question; the edited branch is shown."""
    conversation = storage.create_conversation("Arithmetic", system_prompt="You are a calculator.")
    storage.set_sampling(conversation.id, temperature=0.2, top_p=0.95, max_tokens=64)
    storage.set_model(conversation.id, "smollm2")
    q1 = storage.add_message(conversation.id, "user", "What is 2+2?")
    storage.add_message(conversation.id, "assistant", "5", q1.id, model="smollm2", tok_s=10.0)
    a1 = storage.add_message(
        conversation.id, "assistant", "4", q1.id,
        model="smollm2", quantization="int8", num_prompt_tokens=9, num_generated_tokens=1,
        ttft_s=0.125, tok_s=42.5, finish_reason="stop",
    )  # fmt: skip
    q2 = storage.add_message(conversation.id, "user", "And 3+3?", a1.id)
    storage.add_message(conversation.id, "assistant", "6", q2.id, model="smollm2")
    q2b = storage.add_message(conversation.id, "user", "And 3*3?", a1.id)
    storage.add_message(conversation.id, "assistant", "9, so far", q2b.id, model="smollm2", is_complete=False)
    return conversation.id


def _shape(messages: list[Message]) -> list[tuple[Any, ...]]:
    """Everything about a set of messages except the database ids, with parents as list positions."""
    position = {m.id: index for index, m in enumerate(messages)}
    return [
        (
            None if m.parent_id is None else position[m.parent_id],
            m.role,
            m.content,
            m.model,
            m.quantization,
            m.num_prompt_tokens,
            m.num_generated_tokens,
            m.ttft_s,
            m.tok_s,
            m.finish_reason,
            m.created_at,
            m.is_complete,
        )
        for m in messages
    ]


def test_markdown_shows_the_active_branch_with_metadata(storage: Storage, branched: int) -> None:
    text = to_markdown(storage, branched)
    assert text.startswith("# Arithmetic\n")
    assert "## System prompt\n\nYou are a calculator." in text
    assert "## User\n\nWhat is 2+2?" in text
    assert "## Assistant\n\n4\n\n*model smollm2 (int8) · 42.5 tok/s · TTFT 0.12 s · 1 tokens*" in text
    assert "And 3*3?" in text and "And 3+3?" not in text and "\n5\n" not in text
    assert "incomplete" in text


def test_json_is_openai_messages_plus_hearth_section(storage: Storage, branched: int) -> None:
    data = to_json(storage, branched)
    assert data["messages"] == [
        {"role": "system", "content": "You are a calculator."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3*3?"},
        {"role": "assistant", "content": "9, so far"},
    ]
    hearth = data["hearth"]
    assert hearth["title"] == "Arithmetic"
    assert hearth["sampling"] == {"temperature": 0.2, "top_p": 0.95, "max_tokens": 64, "model": "smollm2"}
    assert len(hearth["tree"]) == 7
    assert json.loads(json.dumps(data)) == data  # plain JSON types only


def test_export_import_round_trip_keeps_branches(storage: Storage, branched: int, tmp_path: Path) -> None:
    data = json.loads(json.dumps(to_json(storage, branched)))
    with Storage(tmp_path / "other.db") as other:
        imported = from_json(other, data)
        original = storage.get_conversation(branched)
        for name in ("title", "system_prompt", "created_at", "temperature", "top_p", "max_tokens", "model"):
            assert getattr(imported, name) == getattr(original, name), name
        assert _shape(other.messages(imported.id)) == _shape(storage.messages(branched))
        assert _shape(other.active_path(imported.id)) == _shape(storage.active_path(branched))
        assert to_markdown(other, imported.id) == to_markdown(storage, branched)
        # the other branches came along: switch to the first reply to "What is 2+2?"
        root = other.active_path(imported.id)[0]
        first_reply = other.children(root.id)[0]
        other.set_active_leaf(imported.id, first_reply.id)
        assert [m.content for m in other.active_path(imported.id)] == ["What is 2+2?", "5"]


def test_import_tolerates_any_node_order(storage: Storage, branched: int) -> None:
    data = to_json(storage, branched)
    data["hearth"]["tree"].reverse()
    imported = from_json(storage, data)
    assert _shape(storage.active_path(imported.id)) == _shape(storage.active_path(branched))
    assert len(storage.messages(imported.id)) == 7


def test_plain_openai_messages_import_as_one_branch(storage: Storage) -> None:
    imported = from_json(
        storage,
        {
            "messages": [
                {"role": "system", "content": "Be nice."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"},
            ]
        },
    )
    assert imported.system_prompt == "Be nice."
    assert [(m.role, m.content) for m in storage.active_path(imported.id)] == [
        ("user", "Hi"),
        ("assistant", "Hello!"),
    ]


def test_left_out_counts_travel_with_their_replies_on_every_branch(
    storage: Storage, branched: int, tmp_path: Path
) -> None:
    """A reply whose chat was cut to fit the context keeps its line through export and import: the JSON carries it
    with its message on every branch, the Markdown says it as the chat does."""
    from app.chat.message_extras import left_out_note  # the words the chat shows

    by_content = {m.content: m for m in storage.messages(branched)}
    set_left_out(storage, by_content["5"].id or 0, LeftOut(2, 512))  # on the branch not shown
    set_left_out(storage, by_content["9, so far"].id or 0, LeftOut(1, 0))
    data = json.loads(json.dumps(to_json(storage, branched)))
    carried = {entry["content"]: entry.get("left_out") for entry in data["hearth"]["tree"]}
    assert carried["5"] == {"num_dropped_messages": 2, "context_length": 512}
    assert carried["9, so far"] == {"num_dropped_messages": 1, "context_length": 0}
    assert carried["4"] is None and carried["6"] is None

    text = to_markdown(storage, branched)
    line = left_out_note({"num_dropped_messages": 1, "context_length": 0})
    assert line == "1 earlier turn is left out (to fit the context)"
    assert f"## Assistant\n\n*{line}*\n\n9, so far" in text
    assert "earlier turns are" not in text  # the cut reply on the other branch is not shown

    with Storage(tmp_path / "other.db") as other:
        imported = from_json(other, data)
        restored = {m.content: conversation_left_out(other, imported.id).get(m.id or 0)
                    for m in other.messages(imported.id)}
        assert restored == {"What is 2+2?": None, "5": LeftOut(2, 512), "4": None, "And 3+3?": None, "6": None,
                            "And 3*3?": None, "9, so far": LeftOut(1, 0)}
        assert to_markdown(other, imported.id) == text
        root = other.active_path(imported.id)[0]
        other.set_active_leaf(imported.id, other.children(root.id)[0].id)  # show the reply "5"
        shown = ConversationStore(other).get(imported.id).messages[-1]
        assert (shown.content, left_out_note(shown.stats)) == ("5", "2 earlier turns are left out (context 512 tokens)")
        assert "*2 earlier turns are left out (context 512 tokens)*\n\n5" in to_markdown(other, imported.id)


def _broken(data: dict[str, Any], change: str) -> dict[str, Any]:
    bad = copy.deepcopy(data)
    hearth, tree = bad["hearth"], bad["hearth"]["tree"]
    if change == "cycle":
        tree[0]["parent_id"] = tree[-1]["id"]
    elif change == "unknown parent":
        tree[2]["parent_id"] = 9999
    elif change == "duplicate id":
        tree[1]["id"] = tree[0]["id"]
    elif change == "bad role":
        tree[1]["role"] = "wizard"
    elif change == "content not text":
        tree[1]["content"] = 42
    elif change == "bad metric":
        tree[1]["metadata"]["tok_s"] = "fast"
    elif change == "negative metric":
        tree[1]["metadata"]["num_generated_tokens"] = -3
    elif change == "unknown metadata":
        tree[1]["metadata"]["colour"] = "blue"
    elif change == "active leaf missing":
        hearth["active_leaf_id"] = 9999
    elif change == "bad sampling":
        hearth["sampling"]["top_p"] = 7.0
    elif change == "blank title":
        hearth["title"] = "  "
    elif change == "left out not counted":
        tree[1]["left_out"] = {"context_length": 512}
    elif change == "left out none":
        tree[1]["left_out"] = {"num_dropped_messages": 0, "context_length": 512}
    elif change == "left out negative context":
        tree[1]["left_out"] = {"num_dropped_messages": 2, "context_length": -1}
    elif change == "future format":
        hearth["format_version"] = 99
    return bad


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("cycle", "cycle"),
        ("unknown parent", "unknown parent_id 9999"),
        ("duplicate id", "appears twice"),
        ("bad role", r"hearth.tree\[1\].role"),
        ("content not text", r"hearth.tree\[1\].content must be str"),
        ("bad metric", r"metadata.tok_s"),
        ("negative metric", r"num_generated_tokens must be >= 0"),
        ("unknown metadata", "unknown keys: colour"),
        ("active leaf missing", "active_leaf_id 9999"),
        ("bad sampling", "top_p"),
        ("blank title", "title"),
        ("future format", "format_version 99"),
        ("left out not counted", r"hearth.tree\[1\].left_out.num_dropped_messages must be int"),
        ("left out none", r"hearth.tree\[1\].left_out.num_dropped_messages must be at least 1"),
        ("left out negative context", r"hearth.tree\[1\].left_out.context_length must not be negative"),
    ],
)
def test_bad_hearth_section_raises_value_error_and_writes_nothing(
    storage: Storage, branched: int, change: str, message: str
) -> None:
    data = _broken(to_json(storage, branched), change)
    before = storage.list_conversations()
    with pytest.raises(ValueError, match=message):
        from_json(storage, data)
    assert storage.list_conversations() == before


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "imported JSON must be"),
        ("not a dict", "imported JSON must be"),
        ({}, "messages must be list"),
        ({"messages": [{"role": "user"}]}, r"messages\[0\].content"),
        ({"messages": ["hi"]}, r"messages\[0\] must be dict"),
        ({"messages": [{"role": "bot", "content": "x"}]}, r"messages\[0\].role must be one of"),
        ({"messages": [], "hearth": "yes"}, "hearth must be dict"),
        ({"messages": [], "hearth": {"format_version": True}}, "format_version must be int"),
    ],
)
def test_malformed_json_raises_value_error(storage: Storage, data: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        from_json(storage, data)
    assert storage.list_conversations() == []
