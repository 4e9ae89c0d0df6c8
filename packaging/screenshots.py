"""Take the screenshots in ``resources/screenshots/`` with the real engine and the default model.

Run from the repository root under a virtual X server (``packaging`` is not importable as a
package: pip's ``packaging`` owns the name)::

    PYTHONPATH=. xvfb-run -a -s "-screen 0 1600x1200x24" .venv/bin/python packaging/screenshots.py monitor
    PYTHONPATH=. xvfb-run -a -s "-screen 0 1366x768x24" .venv/bin/python packaging/screenshots.py window \
        --size 1366x768 --theme dark
    PYTHONPATH=. xvfb-run -a -s "-screen 0 1366x768x24" .venv/bin/python packaging/screenshots.py tools

``monitor``: the monitor pane while four replies stream at once (monitor.png).
``window``: the whole window after a real answer to a question, plus a code question, at ``--size`` (run it on a
screen that size, as ``make screenshots`` does) in the ``--theme``: main-WxH.png for light, dark-WxH.png for dark.
``models``: the whole window at ``--size`` with the Models list in front, the default model loaded and marked as
running, and the folders a user added (``--folder``, repeatable) scanned (models.png).
``tools``: a chat with tools over PyPI's ``mcp-server-time``, at ``--size``: tool-steps.png, a reply with its two
calls folded under it, and tool-approval.png, the approval dialog a call opens. The calls' results come from the
real server through the MCP host and are stored as the tool loop stores them; the reply's sentence is written from
them (no model is loaded). The dialog is opened by the chat's own approver from a worker thread, as a reply does.
The PNGs are written at zlib's highest compression.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

import app  # noqa: F401 (applies app.qtfix)
from app.bridge.engine_bridge import EngineBridge
from app.monitor.monitor_pane import MonitorPane

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "resources" / "screenshots"
#: ``QImage.save``'s quality for PNG: 0 asks for zlib's highest compression.
PNG_QUALITY = 0
PROMPTS = (
    "Write a short story about a lighthouse keeper.",
    "Explain how a paged KV cache works.",
    "List ten facts about octopuses.",
    "Describe a walk through a forest in autumn.",
)


def monitor(out: Path, idle_s: float, stream_s: float) -> None:
    """Load the default model, stream four replies, and grab the monitor pane mid-generation."""
    qapp = QApplication.instance() or QApplication(sys.argv)
    bridge = EngineBridge()
    pane = MonitorPane()
    pane.setWindowTitle("Hearth: Monitor")
    pane.resize(1100, 1130)
    signals = bridge.signals
    signals.metrics_updated.connect(pane._on_metrics_updated)
    signals.model_loaded.connect(pane._on_model_loaded)
    signals.hardware_detected.connect(pane._on_hardware_detected)
    signals.error.connect(lambda message: print("engine error:", message, file=sys.stderr))
    pane.show()
    started = time.monotonic()

    def submit() -> None:
        for i, prompt in enumerate(PROMPTS):
            bridge.submit(f"c{i}", [{"role": "user", "content": prompt}], {"max_tokens": 400, "temperature": 0.7})
        QTimer.singleShot(int(stream_s * 1000), grab)

    def grab() -> None:
        pane.redraw()
        out.parent.mkdir(parents=True, exist_ok=True)
        pane.grab().save(str(out))
        print(f"saved {out} ({time.monotonic() - started:.0f} s after start; "
              f"{pane.snapshot.get('num_running', 0):.0f} running)")
        qapp.quit()

    signals.model_loaded.connect(lambda info: QTimer.singleShot(int(idle_s * 1000), submit))
    signals.model_load_failed.connect(lambda message: (print(message, file=sys.stderr), qapp.exit(1)))
    bridge.detect_hardware()
    bridge.load_model("default")
    code = qapp.exec()
    bridge.shutdown()
    if code:
        raise SystemExit(code)


def _open_window(data_dir: Path, size: tuple[int, int], theme: str) -> Any:
    """Hearth's main window on ``data_dir`` with ``theme`` stored as the user's choice, at ``size``, shown."""
    import app as hearth
    from app.data.settings import Settings

    settings = Settings(data_dir)
    settings.theme = theme
    settings.sync()
    win = hearth.create_window(data_dir=data_dir)
    win.resize(*size)
    win.show()
    return win


def _save_and_close(qapp: Any, win: Any, out: Path) -> None:
    """Save the window's picture to ``out``, close it and end the event loop."""
    out.parent.mkdir(parents=True, exist_ok=True)
    win.grab().save(str(out), "PNG", PNG_QUALITY)
    print(f"saved {out} ({out.stat().st_size // 1024} KiB)")
    win.close()
    qapp.exit(0)


