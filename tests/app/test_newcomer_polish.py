"""What a newcomer sees at once: wheels that scroll panes, button texts, honest labels, the Models list, dates, Help."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import QApplication, QScrollArea, QSpinBox


def _wheel(widget: Any, steps: int = 3) -> QWheelEvent:
    centre = QPointF(widget.rect().center())
    return QWheelEvent(centre, QPointF(widget.mapToGlobal(centre.toPoint())), QPoint(0, 0), QPoint(0, 120 * steps),
                       Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False)


def test_wheel_over_an_unfocused_spin_box_in_the_model_pane_leaves_its_value(window: Any, qtbot: Any) -> None:
    pane = window.model_pane
    spin = pane.findChild(QSpinBox, "maxBatchSizeSpin")
    assert spin is not None
    assert isinstance(pane.findChild(QScrollArea), QScrollArea)
    assert spin.focusPolicy() == Qt.FocusPolicy.StrongFocus  # a wheel does not give it the focus
    window.chat_pane.focus_input()
    assert not spin.hasFocus()
    before = spin.value()
    QApplication.sendEvent(spin, _wheel(spin))
    assert spin.value() == before
    spin.setFocus()
    qtbot.waitUntil(spin.hasFocus, timeout=2000)
    QApplication.sendEvent(spin, _wheel(spin))  # focused, it takes the wheel as before
    assert spin.value() != before


def shown_text(text: str) -> str:
    """A button's or action's text as Qt draws it: "&&" is one "&", a lone "&" marks the next character as the
    mnemonic (drawn underlined; "_" here) and is not drawn itself."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "&" and i + 1 < len(text):
            out.append("&" if text[i + 1] == "&" else "_" + text[i + 1] if text[i + 1] in " \t" else text[i + 1])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def test_shown_text_follows_qt() -> None:
    assert shown_text("Save && send") == "Save & send"
    assert shown_text("Save & send") == "Save _ send"
    assert shown_text("&File") == "File"


def test_no_button_or_action_text_has_a_stray_mnemonic(window: Any) -> None:
    from PySide6.QtGui import QAction
    from PySide6.QtWidgets import QAbstractButton

    from app.chat.composer import Composer

    composer = window.chat_pane.findChild(Composer)
    composer.update_controls(can_send=True, is_streaming=False, is_model_ready=True, is_editing=True)
    send = composer.findChild(QAbstractButton, "sendButton")
    assert shown_text(send.text()) == "Save & send"
    texts = [button.text() for button in window.findChildren(QAbstractButton)]
    texts += [action.text() for action in window.findChildren(QAction)]
    for text in texts:
        for i, char in enumerate(text[:-1]):
            if char == "&" and (i == 0 or text[i - 1] != "&"):
                follower = text[i + 1]
                assert follower == "&" or follower.isalnum(), f"{text!r} shows a stray mnemonic: {shown_text(text)!r}"


def test_status_bar_card_and_markdown_export_name_the_precision_that_runs(qtbot: Any, window: Any) -> None:
    from PySide6.QtWidgets import QComboBox, QLabel

    from app.data import export
    from tests.app import ui_flows
    from tests.app.fake_engine import FakeLLM

    label = ui_flows.child(window, QLabel, "recommendationLabel")
    qtbot.wait_until(lambda: "Recommended" in label.text(), timeout=10_000)
    combo = ui_flows.child(window, QComboBox, "quantizationCombo")
    combo.setCurrentIndex(combo.findData("int4"))
    ui_flows.load_model(qtbot, window)
    llm = FakeLLM.instances[-1]
    assert (llm.quantization, llm.dtype) == ("int4", "bfloat16")  # runs int4, computes in bf16
    assert ui_flows.child(window, QLabel, "modelStatusLabel").text() == "fake-smollm · cpu · int4"
    card = ui_flows.child(window, QLabel, "modelInfoLabel").text()
    assert "precision <b>int4</b> (computes in bfloat16)" in card
    ui_flows.set_generation(window, max_tokens=4)
    reply = ui_flows.send(qtbot, window, "What is the capital of France?")
    ui_flows.wait_finished(qtbot, reply, 10_000)
    text = export.to_markdown(window.storage, window.chat_pane.current_conversation.id)
    assert "model fake-smollm (int4)" in text and "bfloat16" not in text


