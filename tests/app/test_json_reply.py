"""A chat's "Reply as JSON" setting: the schema check, its storage round trip, the settings bar, and a restart."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QCheckBox, QPushButton, QToolButton

from app.bridge.remote_backend import sampling_body
from app.chat.json_schema import parse_schema
from app.chat.schema_dialog import SchemaDialog
from app.data.conversations import ConversationStore
from app.data.migrations import migrate
from app.data.storage import Storage
from app.window.main_window import MainWindow
from tests.app import ui_flows

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "country": {"enum": ["France", "Italy"]}},
    "required": ["city", "country"],
}


@pytest.mark.parametrize(("text", "message"), [
    ("{not json", "This is not valid JSON"),
    ("[1, 2]", "A schema must be a JSON object"),
    ('{"type": "banana"}', "Replies cannot follow this schema: Invalid type: banana"),
    ('{"$ref": "#/definitions/missing"}', "Replies cannot follow this schema"),
    ('{"allOf": [{"type": "string"}, {"type": "integer"}]}', "Unsatisfiable"),
])
def test_a_schema_that_cannot_be_used_is_refused_in_plain_words(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("$", r"\$")):
        parse_schema(text)


def test_blank_text_is_no_schema_and_a_good_schema_parses() -> None:
    assert parse_schema("  \n") is None
    assert parse_schema(json.dumps(SCHEMA)) == SCHEMA


def test_the_reply_format_survives_reopening_the_database(tmp_path: Path) -> None:
    path = tmp_path / "hearth.sqlite3"
    with Storage(path) as storage:
        store = ConversationStore(storage)
        chat, plain = store.create(), store.create()
        store.set_reply_format(chat, True, SCHEMA)
        assert chat.reply_format() == {"response_format": "json", "json_schema": SCHEMA}
    with Storage(path) as storage:
        store = ConversationStore(storage)
        again = store.get(chat.id)
        assert (again.is_json_reply, again.json_schema) == (True, SCHEMA)
        assert again.reply_format() == {"response_format": "json", "json_schema": SCHEMA}
        assert store.get(plain.id).reply_format() == {}
        store.set_reply_format(again, False, SCHEMA)  # off: replies are text, the schema is kept for later
        assert again.reply_format() == {}
    with Storage(path) as storage:
        again = ConversationStore(storage).get(chat.id)
        assert (again.is_json_reply, again.json_schema) == (False, SCHEMA)


def test_storage_refuses_a_schema_that_is_not_a_json_object(tmp_path: Path) -> None:
    with Storage(tmp_path / "hearth.sqlite3") as storage:
        conversation = storage.create_conversation()
        with pytest.raises(ValueError, match="JSON object"):
            storage.set_reply_format(conversation.id, "json", "[1]")
        with pytest.raises(ValueError, match="response_format"):
            storage.set_reply_format(conversation.id, "yaml")
        assert storage.set_reply_format(conversation.id, "json").response_format == "json"


def test_an_older_database_gains_the_setting_off(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        migrate(conn, target=2)
        conn.execute("INSERT INTO conversations (id, title, created_at, updated_at) VALUES (1, 'Old', 1.0, 2.0)")
    finally:
        conn.close()
    with Storage(path) as storage:
        old = ConversationStore(storage).get(1)
        assert (old.is_json_reply, old.json_schema, old.reply_format()) == (False, None, {})


def test_a_remote_server_gets_the_format_in_openai_shape() -> None:
    assert sampling_body({"response_format": "json"})["response_format"] == {"type": "json_object"}
    body = sampling_body({"response_format": "json", "json_schema": SCHEMA})
    assert body["response_format"] == {"type": "json_schema", "json_schema": {"name": "reply", "schema": SCHEMA}}
    assert "response_format" not in sampling_body({"temperature": 0.5})



def test_reply_as_json_with_a_schema_is_sent_and_kept_over_a_restart(
        qtbot: Any, open_window: Callable[[Path], MainWindow], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    window = open_window(tmp_path)
    pane = window.chat_pane
    check = ui_flows.child(window, QCheckBox, "jsonReplyCheck")
    assert not check.isChecked()
    qtbot.mouseClick(ui_flows.child(window, QToolButton, "jsonSchemaButton"), Qt.MouseButton.LeftButton)
    dialog = window.findChild(SchemaDialog, "schemaDialog")
    assert dialog is not None and dialog.isVisible()
    save = dialog.findChild(QPushButton, "saveSchemaButton")
    dialog.set_text('{"type": "object", "properties": ')  # pasted half
    assert "not valid JSON" in dialog.status_text and not save.isEnabled()
    dialog.set_text('{"type": "objekt"}')
    assert "Replies cannot follow this schema" in dialog.status_text and not save.isEnabled()
    dialog.set_text(json.dumps(SCHEMA))
    assert dialog.status_text == "The schema is valid." and save.isEnabled()
    qtbot.mouseClick(save, Qt.MouseButton.LeftButton)
    assert check.isChecked()  # saving a schema turns JSON replies on
    conversation = pane.current_conversation
    assert (conversation.is_json_reply, conversation.json_schema) == (True, SCHEMA)

    submitted: list[dict[str, Any]] = []
    real_submit = window.bridge.submit
    monkeypatch.setattr(window.bridge, "submit", lambda cid, messages, params=None: (
        submitted.append(dict(params)), real_submit(cid, messages, params))[1])
    ui_flows.load_model(qtbot, window)
    reply = ui_flows.send(qtbot, window, ui_flows.FRANCE_QUESTION)
    ui_flows.wait_finished(qtbot, reply, 8000)
    assert submitted[-1]["response_format"] == "json" and submitted[-1]["json_schema"] == SCHEMA
    chat_id = conversation.id
    other = pane.new_conversation()  # another chat keeps free text
    assert not check.isChecked() and pane.sampling_params(other).get("response_format") is None
    window.close()

    again = open_window(tmp_path)
    again.chat_pane.select_conversation(chat_id)
    assert ui_flows.child(again, QCheckBox, "jsonReplyCheck").isChecked()
    bar = again.chat_pane.settings_bar
    assert bar.schema == SCHEMA and "city, country" in ui_flows.child(again, QToolButton, "jsonSchemaButton").toolTip()
    ui_flows.child(again, QCheckBox, "jsonReplyCheck").setChecked(False)  # unticked: text again, schema kept
    reopened = again.chat_pane.current_conversation
    assert again.chat_pane.sampling_params(reopened).get("response_format") is None
    assert again.chat_pane.store.storage.get_conversation(chat_id).response_format is None
    assert reopened.json_schema == SCHEMA


def test_export_and_import_keep_the_reply_format(tmp_path: Path) -> None:
    from app.data import export

    with Storage(tmp_path / "hearth.sqlite3") as storage:
        store = ConversationStore(storage)
        chat = store.create()
        store.set_reply_format(chat, True, SCHEMA)
        data = json.loads(json.dumps(export.to_json(storage, chat.id)))
        assert data["hearth"]["reply_format"] == {"response_format": "json", "json_schema": SCHEMA}
        copy = store.get(export.from_json(storage, data).id)
        assert (copy.is_json_reply, copy.json_schema) == (True, SCHEMA)
        data["hearth"]["reply_format"] = {"response_format": "json", "json_schema": [1]}
        with pytest.raises(ValueError, match="hearth.reply_format.json_schema"):
            export.from_json(storage, data)


def test_a_cut_json_reply_is_not_continued(qtbot: Any, window: MainWindow) -> None:
    ui_flows.child(window, QCheckBox, "jsonReplyCheck").setChecked(True)
    ui_flows.set_generation(window, max_tokens=3)
    ui_flows.load_model(qtbot, window)
    reply = ui_flows.send(qtbot, window, ui_flows.FRANCE_QUESTION)
    ui_flows.wait_finished(qtbot, reply, 8000)
    assert reply.finish_reason == "length"
    with qtbot.wait_signal(window.chat_pane.notice, timeout=1000) as blocker:
        assert window.chat_pane.continue_reply() is None
    assert "cannot be continued" in blocker.args[0] and reply.finish_reason == "length"
