""""Reply as JSON" through the real app, the real engine and the default model: the reply follows the schema."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QCheckBox, QPushButton, QToolButton

from app.chat.schema_dialog import SchemaDialog
from app.data.conversations import STATUS_DONE, STATUS_STREAMING
from tests.app import ui_flows
from tests.app.test_real_model import ENGINE_MISSING, TIMEOUTS

pytestmark = [pytest.mark.slow, pytest.mark.skipif(ENGINE_MISSING is not None, reason=ENGINE_MISSING or "")]


class Place(BaseModel):
    model_config = ConfigDict(extra="forbid")

    city: str = Field(max_length=30)
    country: Literal["France", "Italy", "Spain", "Germany"]
    visitors_per_year: int = Field(ge=0)


def _wait(qtbot: Any, predicate: Any, timeout_ms: int) -> None:
    """Poll ``predicate`` every 100 ms (it reads one attribute) until it holds."""
    deadline = time.monotonic() + timeout_ms / 1000
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        qtbot.wait(100)


def test_a_json_chat_replies_with_a_document_that_validates(qtbot: Any, tmp_path: Path) -> None:
    from app import create_window

    win = create_window(data_dir=tmp_path)
    qtbot.add_widget(win)
    win.show()
    qtbot.wait_exposed(win)
    ui_flows.set_generation(win, temperature=0.0, max_tokens=80)
    qtbot.mouseClick(ui_flows.child(win, QToolButton, "jsonSchemaButton"), Qt.MouseButton.LeftButton)
    dialog = win.findChild(SchemaDialog, "schemaDialog")
    assert dialog is not None
    dialog.set_text(json.dumps(Place.model_json_schema()))
    qtbot.mouseClick(dialog.findChild(QPushButton, "saveSchemaButton"), Qt.MouseButton.LeftButton)
    assert ui_flows.child(win, QCheckBox, "jsonReplyCheck").isChecked()
    chat_id = win.chat_pane.current_conversation.id

    ui_flows.load_model(qtbot, win, timeouts=TIMEOUTS)
    reply = ui_flows.send(qtbot, win, "Where is the Eiffel Tower, and how many people visit it each year?")
    _wait(qtbot, lambda: reply.status != STATUS_STREAMING, TIMEOUTS.reply_ms)
    assert reply.status == STATUS_DONE and reply.finish_reason == "stop", (reply.error, reply.content)
    place = Place.model_validate_json(reply.content)  # raises unless the reply validates
    assert place.city
    win.close()

    again = create_window(data_dir=tmp_path)  # a restart: the chat is still a JSON chat, with its schema
    qtbot.add_widget(again)
    try:
        again.chat_pane.select_conversation(chat_id)
        assert ui_flows.child(again, QCheckBox, "jsonReplyCheck").isChecked()
        params = again.chat_pane.sampling_params(again.chat_pane.current_conversation)
        assert params["response_format"] == "json" and params["json_schema"] == Place.model_json_schema()
        assert again.chat_pane.current_conversation.messages[-1].content == reply.content
    finally:
        again.close()