def _ollama_store(root: Any) -> Any:
    """An Ollama models folder with one tag, ``llama3.2:1b``; returns its weights blob."""
    import json

    from engine.loading.ollama import MODEL_MEDIA_TYPE

    digest = "sha256:" + "b179c952" * 8
    manifest = root / "manifests" / "registry.ollama.ai" / "library" / "llama3.2" / "1b"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"layers": [{"mediaType": MODEL_MEDIA_TYPE, "digest": digest}]}))
    blob = root / "blobs" / digest.replace(":", "-")
    blob.parent.mkdir()
    blob.write_bytes(b"GGUF" + bytes(60))
    return blob


def test_an_ollama_blob_is_shown_and_served_by_its_tag_name(qtbot: Any, window: Any, tmp_path: Any) -> None:
    import json
    import socket
    import urllib.request

    from PySide6.QtWidgets import QCheckBox, QLabel, QSpinBox, QTreeWidget

    from tests.app import ui_flows

    blob = _ollama_store(tmp_path / "models")
    tree = ui_flows.child(window, QTreeWidget, "modelsTree")
    qtbot.wait_until(lambda: tree.topLevelItemCount() == 2, timeout=5000)
    ui_flows.load_model(qtbot, window, str(blob))
    assert window.bridge.model_info.model_name == "llama3.2:1b"
    assert ui_flows.child(window, QLabel, "modelStatusLabel").text().startswith("llama3.2:1b · ")
    assert "<b>llama3.2:1b</b>" in ui_flows.child(window, QLabel, "modelInfoLabel").text()
    running = window.models_view.running_item  # no scan found it, so it is added, first, marked, with its source
    assert running is tree.topLevelItem(0) and tree.topLevelItemCount() == 3
    assert running.text(0) == "llama3.2:1b (running)" and running.font(0).bold()
    assert running.text(1) == "Loaded by path" and str(blob) in running.toolTip(0)

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ui_flows.child(window, QSpinBox, "servePortSpin").setValue(port)
    with qtbot.wait_signal(window.bridge.signals.server_state_changed, timeout=10_000) as blocker:
        ui_flows.child(window, QCheckBox, "serveCheck").setChecked(True)
    assert blocker.args[0].is_running, blocker.args[0]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as response:
        served = [model["id"] for model in json.load(response)["data"]]
    assert served == ["llama3.2:1b"]
    ui_flows.child(window, QCheckBox, "serveCheck").setChecked(False)


def test_the_models_list_marks_the_running_model_shows_sources_and_keeps_whole_names(qtbot: Any,
                                                                                   window: Any) -> None:
    from PySide6.QtWidgets import QTreeWidget

    from app.model.models_view import COLUMNS
    from tests.app import ui_flows

    tree = ui_flows.child(window, QTreeWidget, "modelsTree")
    qtbot.wait_until(lambda: tree.topLevelItemCount() == 2, timeout=5000)
    assert COLUMNS[1] == "Source" and not tree.isColumnHidden(1)
    assert [tree.topLevelItem(i).text(1) for i in range(2)] == ["Hugging Face", "LM Studio"]
    assert tree.textElideMode() == Qt.TextElideMode.ElideMiddle
    assert tree.topLevelItem(1).toolTip(0).splitlines()[0] == "whisper-tiny"  # the whole name
    assert window.models_view.running_item is None
    ui_flows.load_model(qtbot, window)  # the default model, which the scan found: marked in place, not added
    running = window.models_view.running_item
    assert running is tree.topLevelItem(0) and tree.topLevelItemCount() == 2
    assert running.text(0) == "SmolLM2-135M-Instruct (running)"
    with qtbot.wait_signal(window.bridge.signals.model_unloaded, timeout=5000):
        window.bridge.unload_model()
    assert window.models_view.running_item is None and tree.topLevelItem(0).text(0) == "SmolLM2-135M-Instruct"


def test_ollama_manifest_name_of_a_blob(tmp_path: Any) -> None:
    from engine.loading.ollama import manifest_name

    blob = _ollama_store(tmp_path / "models")
    assert manifest_name(blob) == "llama3.2:1b"
    assert manifest_name(tmp_path / "models" / "blobs" / "sha256-other") is None
    assert manifest_name(tmp_path / "model.gguf") is None


