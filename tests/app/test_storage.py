"""Tests for app/data/storage.py, records.py and migrations.py, on real SQLite files."""

from __future__ import annotations

import sqlite3
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.data.conversations import ConversationStore
from app.data.migrations import DEFAULT_PRESETS, SCHEMA_VERSION, migrate, schema_version
from app.data.records import DEFAULT_TITLE, MAX_TITLE_CHARS, make_title
from app.data.storage import Storage


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def storage(tmp_path: Path, clock: FakeClock) -> Iterator[Storage]:
    with Storage(tmp_path / "hearth.db", clock=clock) as opened:
        yield opened


# --- opening and round trips ----------------------------------------------------------------------


def test_open_sets_pragmas_and_latest_schema(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "hearth.db"
    with Storage(path) as storage:
        assert storage.schema_version == SCHEMA_VERSION
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        conn.close()


def test_conversations_and_messages_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "hearth.db"
    with Storage(path) as storage:
        conversation = storage.create_conversation("Trip plans", system_prompt="Be brief.")
        question = storage.add_message(conversation.id, "user", "Where to go?")
        reply = storage.add_message(
            conversation.id, "assistant", "Lisbon.", question.id,
            model="qwen", quantization="int8", num_prompt_tokens=12, num_generated_tokens=3,
            ttft_s=0.25, tok_s=41.5, finish_reason="stop",
        )  # fmt: skip
        storage.set_sampling(conversation.id, temperature=0.3, top_p=0.9, max_tokens=256)
        storage.set_model(conversation.id, "qwen")
    with Storage(path) as storage:
        [loaded] = storage.list_conversations()
        assert loaded.title == "Trip plans"
        assert loaded.system_prompt == "Be brief."
        assert (loaded.temperature, loaded.top_p, loaded.max_tokens, loaded.model) == (0.3, 0.9, 256, "qwen")
        assert loaded.active_leaf_id == reply.id
        assert storage.active_path(conversation.id) == [question, reply]
        assert storage.get_message(reply.id).tok_s == 41.5


def test_list_orders_by_last_update(storage: Storage, clock: FakeClock) -> None:
    first = storage.create_conversation("first")
    clock.advance(1)
    second = storage.create_conversation("second")
    clock.advance(1)
    storage.add_message(first.id, "user", "bump")
    assert [c.id for c in storage.list_conversations()] == [first.id, second.id]


def test_bad_input_raises_value_error(storage: Storage) -> None:
    conversation = storage.create_conversation()
    other = storage.create_conversation()
    foreign = storage.add_message(other.id, "user", "hi")
    with pytest.raises(ValueError, match="role"):
        storage.add_message(conversation.id, "robot", "beep")
    with pytest.raises(ValueError, match="another conversation"):
        storage.add_message(conversation.id, "assistant", "x", foreign.id)
    with pytest.raises(ValueError, match="no conversation"):
        storage.add_message(999, "user", "x")
    with pytest.raises(ValueError, match="no message"):
        storage.update_message(999, content="x")
    with pytest.raises(ValueError, match="top_p"):
        storage.set_sampling(conversation.id, 0.7, 1.5, None)
    with pytest.raises(ValueError, match="blank"):
        storage.rename_conversation(conversation.id, "   ")
    with pytest.raises(ValueError, match="tok_s"):
        storage.update_message(foreign.id, tok_s=-1.0)
    assert storage.messages(conversation.id) == []  # the failed writes left nothing behind


def test_streaming_updates_and_rename(storage: Storage) -> None:
    conversation = storage.create_conversation()
    question = storage.add_message(conversation.id, "user", "Tell me a story")
    reply = storage.add_message(conversation.id, "assistant", "", question.id, is_complete=False)
    assert not reply.is_complete
    storage.update_message(reply.id, content="Once")
    done = storage.update_message(
        reply.id, content="Once upon a time.", is_complete=True, num_generated_tokens=5, finish_reason="stop"
    )
    assert (done.content, done.is_complete, done.num_generated_tokens, done.finish_reason) == (
        "Once upon a time.", True, 5, "stop",
    )  # fmt: skip
    assert storage.rename_conversation(conversation.id, "  Story  time ").title == "Story time"


def test_auto_title(storage: Storage) -> None:
    conversation = storage.create_conversation()
    titled = storage.auto_title(
        conversation.id, "How do I   reverse a linked list in Python without recursion?"
    )
    assert titled.title == "How do I reverse a linked list in Python…"
    # a title already set (by the user or an earlier call) is kept
    assert storage.auto_title(conversation.id, "something else").title == titled.title
    assert storage.auto_title(storage.create_conversation().id, "   ").title == DEFAULT_TITLE


@given(st.text())
def test_make_title_is_short_and_taken_from_the_text(text: str) -> None:
    title = make_title(text)
    words = " ".join(text.split())
    if not words:
        assert title == DEFAULT_TITLE
    elif len(words) <= MAX_TITLE_CHARS:
        assert title == words
    else:
        assert title.endswith("…")
        assert len(title) <= MAX_TITLE_CHARS + 1
        assert words.startswith(title[:-1])


# --- branches -------------------------------------------------------------------------------------


def test_edit_and_regenerate_make_siblings(storage: Storage) -> None:
    conversation = storage.create_conversation()
    q1 = storage.add_message(conversation.id, "user", "What is 2+2?")
    a1 = storage.add_message(conversation.id, "assistant", "5", q1.id)
    # regenerate: a sibling reply under the same question becomes active
    a1b = storage.add_message(conversation.id, "assistant", "4", q1.id)
    assert [m.id for m in storage.children(q1.id)] == [a1.id, a1b.id]
    assert [m.content for m in storage.active_path(conversation.id)] == ["What is 2+2?", "4"]
    q2 = storage.add_message(conversation.id, "user", "And 3+3?", a1b.id)
    a2 = storage.add_message(conversation.id, "assistant", "6", q2.id)
    # edit the second question: a sibling of q2 with its own reply
    q2b = storage.add_message(conversation.id, "user", "And 3*3?", a1b.id)
    a2b = storage.add_message(conversation.id, "assistant", "9", q2b.id)
    assert [m.id for m in storage.siblings(q2.id)] == [q2.id, q2b.id]
    assert [m.id for m in storage.path_to(a2b.id)] == [q1.id, a1b.id, q2b.id, a2b.id]
    # edit the very first question: a second root
    q1b = storage.add_message(conversation.id, "user", "What is 2*2?")
    assert [m.id for m in storage.siblings(q1.id)] == [q1.id, q1b.id]
    assert storage.active_path(conversation.id) == [q1b]
    # switch back to the older branch of q2
    storage.set_active_leaf(conversation.id, storage.latest_leaf(q2.id).id)
    assert [m.content for m in storage.active_path(conversation.id)] == ["What is 2+2?", "4", "And 3+3?", "6"]
    assert storage.get_conversation(conversation.id).active_leaf_id == a2.id
    assert storage.latest_leaf(q1.id) == a2b  # newest reply at each step
    assert len(storage.messages(conversation.id)) == 8


def test_set_active_leaf_rejects_foreign_message(storage: Storage) -> None:
    conversation = storage.create_conversation()
    other = storage.create_conversation()
    foreign = storage.add_message(other.id, "user", "hi")
    with pytest.raises(ValueError, match="another conversation"):
        storage.set_active_leaf(conversation.id, foreign.id)
    with pytest.raises(ValueError, match="no message"):
        storage.path_to(12345)


# --- delete, undo, purge, search ------------------------------------------------------------------


def test_soft_delete_undo_and_purge(storage: Storage, clock: FakeClock) -> None:
    kept = storage.create_conversation("kept")
    doomed = storage.create_conversation("doomed")
    storage.add_message(doomed.id, "user", "bye")
    assert storage.delete_conversation(doomed.id).is_deleted
    assert [c.id for c in storage.list_conversations()] == [kept.id]
    assert len(storage.list_conversations(include_deleted=True)) == 2
    storage.undo_delete(doomed.id)
    assert len(storage.list_conversations()) == 2
    storage.delete_conversation(doomed.id)
    clock.advance(10)
    assert storage.purge_deleted(older_than_s=60) == 0
    clock.advance(60)
    assert storage.purge_deleted(older_than_s=60) == 1
    with pytest.raises(ValueError, match="no conversation"):
        storage.get_conversation(doomed.id)
    assert storage.messages(doomed.id) == []  # cascaded


def test_search_titles_and_messages(storage: Storage, clock: FakeClock) -> None:
    travel = storage.create_conversation("Holiday in Portugal")
    clock.advance(1)
    code = storage.create_conversation("Code help")
    question = storage.add_message(code.id, "user", "Why does my 100% CPU loop_forever hang?")
    storage.add_message(code.id, "assistant", "Because the Lisbon server never answers.", question.id)
    assert [(c.id, snippet) for c, snippet in storage.search("portugal")] == [(travel.id, travel.title)]
    [(found, snippet)] = storage.search("LISBON server")
    assert found.id == code.id and "Lisbon server" in snippet
    assert [c.id for c, _ in storage.search("100%")] == [code.id]  # LIKE wildcards are literal
    assert [c.id for c, _ in storage.search("100_")] == []
    assert [c.id for c, _ in storage.search("loop_forever")] == [code.id]
    assert [c.id for c, _ in storage.search("n")] == [code.id, travel.id]  # short: LIKE fallback
    storage.delete_conversation(code.id)
    assert storage.search("Lisbon") == []
    assert storage.search("  ") == []


def test_search_sees_streamed_updates(storage: Storage) -> None:
    conversation = storage.create_conversation()
    reply = storage.add_message(conversation.id, "assistant", "", is_complete=False)
    storage.update_message(reply.id, content="the word is xylophone")
    assert [c.id for c, _ in storage.search("xylophone")] == [conversation.id]
    storage.update_message(reply.id, content="changed my mind")
    assert storage.search("xylophone") == []


# --- presets --------------------------------------------------------------------------------------


def test_presets_crud(storage: Storage) -> None:
    assert [p.name for p in storage.list_presets()] == [name for name, _ in DEFAULT_PRESETS]
    pirate = storage.add_preset("Pirate", "Talk like a pirate.")
    with pytest.raises(ValueError, match="already exists"):
        storage.add_preset("Pirate", "again")
    conversation = storage.create_conversation(preset_id=pirate.id)
    assert conversation.system_prompt == "Talk like a pirate."
    renamed = storage.update_preset(pirate.id, name="Buccaneer")
    assert (renamed.name, renamed.system_prompt) == ("Buccaneer", "Talk like a pirate.")
    with pytest.raises(ValueError, match="already exists"):
        storage.update_preset(pirate.id, name="Concise")
    storage.delete_preset(pirate.id)
    assert "Buccaneer" not in [p.name for p in storage.list_presets()]
    kept = storage.get_conversation(conversation.id)
    assert (kept.preset_id, kept.system_prompt) == (None, "Talk like a pirate.")
    with pytest.raises(ValueError, match="no preset"):
        storage.delete_preset(pirate.id)


# --- transactions and threads ---------------------------------------------------------------------


def test_batch_rolls_back_everything_on_error(storage: Storage) -> None:
    with pytest.raises(RuntimeError), storage.batch():
        conversation = storage.create_conversation("half done")
        storage.add_message(conversation.id, "user", "hello")
        raise RuntimeError("boom")
    assert storage.list_conversations() == []


def test_writes_from_several_threads(storage: Storage) -> None:
    conversation = storage.create_conversation()
    errors: list[Exception] = []

    def write(worker: int) -> None:
        try:
            for index in range(25):
                storage.add_message(conversation.id, "user", f"{worker}-{index}")
        except Exception as error:  # noqa: BLE001  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=write, args=(worker,)) for worker in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(storage.messages(conversation.id)) == 100


# --- migrations -----------------------------------------------------------------------------------


def test_schema_1_database_is_migrated_with_rows_intact(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        assert migrate(conn, target=1) == 1
        conn.execute(
            "INSERT INTO conversations (id, title, created_at, updated_at, active_leaf_id) "
            "VALUES (1, 'Old chat', 1.0, 2.0, NULL)"
        )
        conn.execute(
            "INSERT INTO messages (id, conversation_id, parent_id, role, content, created_at) "
            "VALUES (1, 1, NULL, 'user', 'an ancient quasar question', 1.5)"
        )
        conn.execute("UPDATE conversations SET active_leaf_id = 1 WHERE id = 1")
        assert schema_version(conn) == 1
        assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'messages_fts'").fetchone() is None
    finally:
        conn.close()
    with Storage(path) as storage:
        assert storage.schema_version == SCHEMA_VERSION == 7
        [old] = storage.list_conversations()
        assert (old.title, old.created_at, old.active_leaf_id) == ("Old chat", 1.0, 1)
        assert [m.content for m in storage.active_path(old.id)] == ["an ancient quasar question"]
        assert len(storage.list_presets()) == len(DEFAULT_PRESETS)  # seeded once, by migration 1
        # rows written under schema 1 are in the new search index (when this SQLite has FTS5)
        assert [c.id for c, _ in storage.search("quasar")] == [old.id]
        assert storage.check_integrity() == []


def test_schema_6_database_gains_the_replies_left_out_context(tmp_path: Path) -> None:
    path = tmp_path / "six.db"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        assert migrate(conn, target=6) == 6
        conn.execute("INSERT INTO conversations (id, title, created_at, updated_at) VALUES (1, 'Chat', 1.0, 1.0)")
        conn.execute("INSERT INTO messages (id, conversation_id, parent_id, role, content, created_at) "
                     "VALUES (1, 1, NULL, 'user', 'hi', 1.0), (2, 1, 1, 'assistant', 'hello', 1.1)")
        conn.execute("UPDATE conversations SET active_leaf_id = 2 WHERE id = 1")
    finally:
        conn.close()
    with Storage(path) as storage:
        assert storage.schema_version == 7
        store = ConversationStore(storage)
        reply = store.get(1).messages[1]
        assert reply.content == "hello" and not (reply.stats or {}).get("num_dropped_messages")
        store.set_left_out(reply, 3, 512)
        with pytest.raises(ValueError, match="at least 1 message"):
            store.set_left_out(reply, 0, 512)
    with Storage(path) as storage:
        again = ConversationStore(storage).get(1).messages[1]
        assert again.stats == {"num_dropped_messages": 3, "context_length": 512}
        storage.delete_conversation(1)
        assert storage.purge_deleted() == 1
        assert storage._all("SELECT * FROM reply_context") == []  # gone with its reply


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    conn = sqlite3.connect(path)
    try:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    finally:
        conn.close()
    with pytest.raises(ValueError, match="newer"):
        Storage(path)


def test_a_new_database_and_its_folder_are_private(tmp_path: Path) -> None:
    """Nobody else on the machine can read the conversations: folder 0700, database (and WAL) 0600."""
    path = tmp_path / "fresh" / "conversations.db"
    store = Storage(path)
    try:
        store.create_conversation("secret")
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        for file in path.parent.iterdir():
            assert stat.S_IMODE(file.stat().st_mode) == 0o600, file.name
    finally:
        store.close()
