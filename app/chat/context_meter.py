"""The context meter under the message box: "1,234 / 4,096 tokens" and a thin bar, per chat.

It counts the chat as the next send would give it to the model: the system prompt, the chat template's tokens, the
turns of the shown branch (up to the message being edited) and the draft as the last turn; the sources block the
chat's documents put before that turn, chosen for the draft as a send chooses them (``DocumentsController``'s
budget and ``DocumentIndex.prepare``: the documents whole when they fit, else the passages retrieved for the
draft); and the prompt tokens the definitions of the chat's tools add (``ChatTools.prompt_tokens``, measured by the
engine's tool loop with the model's chat template).

:class:`ContextMeterController` recounts after each reply, when another chat or branch is shown, when the model
changes, and while the user types (after a pause of ``DEBOUNCE_MS``). The counting runs on a Python thread of its
own (:class:`CountJob`; a Python callable handed to ``QThreadPool`` once crashed this app), one count at a time;
:class:`~app.chat.token_counter.TokenCounter` keeps each message's count, so a keystroke tokenizes only the draft.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QTimer, Signal, Slot
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QWidget

from app import log
from app.chat.token_counter import COUNT_THREAD, TokenCounter, Tokenize
from app.docs.index import DocumentIndex, sources_budget, with_sources

if TYPE_CHECKING:
    from app.chat.chat_pane import ChatPane
    from app.chat.reply_controller import ReplyController

#: The pause in typing after which the draft is counted.
DEBOUNCE_MS = 300
#: The bar's colour once the chat no longer fits with room for the reply.
OVER_COLOUR = "#c62828"


@dataclass(frozen=True, slots=True)
class Count:
    """One count: the chat's tokens, whether the model's tokenizer gave them, and the context they are shown against
    (0: not known, as for a remote server)."""

    num_tokens: int
    is_exact: bool
    context_length: int
    #: Tokens the chat may take before the engine leaves turns out: the context less the room kept for the reply.
    budget: int
    #: Of ``num_tokens``: the sources block of the chat's documents, and the definitions of its tools.
    num_document_tokens: int = 0
    num_tool_tokens: int = 0


class ContextMeter(QWidget):
    """The label and the thin bar; :meth:`show_count` fills them."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("contextMeter")
        self.label = QLabel("")
        self.label.setObjectName("contextMeterLabel")
        self.bar = QProgressBar()
        self.bar.setObjectName("contextMeterBar")
        self.bar.setTextVisible(False)
        self.bar.setFixedHeight(4)
        self.bar.setMaximumWidth(160)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(2, 0, 2, 0)
        layout.addStretch(1)
        layout.addWidget(self.bar)
        layout.addWidget(self.label)
        self._is_over = False

    @property
    def is_over(self) -> bool:
        """Whether the chat is longer than fits with room for the reply."""
        return self._is_over

    def show_count(self, count: Count) -> None:
        about = "" if count.is_exact else "≈"
        context = count.context_length
        self.label.setText(f"{about}{count.num_tokens:,} / {context:,} tokens" if context
                           else f"{about}{count.num_tokens:,} tokens")
        self.bar.setVisible(context > 0)
        self.bar.setRange(0, max(context, 1))
        self.bar.setValue(min(count.num_tokens, context))
        is_over = context > 0 and count.num_tokens > count.budget
        if is_over != self._is_over:
            self._is_over = is_over
            self.bar.setStyleSheet(f"QProgressBar::chunk {{ background: {OVER_COLOUR}; }}" if is_over else "")
        tip = ("This chat as the next message would send it: the system prompt, the chat template, the turns shown, "
               "your draft, the sources from the chat's documents and the definitions of its tools.")
        extras = [f"{n:,} tokens {what}" for n, what in ((count.num_document_tokens, "of document sources"),
                                                          (count.num_tool_tokens, "of tool definitions")) if n]
        if extras:
            tip += f" Of these, {' and '.join(extras)}."
        if context:
            tip += (f" {count.budget:,} of the {context:,} tokens of context are for the chat; the rest is kept for "
                    "the reply (Max tokens, up to half the context).")
        if is_over:
            tip += " Past that, earlier turns are left out (or, under the \"stop\" overflow policy, the chat is refused)."
        if not count.is_exact:
            tip += " Estimated (about four characters a token): no local model's tokenizer is at hand."
        self.setToolTip(tip)


