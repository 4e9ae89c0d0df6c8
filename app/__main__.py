"""``python -m app`` / the ``hearth`` command: open Hearth's main window."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import cast

from PySide6.QtWidgets import QApplication

from app import create_window, log
from app.gui_gc import GuiGarbageCollector
from app.icon import app_icon

#: The engine's data dir (``engine.system.paths.DATA_DIR_ENV``): conversations, settings and the model cache.
DATA_DIR_ENV = "HEARTH_DATA_DIR"


def main(argv: list[str] | None = None) -> int:
    """Run Hearth until its window closes; returns the exit code."""
    argv = list(sys.argv if argv is None else argv)
    parser = argparse.ArgumentParser(prog="hearth", description="Chat with local language models.")
    parser.add_argument("--data-dir", help="where Hearth keeps its data (default: per-user data folder)")
    parser.add_argument("--debug", action="store_true", help="log debug messages")
    parser.add_argument(
        "--self-test", metavar="PROMPT", help="answer PROMPT with the default model, print the reply, exit"
    )
    args, qt_args = parser.parse_known_args(argv[1:])
    if args.data_dir:  # before the engine is imported: its model cache lives in the data dir too
        os.environ[DATA_DIR_ENV] = str(Path(args.data_dir).expanduser().resolve())

    log.init_log(logging.DEBUG if args.debug else logging.INFO)
    if args.self_test is not None:  # headless: no QApplication, no window
        from engine.tools.self_test import run_self_test

        return run_self_test(args.self_test)
    log.install_qt_handler()
    QApplication.setApplicationName("Hearth")
    QApplication.setApplicationDisplayName("Hearth")
    QApplication.setDesktopFileName("hearth")
    app = cast(QApplication, QApplication.instance() or QApplication(argv[:1] + qt_args))
    app.setWindowIcon(app_icon())
    collector = GuiGarbageCollector(app)  # cyclic garbage (Qt wrappers included) is freed on this thread only
    window = create_window(args.data_dir)
    window.show()
    log.ui.info("Hearth started; data in %s", window.data_dir)
    try:
        return app.exec()
    finally:
        collector.stop()


if __name__ == "__main__":
    sys.exit(main())
