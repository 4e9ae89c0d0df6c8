"""The transcript of one conversation, rendered from Markdown, with actions, tool steps and Sources lists."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QEvent, QTimer, QUrl, Signal, Slot
from PySide6.QtGui import (
    QColor,
    QCursor,
    QDesktopServices,
    QFont,
    QImage,
    QPalette,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFormat,
    QTextFrame,
    QTextFrameFormat,
    QTextOption,
)
from PySide6.QtWidgets import QTextBrowser, QToolTip, QWidget

from app.chat.code_highlighter import CODE_BLOCK_PROPERTY, CodeHighlighter
from app.chat.markdown import add_copy_links, close_open_fence, code_blocks, split_reasoning
from app.chat.message_extras import FOLD_ACTION, insert_user_text, is_long, left_out_note, reasoning_markdown
from app.chat.safe_markdown import is_web_link, markdown_fragment, shown_address
from app.chat.sources_list import insert_sources
from app.chat.tool_steps_view import STEP_ACTION, insert_steps
from app.data.conversations import STATUS_ERROR, STATUS_STREAMING, Conversation, Message
from app.data.tool_steps import ToolStepRecord
from app.docs.citations import ShownSources
from app.formatting import reply_stats_line

#: What :meth:`MessageView.loadResource` answers for any image: a transparent pixel.
_BLANK_IMAGE = QImage(1, 1, QImage.Format.Format_ARGB32)
_BLANK_IMAGE.fill(0)
_ROLE_NAMES = {"user": "You", "assistant": "Hearth", "system": "System"}
_BUBBLE_PADDING = 10
_BUBBLE_INDENT = 48
#: Links in the transcript with this scheme are actions, not web pages.
ACTION_SCHEME = "hearth"
#: Actions a link can ask for; ``copy-code`` also names the code block, ``source`` the source's number.
ACTIONS = ("copy", "edit", "regenerate", "continue", "prev", "next", "copy-code", "source")
#: The link that shows or hides a reply's reasoning; the view handles it itself.
REASONING_ACTION = "reasoning"


def action_href(action: str, index: int, extra: int = 0) -> str:
    """The link for ``action`` on message ``index`` (``extra``: the code block, for copy-code)."""
    return f"{ACTION_SCHEME}:{action}/{index}" + (f"/{extra}" if action in ("copy-code", "source") else "")


class MessageView(QTextBrowser):
    """Shows a conversation as a column of message frames, one ``QTextFrame`` per message.

    Assistant replies are Markdown (``QTextCursor.insertMarkdown``) with highlighted code blocks;
    user messages are plain text. Updating a streaming reply re-renders only its own frame, so
    the cost of a repaint does not grow with the length of the conversation.

    Under each message a line of links offers its actions (copy, edit, regenerate, continue, and
    "‹ 1/2 ›" to switch between branches); each finished code block gets a "Copy code" link. A
    click emits :attr:`action_requested`. A message is untrusted (a model, a server or an imported file
    wrote it): nothing in it is ever loaded (images show as text, see :mod:`app.chat.safe_markdown`), and
    only a click on an http(s) link opens it in the browser; a click on any other link opens nothing and
    says so (:attr:`link_refused`). A reply's ``<think>``
    reasoning is folded into a "Reasoning" line that shows or hides it when clicked, and a long user message into
    its start and "Show all"; a reply whose chat was cut to fit the context says so over it
    (:mod:`app.chat.message_extras`). A reply given documents
    lists its Sources under it (file, page, score, passage); a click on one asks for it with the "source" action.

    Lines wrap at the view's width, long words and code lines included, so one long line never
    makes the whole transcript scroll sideways. The bubbles' colours come from the palette when a
    message is drawn, so a theme change redraws them all.

    Signals:
        action_requested(str, int, int): the action (one of :data:`ACTIONS`), the message index,
            and the code block index for "copy-code" or the source's number for "source" (else 0).
        link_refused(str): a link that was clicked and not opened, since it is not an http(s) one.
    """

    action_requested = Signal(str, int, int)
    link_refused = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("messageView")
        self.setOpenLinks(False)
        self.anchorClicked.connect(self._on_anchor_clicked)
        self.setPlaceholderText("Ask anything. Enter sends, Shift+Enter starts a new line.")
        self.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        self.document().setDocumentMargin(12)
        self._highlighter = CodeHighlighter(self.document())
        self._highlighter.set_dark(self._is_dark())
        self._frames: list[QTextFrame] = []
        self._messages: list[Message] = []
        self._conversation: Conversation | None = None
        #: Indexes of the messages whose reasoning is shown, and of the long messages shown whole.
        self._expanded: set[int] = set()
        self._unfolded: set[int] = set()
        self._is_redraw_pending = False
        self._sources_for: Callable[[Message], ShownSources | None] = lambda message: None
        self._steps_for: Callable[[Message], list[ToolStepRecord]] = lambda message: []
        self._open_steps: set[tuple[int, int]] = set()  # (message index, step) shown opened

    # -- public API -------------------------------------------------------------------------------

    def set_sources_provider(self, provider: Callable[[Message], ShownSources | None]) -> None:
        """Where the Sources list of a reply comes from (None: the reply has none)."""
        self._sources_for = provider

    def set_steps_provider(self, provider: Callable[[Message], list[ToolStepRecord]]) -> None:
        """Where a reply's tool steps come from (each a line under it that a click opens)."""
        self._steps_for = provider

    def toggle_step(self, index: int, step: int) -> None:
        """Show or hide the arguments and result of tool step ``step`` of message ``index``."""
        if 0 <= index < len(self._frames):
            self._open_steps ^= {(index, step)}
            self._render(self._frames[index], self._messages[index], index)

    def show_conversation(self, conversation: Conversation | None) -> None:
        """Replace the view with all messages of ``conversation`` (or nothing)."""
        self.clear()
        self._frames = []
        self._messages = []
        if conversation is not self._conversation:
            self._expanded, self._open_steps, self._unfolded = set(), set(), set()
        self._conversation = conversation
        if conversation is not None:
            for message in conversation.messages:
                self.append_message(message)
        self._scroll_to_bottom()

    def set_font_size(self, points: float) -> None:
        """Use ``points`` for the transcript text (0: the application's size) and re-render."""
        font = QFont(self.font())
        font.setPointSizeF(points if points > 0 else QFont().pointSizeF())
        self.setFont(font)
        self.document().setDefaultFont(font)
        self.show_conversation(self._conversation)

    def append_message(self, message: Message) -> None:
        """Add a message frame at the end."""
        was_at_bottom = self._is_at_bottom()
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        frame = cursor.insertFrame(self._frame_format(message.role))
        self._frames.append(frame)
        self._messages.append(message)
        self._render(frame, message, len(self._frames) - 1)
        if was_at_bottom:
            self._scroll_to_bottom()

    def update_message(self, index: int, message: Message) -> None:
        """Re-render message ``index`` (e.g. a reply that received more text)."""
        if not 0 <= index < len(self._frames):
            return
        was_at_bottom = self._is_at_bottom()
        self._messages[index] = message
        self._render(self._frames[index], message, index)
        if was_at_bottom:
            self._scroll_to_bottom()

    @property
    def message_count(self) -> int:
        return len(self._frames)

    def message_text(self, index: int) -> str:
        """The rendered plain text of message ``index`` (header and stats included)."""
        frame = self._frames[index]
        cursor = QTextCursor(self.document())
        cursor.setPosition(frame.firstPosition())
        cursor.setPosition(frame.lastPosition(), QTextCursor.MoveMode.KeepAnchor)
        return cursor.selection().toPlainText()

    def hrefs(self, index: int) -> list[str]:
        """The links in message ``index``, in order (its actions and copy-code links)."""
        frame = self._frames[index]
        found: list[str] = []
        block = self.document().findBlock(frame.firstPosition())
        while block.isValid() and block.position() <= frame.lastPosition():
            it = block.begin()
            while not it.atEnd():
                fmt = it.fragment().charFormat()
                if fmt.isAnchor() and (not found or found[-1] != fmt.anchorHref()):
                    found.append(fmt.anchorHref())
                it += 1
            block = block.next()
        return found

    def is_reasoning_shown(self, index: int) -> bool:
        """Whether message ``index`` shows its reasoning (else only the "Reasoning" line)."""
        return index in self._expanded

    def toggle_reasoning(self, index: int) -> None:
        """Show or hide the reasoning of message ``index``."""
        self._toggle(self._expanded, index)

    def toggle_fold(self, index: int) -> None:
        """Show all of long message ``index``, or only its start again."""
        self._toggle(self._unfolded, index)

    def unfold_matching(self, needle: str) -> None:
        """Show whole the folded messages that hold ``needle`` (a search result may lie in a folded part)."""
        for index, message in enumerate(self._messages):
            if index not in self._unfolded and is_long(message.content) and needle.lower() in message.content.lower():
                self._toggle(self._unfolded, index)

    def _toggle(self, shown: set[int], index: int) -> None:
        if 0 <= index < len(self._frames):
            shown ^= {index}
            self._render(self._frames[index], self._messages[index], index)

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange) \
                and not self._is_redraw_pending:
            self._is_redraw_pending = True  # one redraw for the burst of events a theme change sends
            QTimer.singleShot(0, self, self._redraw_all)

    @Slot()
    def _redraw_all(self) -> None:
        """Draw every message again with the current palette (after a theme change)."""
        self._is_redraw_pending = False
        self._highlighter.set_dark(self._is_dark())
        messages = list(self._messages)
        was_at_bottom = self._is_at_bottom()
        self.clear()
        self._frames, self._messages = [], []
        for message in messages:
            self.append_message(message)
        if was_at_bottom:
            self._scroll_to_bottom()

    def loadResource(self, kind: int, name: QUrl | str, /) -> Any:
        """Load nothing: no file, ``qrc:`` or network resource is read for what a message holds.

        Messages are rendered without images, so this is only a backstop. An empty image or text (rather than
        none) keeps ``QTextDocument`` from reading the file itself.
        """
        if kind == QTextDocument.ResourceType.ImageResource.value:
            return _BLANK_IMAGE
        return ""

    @Slot(QUrl)
    def _on_anchor_clicked(self, url: QUrl) -> None:
        if url.scheme() != ACTION_SCHEME:
            if is_web_link(url):
                QDesktopServices.openUrl(url)
            else:
                self._refuse_link(url)
            return
        action, _, rest = url.path().partition("/")
        numbers = [int(part) for part in rest.split("/") if part.isdigit()]
        if action == REASONING_ACTION and numbers:
            self.toggle_reasoning(numbers[0])
        elif action == FOLD_ACTION and numbers:
            self.toggle_fold(numbers[0])
        elif action == STEP_ACTION and len(numbers) == 2:
            self.toggle_step(*numbers)
        elif action in ACTIONS and numbers:
            self.action_requested.emit(action, numbers[0], numbers[1] if len(numbers) > 1 else 0)

    def _refuse_link(self, url: QUrl) -> None:
        address = url.toString()
        QToolTip.showText(QCursor.pos(), "Hearth opens only web (http and https) links; this one was not "
                          f"opened:\n{shown_address(address)}", self.viewport())
        self.link_refused.emit(address)

    # -- rendering --------------------------------------------------------------------------------

    def _frame_format(self, role: str) -> QTextFrameFormat:
        palette = self.palette()
        fmt = QTextFrameFormat()
        fmt.setPadding(_BUBBLE_PADDING)
        fmt.setTopMargin(4)
        fmt.setBottomMargin(8)
        fmt.setBorder(1)
        fmt.setBorderStyle(QTextFrameFormat.BorderStyle.BorderStyle_Solid)
        if role == "user":
            tint = QColor(palette.color(QPalette.ColorRole.Highlight))
            tint.setAlpha(28)
            border = QColor(palette.color(QPalette.ColorRole.Highlight))
            border.setAlpha(70)
            fmt.setBackground(tint)
            fmt.setLeftMargin(_BUBBLE_INDENT)
        else:
            border = QColor(palette.color(QPalette.ColorRole.Mid))
            border.setAlpha(90)
            fmt.setBackground(palette.color(QPalette.ColorRole.AlternateBase))
            fmt.setRightMargin(_BUBBLE_INDENT)
        fmt.setBorderBrush(border)
        return fmt

    def _render(self, frame: QTextFrame, message: Message, index: int) -> None:
        cursor = QTextCursor(self.document())
        cursor.beginEditBlock()
        cursor.setPosition(frame.firstPosition())
        cursor.setPosition(frame.lastPosition(), QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        cursor.setBlockFormat(QTextBlockFormat())
        cursor.setCharFormat(QTextCharFormat())

        name = _ROLE_NAMES.get(message.role, message.role)
        palette = self.palette()
        muted, link = palette.color(QPalette.ColorRole.PlaceholderText), palette.color(QPalette.ColorRole.Link)
        if left_out := left_out_note(message.stats) if message.role == "assistant" else "":
            self._insert_note(cursor, f"↳ {left_out}", italic=True)  # above the reply: the chat it was given
            cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
        header_at = cursor.position()
        if message.role == "assistant" and message.content:
            # The name goes in as the first Markdown paragraph: a fragment's first block merges
            # into the block it is inserted at, which would strip a leading code block's format.
            reply = split_reasoning(message.content)
            body = close_open_fence(add_copy_links(reply.answer,
                                                   lambda k: action_href("copy-code", index, k)))
            if reply.reasoning or reply.is_thinking:
                body = reasoning_markdown(reply.reasoning, reply.is_thinking, f"{ACTION_SCHEME}:{REASONING_ACTION}/{index}",
                                          index in self._expanded) + f"\n\n{body}"
            own_links = {action_href("copy-code", index, k) for k in range(len(code_blocks(reply.answer)))}
            own_links.add(f"{ACTION_SCHEME}:{REASONING_ACTION}/{index}")
            cursor.insertFragment(markdown_fragment(f"{name}\n\n{body}", own_links, ACTION_SCHEME))
            self._shade_code_blocks(header_at, cursor.position())
        else:
            cursor.insertText(name)
            cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
            if message.role != "assistant":
                insert_user_text(cursor, message.content, index in self._unfolded,
                                 f"{ACTION_SCHEME}:{FOLD_ACTION}/{index}", self._small_size(), link)
            elif message.is_streaming:
                self._insert_note(cursor, "Thinking…", italic=True)
        self._style_header(header_at)
        steps = self._steps_for(message) if message.role == "assistant" else []
        if steps:
            insert_steps(cursor, steps, lambda k: f"{ACTION_SCHEME}:{STEP_ACTION}/{index}/{k}",
                         lambda k: (index, k) in self._open_steps, self._small_size(), muted, link)
        note = self._note_for(message)
        if note:
            if cursor.block().length() > 1:  # not an empty body line
                cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
            self._insert_note(cursor, note, error=message.status == STATUS_ERROR)
        shown = self._sources_for(message)
        if shown is not None and shown.entries:
            insert_sources(cursor, shown, lambda n: action_href("source", index, n), self._small_size(), muted, link)
        actions = self._actions_for(message)
        if actions:
            if cursor.block().length() > 1:
                cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
            self._insert_actions(cursor, actions, index, message)
        cursor.endEditBlock()

    @staticmethod
    def _actions_for(message: Message) -> list[str]:
        """The action links shown under a message: labels are looked up in :meth:`_insert_actions`."""
        if message.is_streaming:
            return []
        actions = ["copy"] if message.content else []
        if message.role == "user":
            actions.append("edit")
        elif message.role == "assistant":
            actions.append("regenerate")
            if message.can_continue:
                actions.append("continue")
        if message.branch_count > 1:
            actions += ["prev", "next"]
        return actions

    def _insert_actions(self, cursor: QTextCursor, actions: list[str], index: int,
                        message: Message) -> None:
        labels = {"copy": "Copy", "edit": "Edit", "regenerate": "Regenerate", "continue": "Continue",
                  "prev": "‹", "next": "›"}
        plain = QTextCharFormat()
        plain.setFontPointSize(self._small_size())
        plain.setForeground(self.palette().color(QPalette.ColorRole.PlaceholderText))
        for n, action in enumerate(actions):
            if n and action != "next":
                cursor.insertText("   ", plain)
            if action == "next":
                cursor.insertText(f" {message.branch_index + 1}/{message.branch_count} ", plain)
            link = QTextCharFormat(plain)
            link.setAnchor(True)
            link.setAnchorHref(action_href(action, index))
            link.setForeground(self.palette().color(QPalette.ColorRole.Link))
            cursor.insertText(labels[action], link)

    def _style_header(self, position: int) -> None:
        header = QTextCharFormat()
        header.setFontWeight(QFont.Weight.Bold)
        header.setForeground(self.palette().color(QPalette.ColorRole.PlaceholderText))
        cursor = QTextCursor(self.document())
        cursor.setPosition(position)
        cursor.movePosition(QTextCursor.MoveOperation.EndOfBlock, QTextCursor.MoveMode.KeepAnchor)
        cursor.mergeCharFormat(header)

    @staticmethod
    def _note_for(message: Message) -> str:
        if message.status == STATUS_ERROR:
            return f"⚠ {message.error}"
        if message.role != "assistant" or message.status == STATUS_STREAMING:
            return ""
        return reply_stats_line(message.stats, message.finish_reason)

    def _small_size(self) -> float:
        """The point size of the lines around a message's text (actions, notes, steps, sources)."""
        return max(self.font().pointSizeF() * 0.85, 7.0)

    def _insert_note(self, cursor: QTextCursor, text: str, *, italic: bool = False,
                     error: bool = False) -> None:
        fmt = QTextCharFormat()
        fmt.setFontItalic(italic)
        fmt.setFontPointSize(self._small_size())
        colour = QColor("#c62828") if error else self.palette().color(QPalette.ColorRole.PlaceholderText)
        fmt.setForeground(colour)
        cursor.insertText(text, fmt)

    def _shade_code_blocks(self, start: int, end: int) -> None:
        background = QColor(self.palette().color(QPalette.ColorRole.Text))
        background.setAlpha(14)
        block = self.document().findBlock(start)
        while block.isValid() and block.position() <= end:
            fmt = block.blockFormat()
            if fmt.hasProperty(QTextFormat.Property.BlockCodeFence) or fmt.nonBreakableLines():
                shade = QTextCursor(block)
                fmt.setBackground(background)
                fmt.setLeftMargin(6)
                fmt.setNonBreakableLines(False)  # wrap long code lines rather than widen the transcript
                fmt.setProperty(CODE_BLOCK_PROPERTY, True)
                shade.setBlockFormat(fmt)
            block = block.next()

    def _is_dark(self) -> bool:
        return self.palette().color(QPalette.ColorRole.Base).lightness() < 128

    def _is_at_bottom(self) -> bool:
        bar = self.verticalScrollBar()
        return bar.value() >= bar.maximum() - 4

    def _scroll_to_bottom(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())