def _load_then(qapp: Any, win: Any, delay_ms: int, then: Callable[[], None]) -> None:
    """Press the window's Load button, call ``then`` ``delay_ms`` after the model loaded, and run the event loop
    until something ends it (exit 1 when the load fails)."""
    from PySide6.QtWidgets import QPushButton

    win.bridge.signals.model_loaded.connect(lambda info: QTimer.singleShot(delay_ms, then))
    win.bridge.signals.model_load_failed.connect(lambda message: (print(message, file=sys.stderr), qapp.exit(1)))
    QTimer.singleShot(500, win.findChild(QPushButton, "loadModelButton").click)
    if qapp.exec():
        raise SystemExit(1)


def main_window(out: Path, size: tuple[int, int] = (1500, 950), theme: str = "system") -> None:
    """Load the default model through the model pane, ask two questions, grab the window when both are done."""
    import tempfile

    from PySide6.QtWidgets import QDoubleSpinBox, QPushButton

    from app.chat.chat_input import ChatInput
    from app.data.conversations import STATUS_STREAMING

    qapp = QApplication.instance() or QApplication(sys.argv)
    win = _open_window(Path(tempfile.mkdtemp(prefix="hearth-shot-")), size, theme)
    win.findChild(QDoubleSpinBox, "temperatureSpin").setValue(0.0)
    questions = iter(["What is the capital of France?", "Write a Python function that reverses a string."])

    def ask() -> None:
        question = next(questions, None)
        if question is None:
            QTimer.singleShot(1500, grab)
            return
        box = win.findChild(ChatInput, "chatInput")
        box.setPlainText(question)
        win.findChild(QPushButton, "sendButton").click()
        reply = win.chat_pane.current_conversation.messages[-1]

        def wait() -> None:
            if reply.status == STATUS_STREAMING:
                QTimer.singleShot(200, wait)
            else:
                QTimer.singleShot(500, ask)

        QTimer.singleShot(200, wait)

    def grab() -> None:
        _save_and_close(qapp, win, out)

    _load_then(qapp, win, 2000, ask)


def models_window(out: Path, size: tuple[int, int], folders: list[str]) -> None:
    """Load the default model, put the Models list in front with ``folders`` added, grab the window once the list
    shows the running model."""
    import tempfile

    from app.model.models_view import RUNNING_MARK

    qapp = QApplication.instance() or QApplication(sys.argv)
    win = _open_window(Path(tempfile.mkdtemp(prefix="hearth-shot-")), size, "light")
    if folders:
        win.models_view.set_folders([str(Path(f).resolve()) for f in folders])
        win.models_view.refresh()

    def shown() -> None:
        running = win.models_view.running_item
        if running is None or not running.text(0).endswith(RUNNING_MARK):
            QTimer.singleShot(300, shown)
            return
        win.models_dock.raise_()
        QTimer.singleShot(1000, grab)

    def grab() -> None:
        _save_and_close(qapp, win, out)

    _load_then(qapp, win, 1000, shown)


TOOLS_QUESTION = "What time is it in Tokyo and in Paris?"
TIMEZONES = ("Asia/Tokyo", "Europe/Paris")


def _time_server() -> dict[str, object]:
    """``mcp.json``'s entry for PyPI's ``mcp-server-time``, run by this interpreter."""
    return {"command": sys.executable, "args": ["-m", "mcp_server_time"]}


def _stored_time_chat(data_dir: Path) -> int:
    """A chat that asked the time in two cities, with the server's real answers stored as the reply's steps."""
    import json
    from datetime import datetime, timedelta

    from app.data.storage import Storage
    from app.data.tool_steps import ToolsChoice, ToolStepRecord, ToolStepStore
    from engine.mcp.config import parse_config
    from engine.mcp.host import McpHost

    steps, times = [], []
    with McpHost(parse_config({"mcpServers": {"time": _time_server()}}), start_timeout_s=60) as host:
        for zone in TIMEZONES:
            arguments = {"timezone": zone}
            result = host.call_tool("time", "get_current_time", arguments).result(90)
            if result.is_error:
                raise SystemExit(f"mcp-server-time failed: {result.text}")
            steps.append(ToolStepRecord("time", "get_current_time", json.dumps(arguments), "ok", result.text))
            times.append(datetime.fromisoformat(json.loads(result.text)["datetime"]))
    tokyo, paris = times
    ahead = ((tokyo.utcoffset() or timedelta()) - (paris.utcoffset() or timedelta())) // timedelta(hours=1)
    answer = (f"It is **{tokyo:%H:%M}** in Tokyo and **{paris:%H:%M}** in Paris: Tokyo is {ahead} hours ahead.")
    with Storage(data_dir / "hearth.db") as storage:
        conversation = storage.create_conversation("Time in Tokyo and Paris")
        question = storage.add_message(conversation.id, "user", TOOLS_QUESTION)
        reply = storage.add_message(conversation.id, "assistant", answer, question.id)
        store = ToolStepStore(storage)
        store.add_all(reply.id or 0, steps)
        store.set_choice(conversation.id, ToolsChoice(enabled=True))
        return conversation.id


