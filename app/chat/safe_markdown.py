"""A message's Markdown turned into rich text that can neither load nor open anything by itself.

A reply comes from a model, a remote server or an imported file, so its Markdown is untrusted. Qt would read an
image's file (``file:``, ``qrc:``, a bare or relative path) on the GUI thread when it lays the text out: a
``/dev/zero`` image fills the memory and a FIFO blocks the app for good. So images become text (their alt, and
a link when they are on the web), inline and block HTML shows as the text it is, and a link in the reply may not
pose as one of the view's own ``hearth:`` actions. Links stay links: the view opens only a click on an http(s)
one (:func:`is_web_link`).
"""

from __future__ import annotations

from collections.abc import Container

from PySide6.QtCore import QUrl
from PySide6.QtGui import (
    QGuiApplication,
    QPalette,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextDocumentFragment,
    QTextFormat,
)

#: The only schemes a click may open (in the system's browser).
WEB_SCHEMES = frozenset({"http", "https"})
#: GitHub's dialect (tables, task lists, strikethrough, autolinks), with HTML kept as text.
_FEATURES = QTextDocument.MarkdownFeature.MarkdownDialectGitHub | QTextDocument.MarkdownFeature.MarkdownNoHTML
_SHOWN_ADDRESS_CHARS = 200


def is_web_link(url: QUrl) -> bool:
    """Whether ``url`` is an http(s) address with a host: the only kind a click opens."""
    return url.isValid() and url.scheme().lower() in WEB_SCHEMES and bool(url.host())


def shown_address(href: str) -> str:
    """``href`` cut to a length fit for a tooltip or a notice (a ``data:`` address can be megabytes)."""
    return href if len(href) <= _SHOWN_ADDRESS_CHARS else href[:_SHOWN_ADDRESS_CHARS] + "…"


def markdown_fragment(markdown: str, own_links: Container[str], own_scheme: str) -> QTextDocumentFragment:
    """Render ``markdown`` into a fragment with no image and no forged action link.

    Args:
        markdown: The message's Markdown.
        own_links: The ``own_scheme`` links the caller put into ``markdown`` itself; any other link with that
            scheme came from the message and becomes plain text.
        own_scheme: The scheme of the view's action links.
    """
    # A document with no parent and no layout: nothing in it is ever loaded or drawn.
    document = QTextDocument()
    document.setMarkdown(markdown, _FEATURES)
    _defuse(document, own_links, own_scheme)
    return QTextDocumentFragment(document)


def _defuse(document: QTextDocument, own_links: Container[str], own_scheme: str) -> None:
    images: list[tuple[int, int, QTextCharFormat]] = []
    block = document.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            fmt = fragment.charFormat()
            if fmt.isImageFormat():
                images.append((fragment.position(), fragment.length(), fmt))
            elif fmt.isAnchor() and fmt.anchorHref():
                _defuse_link(document, fragment.position(), fragment.length(), fmt, own_links, own_scheme)
            it += 1
        block = block.next()
    for position, length, fmt in reversed(images):  # from the end, so earlier positions stay put
        cursor = QTextCursor(document)
        cursor.setPosition(position)
        cursor.setPosition(position + length, QTextCursor.MoveMode.KeepAnchor)
        cursor.insertText(_image_text(fmt) * length, _image_format(fmt))  # equal neighbours share a fragment


def _defuse_link(document: QTextDocument, position: int, length: int, fmt: QTextCharFormat,
                 own_links: Container[str], own_scheme: str) -> None:
    href = fmt.anchorHref()
    safe = QTextCharFormat(fmt)
    if QUrl(href).scheme() == own_scheme and href not in own_links:
        safe.setAnchor(False)
        safe.clearProperty(QTextFormat.Property.AnchorHref)
        safe.clearForeground()
        safe.setFontUnderline(False)
    safe.setToolTip(shown_address(href))
    cursor = QTextCursor(document)
    cursor.setPosition(position)
    cursor.setPosition(position + length, QTextCursor.MoveMode.KeepAnchor)
    cursor.setCharFormat(safe)


def _image_text(fmt: QTextCharFormat) -> str:
    alt = str(fmt.property(QTextFormat.Property.ImageAltText) or "").strip()
    return f"[image: {alt}]" if alt else "[image]"


def _image_format(image: QTextCharFormat) -> QTextCharFormat:
    src = image.toImageFormat().name()
    fmt = QTextCharFormat()
    fmt.setFontItalic(True)
    fmt.setToolTip(shown_address(src))
    if is_web_link(QUrl(src)):
        fmt.setAnchor(True)
        fmt.setAnchorHref(src)
        fmt.setFontUnderline(True)
        fmt.setForeground(QGuiApplication.palette().color(QPalette.ColorRole.Link))
    return fmt