def test_when_text_reads_like_a_calendar() -> None:
    from datetime import datetime

    from app.chat.conversation_list import when_text

    now = datetime(2026, 11, 20, 18, 30)
    assert when_text(datetime(2026, 11, 20, 14, 2).timestamp(), now) == "Today 14:02"
    assert when_text(datetime(2026, 11, 19, 9, 15).timestamp(), now) == "Yesterday 09:15"
    assert when_text(datetime(2026, 11, 3, 9, 15).timestamp(), now) == "3 Nov"
    assert when_text(datetime(2025, 11, 3, 9, 15).timestamp(), now) == "3 Nov 2025"


def test_conversations_with_one_title_are_told_apart_by_their_dates(qtbot: Any) -> None:
    import time

    from PySide6.QtWidgets import QListWidget

    from app.chat.conversation_list import ConversationList
    from app.data import records

    sidebar = ConversationList()
    qtbot.add_widget(sidebar)
    day = 86_400.0
    now = time.time()
    rows = [records.Conversation(id=i + 1, title="Pancakes", created_at=when, updated_at=when, system_prompt=None,
                                 preset_id=None, temperature=None, top_p=None, max_tokens=None, model=None,
                                 deleted_at=None, active_leaf_id=None)
            for i, when in enumerate((now, now - day, now - 40 * day))]
    sidebar.show_conversations([(row, "") for row in rows], 1, set())
    listing = sidebar.findChild(QListWidget, "conversationList")
    texts = [listing.item(i).text() for i in range(3)]
    assert [text.splitlines()[0] for text in texts] == ["Pancakes"] * 3  # the title stays the first line
    assert texts[0].splitlines()[1].startswith("Today ") and texts[1].splitlines()[1].startswith("Yesterday ")
    assert len(set(texts)) == 3


def test_a_search_result_opens_at_its_match_and_marks_it(qtbot: Any, window: Any) -> None:
    from PySide6.QtWidgets import QLineEdit, QListWidget

    from app.chat.search_highlight import MATCH_BACKGROUND

    pane = window.chat_pane
    store = pane.store
    long_chat = pane.current_conversation
    for n in range(30):
        store.add_user(long_chat, "Which birds live at the South Pole? I read about penguins." if n == 1
                       else f"Question {n}: tell me something about bread, at some length please.")
        reply = store.start_reply(long_chat)
        reply.content = f"Answer {n}. " + "Bread is flour, water, salt and time. " * 8
        store.finish_reply(reply, "stop", {})
    pane.new_conversation()
    store.add_user(pane.current_conversation, "Something else entirely")
    pane.refresh()
    assert pane.current_conversation.id != long_chat.id
    search = window.findChild(QLineEdit, "conversationSearch")
    listing = window.findChild(QListWidget, "conversationList")
    qtbot.keyClicks(search, "PENGUIN")
    qtbot.wait_until(lambda: listing.count() == 1, timeout=3000)
    row = listing.visualItemRect(listing.item(0)).center()
    qtbot.mouseClick(listing.viewport(), Qt.MouseButton.LeftButton, pos=row)
    qtbot.wait_until(lambda: pane.current_conversation.id == long_chat.id, timeout=3000)
    view = pane.view
    bar = view.verticalScrollBar()
    assert bar.maximum() > 0 and bar.value() < bar.maximum() // 2  # not left at the end of the chat
    marks = view.extraSelections()
    assert [mark.cursor.selectedText() for mark in marks] == ["penguin"]
    assert marks[0].format.background().color().name() == MATCH_BACKGROUND
    assert view.viewport().rect().contains(view.cursorRect(marks[0].cursor))  # the match is in sight
    assert "penguin" in view.message_text(2)  # the early message that has it (the third of sixty)
    search.clear()
    qtbot.wait_until(lambda: not view.extraSelections(), timeout=3000)  # clearing the search clears the marks


def _help_actions(window: Any) -> dict[str, Any]:
    from PySide6.QtGui import QAction

    return {action.objectName(): action for action in window.findChildren(QAction) if action.objectName()}