class CountJob(QObject):
    """Counts one chat on a thread of its own.

    Signals:
        finished(object): the :class:`Count`, or None when counting failed.
    """

    finished = Signal(object)

    def __init__(self, count: Callable[[], Count]) -> None:
        super().__init__()  # no parent: the thread keeps it alive until it has emitted
        self._count = count
        self._thread = threading.Thread(target=self._run, name=COUNT_THREAD, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            result: Count | None = self._count()
        except Exception as exc:  # noqa: BLE001 (a worker thread must report, not die)
            log.ui.warning("counting the chat's tokens failed: %s: %s", type(exc).__name__, exc)
            result = None
        self.finished.emit(result)


@dataclass(frozen=True, slots=True)
class Extras:
    """What comes into a prompt beside the chat's turns, gathered on the GUI thread for a count: the chat's
    documents (the index and its collections; None when it has none) and its tools' prompt tokens."""

    conversation_id: int
    index: DocumentIndex | None
    collections: tuple[str, ...]
    params: dict[str, object]
    num_tool_tokens: int


class ContextMeterController(QObject):
    """Keeps a chat pane's :class:`ContextMeter` up to date.

    Args:
        pane: the chat pane whose shown chat and draft are counted.
        replies: the replies (their end, the model's context and tokenizer).
        meter: the widget to fill.
    """

    def __init__(self, pane: ChatPane, replies: ReplyController, meter: ContextMeter) -> None:
        super().__init__(pane)
        self._pane = pane
        self._replies = replies
        self.meter = meter
        #: The prompt tokens a chat's tool definitions add (set by ``ChatTools.attach``; 0 while none are counted).
        self.tool_tokens: Callable[[int], int] = lambda _conversation_id: 0
        # The counts of one model's tokenizer, and that model's engine (a weak reference: an unloaded model goes).
        # Worker threads only, one at a time.
        self._counter = TokenCounter()
        self._owner: weakref.ref[object] | None = None
        self._job: CountJob | None = None
        self._is_pending = False
        #: The latest count shown (None before the first).
        self.count: Count | None = None
        self._timer = QTimer(self)
        self._timer.setObjectName("context-meter-timer")
        self._timer.setSingleShot(True)
        self._timer.setInterval(DEBOUNCE_MS)
        self._timer.timeout.connect(self.refresh_now)
        pane.composer.text_changed.connect(self._timer.start)
        pane.conversation_shown.connect(self._on_changed)
        pane.view.action_requested.connect(self._on_changed)
        pane.settings_bar.preset_chosen.connect(self._on_changed)
        replies.streaming_changed.connect(self._on_changed)
        replies.model_changed.connect(self._on_changed)
        pane.documents.attachments_changed.connect(self._on_changed)

    @property
    def is_counting(self) -> bool:
        return self._job is not None or self._is_pending or self._timer.isActive()

    @Slot()
    def refresh_now(self) -> None:
        """Count the shown chat and the draft now (after the count under way, if one is)."""
        self._timer.stop()
        if self._job is not None:
            self._is_pending = True
            return
        self._is_pending = False
        conversation = self._pane.current_conversation
        if conversation is None or self._pane.store.storage.is_closed:  # a closed window's last count came in
            return
        editing = self._pane.composer.editing_index
        messages = conversation.prompt_messages(upto=editing)
        draft = self._pane.composer.text().strip()
        if draft:
            messages.append({"role": "user", "content": draft})
        context = self._replies.context_length
        params = self._pane.sampling_params(conversation)
        max_tokens = int(params.get("max_tokens") or 0)
        budget = context - min(max_tokens, context // 2)
        documents = self._pane.documents
        uses_documents = documents.uses_documents(conversation.id)
        extras = Extras(conversation.id, documents.index if uses_documents else None,
                        tuple(documents.chat_collections(conversation.id)) if uses_documents else (), params,
                        0 if conversation.is_json_reply else self.tool_tokens(conversation.id))

        def count() -> Count:
            return self._count_all(messages, bool(draft), extras, context, budget)

        self._job = CountJob(count)
        self._job.finished.connect(self._on_counted)
        self._job.start()

    def _count_all(self, messages: list[dict[str, str]], has_draft: bool, extras: Extras, context: int,
                   budget: int) -> Count:
        """The chat, the sources its documents give the draft (a send's choice, for a send's budget) and its tools'
        definitions (worker thread: ``DocumentIndex`` opens a connection of its own)."""
        num_tokens, is_exact = self._count(messages, has_draft)
        num_document_tokens = 0
        if extras.index is not None:
            # Without a draft the next send's turn is still to come: the sources are counted before an empty one.
            asked = messages if has_draft else [*messages, {"role": "user", "content": ""}]
            prepared = extras.index.prepare(extras.conversation_id, asked[-1]["content"],
                                            sources_budget(asked, extras.params, context), extras.collections)
            if prepared is not None:
                with_docs, is_exact = self._count(with_sources(asked, prepared.block), True)
                num_document_tokens = max(with_docs - num_tokens, 0)
        return Count(num_tokens + num_document_tokens + extras.num_tool_tokens, is_exact, context, budget,
                     num_document_tokens, extras.num_tool_tokens)

    def _count(self, messages: list[dict[str, str]], has_draft: bool) -> tuple[int, bool]:
        """Count with the model in use (worker thread: the bridge's model lookup takes a lock)."""
        tokenize: Tokenize | None = self._replies.tokenizer()
        owner = getattr(tokenize, "__self__", tokenize)
        if tokenize is not None and (self._owner is None or self._owner() is not owner):
            self._counter = TokenCounter()  # another model: the old counts are no use
            try:
                self._owner = weakref.ref(owner)
            except TypeError:  # not weakly referable: count afresh each time
                self._owner = None
        return self._counter.count(messages, tokenize, is_draft_last=has_draft)

    @Slot()
    def _on_changed(self, *args: object) -> None:
        self._timer.start(0)

    @Slot(int)
    def on_tools_changed(self, conversation_id: int) -> None:
        """A chat's tools or their measure changed: recount if it is the chat shown."""
        conversation = self._pane.current_conversation
        if conversation is not None and conversation.id == conversation_id:
            self._timer.start(0)

    @Slot(object)
    def _on_counted(self, count: Count | None) -> None:
        self._job = None
        if count is not None:
            self.count = count
            self.meter.show_count(count)
        if self._is_pending:
            self.refresh_now()
