"""A reply's Sources list in the transcript (:class:`~app.chat.message_view.MessageView` draws it under the reply):
each source's number, file and page as a link that opens it, its score, and its passage."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtGui import QColor, QFont, QTextBlockFormat, QTextCharFormat, QTextCursor

from app.docs.citations import ShownSources, snippet


def insert_sources(cursor: QTextCursor, shown: ShownSources, href: Callable[[int], str], point_size: float,
                   muted: QColor, link: QColor) -> None:
    """Insert the Sources list at ``cursor``; source ``n``'s link is ``href(n)``."""
    plain = QTextCharFormat()
    plain.setFontPointSize(point_size)
    plain.setForeground(muted)
    title = QTextCharFormat(plain)
    title.setFontWeight(QFont.Weight.Bold)
    if cursor.block().length() > 1:
        cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
    cursor.insertText(shown.title, title)
    for number, source in shown.entries:
        cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
        fmt = QTextCharFormat(plain)
        fmt.setAnchor(True)
        fmt.setAnchorHref(href(number))
        fmt.setForeground(link)
        fmt.setToolTip(source.file)
        cursor.insertText(f"[{number}] {source.label}", fmt)
        cursor.insertText(f"  ·  score {source.score:.3f}  ·  {snippet(source)}", plain)
    cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
