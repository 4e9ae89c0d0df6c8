"""The sidebar search's matches, marked in the transcript, and the first one scrolled into view.

Opening a search result used to show the end of the chat with nothing marked, so the user had to find the match
again by eye. The marks are extra selections: they colour the text without changing the document (the messages'
own formats, links and code colours stay as rendered) and go away when the search is cleared.
"""

from __future__ import annotations

from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QTextEdit

from app.chat.message_view import MessageView

#: The marks' colours: a highlighter's yellow with black text, which reads in the light and the dark theme alike.
MATCH_BACKGROUND = "#ffd54f"
MATCH_FOREGROUND = "#000000"
#: At most this many matches are marked (the first is the one scrolled to).
MAX_MARKED = 500


def highlight_matches(view: QTextEdit, text: str, *, scroll: bool = True) -> int:
    """Mark every case-insensitive occurrence of ``text`` in ``view``; with ``scroll``, bring the first into view.

    An empty ``text`` clears the marks.

    Returns:
        How many occurrences were marked.
    """
    needle = text.strip()
    if needle and isinstance(view, MessageView):
        view.unfold_matching(needle)  # a match in a folded message shows
    marks: list[QTextEdit.ExtraSelection] = []
    document = view.document()
    mark_format = QTextCharFormat()
    mark_format.setBackground(QColor(MATCH_BACKGROUND))
    mark_format.setForeground(QColor(MATCH_FOREGROUND))
    cursor = QTextCursor(document)
    while needle and len(marks) < MAX_MARKED:
        cursor = document.find(needle, cursor)
        if cursor.isNull():
            break
        mark = QTextEdit.ExtraSelection()
        mark.cursor = QTextCursor(cursor)
        mark.format = mark_format
        marks.append(mark)
    view.setExtraSelections(marks)
    if marks and scroll:
        _scroll_to(view, marks[0].cursor)
    return len(marks)


def _scroll_to(view: QTextEdit, cursor: QTextCursor) -> None:
    """Scroll so that ``cursor`` sits a third of the way down the viewport (some context above it shows)."""
    bar = view.verticalScrollBar()
    top = view.cursorRect(cursor).top()
    bar.setValue(bar.value() + top - view.viewport().height() // 3)
