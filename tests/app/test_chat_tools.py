"""Tools in a chat, in the real window offscreen: the fake engine's scripted replies call the engine tests' own MCP
server (on the SDK) through the tool loop; the approval dialog's buttons are clicked; the steps show under the
reply, stay in the database, and Stop during an approval ends the reply cleanly. Settings' step limit and call
timeout reach the loop; a chat's subset of tools is all the model sees and counts; steps go through export and
import with their branch; and the MCP SDK is never imported on the GUI thread."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import shiboken6
from PySide6.QtWidgets import QPushButton

from app.data.conversations import STATUS_DONE, STATUS_STOPPED
from app.data.export import from_json, to_json, to_markdown
from app.data.settings import Settings
from app.data.storage import Storage
from app.data.tool_steps import ToolStepRecord, ToolStepStore
from app.tools.approval_dialog import ApprovalDialog
from app.tools.mcp_page import McpPage
from app.window.main_window import MainWindow
from engine.mcp.approvals import ApprovalStore
from tests.app import ui_flows
from tests.app.fake_engine import FakeLLM
from tests.engine.mcp.conftest import SERVER

ROOT = Path(__file__).resolve().parents[2]

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


def test_the_step_limit_and_call_timeout_set_in_settings_reach_the_loop(
        qtbot: Any, open_window: Callable[[Path], Any], tmp_path: Path) -> None:
    win = open_with_tools(qtbot, open_window, tmp_path)
    cid = win.chat_pane.current_conversation.id
    spec = win.tools.spec_for(cid)
    assert (spec.max_steps, spec.call_timeout_s) == (8, 30.0)  # the defaults
    page = McpPage(tmp_path)  # Settings → Tools (MCP): saved as they change, OK or not
    qtbot.add_widget(page)
    page.steps_spin.setValue(2)
    page.timeout_spin.setValue(1)
    page.close_servers()
    assert (Settings(tmp_path).tool_max_steps, Settings(tmp_path).tool_call_timeout_s) == (2, 1)
    assert "max_steps=2" in (tmp_path / "settings.ini").read_text()
    spec = win.tools.spec_for(cid)
    assert (spec.max_steps, spec.call_timeout_s) == (2, 1.0)
    approvals = ApprovalStore(tmp_path / "mcp_approvals.json")  # no dialog: both tools allowed always
    approvals.remember("t", "slow")
    approvals.remember("t", "add")
    win.tools.approvals = approvals
    engine = FakeLLM.instances[-1].engine
    engine.replies.extend([tool_call("slow", seconds=5), tool_call("add", a=2, b=3), "never generated"])
    reply = ui_flows.send(qtbot, win, "Take your time")
    ui_flows.wait_finished(qtbot, reply, REPLY_MS)
    assert reply.status == STATUS_DONE and "(Stopped after 2 replies with tool calls.)" in reply.content
    assert list(engine.replies) == ["never generated"]  # the limit: no third reply
    told = engine.prompts[-1][-1]["content"]  # the slow tool was abandoned after 1 s, and the model told so
    assert "did not answer within 1 s" in told, told
    shown = win.chat_pane.view.message_text(1)
    assert "Tool slow · server t · failed" in shown and "Tool add · server t · ran" in shown
    assert McpPage(tmp_path).steps_spin.value() == 2  # shown again when Settings opens


def test_a_chat_offers_only_the_tools_it_keeps_on_and_counts_only_those(
        qtbot: Any, open_window: Callable[[Path], Any], tmp_path: Path) -> None:
    win = open_with_tools(qtbot, open_window, tmp_path)
    cid = win.chat_pane.current_conversation.id
    button, tools = win.tools.button, win.tools
    all_tokens = tools.measure_of(cid).prompt_tokens
    assert len(tools.measure_of(cid).offered) == 6
    for name in ("add", "city_time", "crash", "big"):
        action = button.action("t", name)
        assert action is not None and action.isCheckable() and action.isChecked() and action.isEnabled()
    for name in ("crash", "big"):
        button.action("t", name).trigger()  # unchecked: off for this chat
        qtbot.wait_until(lambda n=name: ("t", n) in tools.choice(cid).tools_off, timeout=2000)
    qtbot.wait_until(lambda: button.text().startswith("🛠 4 of 6 tools"), timeout=REPLY_MS)
    fewer = tools.measure_of(cid).prompt_tokens
    assert fewer is not None and 0 < fewer < all_tokens and f"{fewer} tokens" in button.text()
    assert not button.action("t", "crash").isChecked() and button.action("t", "add").isChecked()
    assert tools.spec_for(cid).tools_off == {("t", "crash"), ("t", "big")}

    engine = FakeLLM.instances[-1].engine  # the model is not offered "crash": a call to it is not run
    engine.replies.extend([tool_call("crash"), "I cannot crash it."])
    reply = ui_flows.send(qtbot, win, "Crash the server")
    ui_flows.wait_finished(qtbot, reply, REPLY_MS)
    assert reply.status == STATUS_DONE and reply.content == "I cannot crash it."
    told = engine.prompts[-1][-1]["content"]
    assert "no tool named 'crash' (the tools are: add, city_time, slow, started)" in told, told

    button.action("t", "big").trigger()  # on again
    qtbot.wait_until(lambda: button.text().startswith("🛠 5 of 6 tools"), timeout=REPLY_MS)
    win.close()
    again = open_window(tmp_path)  # remembered per chat
    again.chat_pane.select_conversation(cid)
    assert again.tools.choice(cid).tools_off == {("t", "crash")}
    # the reopened window starts its tool servers as it loads: on a busy machine that took over 5 s (a fresh clone's
    # two-worker run), so the load gets the servers' start time
    ui_flows.load_model(qtbot, again, timeouts=ui_flows.Timeouts(load_ms=START_MS))
    qtbot.wait_until(lambda: again.tools.button.text().startswith("🛠 5 of 6 tools"), timeout=START_MS)


def test_tool_steps_go_through_export_and_import_with_their_branch(tmp_path: Path) -> None:
    steps_a = [ToolStepRecord("t", "add", '{"a": 2, "b": 3}', "ok", "5"),
               ToolStepRecord("t", "slow", '{"seconds": 5}', "error", "did not answer <b>in time</b>")]
    steps_b = [ToolStepRecord("t", "add", '{"a": 1}', "denied", "The user denied this call")]
    with Storage(tmp_path / "a.db") as storage:
        conversation = storage.create_conversation("Tools")
        question = storage.add_message(conversation.id, "user", "What is 2 + 3?")
        first = storage.add_message(conversation.id, "assistant", "The sum is 5.", question.id)
        second = storage.add_message(conversation.id, "assistant", "I was not allowed.", question.id)
        store = ToolStepStore(storage)
        store.add_all(first.id, steps_a)
        store.add_all(second.id, steps_b)
        storage.set_active_leaf(conversation.id, first.id)
        data = json.loads(json.dumps(to_json(storage, conversation.id)))
        assert "- *Tool add (server t): ok*" in to_markdown(storage, conversation.id)
    data["hearth"]["tree"].reverse()  # any order: the steps follow their message, not its place
    with Storage(tmp_path / "b.db") as other:
        imported = from_json(other, data)
        store = ToolStepStore(other)
        by_text = {m.content: store.steps(m.id) for m in other.messages(imported.id)}
        assert by_text == {"What is 2 + 3?": [], "The sum is 5.": steps_a, "I was not allowed.": steps_b}
        assert [m.content for m in other.active_path(imported.id)] == ["What is 2 + 3?", "The sum is 5."]
        bad = json.loads(json.dumps(data))
        next(e for e in bad["hearth"]["tree"] if "tool_steps" in e)["tool_steps"][0]["outcome"] = "maybe"
        count = len(other.list_conversations())
        with pytest.raises(ValueError, match=r"\.tool_steps\[0\]\.outcome must be one of ok, error, denied"):
            from_json(other, bad)
        assert len(other.list_conversations()) == count  # nothing written


_NO_SDK_ON_THE_GUI_THREAD = r"""
import importlib.abc, json, sys, threading, time
from pathlib import Path

