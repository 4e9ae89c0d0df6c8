"""The main window on the fake engine: layout, loading, chatting, stopping, errors, smoothness."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDockWidget, QLabel, QProgressBar, QPushButton, QSpinBox

from app.bridge.tool_runs import ToolsMeasure
from app.window.main_window import MainWindow
from tests.app import ui_flows
from tests.app.fake_engine import FakeLLM


def test_window_has_title_icon_chat_and_side_panes(window: MainWindow) -> None:
    assert window.windowTitle() == "Hearth"
    assert not window.windowIcon().isNull()
    assert window.centralWidget() is window.chat_pane  # the chat cannot be closed
    assert window.findChild(QDockWidget, "chatPane") is None
    for name in ("modelPane", "monitorPane"):
        dock = window.findChild(QDockWidget, name)
        assert dock is not None and not dock.isHidden()
        assert dock.features() & QDockWidget.DockWidgetFeature.DockWidgetMovable
    assert window.tabifiedDockWidgets(window.model_dock) == [window.models_dock, window.monitor_dock]
    assert window.model_dock.isVisible()  # the model tab is in front


def test_send_is_disabled_until_a_model_loads(qtbot: Any, window: MainWindow) -> None:
    box = ui_flows.child(window, ui_flows.ChatInput, "chatInput")
    qtbot.keyClicks(box, "hello")
    assert not ui_flows.child(window, QPushButton, "sendButton").isEnabled()
    assert not ui_flows.child(window, QPushButton, "stopButton").isEnabled()
    assert "Load a model" in box.placeholderText()
    assert window.findChild(QLabel, "modelStatusLabel").text() == "No model loaded"


def test_input_has_focus(qtbot: Any, window: MainWindow) -> None:
    window.activateWindow()
    qtbot.wait_until(lambda: window.focusWidget() is ui_flows.child(window, ui_flows.ChatInput, "chatInput"),
                     timeout=2000)


def test_load_progress_and_status_bar(qtbot: Any, window: MainWindow) -> None:
    ui_flows.load_model(qtbot, window)
    assert ui_flows.child(window, QProgressBar, "modelLoadProgress").value() == 1000
    assert window.findChild(QLabel, "modelStatusLabel").text() == "fake-smollm · cpu · int8"  # the level it runs at
    assert "fake-smollm" in window.findChild(QLabel, "modelInfoLabel").text()
    assert ui_flows.child(window, QPushButton, "unloadModelButton").isEnabled()


def test_engine_settings_apply_on_next_load(qtbot: Any, window: MainWindow) -> None:
    ui_flows.child(window, QSpinBox, "maxBatchSizeSpin").setValue(3)
    ui_flows.child(window, QSpinBox, "kvCacheSpin").setValue(128)
    ui_flows.load_model(qtbot, window)
    llm = FakeLLM.instances[-1]
    assert llm.max_batch_size == 3 and llm.kv_cache_bytes == 128 * 1024 * 1024


def test_capital_of_france(qtbot: Any, window: MainWindow) -> None:
    ui_flows.flow_capital_of_france(qtbot, window)


def test_stop_keeps_partial_reply(qtbot: Any, window: MainWindow) -> None:
    ui_flows.flow_stop_mid_reply(qtbot, window)


def test_two_conversations_stream_at_once(qtbot: Any, window: MainWindow) -> None:
    ui_flows.flow_two_conversations(qtbot, window)
    assert FakeLLM.instances[-1].engine.max_batch_seen == 2


def test_bad_model_path_shows_error(qtbot: Any, window: MainWindow, tmp_path: Path) -> None:
    ui_flows.flow_bad_model_path(qtbot, window, str(tmp_path / "missing.gguf"))


def test_event_loop_never_stalls(qtbot: Any, window: MainWindow) -> None:
    ui_flows.flow_event_loop_never_stalls(qtbot, window)


def test_shift_enter_adds_a_line(qtbot: Any, window: MainWindow) -> None:
    ui_flows.load_model(qtbot, window)
    box = ui_flows.child(window, ui_flows.ChatInput, "chatInput")
    qtbot.keyClicks(box, "one")
    qtbot.keyClick(box, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(box, "two")
    assert box.toPlainText() == "one\ntwo"
    assert window.chat_pane.current_conversation.messages == []


def test_delete_conversation_while_streaming(qtbot: Any, window: MainWindow) -> None:
    ui_flows.load_model(qtbot, window)
    reply = ui_flows.send(qtbot, window, ui_flows.LONG_PROMPT)
    qtbot.wait_until(lambda: bool(reply.content), timeout=3000)
    qtbot.mouseClick(ui_flows.child(window, QPushButton, "deleteChatButton"), Qt.MouseButton.LeftButton)
    assert window.replies.num_streaming == 0
    assert len(window.chat_pane.store) == 1  # a fresh, empty conversation replaces it
    qtbot.wait_until(lambda: (m := window.bridge.last_metrics) is not None and m.num_running == 0, timeout=5000)


def test_unload_fails_streaming_reply_and_disables_send(qtbot: Any, window: MainWindow) -> None:
    ui_flows.load_model(qtbot, window)
    reply = ui_flows.send(qtbot, window, ui_flows.LONG_PROMPT)
    qtbot.wait_until(lambda: bool(reply.content), timeout=3000)
    with qtbot.wait_signal(window.bridge.signals.model_unloaded, timeout=5000):
        qtbot.mouseClick(ui_flows.child(window, QPushButton, "unloadModelButton"), Qt.MouseButton.LeftButton)
    qtbot.wait_until(lambda: reply.status == "error", timeout=2000)
    assert "unloaded" in window.chat_pane.view.message_text(1)
    assert window.findChild(QLabel, "modelStatusLabel").text() == "No model loaded"
    assert FakeLLM.instances[-1].is_closed


def test_hardware_is_described(qtbot: Any, window: MainWindow) -> None:
    label = ui_flows.child(window, QLabel, "hardwareLabel")
    qtbot.wait_until(lambda: "Fake CPU 9000" in label.text(), timeout=3000)
    assert "No NVIDIA GPU" in label.text()


def test_monitor_graphs_fill(qtbot: Any, window: MainWindow) -> None:
    ui_flows.load_model(qtbot, window)
    monitor = window.monitor_pane
    qtbot.wait_until(lambda: bool(monitor.kv_graph.samples and monitor.rss_graph.samples), timeout=4000)
    assert monitor.rss_graph.samples[-1] > 10 * 1024 * 1024


def test_close_shuts_the_bridge_down(qtbot: Any, window: MainWindow) -> None:
    ui_flows.load_model(qtbot, window)
    window.close()
    assert window.bridge.pool.activeThreadCount() == 0
    assert FakeLLM.instances[-1].is_closed


def test_edit_and_regenerate_make_switchable_branches(qtbot: Any, window: MainWindow) -> None:
    ui_flows.flow_edit_and_regenerate_branch(qtbot, window)


def test_what_the_bridge_posted_before_closing_lands_harmlessly_after(qtbot: Any, open_window: Any,
                                                                      tmp_path: Path) -> None:
    """A load that ends as the window closes posts ``model_loaded`` into the event loop; it arrives after the storage
    closed (a CI run saw the tools' handler read the closed database). Every handler of the bridge's news ignores it."""
    win = open_window(tmp_path / "data")
    with qtbot.wait_signal(win.bridge.signals.model_loaded, timeout=30_000) as loaded:
        ui_flows.load_model(qtbot, win)
    info = loaded.args[0]
    win.close()
    signals = win.bridge.signals
    signals.model_loaded.emit(info)
    signals.tools_measured.emit(win.chat_pane.current_conversation.id, ToolsMeasure((), 12))
    signals.model_unloaded.emit()
    signals.model_load_failed.emit("late")
    qtbot.wait(50)
