"""Tools in a chat, in the real window offscreen: the fake engine's scripted replies call the engine tests' own MCP
server (on the SDK) through the tool loop; the approval dialog's buttons are clicked; the steps show under the
reply, stay in the database, and Stop during an approval ends the reply cleanly."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import shiboken6
from PySide6.QtWidgets import QPushButton

from app.data.conversations import STATUS_DONE, STATUS_STOPPED
from app.tools.approval_dialog import ApprovalDialog
from app.window.main_window import MainWindow
from tests.app import ui_flows
from tests.app.fake_engine import FakeLLM
from tests.engine.mcp.conftest import SERVER

START_MS = 60_000  # a Python process importing the SDK, on a busy machine
REPLY_MS = 20_000


def tool_call(name: str, **arguments: Any) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(arguments)}}}</tool_call>'


def open_with_tools(qtbot: Any, open_window: Callable[[Path], Any], data_dir: Path) -> MainWindow:
    """A window over ``data_dir`` whose ``mcp.json`` names the test server "t"; the model loaded, tools on."""
    (data_dir / "mcp.json").write_text(json.dumps({"mcpServers": {"t": {"command": sys.executable,
                                                                        "args": [str(SERVER)]}}}))
    win: MainWindow = open_window(data_dir)
    ui_flows.load_model(qtbot, win)
    button = win.tools.button
    assert button.text() == "🛠 Tools: off"
    use = button.action("use")
    assert use is not None and button.action("t") is not None and not button.action("t").isEnabled()
    use.trigger()
    qtbot.wait_until(lambda: "6 tools" in button.text(), timeout=START_MS)
    assert "tokens" in button.text()  # the definitions counted with the loaded model's template
    tokens = win.tools.measure_of(win.chat_pane.current_conversation.id).prompt_tokens
    assert tokens and tokens > 50 and f"take {tokens} prompt tokens" in button.toolTip()
    return win


def ask_and_answer(qtbot: Any, win: MainWindow, text: str, button: str | None) -> Any:
    """Send ``text``; once the approval dialog shows, click ``button`` in it (None: leave it open)."""
    with qtbot.wait_signal(win.tools.asked, timeout=REPLY_MS) as asked:
        reply = ui_flows.send(qtbot, win, text)
    dialog: ApprovalDialog = asked.args[0]
    assert dialog.isVisible() and json.loads(dialog.arguments.toPlainText()) == {"a": 2, "b": 3}
    if button is not None:
        dialog.findChild(QPushButton, button).click()
    return reply, dialog


def test_a_tool_call_approved_once_shows_its_step_and_the_answer_and_both_stay(
        qtbot: Any, open_window: Callable[[Path], Any], tmp_path: Path) -> None:
    win = open_with_tools(qtbot, open_window, tmp_path)
    engine = FakeLLM.instances[-1].engine
    engine.replies.extend([tool_call("add", a=2, b=3), "The sum is 5."])
    reply, _ = ask_and_answer(qtbot, win, "What is 2 + 3?", "allowOnceButton")
    ui_flows.wait_finished(qtbot, reply, REPLY_MS)
    assert reply.status == STATUS_DONE and reply.content == "The sum is 5.", reply.error
    last = engine.prompts[-1][-1]  # the result went back to the model (as a user turn: the fake's template
    assert last["role"] == "user" and last["content"].startswith("Result of the function call")  # knows no tools)
    assert last["content"].endswith(": 5")
    view = win.chat_pane.view
    shown = view.message_text(1)
    assert "▸ Tool add · server t · ran" in shown and "The sum is 5." in shown and '"a"' not in shown
    view.toggle_step(1, 0)  # the step opens: its arguments and result
    shown = view.message_text(1)
    assert "▾ Tool add" in shown and '"a": 2' in shown and "Result\n5" in shown
    assert "hearth:step/1/0" in view.hrefs(1)
    conversation_id = win.chat_pane.current_conversation.id
    win.close()

    again = open_window(tmp_path)  # the steps and the chat's choice come back from the database
    again.chat_pane.select_conversation(conversation_id)
    assert "▸ Tool add · server t · ran" in again.chat_pane.view.message_text(1)
    assert again.tools.choice(conversation_id).enabled
    assert again.tools.button.text() != "🛠 Tools: off"


def test_a_denied_call_says_so_and_stop_during_an_approval_ends_the_reply(
        qtbot: Any, open_window: Callable[[Path], Any], tmp_path: Path) -> None:
    win = open_with_tools(qtbot, open_window, tmp_path)
    engine = FakeLLM.instances[-1].engine
    engine.replies.extend([tool_call("add", a=2, b=3), "I was not allowed to add them."])
    reply, _ = ask_and_answer(qtbot, win, "What is 2 + 3?", "denyButton")
    ui_flows.wait_finished(qtbot, reply, REPLY_MS)
    assert reply.status == STATUS_DONE and reply.content == "I was not allowed to add them."
    assert "denied" in engine.prompts[-1][-1]["content"]  # the model was told
    assert "▸ Tool add · server t · denied by you" in win.chat_pane.view.message_text(1)

    engine.replies.extend([tool_call("add", a=2, b=3), "never generated"])
    reply, dialog = ask_and_answer(qtbot, win, "Add them again", None)
    stop = ui_flows.child(win, QPushButton, "stopButton")
    assert stop.isEnabled()
    stop.click()
    ui_flows.wait_finished(qtbot, reply, REPLY_MS)
    assert reply.status == STATUS_STOPPED and reply.finish_reason == "abort" and not reply.error
    qtbot.wait_until(lambda: not shiboken6.isValid(dialog) or not dialog.isVisible(), timeout=2000)  # closed
    assert list(engine.replies) == ["never generated"]
    assert ui_flows.child(win, QPushButton, "sendButton").isEnabled() is False  # ready again, box empty
    assert not win.replies.streaming_conversations()


def test_a_chat_without_tools_answers_without_the_tool_loop(
        qtbot: Any, open_window: Callable[[Path], Any], tmp_path: Path) -> None:
    win: MainWindow = open_window(tmp_path)
    ui_flows.load_model(qtbot, win)
    assert win.tools.spec_for(win.chat_pane.current_conversation.id) is None
    reply = ui_flows.send(qtbot, win, ui_flows.FRANCE_QUESTION)
    ui_flows.wait_finished(qtbot, reply, REPLY_MS)
    assert "Paris" in reply.content and FakeLLM.instances[-1].engine.prompts == []  # a plain reply
    assert win.tools.button.action("use") is not None
    assert "No MCP servers yet" in " ".join(a.text() for a in win.tools.button.menu().actions())