importers = []

class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "mcp":
            importers.append(threading.current_thread().name)
        return None

sys.meta_path.insert(0, Watch())
from PySide6.QtWidgets import QApplication
qapp = QApplication([])
from app import create_window
from app.bridge.engine_bridge import EngineBridge
from tests.app.fake_engine import make_fake_api

data, server = Path(sys.argv[1]), sys.argv[2]
(data / "mcp.json").write_text(json.dumps({"mcpServers": {"t": {"command": sys.executable, "args": [server]}}}))
win = create_window(data_dir=data, bridge=EngineBridge(api=make_fake_api(load_delay_s=0.05, step_delay_s=0.01)))
win.show()
before = "mcp" in sys.modules
cid = win.chat_pane.current_conversation.id
win.tools.button.action("use").trigger()  # the first chat that uses tools
deadline = time.monotonic() + 90
while win.tools.measure_of(cid) is None and time.monotonic() < deadline:
    qapp.processEvents()
    time.sleep(0.02)
measure = win.tools.measure_of(cid)
win.close()
print(json.dumps({"before": before, "importers": importers, "main": threading.main_thread().name,
                  "tools": None if measure is None else len(measure.tools)}))
"""


def test_the_first_tools_chat_imports_the_mcp_sdk_off_the_gui_thread(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", _NO_SDK_ON_THE_GUI_THREAD, str(tmp_path), str(SERVER)],
                          check=False, cwd=ROOT, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["before"] is False and seen["tools"] == 6, seen
    assert seen["importers"] and seen["main"] not in seen["importers"], seen  # loaded by a worker thread


def test_a_tools_count_that_arrives_after_the_window_closed_reads_no_database(
        qtbot: Any, open_window: Callable[[Path], Any], tmp_path: Path) -> None:
    win = open_with_tools(qtbot, open_window, tmp_path)
    conversation_id = win.chat_pane.current_conversation.id
    measure = win.tools.measure_of(conversation_id)
    assert measure is not None
    win.close()
    win.tools._on_measured(conversation_id, measure)  # a count still running when the window closed lands now
    assert win.tools.measure_of(conversation_id) is measure
