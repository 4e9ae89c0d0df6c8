"""Engine settings that take effect on a load say so while they differ from the model in use, and "Reload now"
loads it again with them (issue 31). On the fake engine, in the real window."""

from __future__ import annotations

from typing import Any

from PySide6.QtWidgets import QLabel, QSpinBox

from app.model.load_settings import PENDING_TITLE, TITLE
from tests.app import ui_flows
from tests.app.fake_engine import FakeLLM

TIMEOUT_MS = 5000


def test_a_setting_changed_since_the_load_says_so_until_the_reload(qtbot: Any, window: Any) -> None:
    pane = window.model_pane
    form = pane.load_settings_form
    section = pane.engine_section
    section.set_folded(False)
    note = ui_flows.child(window, QLabel, "reloadPendingLabel")
    batch = ui_flows.child(window, QSpinBox, "maxBatchSizeSpin")
    batch.setValue(3)
    assert not note.isVisible()  # nothing runs: every setting is for the next load anyway
    ui_flows.load_model(qtbot, window)
    assert FakeLLM.instances[-1].max_batch_size == 3
    assert not note.isVisible() and form.pending_text == ""

    batch.setValue(6)
    assert note.isVisible() and "Concurrent chats" in form.pending_text and "next load" in form.pending_text
    assert section._header.text() == PENDING_TITLE
    batch.setValue(3)  # back to what the model runs with
    assert not note.isVisible() and section._header.text() == TITLE
    form.set_overflow("stop")  # applies at once: no note
    assert not note.isVisible()
    batch.setValue(6)
    form.set_repeatable(not form.is_repeatable())
    assert form.pending == ["Concurrent chats", "Repeatable replies"]

    with qtbot.wait_signal(window.bridge.signals.model_loaded, timeout=TIMEOUT_MS):
        note.linkActivated.emit("reload")  # "Reload now"
    assert FakeLLM.instances[-1].max_batch_size == 6
    assert not note.isVisible() and form.pending_text == "" and section._header.text() == TITLE
    batch.setValue(2)
    assert note.isVisible()
    with qtbot.wait_signal(window.bridge.signals.model_unloaded, timeout=TIMEOUT_MS):
        window.bridge.unload_model()
    assert not note.isVisible()  # no model: nothing to reload