def test_help_opens_the_docs_and_the_data_folder_only_when_clicked(window: Any, monkeypatch: Any) -> None:
    from PySide6.QtCore import QUrl
    from PySide6.QtGui import QDesktopServices

    opened: list[QUrl] = []
    monkeypatch.setattr(QDesktopServices, "openUrl", staticmethod(lambda url: opened.append(url) or True))
    actions = _help_actions(window)
    help_menu = next(a.menu() for a in window.menuBar().actions() if a.text() == "&Help")
    names = [a.objectName() for a in help_menu.actions() if a.objectName()]
    assert names[:4] == ["documentationAction", "shortcutsAction", "openDataFolderAction", "copyDiagnosticsAction"]
    assert opened == []
    actions["documentationAction"].trigger()
    assert len(opened) == 1 and opened[0].isLocalFile() and opened[0].toLocalFile().endswith("README.md")
    actions["openDataFolderAction"].trigger()
    assert opened[1].toLocalFile() == str(window.data_dir)


def test_the_shortcuts_dialog_lists_the_actions_real_shortcuts(window: Any, monkeypatch: Any) -> None:
    from PySide6.QtGui import QKeySequence

    from app.window.help_menu import ShortcutsDialog, shortcut_rows

    rows = dict(shortcut_rows(window))
    native = QKeySequence.SequenceFormat.NativeText
    assert rows["Regenerate reply"] == QKeySequence("Ctrl+R").toString(native)
    assert rows["Rename conversation"] == "F2"
    actions = _help_actions(window)
    actions["regenerateAction"].setShortcut(QKeySequence("Ctrl+G"))  # read from the actions, not a fixed list
    assert dict(shortcut_rows(window))["Regenerate reply"] == QKeySequence("Ctrl+G").toString(native)
    shown: list[ShortcutsDialog] = []
    monkeypatch.setattr(ShortcutsDialog, "exec", lambda self: shown.append(self) or 0)
    actions["shortcutsAction"].trigger()
    table = shown[0].table
    listed = {table.item(r, 0).text(): table.item(r, 1).text() for r in range(table.rowCount())}
    assert listed == dict(shortcut_rows(window)) and "Search conversations" in listed


def test_copy_diagnostics_puts_versions_cpu_flags_model_and_precision_on_the_clipboard(
        qtbot: Any, window: Any) -> None:
    from importlib import metadata

    from PySide6.QtGui import QGuiApplication

    from tests.app import ui_flows

    ui_flows.load_model(qtbot, window)
    qtbot.wait_until(lambda: window.menus.help._hardware is not None, timeout=5000)
    _help_actions(window)["copyDiagnosticsAction"].trigger()
    text = QGuiApplication.clipboard().text()
    assert text.startswith("Hearth ") and "OS: " in text
    assert f"torch {metadata.version('torch')}" in text
    assert "CPU: Fake CPU 9000" in text and "flags: avx2" in text  # the fake machine has AVX2 only
    assert "Model: fake-smollm (default) on cpu, precision int8, computes in bfloat16" in text


def test_a_narrow_models_list_shows_whole_names_before_the_other_columns(qtbot: Any) -> None:
    """In the side pane (about 420 px at 1366x768) the name column takes the room it needs, up to its share, and the
    columns after it scroll: before, the name got what the others left (about 100 px) and read "llama-…M.gguf"."""
    from PySide6.QtWidgets import QTreeWidget

    from app.model.models_view import NAME_SHARE, ModelsView

    view = ModelsView()
    qtbot.add_widget(view)
    view.resize(420, 400)
    view.show()
    qtbot.wait_exposed(view)
    names = ["Llama-3.2-1B-Instruct-Q4_K_M.gguf", "qwen2.5-0.5b-instruct-q8_0.gguf",
             "a-model-whose-name-runs-on-far-past-any-side-pane-Q4_K_M.gguf"]
    view.show_models([{"name": name, "path": f"/models/{name}", "source": "lmstudio", "runnable": True,
                       "fits": "yes", "architecture": "llama", "num_parameters": 1.2e9, "quantization": "Q4_K_M",
                       "size_bytes": 800 << 20} for name in names])
    tree = view.findChild(QTreeWidget, "modelsTree")
    width = tree.header().sectionSize(0)
    metrics = tree.fontMetrics()
    assert width >= metrics.horizontalAdvance(names[0]) and width >= metrics.horizontalAdvance(names[1]), width
    assert width <= tree.viewport().width() * NAME_SHARE + 1  # the longest name elides rather than fill the list
    view.resize(900, 400)
    qtbot.wait_until(lambda: tree.header().sectionSize(0) >= metrics.horizontalAdvance(names[2]), timeout=2000)
