"""The database refusing writes, for real: a second connection holding the write lock (another Hearth), and a
full database (``PRAGMA max_page_count``, which raises SQLite's own SQLITE_FULL). The user is told in words what
happened and what to do, and nothing typed or streamed is lost."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.data import storage as storage_module
from app.data.storage_errors import FULL_TEXT, LOCKED_TEXT, storage_error_text
from tests.app import ui_flows

pytestmark = pytest.mark.gui


@pytest.fixture
def window(qtbot: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from app import create_window
    from app.bridge.engine_bridge import EngineBridge
    from tests.app.fake_engine import FakeLLM, make_fake_api

    monkeypatch.setattr(storage_module, "BUSY_TIMEOUT_MS", 200)  # a locked write gives up sooner than 5 s
    FakeLLM.instances.clear()
    win = create_window(data_dir=tmp_path, bridge=EngineBridge(api=make_fake_api(step_delay_s=0.01)))
    qtbot.add_widget(win)
    win.show()
    qtbot.wait_exposed(win)
    yield win
    FakeLLM.instances.clear()


@pytest.fixture
def other_instance(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    """A second connection to the window's database, as another Hearth would hold it."""
    conn = sqlite3.connect(tmp_path / "hearth.db", isolation_level=None, timeout=0.1)
    yield conn
    if conn.in_transaction:
        conn.execute("ROLLBACK")
    conn.close()


def composer_text(window: Any) -> str:
    return str(window.chat_pane._composer.text())


def stored_contents(window: Any) -> list[str]:
    return [row[0] for row in window.storage._conn.execute("SELECT content FROM messages ORDER BY id")]


def test_the_error_texts_say_what_happened_and_what_to_do(tmp_path: Path) -> None:
    locked = sqlite3.OperationalError("database is locked")
    locked.sqlite_errorcode = sqlite3.SQLITE_BUSY  # type: ignore[attr-defined]
    assert storage_error_text(locked) == LOCKED_TEXT and "another Hearth" in LOCKED_TEXT
    assert storage_error_text(OSError(28, "No space left on device")) == FULL_TEXT and "Free some" in FULL_TEXT
    assert storage_error_text(ValueError("x")) is None


def test_a_message_sent_while_another_hearth_holds_the_database(qtbot: Any, window: Any, dialogs: list[Any],
                                                              other_instance: sqlite3.Connection) -> None:
    ui_flows.load_model(qtbot, window)
    other_instance.execute("BEGIN IMMEDIATE")  # the other instance is writing
    other_instance.execute("UPDATE presets SET name = name")
    box = ui_flows.child(window, ui_flows.ChatInput, "chatInput")
    box.setFocus()
    qtbot.keyClicks(box, "Keep this question")
    qtbot.keyClick(box, ui_flows.Qt.Key.Key_Return)
    assert dialogs == [("Could not save", LOCKED_TEXT)]
    assert composer_text(window) == "Keep this question"  # nothing typed is lost
    assert window.chat_pane.current_conversation.messages == []
    other_instance.execute("ROLLBACK")  # the other Hearth is closed: sending again works
    qtbot.keyClick(box, ui_flows.Qt.Key.Key_Return)
    qtbot.wait_until(lambda: not window.chat_pane.current_conversation.is_streaming
                     and len(window.chat_pane.current_conversation.messages) == 2, timeout=10_000)
    assert composer_text(window) == ""
    assert stored_contents(window)[0] == "Keep this question"


def test_a_reply_that_ends_while_the_database_is_locked_is_saved_later(
        qtbot: Any, window: Any, dialogs: list[Any], other_instance: sqlite3.Connection) -> None:
    ui_flows.load_model(qtbot, window)
    window.replies._save_timer.setInterval(300)  # retries come sooner than every SAVE_INTERVAL_MS
    reply = ui_flows.send(qtbot, window, "Tell me a story")
    other_instance.execute("BEGIN IMMEDIATE")
    other_instance.execute("UPDATE presets SET name = name")
    ui_flows.wait_finished(qtbot, reply, 10_000)
    qtbot.wait_until(lambda: bool(dialogs), timeout=5_000)
    assert dialogs[0] == ("Could not save", LOCKED_TEXT)
    assert reply.content  # on screen all along
    other_instance.execute("ROLLBACK")
    row = (None, 0)

    def saved() -> bool:
        nonlocal row
        row = window.storage._conn.execute("SELECT content, is_complete FROM messages WHERE id = ?",
                                           (reply.id,)).fetchone()
        return bool(row[1])

    qtbot.wait_until(saved, timeout=10_000)
    assert row[0] == reply.content
    assert len(dialogs) == 1  # one dialog, not one per retry


def test_a_full_disk_is_explained_and_the_text_kept(qtbot: Any, window: Any, dialogs: list[Any]) -> None:
    ui_flows.load_model(qtbot, window)
    conn = window.storage._conn
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")  # the database cannot grow: SQLITE_FULL on the next page
    text = "a long question " * 2_000
    assert window.chat_pane.send(text) is None
    assert dialogs == [("Could not save", FULL_TEXT)]
    assert window.chat_pane.current_conversation.messages == []
    assert window.storage.check_integrity() == []
    conn.execute("PRAGMA max_page_count = 1073741823")  # space freed
    assert window.chat_pane.send(text) is not None
    assert stored_contents(window)[0] == text.strip()


def test_a_full_disk_during_an_import_is_the_import_failed_dialog(qtbot: Any, window: Any, dialogs: list[Any],
                                                                  tmp_path: Path) -> None:
    import json

    path = tmp_path / "chat.json"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "x" * 200_000}]}), encoding="utf-8")
    conn = window.storage._conn
    conn.execute(f"PRAGMA max_page_count = {conn.execute('PRAGMA page_count').fetchone()[0]}")
    before = len(window.store.list())
    with qtbot.wait_signal(window.import_finished, timeout=10_000) as finished:
        window.import_conversation(path)
    assert finished.args == [None]
    assert dialogs[0][0] == "Import failed" and FULL_TEXT in dialogs[0][1]
    assert len(window.store.list()) == before


def test_a_second_window_opens_while_the_first_is_writing(qtbot: Any, tmp_path: Path, dialogs: list[Any],
                                                          other_instance: sqlite3.Connection,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from app import create_window
    from app.bridge.engine_bridge import EngineBridge
    from tests.app.fake_engine import make_fake_api

    monkeypatch.setattr(storage_module, "BUSY_TIMEOUT_MS", 200)
    storage_module.Storage(tmp_path / "hearth.db").close()
    other_instance.execute("BEGIN IMMEDIATE")
    other_instance.execute("UPDATE presets SET name = name")
    win = create_window(data_dir=tmp_path, bridge=EngineBridge(api=make_fake_api()))  # no exception escapes
    qtbot.add_widget(win)
    qtbot.wait_until(lambda: bool(dialogs), timeout=5_000)
    assert dialogs == [("Could not save", LOCKED_TEXT)]
    assert win.chat_pane.current_conversation is None
    other_instance.execute("ROLLBACK")  # the other Hearth finished: a new chat can start
    assert win.chat_pane.new_conversation() is not None
