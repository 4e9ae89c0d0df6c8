"""Colours code blocks in a rendered Markdown document."""

from __future__ import annotations

from PySide6.QtGui import QColor, QFont, QSyntaxHighlighter, QTextCharFormat, QTextDocument, QTextFormat

from app.chat.markdown import tokenize_code

_COLOURS = {
    "keyword": ("#8839ef", True),
    "string": ("#40a02b", False),
    "comment": ("#8c8fa1", False),
    "number": ("#fe640b", False),
    "builtin": ("#1e66f5", False),
}
#: The same kinds on a dark background.
_DARK_COLOURS = {
    "keyword": ("#cba6f7", True),
    "string": ("#a6e3a1", False),
    "comment": ("#9399b2", False),
    "number": ("#fab387", False),
    "builtin": ("#89b4fa", False),
}
#: Block property that marks a code block whose lines were made wrappable (no longer ``nonBreakableLines``).
CODE_BLOCK_PROPERTY = QTextFormat.Property.UserProperty + 1


class CodeHighlighter(QSyntaxHighlighter):
    """Highlights the blocks Qt's Markdown importer marked as code (fenced or indented).

    Qt re-runs :meth:`highlightBlock` only for blocks that changed, so streaming a reply costs
    a highlight of the new lines, not of the whole conversation.
    """

    def __init__(self, document: QTextDocument) -> None:
        super().__init__(document)
        self._formats: dict[str, QTextCharFormat] = {}
        self._is_dark: bool | None = None
        self.set_dark(False)

    def set_dark(self, is_dark: bool) -> None:
        """Use colours that read on a dark (or light) background, for blocks highlighted from now on."""
        if is_dark == self._is_dark:
            return
        self._is_dark = is_dark
        for kind, (colour, bold) in (_DARK_COLOURS if is_dark else _COLOURS).items():
            fmt = QTextCharFormat()
            fmt.setForeground(QColor(colour))
            if bold:
                fmt.setFontWeight(QFont.Weight.DemiBold)
            self._formats[kind] = fmt

    def highlightBlock(self, text: str) -> None:
        block_format = self.currentBlock().blockFormat()
        if not (block_format.hasProperty(QTextFormat.Property.BlockCodeFence)
                or block_format.nonBreakableLines() or block_format.boolProperty(CODE_BLOCK_PROPERTY)):
            return
        language = block_format.stringProperty(QTextFormat.Property.BlockCodeLanguage)
        for span in tokenize_code(text, language):
            self.setFormat(span.start, span.length, self._formats[span.kind])