def tools(out_dir: Path, size: tuple[int, int], theme: str) -> None:
    """Grab the chat with tool steps, then the approval dialog over it."""
    import json
    import tempfile
    import threading

    from PySide6.QtCore import QPoint
    from PySide6.QtGui import QColor, QGuiApplication, QPainter, QPen, QPixmap

    from app.tools.approval_dialog import ApprovalDialog
    from engine.mcp.approvals import ApprovalRequest

    qapp = QApplication.instance() or QApplication(sys.argv)
    data_dir = Path(tempfile.mkdtemp(prefix="hearth-shot-"))
    (data_dir / "mcp.json").write_text(json.dumps({"mcpServers": {"time": _time_server()}}))
    conversation_id = _stored_time_chat(data_dir)
    win = _open_window(data_dir, size, theme)
    win.chat_pane.select_conversation(conversation_id)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    def save(image: QPixmap, name: str) -> None:
        path = out_dir / name
        image.save(str(path), "PNG", PNG_QUALITY)
        print(f"saved {path} ({path.stat().st_size // 1024} KiB)")

    def grab_steps() -> None:  # once the chat's server is up: the button shows its tools
        if "2 tools" not in win.tools.button.text() and time.monotonic() - started < 90:
            QTimer.singleShot(200, grab_steps)
            return
        save(win.chat_pane.grab(), "tool-steps.png")
        spec = win.tools.spec_for(conversation_id)
        if spec is None:
            raise SystemExit("the chat has no tools")
        request = ApprovalRequest("time", "get_current_time", {"timezone": "Asia/Tokyo"})
        win.tools.asked.connect(lambda dialog: QTimer.singleShot(800, lambda: grab_dialog(dialog)))
        threading.Thread(target=spec.approve, args=(request,), name="shot-approve", daemon=True).start()

    def grab_dialog(dialog: ApprovalDialog) -> None:  # the chat with the dialog over it, as the screen shows them
        pane = win.chat_pane
        corner = pane.mapToGlobal(QPoint(0, 0))
        image = QGuiApplication.primaryScreen().grabWindow(0, corner.x(), corner.y(), pane.width(), pane.height())
        painter = QPainter(image)  # the virtual screen has no window manager to draw the dialog's frame
        painter.setPen(QPen(QColor("#555555"), 2))
        painter.drawRect(dialog.frameGeometry().translated(-corner.x(), -corner.y()).adjusted(-1, -1, 0, 0))
        painter.end()
        save(image, "tool-approval.png")
        dialog.reject()  # denied: nothing runs
        win.close()
        qapp.exit(0)

    QTimer.singleShot(1000, grab_steps)
    if qapp.exec():
        raise SystemExit(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="packaging/screenshots.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shot", choices=["monitor", "window", "models", "tools"])
    parser.add_argument("--size", default="1366x768", help="the window's size, WIDTHxHEIGHT (window)")
    parser.add_argument("--theme", choices=["light", "dark"], default="light", help="the theme (window)")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    parser.add_argument("--folder", action="append", default=[], help="a models folder to add to the list (models)")
    parser.add_argument("--idle", type=float, default=6.0, help="seconds of idle graph before the replies")
    parser.add_argument("--stream", type=float, default=14.0, help="seconds of streaming before the grab")
    args = parser.parse_args(argv)
    width, _, height = args.size.partition("x")
    if args.shot in ("window", "models", "tools") and not (width.isdigit() and height.isdigit()):
        parser.error(f"--size takes WIDTHxHEIGHT, such as 1366x768, not {args.size!r}")
    if args.shot == "window":
        name = "main" if args.theme == "light" else "dark"
        main_window(args.out_dir / f"{name}-{args.size}.png", size=(int(width), int(height)), theme=args.theme)
    elif args.shot == "models":
        models_window(args.out_dir / "models.png", (int(width), int(height)), args.folder)
    elif args.shot == "tools":
        tools(args.out_dir, (int(width), int(height)), args.theme)
    else:
        monitor(args.out_dir / "monitor.png", args.idle, args.stream)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
