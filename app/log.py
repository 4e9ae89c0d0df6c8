"""Category loggers and the Qt message handler.

Loggers are named for what they cover, not for the file that logs (as in qutebrowser's
``utils/log.py``): ``ui`` for widgets, ``bridge`` for the engine bridge, ``qt`` for messages
Qt itself prints. :func:`init_log` sets up console output; :func:`install_qt_handler` routes
``qDebug``/``qWarning``/... into the ``qt`` logger.
"""

from __future__ import annotations

import logging
import sys

from PySide6.QtCore import QMessageLogContext, QtMsgType, qInstallMessageHandler

ui = logging.getLogger("ui")
bridge = logging.getLogger("bridge")
qt = logging.getLogger("qt")

_QT_LEVELS = {
    QtMsgType.QtDebugMsg: logging.DEBUG,
    QtMsgType.QtInfoMsg: logging.INFO,
    QtMsgType.QtWarningMsg: logging.WARNING,
    QtMsgType.QtCriticalMsg: logging.ERROR,
    QtMsgType.QtFatalMsg: logging.CRITICAL,
}

_FORMAT = "%(asctime)s %(levelname)-7s %(name)-7s %(message)s"


def init_log(level: int = logging.INFO) -> None:
    """Send log records of all categories to stderr."""
    root = logging.getLogger()
    if not any(getattr(h, "_hearth", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
        handler._hearth = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(level)


def qt_message_handler(msg_type: QtMsgType, context: QMessageLogContext, message: str) -> None:
    """Log a message from Qt on the ``qt`` logger, at the matching level."""
    level = _QT_LEVELS.get(msg_type, logging.WARNING)
    where = ""
    if context is not None and context.category and context.category != "default":
        where = f"[{context.category}] "
    qt.log(level, "%s%s", where, message)


def install_qt_handler() -> None:
    """Route Qt's own messages into the ``qt`` logger."""
    qInstallMessageHandler(qt_message_handler)
