"""Logging categories, the Qt message handler, the PySide work-around, the icon and ``main()``."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QMessageLogContext, QTimer, QtMsgType
from PySide6.QtWidgets import QApplication

from app import log, qtfix
from app.icon import RESOURCES_DIR, app_icon, draw_icon

ROOT = Path(__file__).parents[2]


def test_category_loggers() -> None:
    assert (log.ui.name, log.bridge.name, log.qt.name) == ("ui", "bridge", "qt")


def test_qt_messages_go_to_the_qt_logger(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="qt"):
        log.qt_message_handler(QtMsgType.QtInfoMsg, QMessageLogContext(), "hello from Qt")
        log.qt_message_handler(QtMsgType.QtCriticalMsg, QMessageLogContext(), "bad")
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("qt", logging.INFO, "hello from Qt"), ("qt", logging.ERROR, "bad")]


def test_many_emits_do_not_crash_the_interpreter() -> None:
    """PySide6 6.12.0 drops a reference to True on every emit; qtfix must keep us alive."""
    code = textwrap.dedent("""
        import app
        from PySide6.QtCore import QCoreApplication, QObject, Signal
        class S(QObject):
            fired = Signal(str)
        qapp = QCoreApplication([])
        s = S()
        s.fired.connect(lambda text: None)
        for _ in range(200_000):
            s.fired.emit("x")
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ok"


def test_many_void_calls_do_not_crash_the_interpreter() -> None:
    """PySide6 6.12.0 drops a reference to None on every call of a void method (pyqtgraph makes many)."""
    code = textwrap.dedent("""
        import app
        from PySide6.QtCore import QCoreApplication, QTimer
        qapp = QCoreApplication([])
        timer = QTimer()
        for _ in range(200_000):
            timer.setInterval(5)
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ok"


def test_qtfix_apply_is_idempotent() -> None:
    first = qtfix.apply()
    assert qtfix.apply() == first


def test_icon_files_and_fallback(qapp: Any) -> None:
    assert (RESOURCES_DIR / "hearth.svg").is_file() and (RESOURCES_DIR / "hearth.png").is_file()
    assert not app_icon().isNull()
    image = draw_icon(64)
    assert image.width() == 64 and image.pixelColor(32, 40).alpha() == 255


def test_main_opens_the_window_and_returns_on_close(qtbot: Any, monkeypatch: pytest.MonkeyPatch,
                                                    fake_api: Any, tmp_path: Path) -> None:
    import app
    import app.__main__ as app_main
    from app.bridge.engine_bridge import EngineBridge

    windows: list[Any] = []

    def create_window(data_dir: Any = None) -> Any:
        win = app.create_window(data_dir, bridge=EngineBridge(api=fake_api))
        windows.append(win)
        return win

    monkeypatch.setattr(app_main, "create_window", create_window)
    monkeypatch.setattr(log, "install_qt_handler", lambda: None)  # keep pytest-qt's handler
    QTimer.singleShot(300, lambda: windows[0].close())
    assert app_main.main(["hearth", "--data-dir", str(tmp_path)]) == 0
    assert windows[0].windowTitle() == "Hearth"
    assert windows[0].data_dir == tmp_path
    assert not QApplication.windowIcon().isNull()
