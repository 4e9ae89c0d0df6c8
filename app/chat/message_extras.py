"""What the transcript shows around a message's own text: the folds (a long user message, a reply's reasoning) and
the quiet line over a reply whose chat was cut to fit the context.

A large paste used to become one huge bubble that pushed the reply out of sight; past :data:`FOLD_MAX_LINES` lines
or :data:`FOLD_MAX_CHARS` characters a user message shows its start and a "Show all" link (then "Show less"). Only
the view folds: the stored text, Copy and Edit keep all of it.

When the engine leaves turns out to fit the context, the chat says so over the reply ("2 earlier turns are left out
(context 512 tokens)"), for a plain reply and a tools reply alike; the counts ride in the reply's ``stats`` under
:data:`LEFT_OUT_KEY` and :data:`CONTEXT_KEY` (``ReplyController`` puts them there through
``ConversationStore.set_left_out``, which keeps them in the database too), so a redraw and a restart keep the line.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtGui import QColor, QTextBlockFormat, QTextCharFormat, QTextCursor

from app.chat.markdown import close_open_fence
from app.data.conversations import CONTEXT_KEY, LEFT_OUT_KEY
from app.data.reply_context import LeftOut, left_out_words

#: The link action that folds or unfolds a long message (``hearth:fold/<message>``); the view handles it itself.
FOLD_ACTION = "fold"
#: A user message with more lines, or more characters, than these shows folded.
FOLD_MAX_LINES = 25
FOLD_MAX_CHARS = 2000
#: How much of a folded message shows: its first lines, at most this many characters.
FOLDED_LINES = 12
FOLDED_CHARS = 1000


def is_long(text: str) -> bool:
    """Whether ``text`` shows folded until the user asks for all of it."""
    return len(text) > FOLD_MAX_CHARS or text.count("\n") >= FOLD_MAX_LINES


def folded_text(text: str) -> str:
    """The start of ``text`` that a folded message shows: whole lines, cut at a space when one line is too long."""
    start = "\n".join(text.splitlines()[:FOLDED_LINES])
    if len(start) > FOLDED_CHARS:
        cut = start.rfind(" ", 0, FOLDED_CHARS)
        start = start[:cut if cut > FOLDED_CHARS // 2 else FOLDED_CHARS]
    return start.rstrip() + " …"


def fold_label(text: str, is_open: bool) -> str:
    """The link under a long message: what a click does, and how much there is."""
    if is_open:
        return "▴ Show less"
    num_lines = text.count("\n") + 1
    size = f"{num_lines:,} lines" if num_lines > 1 else f"{len(text):,} characters"
    return f"▾ Show all ({size})"


def insert_user_text(cursor: QTextCursor, text: str, is_open: bool, href: str, point_size: float,
                     link: QColor) -> None:
    """Insert a user message's text at ``cursor`` as plain text: all of it, or its start and a "Show all" link
    (``href``) when it is long and not ``is_open``."""
    if not is_long(text):
        cursor.insertText(text)
        return
    cursor.insertText(text if is_open else folded_text(text))
    cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
    fmt = QTextCharFormat()
    fmt.setFontPointSize(point_size)
    fmt.setForeground(link)
    fmt.setAnchor(True)
    fmt.setAnchorHref(href)
    fmt.setToolTip("Show less of this message" if is_open else "Show the whole message")
    cursor.insertText(fold_label(text, is_open), fmt)


def reasoning_markdown(reasoning: str, is_thinking: bool, href: str, is_shown: bool) -> str:
    """The "Reasoning" line that folds a reply's ``<think>`` reasoning (a link to ``href``), and the reasoning as a
    quote when shown."""
    title = "Thinking…" if is_thinking else "Reasoning"
    words = len(reasoning.split())
    link = f"[{'▾' if is_shown else '▸'} {title} ({words} words, click to {'hide' if is_shown else 'show'})]"
    if not is_shown or not reasoning:
        return f"{link}({href})"
    quoted = "\n".join(f"> {line}" for line in close_open_fence(reasoning).splitlines())
    return f"{link}({href})\n\n{quoted}"


def left_out_note(stats: dict[str, Any] | None) -> str:
    """The line over a reply whose chat was cut to fit the context ("" when nothing was left out)."""
    num = int((stats or {}).get(LEFT_OUT_KEY) or 0)
    if num <= 0:
        return ""
    return left_out_words(LeftOut(num, int((stats or {}).get(CONTEXT_KEY) or 0)))
