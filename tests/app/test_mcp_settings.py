"""The settings dialog's "Tools (MCP)" page, offscreen, over a real MCP server (the engine tests' own, on the
SDK) and ``mcp.json`` in a temporary data folder; and the approval dialog's three answers."""

from __future__ import annotations

import json
import stat
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtWidgets import QLabel, QLineEdit, QPlainTextEdit, QPushButton

from app.data.settings import Settings
from app.tools.approval_dialog import ApprovalDialog, GuiApprover, ask
from app.tools.mcp_page import McpPage
from app.tools.server_dialog import ServerDialog
from app.window.settings_dialog import SettingsDialog
from engine.mcp.approvals import ApprovalRequest, ApprovalStore, Decision
from tests.engine.mcp.conftest import SERVER

START_MS = 60_000  # a Python process importing the SDK, on a busy machine


@pytest.fixture
def dialog(qtbot: Any, tmp_path: Path) -> Iterator[SettingsDialog]:
    dlg = SettingsDialog(Settings(tmp_path), [])
    qtbot.add_widget(dlg)
    yield dlg
    dlg.mcp_page.close_servers()
    assert dlg.mcp_page.servers.wait_closed(20)


def saved(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "mcp.json").read_text())["mcpServers"]


def fill(qtbot: Any, page: McpPage, editor: ServerDialog, **fields: str) -> None:
    for name, text in fields.items():
        widget = editor.findChild((QPlainTextEdit if name == "env" else QLineEdit), f"mcp{name.title()}Edit")
        widget.clear()
        if isinstance(widget, QPlainTextEdit):
            widget.setPlainText(text)
        else:
            widget.setText(text)
    editor.accept()


def test_added_server_reaches_ready_and_lists_its_tools(qtbot: Any, dialog: SettingsDialog, tmp_path: Path) -> None:
    page = dialog.mcp_page
    page.findChild(QPushButton, "mcpAddButton").click()
    editor = page.findChild(ServerDialog)
    assert editor is not None and editor.isVisible()
    fill(qtbot, page, editor, name="test", command=sys.executable, args=str(SERVER), env="GREETING=hello world")
    assert saved(tmp_path) == {"test": {"command": sys.executable, "args": [str(SERVER)],
                                        "env": {"GREETING": "hello world"}}}
    assert stat.S_IMODE((tmp_path / "mcp.json").stat().st_mode) == 0o600
    assert page.state_text("test") in ("Starting…", "Ready, 6 tools")
    qtbot.wait_until(lambda: page.state_text("test").startswith("Ready"), timeout=START_MS)
    assert page.state_text("test") == "Ready, 6 tools"
    assert {"add", "city_time", "crash"} <= set(page.tool_names("test"))
    assert page.findChild(QPushButton, "mcpStartButton").text() == "Restart"


def test_bad_command_fails_with_the_reason(qtbot: Any, dialog: SettingsDialog) -> None:
    page = dialog.mcp_page
    editor = page.open_editor()
    fill(qtbot, page, editor, name="broken", command="/nonexistent/mcp-server", args="--x")
    qtbot.wait_until(lambda: page.state_text("broken").startswith("Failed"), timeout=START_MS)
    assert "not found" in page.state_text("broken") and "/nonexistent/mcp-server" in page.state_text("broken")
    assert page.tool_names("broken") == []
    assert "/nonexistent/mcp-server --x" in page.detail.toPlainText()


def test_a_server_whose_process_exits_shows_its_stderr(qtbot: Any, dialog: SettingsDialog) -> None:
    page = dialog.mcp_page
    fill(qtbot, page, page.open_editor(), name="exits", command=sys.executable,
         args="-c \"import sys; print('no such module: foo', file=sys.stderr); sys.exit(2)\"")
    qtbot.wait_until(lambda: page.state_text("exits").startswith("Failed"), timeout=START_MS)
    assert "no such module: foo" in page.detail.toPlainText()


