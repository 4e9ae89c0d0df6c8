"""A reply's tool steps in the transcript (:class:`~app.chat.message_view.MessageView` draws them under it).

Each call is one line, "▸ Tool add · server t · ran", that a click opens to show the arguments and the result, and
closes again. Everything is inserted as plain text: nothing a model or a tool wrote is rendered as HTML or
followed as a link.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from PySide6.QtGui import QColor, QFont, QFontDatabase, QTextBlockFormat, QTextCharFormat, QTextCursor

from app.data.tool_steps import ToolStepRecord

#: The link action that opens or closes a step (``hearth:step/<message>/<step>``); the view handles it itself.
STEP_ACTION = "step"
#: A result longer than this shows its start only (the model was given all of it).
MAX_SHOWN_CHARS = 4000
_OUTCOME_WORDS = {"ok": "ran", "error": "failed", "denied": "denied by you"}


def step_title(step: ToolStepRecord) -> str:
    """The step's line without its fold mark: the tool, its server and what came of it."""
    server = f" · server {step.server}" if step.server else ""
    return f"Tool {step.tool}{server} · {_OUTCOME_WORDS.get(step.outcome, step.outcome)}"


def shown_arguments(arguments: str) -> str:
    """The arguments as indented JSON (as written when they are not JSON)."""
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except ValueError:
        return arguments


def _clip(text: str) -> str:
    return text if len(text) <= MAX_SHOWN_CHARS else text[:MAX_SHOWN_CHARS] + f"\n… ({len(text):,} characters)"


def insert_steps(cursor: QTextCursor, steps: list[ToolStepRecord], href: Callable[[int], str],
                 is_open: Callable[[int], bool], point_size: float, muted: QColor, link: QColor) -> None:
    """Insert ``steps`` at ``cursor``: each a link line (``href(k)``), opened when ``is_open(k)``."""
    plain = QTextCharFormat()
    plain.setFontPointSize(point_size)
    plain.setForeground(muted)
    mono = QTextCharFormat(plain)
    mono.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
    mono.setFontPointSize(point_size)
    label = QTextCharFormat(plain)
    label.setFontWeight(QFont.Weight.Bold)
    for k, step in enumerate(steps):
        if cursor.block().length() > 1:
            cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
        line = QTextCharFormat(plain)
        line.setAnchor(True)
        line.setAnchorHref(href(k))
        line.setForeground(QColor("#c62828") if step.outcome != "ok" else link)
        line.setToolTip("Show or hide the arguments and the result")
        cursor.insertText(f"{'▾' if is_open(k) else '▸'} {step_title(step)}", line)
        if not is_open(k):
            continue
        for title, text in (("Arguments", shown_arguments(step.arguments)), ("Result", _clip(step.result))):
            cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
            cursor.insertText(title, label)
            for text_line in (text or "(empty)").splitlines() or [""]:
                cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
                cursor.insertText(text_line, mono)
    cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
