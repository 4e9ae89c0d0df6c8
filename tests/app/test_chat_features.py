"""Chat features on the fake engine: saving, branches, continue, copy, list, presets, export, restart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QAction, QGuiApplication, QPalette, QTextCursor
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDockWidget,
    QDoubleSpinBox,
    QFileDialog,
    QLineEdit,
    QListWidget,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
)

from app.chat import reply_controller
from app.chat.preset_dialog import PresetDialog
from app.data import export
from app.data.conversations import STATUS_DONE, STATUS_STREAMING
from app.window.main_window import MainWindow
from app.window.theme import apply_theme
from tests.app import ui_flows
from tests.app.fake_engine import FRANCE_REPLY, FakeLLM

TIMEOUT_MS = 8000



def ask(qtbot: Any, win: MainWindow, text: str) -> Any:
    """Send ``text`` and wait for the whole reply."""
    reply = ui_flows.send(qtbot, win, text)
    ui_flows.wait_finished(qtbot, reply, TIMEOUT_MS)
    return reply


def click_action(win: MainWindow, href: str) -> None:
    """Click a link under a message, as the view reports it."""
    index = int(href.split("/")[1])
    assert href in win.chat_pane.view.hrefs(index), win.chat_pane.view.hrefs(index)
    win.chat_pane.view.anchorClicked.emit(QUrl(href))


def test_reply_is_saved_while_streaming_and_when_it_ends(qtbot: Any, open_window: Any, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reply_controller, "SAVE_INTERVAL_MS", 100)
    win = open_window(tmp_path)
    ui_flows.set_generation(win, max_tokens=2000)  # the whole long reply
    ui_flows.load_model(qtbot, win)
    reply = ui_flows.send(qtbot, win, ui_flows.LONG_PROMPT)
    storage = win.storage
    qtbot.wait_until(lambda: len(storage.get_message(reply.id).content) > 20, timeout=TIMEOUT_MS)
    row = storage.get_message(reply.id)
    assert reply.status == STATUS_STREAMING and not row.is_complete
    assert reply.content.startswith(row.content)
    ui_flows.wait_finished(qtbot, reply, TIMEOUT_MS)
    row = storage.get_message(reply.id)
    assert row.is_complete and row.content == reply.content and row.finish_reason == "stop"
    assert (row.model, row.quantization) == ("fake-smollm", "int8")  # the level it ran at, not the dtype
    assert row.num_prompt_tokens == 12 and row.num_generated_tokens and row.tok_s and row.ttft_s is not None
    question = storage.get_message(row.parent_id)
    assert (question.role, question.content) == ("user", ui_flows.LONG_PROMPT)


def test_regenerate_edit_and_switch_branches(qtbot: Any, window: MainWindow) -> None:
    ui_flows.load_model(qtbot, window)
    pane = window.chat_pane
    first = ask(qtbot, window, ui_flows.FRANCE_QUESTION)
    assert "hearth:prev/1" not in pane.view.hrefs(1)  # one version: no switcher
    click_action(window, "hearth:regenerate/1")
    conversation = pane.current_conversation
    second = conversation.messages[1]
    assert second is not first and second.status == STATUS_STREAMING
    ui_flows.wait_finished(qtbot, second, TIMEOUT_MS)
    assert "2/2" in pane.view.message_text(1)
    click_action(window, "hearth:prev/1")
    assert conversation.messages[1].id == first.id and "1/2" in pane.view.message_text(1)
    click_action(window, "hearth:next/1")
    assert conversation.messages[1].id == second.id

    click_action(window, "hearth:edit/0")
    box = ui_flows.child(window, ui_flows.ChatInput, "chatInput")
    assert box.toPlainText() == ui_flows.FRANCE_QUESTION and pane.is_editing
    box.clear()
    qtbot.keyClicks(box, "Tell me a story")
    qtbot.keyClick(box, Qt.Key.Key_Return)
    assert [m.content for m in conversation.messages[:1]] == ["Tell me a story"]
    ui_flows.wait_finished(qtbot, conversation.messages[1], TIMEOUT_MS)
    assert conversation.messages[1].content.startswith("Here is a longer answer")
    assert "2/2" in pane.view.message_text(0)
    click_action(window, "hearth:prev/0")
    assert [m.id for m in conversation.messages] == [first.parent_id, second.id]  # its newest reply
    assert len(window.storage.messages(conversation.id)) == 5


def test_continue_a_reply_cut_at_max_tokens(qtbot: Any, window: MainWindow) -> None:
    ui_flows.set_generation(window, max_tokens=5)
    ui_flows.load_model(qtbot, window)
    reply = ask(qtbot, window, ui_flows.FRANCE_QUESTION)
    assert reply.finish_reason == "length" and "token limit" in window.chat_pane.view.message_text(1)
    partial = reply.content
    ui_flows.set_generation(window, max_tokens=2000)
    click_action(window, "hearth:continue/1")
    assert reply.status == STATUS_STREAMING
    ui_flows.wait_finished(qtbot, reply, TIMEOUT_MS)
    conversation = window.chat_pane.current_conversation
    assert len(conversation.messages) == 2 and conversation.messages[1] is reply
    assert reply.content.startswith(partial) and len(reply.content) > len(partial)
    assert reply.finish_reason == "stop" and "hearth:continue/1" not in window.chat_pane.view.hrefs(1)
    # The engine got the partial reply as the last message, to continue it exactly (no extra instruction).
    sent = FakeLLM.instances[-1].engine.submitted[-1]
    assert sent == [{"role": "user", "content": ui_flows.FRANCE_QUESTION}, {"role": "assistant", "content": partial}]
    assert reply.content == FRANCE_REPLY
    row = window.storage.get_message(reply.id)
    assert row.content == reply.content and row.num_generated_tokens == reply.stats["num_generated_tokens"]


def test_copy_message_and_code_block(qtbot: Any, window: MainWindow) -> None:
    ui_flows.set_generation(window, max_tokens=2000)
    ui_flows.load_model(qtbot, window)
    reply = ask(qtbot, window, ui_flows.LONG_PROMPT)
    view = window.chat_pane.view
    assert "hearth:copy-code/1/0" in view.hrefs(1)
    # Click the "Copy code" link with the mouse.
    document = view.document()
    found = document.find("Copy code")
    assert not found.isNull()
    cursor = QTextCursor(document)
    cursor.setPosition(found.selectionStart() + 2)
    view.setTextCursor(cursor)
    view.ensureCursorVisible()
    QGuiApplication.clipboard().clear()
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=view.cursorRect(cursor).center())
    assert QGuiApplication.clipboard().text() == 'def greet(name):\n    return f"Hello, {name}!"  # friendly'
    click_action(window, "hearth:copy/1")
    assert QGuiApplication.clipboard().text() == reply.content
    click_action(window, "hearth:copy/0")
    assert QGuiApplication.clipboard().text() == ui_flows.LONG_PROMPT


def test_rename_search_delete_and_undo(qtbot: Any, window: MainWindow) -> None:
    ui_flows.load_model(qtbot, window)
    pane = window.chat_pane
    ask(qtbot, window, ui_flows.FRANCE_QUESTION)
    france = pane.current_conversation
    assert france.title == ui_flows.FRANCE_QUESTION  # auto-titled
    qtbot.mouseClick(ui_flows.child(window, QPushButton, "newChatButton"), Qt.MouseButton.LeftButton)
    ask(qtbot, window, "Tell me about penguins")
    listing = ui_flows.child(window, QListWidget, "conversationList")
    assert listing.count() == 2

    pane.sidebar.item_for(france.id).setText("Geography")  # what the in-place editor does
    assert window.storage.get_conversation(france.id).title == "Geography"

    search = ui_flows.child(window, QLineEdit, "conversationSearch")
    qtbot.keyClicks(search, "Paris")
    qtbot.wait_until(lambda: listing.count() == 1, timeout=2000)
    assert listing.item(0).text().startswith("Geography") and "Paris" in listing.item(0).text()
    search.clear()
    qtbot.wait_until(lambda: listing.count() == 2, timeout=2000)

    pane.select_conversation(france.id)
    qtbot.mouseClick(ui_flows.child(window, QPushButton, "deleteChatButton"), Qt.MouseButton.LeftButton)
    assert listing.count() == 1 and pane.current_conversation.id != france.id
    undo = ui_flows.child(window, QPushButton, "undoDeleteButton")
    assert undo.isVisible()
    qtbot.mouseClick(undo, Qt.MouseButton.LeftButton)
    assert listing.count() == 2 and pane.current_conversation.id == france.id
    assert pane.view.message_count == 2 and not undo.isVisible()


def test_presets_and_sampling_per_conversation(qtbot: Any, window: MainWindow,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    ui_flows.load_model(qtbot, window)
    submitted: list[tuple[list[dict[str, str]], dict[str, Any]]] = []
    real_submit = window.bridge.submit

    def spy(conversation_id: str, messages: Any, params: Any = None) -> str:
        submitted.append((messages, dict(params)))
        return real_submit(conversation_id, messages, params)

    monkeypatch.setattr(window.bridge, "submit", spy)
    pane = window.chat_pane
    # Add a preset in the dialog.
    qtbot.mouseClick(ui_flows.child(window, QPushButton, "managePresetsButton"), Qt.MouseButton.LeftButton)
    dialog = window.findChild(PresetDialog)
    assert dialog is not None and dialog.isVisible()
    dialog.findChild(QLineEdit, "presetNameEdit").setText("Pirate")
    dialog.findChild(QPlainTextEdit, "presetPromptEdit").setPlainText("Talk like a pirate.")
    qtbot.mouseClick(dialog.findChild(QPushButton, "addPresetButton"), Qt.MouseButton.LeftButton)
    dialog.findChild(QPlainTextEdit, "presetPromptEdit").setPlainText("Talk like a pirate, always.")
    qtbot.mouseClick(dialog.findChild(QPushButton, "savePresetButton"), Qt.MouseButton.LeftButton)
    pirate = next(p for p in window.storage.list_presets() if p.name == "Pirate")
    assert pirate.system_prompt == "Talk like a pirate, always."
    dialog.close()
    # Choose it, and own sampling, for this conversation.
    combo = ui_flows.child(window, QComboBox, "presetCombo")
    combo.activated.emit(combo.findData(pirate.id))
    ui_flows.child(window, QCheckBox, "customSamplingCheck").setChecked(True)
    ui_flows.child(window, QDoubleSpinBox, "chatTemperatureSpin").setValue(0.0)
    ui_flows.child(window, QSpinBox, "chatMaxTokensSpin").setValue(7)
    ask(qtbot, window, ui_flows.FRANCE_QUESTION)
    history, params = submitted[-1]
    assert history[0] == {"role": "system", "content": "Talk like a pirate, always."}
    assert params == {"temperature": 0.0, "top_p": 0.3, "max_tokens": 7, "repetition_penalty": 1.1,
                      "repeat_last_n": 64}
    pirate_chat = pane.current_conversation
    # A new conversation uses the defaults and no system prompt.
    pane.new_conversation()
    assert combo.currentData() == 0 and not ui_flows.child(window, QCheckBox, "customSamplingCheck").isChecked()
    ask(qtbot, window, ui_flows.FRANCE_QUESTION)
    history, params = submitted[-1]
    assert history[0]["role"] == "user" and params == {"temperature": 0.3, "top_p": 0.3, "max_tokens": 512,
                                                       "repetition_penalty": 1.1,
                                                       "repeat_last_n": 64}  # the model's own defaults
    # the Generation box's penalty window reaches the next reply's SamplingParams
    window_spin = ui_flows.child(window, QSpinBox, "penaltyWindowSpin")
    assert window_spin.value() == 64 and "repetition penalty looks at" in window_spin.toolTip()
    window_spin.setValue(-1)
    assert window_spin.text() == "All"
    ask(qtbot, window, ui_flows.FRANCE_QUESTION)
    assert submitted[-1][1]["repeat_last_n"] == -1
    assert FakeLLM.instances[-1].engine.submitted_params[-1].repeat_last_n == -1  # the reply's SamplingParams
    window_spin.setValue(64)
    pane.select_conversation(pirate_chat.id)
    assert combo.currentData() == pirate.id
    assert ui_flows.child(window, QSpinBox, "chatMaxTokensSpin").value() == 7
    # Deleting the preset keeps the conversation's prompt.
    dialog = pane.open_presets_dialog()
    dialog.select(pirate.id)
    qtbot.mouseClick(dialog.findChild(QPushButton, "deletePresetButton"), Qt.MouseButton.LeftButton)
    dialog.close()
    assert "Pirate" not in [p.name for p in window.storage.list_presets()]
    assert pane.current_conversation.system_prompt == "Talk like a pirate, always."
    assert combo.currentText() == "Custom prompt"


def test_export_then_import_gives_the_same_conversation(qtbot: Any, window: MainWindow, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    ui_flows.load_model(qtbot, window)
    ask(qtbot, window, ui_flows.FRANCE_QUESTION)
    window.chat_pane.regenerate()
    ui_flows.wait_finished(qtbot, window.chat_pane.current_conversation.messages[-1], TIMEOUT_MS)
    original = window.chat_pane.current_conversation
    json_path, md_path = tmp_path / "chat.json", tmp_path / "chat.md"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(json_path), "")))
    actions = {a.objectName(): a for a in window.findChildren(QAction)}
    actions["exportJsonAction"].trigger()
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(md_path), "")))
    actions["exportMarkdownAction"].trigger()
    markdown = md_path.read_text(encoding="utf-8")
    assert markdown.startswith(f"# {ui_flows.FRANCE_QUESTION}") and FRANCE_REPLY in markdown
    exported = json.loads(json_path.read_text(encoding="utf-8"))
    assert exported["messages"][-1] == {"role": "assistant", "content": FRANCE_REPLY}

    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(json_path), "")))
    with qtbot.waitSignal(window.import_finished, timeout=TIMEOUT_MS) as finished:
        actions["importJsonAction"].trigger()  # the import runs off the GUI thread
    imported = window.chat_pane.current_conversation
    assert finished.args == [imported.id]
    assert imported.id != original.id and imported.title == original.title
    again = export.to_json(window.storage, imported.id)

    def shape(data: dict[str, Any]) -> Any:
        tree = data["hearth"]["tree"]
        position = {node["id"]: i for i, node in enumerate(tree)}
        nodes = [(position.get(n["parent_id"]), n["role"], n["content"], n["metadata"], n["is_complete"])
                 for n in tree]
        return (data["messages"], nodes, data["hearth"]["title"], data["hearth"]["sampling"],
                position[data["hearth"]["active_leaf_id"]])

    assert shape(again) == shape(exported)
    assert [(m.branch_index, m.branch_count) for m in imported.messages] == [(0, 1), (1, 2)]
    assert window.chat_pane.view.message_count == 2


def test_restart_restores_conversations_layout_and_settings(qtbot: Any, open_window: Any,
                                                            tmp_path: Path) -> None:
    win = open_window(tmp_path)
    ui_flows.load_model(qtbot, win)
    ask(qtbot, win, ui_flows.FRANCE_QUESTION)
    france_id = win.chat_pane.current_conversation.id
    win.chat_pane.new_conversation()
    streaming = ui_flows.send(qtbot, win, ui_flows.LONG_PROMPT)  # closed mid-reply below
    qtbot.wait_until(lambda: len(streaming.content) > 20, timeout=TIMEOUT_MS)
    ui_flows.set_generation(win, temperature=0.3)
    ui_flows.child(win, QSpinBox, "penaltyWindowSpin").setValue(128)  # the model's default is 64
    win.monitor_dock.hide()
    win.resize(win.width(), 540)  # the panes keep the width above the offscreen screen's 800 px
    qtbot.wait_until(lambda: win.height() == 540, timeout=2000)
    win.settings.font_size = 15
    win.settings.theme = "dark"
    win.settings.default_model = str(tmp_path / "my-model")
    win.apply_settings()
    try:
        win.close()
        partial = streaming.content
        again = open_window(tmp_path)
        pane = again.chat_pane
        assert len(pane.store) == 2
        current = pane.current_conversation
        assert current.messages[0].content == ui_flows.LONG_PROMPT
        assert current.messages[1].content == partial and "stopped" in pane.view.message_text(1)
        pane.select_conversation(france_id)
        assert [m.content for m in pane.current_conversation.messages] == [ui_flows.FRANCE_QUESTION,
                                                                           FRANCE_REPLY]
        assert "tok/s" in pane.view.message_text(1)
        assert not again.findChild(QDockWidget, "monitorPane").isVisible()
        assert again.findChild(QDockWidget, "modelPane").isVisible()
        assert again.height() == 540
        assert pane.view.font().pointSize() == 15
        assert again.palette().color(QPalette.ColorRole.Window).lightness() < 100  # dark
        assert ui_flows.child(again, QDoubleSpinBox, "temperatureSpin").value() == pytest.approx(0.3)
        assert ui_flows.child(again, QSpinBox, "penaltyWindowSpin").value() == 128
        assert again.model_pane.sampling_params()["repeat_last_n"] == 128
        assert ui_flows.child(again, QLineEdit, "modelPathEdit").text() == str(tmp_path / "my-model")
    finally:
        apply_theme("system")
    qtbot.wait_until(lambda: again.palette().color(QPalette.ColorRole.Window).lightness() > 150, timeout=2000)


def test_keyboard_shortcuts(qtbot: Any, window: MainWindow) -> None:
    ui_flows.load_model(qtbot, window)
    window.activateWindow()
    qtbot.wait_until(lambda: QGuiApplication.focusWindow() is window.windowHandle(), timeout=2000)
    pane = window.chat_pane
    box = ui_flows.child(window, ui_flows.ChatInput, "chatInput")
    search = ui_flows.child(window, QLineEdit, "conversationSearch")
    ask(qtbot, window, ui_flows.FRANCE_QUESTION)

    qtbot.keyClick(box, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)
    assert search.hasFocus()
    qtbot.keyClick(search, Qt.Key.Key_L, Qt.KeyboardModifier.ControlModifier)
    assert box.hasFocus()
    qtbot.keyClick(box, Qt.Key.Key_R, Qt.KeyboardModifier.ControlModifier)  # regenerate
    reply = pane.current_conversation.messages[1]
    assert reply.status == STATUS_STREAMING and reply.branch_count == 2
    ui_flows.wait_finished(qtbot, reply, TIMEOUT_MS)
    first = pane.current_conversation
    qtbot.keyClick(box, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)  # new chat
    assert pane.current_conversation is not first and pane.current_conversation.messages == []
    reply = ui_flows.send(qtbot, window, ui_flows.LONG_PROMPT)
    qtbot.wait_until(lambda: bool(reply.content), timeout=TIMEOUT_MS)
    qtbot.keyClick(box, Qt.Key.Key_Escape)  # stop
    ui_flows.wait_finished(qtbot, reply, TIMEOUT_MS)
    assert reply.finish_reason == "abort"
    assert first.messages[1].status == STATUS_DONE


def test_settings_dialog_sets_theme_font_model_and_default_preset(qtbot: Any, window: MainWindow) -> None:
    from app.window.settings_dialog import SettingsDialog

    preset = window.storage.list_presets()[1]
    dialog = SettingsDialog(window.settings, window.storage.list_presets(), window)
    qtbot.add_widget(dialog)
    theme = dialog.findChild(QComboBox, "themeCombo")
    theme.setCurrentIndex(theme.findData("light"))
    dialog.findChild(QSpinBox, "fontSizeSpin").setValue(13)
    dialog.findChild(QLineEdit, "defaultModelEdit").setText("  /models/tiny.gguf ")
    presets = dialog.findChild(QComboBox, "defaultPresetCombo")
    presets.setCurrentIndex(presets.findData(preset.id))
    dialog.apply_to(window.settings)
    try:
        window.apply_settings()
        settings = window.settings
        assert (settings.theme, settings.font_size, settings.default_model, settings.default_preset_id) == (
            "light", 13, "/models/tiny.gguf", preset.id)
        assert window.chat_pane.view.font().pointSize() == 13
        ui_flows.load_model(qtbot, window)
        ask(qtbot, window, ui_flows.FRANCE_QUESTION)
        conversation = window.chat_pane.new_conversation()
        assert conversation.preset_id == preset.id and conversation.system_prompt == preset.system_prompt
        assert ui_flows.child(window, QComboBox, "presetCombo").currentData() == preset.id
    finally:
        apply_theme("system")