def test_edit_disable_and_remove_persist(qtbot: Any, tmp_path: Path) -> None:
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": {
        "a": {"command": "uvx", "args": ["mcp-server-time"], "cwd": "/tmp"},
        "b": {"url": "https://example.org/mcp", "headers": {"Authorization": "Bearer x"}},
        "bad": {"command": 3},
    }}))
    dialog = SettingsDialog(Settings(tmp_path), [])
    qtbot.add_widget(dialog)
    page = dialog.mcp_page
    assert page.state_text("a") == "Not started" and page.state_text("b") == "Not started"
    assert page.state_text("bad").startswith("Invalid entry: 'command' must be")
    page.set_enabled("a", False)
    assert saved(tmp_path)["a"]["disabled"] is True and page.state_text("a") == "Disabled"
    page.select("a")
    assert not page.findChild(QPushButton, "mcpStartButton").isEnabled()

    editor = page.open_editor("a")  # a rename keeps its place, cwd and "disabled"
    assert editor.findChild(QLineEdit, "mcpArgsEdit").text() == "mcp-server-time"
    fill(qtbot, page, editor, name="clock", args="mcp-server-time --local-timezone 'Asia/Tokyo'")
    assert list(saved(tmp_path)) == ["clock", "b", "bad"]
    assert saved(tmp_path)["clock"] == {"command": "uvx", "args": ["mcp-server-time", "--local-timezone",
                                                                   "Asia/Tokyo"], "cwd": "/tmp", "disabled": True}
    assert saved(tmp_path)["bad"] == {"command": 3}  # kept for the user to fix

    editor = page.open_editor("b")
    assert editor.findChild(QPlainTextEdit, "mcpEnvEdit").toPlainText() == "Authorization=Bearer x"
    fill(qtbot, page, editor, name="b", command="uvx")  # both a command and a URL: refused, in words
    assert editor.isVisible() and "not both" in editor.findChild(QLabel, "mcpServerError").text()
    editor.reject()
    page.set_enabled("clock", True)
    page.select("b")
    page.findChild(QPushButton, "mcpRemoveButton").click()
    page.select("bad")
    page.findChild(QPushButton, "mcpRemoveButton").click()
    assert saved(tmp_path) == {"clock": {"command": "uvx", "args": ["mcp-server-time", "--local-timezone",
                                                                    "Asia/Tokyo"], "cwd": "/tmp"}}
    reopened = McpPage(tmp_path)
    qtbot.add_widget(reopened)
    assert [reopened.tree.topLevelItem(i).text(0) for i in range(reopened.tree.topLevelItemCount())] == ["clock"]
    dialog.mcp_page.close_servers()
    reopened.close_servers()


def test_a_file_that_is_not_json_is_reported(qtbot: Any, tmp_path: Path) -> None:
    (tmp_path / "mcp.json").write_text("{not json")
    page = McpPage(tmp_path)
    qtbot.add_widget(page)
    assert "is not valid JSON" in page._file_error.text() and page.tree.topLevelItemCount() == 0
    page.close_servers()


@pytest.mark.parametrize(("button", "decision", "remembered"), [
    ("allowOnceButton", Decision.ALLOW_ONCE, False),
    ("alwaysAllowButton", Decision.ALLOW_ALWAYS, True),
    ("denyButton", Decision.DENY, False),
])
def test_approval_dialog_answers(qtbot: Any, tmp_path: Path, button: str, decision: Decision,
                                 remembered: bool) -> None:
    store = ApprovalStore(tmp_path / "mcp_approvals.json")
    request = ApprovalRequest("time", "get_time", {"timezone": "Asia/Tokyo", "note": "<b>not bold</b>"})
    dialog = ApprovalDialog(request, store)
    qtbot.add_widget(dialog)
    assert json.loads(dialog.arguments.toPlainText()) == request.arguments
    assert '\n  "timezone": "Asia/Tokyo"' in dialog.arguments.toPlainText()
    assert "get_time" in dialog.findChild(QLabel, "approvalQuestion").text()
    dialog.findChild(QPushButton, button).click()
    assert dialog.decision is decision
    assert dialog.result() == (dialog.DialogCode.Rejected if decision is Decision.DENY else dialog.DialogCode.Accepted)
    assert ApprovalStore(tmp_path / "mcp_approvals.json").is_always("time", "get_time") is remembered
    if remembered:
        assert stat.S_IMODE((tmp_path / "mcp_approvals.json").stat().st_mode) == 0o600
        assert ask(request, store) is Decision.ALLOW_ALWAYS  # not asked again


