"""Streams the model's replies into conversations: starts requests, takes token deltas, saves, ends them.

Not a widget. :class:`ReplyController` stands between the engine bridge and the chat pane: the pane asks
it to start, continue or stop replies, and ``MainWindow._connect_engine`` connects the bridge's
``token_delta``, ``request_finished``, ``request_failed`` and ``tool_step`` to its ``_on_*`` slots. A reply in a
chat that uses tools runs through the bridge's MCP tool loop (``EngineBridge.submit_tools``) when
:attr:`ReplyController.tool_spec` gives it a spec; it streams the same way, and each tool step is saved with it
(:mod:`app.data.tool_steps`). Deltas are
appended to the reply (a live :class:`~app.data.conversations.Message`) at once, announced through
``reply_changed`` at most every ``FLUSH_INTERVAL_MS``, and saved every ``SAVE_INTERVAL_MS`` (and when
the reply ends), so a crash loses at most the last seconds of a reply.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QTimer, Signal, Slot

from app import log
from app.bridge.engine_bridge import EngineBridge
from app.bridge.types import ModelInfo, RequestInfo
from app.data.conversations import CONTINUE_PROMPT, Conversation, ConversationStore, Message
from app.data.storage_errors import storage_error_text
from app.data.tool_steps import ToolStepRecord, ToolStepStore

if TYPE_CHECKING:
    from app.bridge.tool_runs import ToolRunSpec

#: Token deltas are coalesced and announced (so painted) at most this often.
FLUSH_INTERVAL_MS = 40
#: A streaming reply's text is saved to the database this often (and when it ends).
SAVE_INTERVAL_MS = 2000


class ReplyController(QObject):
    """The replies streaming in all conversations, from request to saved message.

    Signals:
        reply_changed(int, object): a reply's text or status changed (conversation id, Message); also when the
            engine left earlier turns out of its chat (the counts go in its ``stats``, see
            :mod:`app.chat.message_extras`).
        streaming_changed(int): a reply started or ended; the number of replies streaming now.
        model_changed(): another model (or none) writes the replies: the context and the tokenizer changed.
        storage_failed(str): a reply could not be saved (the database is locked or the disk full); in words.
            The reply stays on screen and its save is tried again every ``SAVE_INTERVAL_MS`` until it lands.

    Args:
        bridge: submits and cancels the requests.
        store: where the replies are kept.
    """

    reply_changed = Signal(int, object)
    streaming_changed = Signal(int)
    model_changed = Signal()
    storage_failed = Signal(str)

    def __init__(self, bridge: EngineBridge, store: ConversationStore, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._bridge = bridge
        self._store = store
        self._tool_steps = ToolStepStore(store.storage)
        #: A chat's tools for its next reply (None: a plain reply); set by the window's ``ChatTools``.
        self.tool_spec: Callable[[int], ToolRunSpec | None] | None = None
        self._model: tuple[str | None, str | None] = (None, None)
        #: The loaded model's context length in tokens (0: not known, as for a remote server).
        self.context_length = 0
        # request id -> (conversation id, the reply it streams into)
        self._requests: dict[str, tuple[int, Message]] = {}
        self._saved_lengths: dict[str, int] = {}
        self._dirty: set[str] = set()
        # ended replies whose final save failed, to save again
        self._unsaved: list[Message] = []
        self._last_failure = ""
        self._flush_timer = QTimer(self)
        self._flush_timer.setObjectName("flush-timer")
        self._flush_timer.setSingleShot(True)
        self._flush_timer.setInterval(FLUSH_INTERVAL_MS)
        self._flush_timer.timeout.connect(self._on_flush_timeout)
        self._save_timer = QTimer(self)
        self._save_timer.setObjectName("save-timer")
        self._save_timer.setInterval(SAVE_INTERVAL_MS)
        self._save_timer.timeout.connect(self._on_save_timeout)
        bridge.signals.context_fitted.connect(self._on_context_fitted)

    # -- public API -------------------------------------------------------------------------------

    @property
    def num_streaming(self) -> int:
        return len(self._requests)

    def streaming_conversations(self) -> set[int]:
        """The ids of the conversations a reply is streaming in."""
        return {cid for cid, _ in self._requests.values()}

    @Slot(object)
    def set_model_info(self, info: ModelInfo | None) -> None:
        """The model new replies are recorded as written by."""
        self._model = (info.model_name, info.precision) if info is not None else (None, None)
        self.context_length = info.context_length if info is not None else 0
        self.model_changed.emit()

    def tokenizer(self) -> Callable[[list[dict[str, str]] | str], list[int]] | None:
        """The local model's ``tokenize`` (None without one): the context meter counts with it, off the GUI
        thread."""
        return self._bridge.tokenizer()

    def new_reply(self, conversation: Conversation) -> Message:
        """Add an empty assistant reply to ``conversation``, to be streamed into by :meth:`submit`."""
        return self._store.start_reply(conversation, *self._model)

    def submit(self, conversation: Conversation, reply: Message, history: list[dict[str, str]],
               params: dict[str, Any], *, tools: bool = True) -> str:
        """Ask the engine to answer ``history`` into ``reply`` (through the tool loop when the chat uses tools and
        ``tools``; never for a JSON reply); returns the request id."""
        spec = None
        if tools and self.tool_spec is not None and not conversation.is_json_reply:
            spec = self.tool_spec(conversation.id)
        if spec is not None:
            rid = self._bridge.submit_tools(str(conversation.id), history, params, spec)
        else:
            rid = self._bridge.submit(str(conversation.id), history, params)
        reply.request_id = rid
        self._requests[rid] = (conversation.id, reply)
        self._saved_lengths[rid] = len(reply.content)
        if not self._save_timer.isActive():
            self._save_timer.start()
        log.ui.debug("sent %s in conversation %s", rid, conversation.id)
        self.streaming_changed.emit(len(self._requests))
        return rid

    def resume(self, conversation: Conversation, reply: Message, params: dict[str, Any]) -> str:
        """Have the model go on with ``reply``, the last message of ``conversation``; returns the request id."""
        # The partial reply goes last: the local engine continues a trailing assistant message exactly (no new
        # turn). A remote server may open a new turn instead, so it gets an explicit instruction.
        history = conversation.prompt_messages()
        if self._bridge.remote is not None:
            history.append({"role": "user", "content": CONTINUE_PROMPT})
        self._store.resume_reply(reply)
        self.reply_changed.emit(conversation.id, reply)
        return self.submit(conversation, reply, history, params, tools=False)

    def stop(self, conversation_id: int | None) -> None:
        """Stop the replies streaming in a conversation; they keep their text and end as usual."""
        for rid, (cid, _) in self._requests.items():
            if cid == conversation_id:
                self._bridge.cancel(rid)

    def abort(self, conversation_id: int) -> None:
        """Stop a conversation's replies and end them at once (the conversation is going away)."""
        aborted = [rid for rid, (cid, _) in self._requests.items() if cid == conversation_id]
        for rid in aborted:
            self._bridge.cancel(rid)
            self._finish(self._requests[rid][1], "abort", {})
            self._forget(rid)
        if aborted:
            self.streaming_changed.emit(len(self._requests))

    def shutdown(self) -> None:
        """Save the text of streaming replies and stop tracking them (the window is closing).

        They stay marked incomplete in the database and show as stopped next time.
        """
        self._on_save_timeout()
        for rid in list(self._requests):
            self._forget(rid)
        self._flush_timer.stop()

    # -- engine events ----------------------------------------------------------------------------

    @Slot(str, str)
    def _on_token_delta(self, request_id: str, text: str) -> None:
        entry = self._requests.get(request_id)
        if entry is None:
            return
        entry[1].content += text
        self._dirty.add(request_id)
        if not self._flush_timer.isActive():
            self._flush_timer.start()

    @Slot(str, object)
    def _on_request_finished(self, request_id: str, info: RequestInfo) -> None:
        entry = self._requests.get(request_id)
        if entry is None:
            return
        self._finish(entry[1], info.finish_reason, dict(info.metrics))
        self._end(request_id)

    @Slot(str, int)
    def _on_context_fitted(self, request_id: str, num_dropped: int) -> None:
        entry = self._requests.get(request_id)
        if entry is None:
            return
        self._saved(self._store.set_left_out, entry[1], num_dropped, self.context_length)  # live even if unsaved
        self._announce(request_id)

    @Slot(str, object)
    def _on_tool_step(self, request_id: str, step: ToolStepRecord) -> None:
        entry = self._requests.get(request_id)
        if entry is None or entry[1].id is None:
            return
        self._saved(self._tool_steps.add, entry[1].id, step)
        self._announce(request_id)

    @Slot(str, str)
    def _on_request_failed(self, request_id: str, text: str) -> None:
        entry = self._requests.get(request_id)
        if entry is None:
            return
        self._finish(entry[1], None, {}, error=text)
        self._end(request_id)

    # -- timers -----------------------------------------------------------------------------------

    @Slot()
    def _on_flush_timeout(self) -> None:
        dirty, self._dirty = self._dirty, set()
        for rid in dirty:
            self._announce(rid)

    @Slot()
    def _on_save_timeout(self) -> None:
        for rid, (_, message) in self._requests.items():
            if len(message.content) != self._saved_lengths.get(rid, 0):
                if not self._saved(self._store.save_partial, message):
                    return  # tried again at the next tick
                self._saved_lengths[rid] = len(message.content)
        self._unsaved = [message for message in self._unsaved if not self._saved(self._store.save_ended, message)]
        if not self._requests and not self._unsaved:
            self._save_timer.stop()

    # -- helpers ----------------------------------------------------------------------------------

    def _saved(self, save: Any, *args: Any, **kwargs: Any) -> bool:
        """Run one store write; a database failure is announced (once until a write lands) and returns False."""
        try:
            save(*args, **kwargs)
        except Exception as exc:
            if (why := storage_error_text(exc)) is None:
                raise
            log.ui.warning("could not save a reply: %s", exc)
            if why != self._last_failure:
                self._last_failure = why
                self.storage_failed.emit(why)
            return False
        self._last_failure = ""
        return True

    def _finish(self, message: Message, finish_reason: str | None, metrics: dict[str, Any],
                error: str | None = None) -> None:
        """Save an ended reply; if the database refuses, keep it to save again (the save timer retries)."""
        if error is not None:
            ok = self._saved(self._store.fail_reply, message, error)
        else:
            ok = self._saved(self._store.finish_reply, message, finish_reason, metrics)
        if not ok:
            self._unsaved.append(message)
            if not self._save_timer.isActive():
                self._save_timer.start()

    def _announce(self, request_id: str) -> None:
        entry = self._requests.get(request_id)
        if entry is not None:
            self.reply_changed.emit(*entry)

    def _end(self, request_id: str) -> None:
        self._dirty.discard(request_id)
        self._announce(request_id)
        self._forget(request_id)
        self.streaming_changed.emit(len(self._requests))

    def _forget(self, request_id: str) -> None:
        self._requests.pop(request_id, None)
        self._saved_lengths.pop(request_id, None)
        self._dirty.discard(request_id)
        if not self._requests and not self._unsaved:
            self._save_timer.stop()
