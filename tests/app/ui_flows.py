"""User-level scenarios on the main window, shared by the fake-engine and real-engine tests.

Each flow drives the window the way a user would (typing, clicking, pressing Enter) and checks
what the user would see. ``Timeouts`` lets the real-model tests wait longer than the fake ones.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import Qt, QTimer, QUrl
from PySide6.QtWidgets import QDoubleSpinBox, QLabel, QLineEdit, QPushButton, QSpinBox

from app.chat.chat_input import ChatInput
from app.data.conversations import STATUS_DONE, STATUS_STOPPED, STATUS_STREAMING, Message
from app.window.main_window import MainWindow

FRANCE_QUESTION = "What is the capital of France?"
LONG_PROMPT = "Write a long story about a dragon who learns to bake bread. Use many paragraphs."


@dataclass(frozen=True)
class Timeouts:
    load_ms: int = 5000
    reply_ms: int = 5000
    first_token_ms: int = 5000


def child(win: MainWindow, cls: type, name: str) -> Any:
    widget = win.findChild(cls, name)
    assert widget is not None, f"no {cls.__name__} named {name!r}"
    return widget


def open_collections_dialog(qtbot: Any, win: MainWindow) -> Any:
    """Attach → Folder collections…: the collections dialog, shown."""
    from PySide6.QtGui import QAction

    from app.chat.collections_dialog import CollectionsDialog

    child(win, QAction, "attachCollectionsAction").trigger()
    dialog = win.findChild(CollectionsDialog, "collectionsDialog")
    assert dialog is not None
    qtbot.wait_until(dialog.isVisible, timeout=2_000)
    return dialog


def wait_collections_idle(qtbot: Any, win: MainWindow) -> None:
    """Until no folder collection is being indexed."""
    qtbot.wait_until(lambda: not win.chat_pane.documents.collections.is_busy, timeout=30_000)


def load_model(qtbot: Any, win: MainWindow, path: str = "", timeouts: Timeouts = Timeouts()) -> None:
    """Type ``path`` (empty = default model) and click Load; wait until it is loaded."""
    edit = child(win, QLineEdit, "modelPathEdit")
    edit.clear()
    if path:
        qtbot.keyClicks(edit, path)
    with qtbot.wait_signal(win.bridge.signals.model_loaded, timeout=timeouts.load_ms):
        qtbot.mouseClick(child(win, QPushButton, "loadModelButton"), Qt.MouseButton.LeftButton)
    assert child(win, QPushButton, "sendButton").isEnabled() is False  # nothing typed yet


def set_generation(win: MainWindow, temperature: float | None = None, max_tokens: int | None = None) -> None:
    if temperature is not None:
        child(win, QDoubleSpinBox, "temperatureSpin").setValue(temperature)
    if max_tokens is not None:
        child(win, QSpinBox, "maxTokensSpin").setValue(max_tokens)


def send(qtbot: Any, win: MainWindow, text: str) -> Message:
    """Type ``text`` into the chat box, press Enter, and return the reply message being streamed."""
    box = child(win, ChatInput, "chatInput")
    box.setFocus()
    qtbot.keyClicks(box, text)
    assert child(win, QPushButton, "sendButton").isEnabled()
    qtbot.keyClick(box, Qt.Key.Key_Return)
    assert box.toPlainText() == ""
    conversation = win.chat_pane.current_conversation
    assert conversation is not None
    reply = conversation.messages[-1]
    assert reply.role == "assistant" and reply.request_id
    assert conversation.messages[-2].content == text
    return reply


def wait_finished(qtbot: Any, reply: Message, timeout_ms: int) -> None:
    qtbot.wait_until(lambda: reply.status != STATUS_STREAMING, timeout=timeout_ms)


def flow_capital_of_france(qtbot: Any, win: MainWindow, timeouts: Timeouts = Timeouts()) -> None:
    """Load the default model, ask about France: the reply streams in and names Paris."""
    set_generation(win, temperature=0.0, max_tokens=48)
    load_model(qtbot, win, timeouts=timeouts)
    reply = send(qtbot, win, FRANCE_QUESTION)
    qtbot.wait_until(lambda: bool(reply.content), timeout=timeouts.first_token_ms)
    assert reply.status == STATUS_STREAMING or "Paris" in reply.content
    wait_finished(qtbot, reply, timeouts.reply_ms)
    assert reply.status == STATUS_DONE, reply.error
    assert "Paris" in reply.content
    shown = win.chat_pane.view.message_text(1)
    assert "Paris" in shown
    assert "tok/s" in shown and "first token" in shown


def flow_stop_mid_reply(qtbot: Any, win: MainWindow, timeouts: Timeouts = Timeouts()) -> None:
    """Stop a reply part-way: the text so far stays and the engine has nothing running."""
    set_generation(win, max_tokens=400)
    load_model(qtbot, win, timeouts=timeouts)
    reply = send(qtbot, win, LONG_PROMPT)
    stop = child(win, QPushButton, "stopButton")
    qtbot.wait_until(lambda: len(reply.content) > 30, timeout=timeouts.first_token_ms)
    assert stop.isEnabled()
    qtbot.mouseClick(stop, Qt.MouseButton.LeftButton)
    wait_finished(qtbot, reply, timeouts.reply_ms)
    assert reply.status == STATUS_STOPPED and reply.finish_reason == "abort"
    partial = reply.content
    assert len(partial) > 30
    assert "stopped" in win.chat_pane.view.message_text(1)
    stopped_at = time.time()
    qtbot.wait_until(lambda: (m := win.bridge.last_metrics) is not None and m.time > stopped_at, timeout=3000)
    metrics = win.bridge.last_metrics
    assert metrics is not None and metrics.num_running == 0
    assert reply.content == partial
    assert not stop.isEnabled()


def flow_two_conversations(qtbot: Any, win: MainWindow, timeouts: Timeouts = Timeouts()) -> None:
    """Replies in two conversations stream at the same time."""
    set_generation(win, max_tokens=64)
    load_model(qtbot, win, timeouts=timeouts)
    first = send(qtbot, win, LONG_PROMPT)
    first_conversation = win.chat_pane.current_conversation
    assert first_conversation is not None
    qtbot.mouseClick(child(win, QPushButton, "newChatButton"), Qt.MouseButton.LeftButton)
    assert win.chat_pane.current_conversation is not first_conversation
    second = send(qtbot, win, LONG_PROMPT)
    seen_both = []

    def both_streaming() -> bool:
        lengths = (len(first.content), len(second.content))
        if first.status == second.status == STATUS_STREAMING and all(lengths):
            seen_both.append(lengths)
        if len(seen_both) < 2:
            return False
        (first_0, second_0), (first_1, second_1) = seen_both[0], seen_both[-1]
        return first_1 > first_0 and second_1 > second_0

    qtbot.wait_until(both_streaming, timeout=timeouts.reply_ms)
    wait_finished(qtbot, first, timeouts.reply_ms)
    wait_finished(qtbot, second, timeouts.reply_ms)
    assert first.status == second.status == STATUS_DONE
    assert len(win.chat_pane.store) == 2
    # Switching back shows the first conversation's reply.
    win.chat_pane.select_conversation(first_conversation.id)
    assert win.chat_pane.view.message_count == 2


def flow_bad_model_path(qtbot: Any, win: MainWindow, bad_path: str, timeouts: Timeouts = Timeouts()) -> None:
    """A bad path shows a readable error in the model pane; the app still loads and chats."""
    edit = child(win, QLineEdit, "modelPathEdit")
    qtbot.keyClicks(edit, bad_path)
    with qtbot.wait_signal(win.bridge.signals.model_load_failed, timeout=timeouts.load_ms):
        qtbot.mouseClick(child(win, QPushButton, "loadModelButton"), Qt.MouseButton.LeftButton)
    error = child(win, QLabel, "modelErrorLabel")
    assert error.isVisible()
    assert error.text().startswith("Could not load the model.") and len(error.text()) > 30
    assert not child(win, QPushButton, "sendButton").isEnabled()
    set_generation(win, temperature=0.0, max_tokens=24)
    load_model(qtbot, win, timeouts=timeouts)
    assert not error.isVisible()
    reply = send(qtbot, win, FRANCE_QUESTION)
    wait_finished(qtbot, reply, timeouts.reply_ms)
    assert reply.status == STATUS_DONE and reply.content


def flow_event_loop_never_stalls(qtbot: Any, win: MainWindow, timeouts: Timeouts = Timeouts(),
                                 max_gap_ms: float = 100.0) -> None:
    """While a reply streams, a 10 ms timer keeps firing: no gap between ticks exceeds ``max_gap_ms``."""
    set_generation(win, max_tokens=80)
    load_model(qtbot, win, timeouts=timeouts)
    ticks: list[float] = []
    probe = QTimer()
    probe.setInterval(10)
    probe.timeout.connect(lambda: ticks.append(time.perf_counter()))
    reply = send(qtbot, win, LONG_PROMPT)
    probe.start()
    try:
        wait_finished(qtbot, reply, timeouts.reply_ms)
    finally:
        probe.stop()
    assert reply.status == STATUS_DONE
    assert len(reply.content) > 100
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(ticks)]
    assert len(gaps) > 10
    assert max(gaps) < max_gap_ms, f"event loop stalled for {max(gaps):.0f} ms"


ITALY_QUESTION = "What is the capital of Italy?"


def click_message_action(win: MainWindow, href: str) -> None:
    """Click one of the links under a message ("hearth:regenerate/1", "hearth:prev/0", ...)."""
    view = win.chat_pane.view
    index = int(href.split(":", 1)[1].split("/")[1])
    assert href in view.hrefs(index), view.hrefs(index)
    view.anchorClicked.emit(QUrl(href))


def flow_edit_and_regenerate_branch(qtbot: Any, win: MainWindow, timeouts: Timeouts = Timeouts()) -> Any:
    """Regenerate a reply and edit the question: both make branches that "‹ ›" switches between.

    Returns the conversation, showing the edited question's branch.
    """
    set_generation(win, temperature=0.0, max_tokens=24)
    load_model(qtbot, win, timeouts=timeouts)
    first = send(qtbot, win, FRANCE_QUESTION)
    wait_finished(qtbot, first, timeouts.reply_ms)
    assert first.status == STATUS_DONE and "Paris" in first.content
    pane = win.chat_pane
    conversation = pane.current_conversation
    assert conversation is not None
    click_message_action(win, "hearth:regenerate/1")
    second = conversation.messages[1]
    assert second is not first and second.is_streaming
    wait_finished(qtbot, second, timeouts.reply_ms)
    assert second.status == STATUS_DONE and "Paris" in second.content
    assert "2/2" in pane.view.message_text(1)
    click_message_action(win, "hearth:prev/1")
    assert conversation.messages[1].id == first.id and conversation.messages[1].content == first.content
    assert "1/2" in pane.view.message_text(1)

    click_message_action(win, "hearth:edit/0")
    box = child(win, ChatInput, "chatInput")
    assert box.toPlainText() == FRANCE_QUESTION
    box.clear()
    qtbot.keyClicks(box, ITALY_QUESTION)
    qtbot.keyClick(box, Qt.Key.Key_Return)
    edited = conversation.messages[1]
    assert conversation.messages[0].content == ITALY_QUESTION and edited.is_streaming
    wait_finished(qtbot, edited, timeouts.reply_ms)
    assert edited.status == STATUS_DONE and edited.content and "2/2" in pane.view.message_text(0)
    assert edited.content != second.content  # answers the edited question
    click_message_action(win, "hearth:prev/0")  # back to France, on its newest reply
    assert [m.content for m in conversation.messages] == [FRANCE_QUESTION, second.content]
    click_message_action(win, "hearth:next/0")
    assert [m.id for m in conversation.messages] == [conversation.messages[0].id, edited.id]
    assert conversation.messages[0].content == ITALY_QUESTION
    assert len(win.storage.messages(conversation.id)) == 5
    return conversation