def test_closing_the_approval_dialog_denies(qtbot: Any, tmp_path: Path) -> None:
    dialog = ApprovalDialog(ApprovalRequest("s", "t", {}), ApprovalStore(None))
    qtbot.add_widget(dialog)
    dialog.reject()
    assert dialog.decision is Decision.DENY


def test_gui_approver_asks_from_a_worker_thread(qtbot: Any, tmp_path: Path) -> None:
    store = ApprovalStore(tmp_path / "mcp_approvals.json")
    approver = GuiApprover(store)
    answers: list[Decision] = []

    def worker(request: ApprovalRequest) -> None:
        answers.append(approver(request))

    for button, expected in (("allowOnceButton", Decision.ALLOW_ONCE), ("alwaysAllowButton", Decision.ALLOW_ALWAYS)):
        with qtbot.wait_signal(approver.asked, timeout=5000) as asked:
            thread = threading.Thread(target=worker, args=(ApprovalRequest("s", "t", {"a": 1}),))
            thread.start()
        dialog = asked.args[0]
        assert dialog.isVisible() and json.loads(dialog.arguments.toPlainText()) == {"a": 1}
        dialog.findChild(QPushButton, button).click()
        thread.join(5)
        assert answers[-1] is expected
    thread = threading.Thread(target=worker, args=(ApprovalRequest("s", "t", {}),))
    thread.start()  # "always" now: not asked
    thread.join(5)
    assert answers[-1] is Decision.ALLOW_ALWAYS

    with qtbot.wait_signal(approver.asked, timeout=5000):
        thread = threading.Thread(target=worker, args=(ApprovalRequest("s", "other", {}),))
        thread.start()
    approver.deny_all()  # the chat stopped: the worker is not left waiting
    thread.join(5)
    assert not thread.is_alive() and answers[-1] is Decision.DENY


def test_the_tool_loop_limits_are_saved_checked_and_shown(qtbot: Any, tmp_path: Path) -> None:
    settings = Settings(tmp_path)
    assert (settings.tool_max_steps, settings.tool_call_timeout_s) == (8, 30)  # the defaults
    for name, bad in (("tool_max_steps", 0), ("tool_max_steps", 51), ("tool_call_timeout_s", 0)):
        with pytest.raises(ValueError, match="must be in"):
            setattr(settings, name, bad)
    page = McpPage(tmp_path)
    qtbot.add_widget(page)
    assert (page.steps_spin.value(), page.timeout_spin.value()) == (8, 30)
    page.steps_spin.setValue(3)
    page.timeout_spin.setValue(90)
    page.close_servers()
    assert "call_timeout_s=90" in (tmp_path / "settings.ini").read_text()  # saved at once, no OK needed
    reopened = McpPage(tmp_path)
    qtbot.add_widget(reopened)
    assert (reopened.steps_spin.value(), reopened.timeout_spin.value()) == (3, 90)
    reopened.close_servers()
    (tmp_path / "settings.ini").write_text("[tools]\nmax_steps=999\ncall_timeout_s=abc\n")
    assert (Settings(tmp_path).tool_max_steps, Settings(tmp_path).tool_call_timeout_s) == (8, 30)  # not trusted
