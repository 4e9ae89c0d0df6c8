"""The chat pane: conversation list, transcript and message box."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal, Slot
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSplitter,
    QStyle,
    QVBoxLayout,
    QWidget,
)

from app import log
from app.chat_input import ChatInput
from app.conversations import (
    STATUS_DONE,
    STATUS_ERROR,
    STATUS_STOPPED,
    STATUS_STREAMING,
    Conversation,
    ConversationStore,
)
from app.engine_bridge import EngineBridge, RequestInfo
from app.message_view import MessageView

#: Token deltas are coalesced and painted at most this often.
FLUSH_INTERVAL_MS = 40


class ChatPane(QWidget):
    """Lets the user hold several conversations with the loaded model.

    Sends go to :meth:`EngineBridge.submit`; replies come back through the ``_on_*`` slots, which
    ``MainWindow._connect_engine`` connects to the bridge's signals. Deltas are appended to the
    conversation model at once but painted by a ``FLUSH_INTERVAL_MS`` timer, so a fast model does
    not repaint the transcript for every token.

    Signals:
        streaming_changed(int): the number of replies streaming in all conversations.
    """

    streaming_changed = Signal(int)

    def __init__(self, bridge: EngineBridge, store: ConversationStore | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("chatPaneWidget")
        self._bridge = bridge
        self._store = store if store is not None else ConversationStore()
        self._current_id: str | None = None
        self._is_model_ready = False
        self._params: dict[str, Any] = {}
        # request id -> (conversation id, index of the reply in its messages)
        self._requests: dict[str, tuple[str, int]] = {}
        self._dirty: set[str] = set()
        self._flush_timer = QTimer(self)
        self._flush_timer.setObjectName("flush-timer")
        self._flush_timer.setSingleShot(True)
        self._flush_timer.setInterval(FLUSH_INTERVAL_MS)
        self._flush_timer.timeout.connect(self._on_flush_timeout)
        self._build()
        self.new_conversation()

    # -- layout -----------------------------------------------------------------------------------

    def _build(self) -> None:
        self._conversation_list = QListWidget()
        self._conversation_list.setObjectName("conversationList")
        self._conversation_list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self._conversation_list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self._conversation_list.currentItemChanged.connect(self._on_current_item_changed)
        self._new_button = QPushButton("New chat")
        self._new_button.setObjectName("newChatButton")
        self._new_button.setIcon(self.style().standardIcon(QStyle.StandardPixmap.SP_FileIcon))
        self._new_button.clicked.connect(self._on_new_clicked)
        self._delete_button = QPushButton("Delete")
        self._delete_button.setObjectName("deleteChatButton")
        self._delete_button.setToolTip("Delete the selected conversation")
        self._delete_button.clicked.connect(self._on_delete_clicked)

        title = QLabel("Conversations")
        title.setObjectName("paneTitle")
        list_buttons = QHBoxLayout()
        list_buttons.addWidget(self._new_button)
        list_buttons.addWidget(self._delete_button)
        side = QWidget()
        side_layout = QVBoxLayout(side)
        side_layout.setContentsMargins(0, 0, 6, 0)
        side_layout.addWidget(title)
        side_layout.addWidget(self._conversation_list, 1)
        side_layout.addLayout(list_buttons)

        self._view = MessageView()
        self._input = ChatInput()
        self._input.submitted.connect(self._on_input_submitted)
        self._input.textChanged.connect(self._on_input_changed)
        self._send_button = QPushButton("Send")
        self._send_button.setObjectName("sendButton")
        self._send_button.setDefault(True)
        self._send_button.setToolTip("Send (Enter)")
        self._send_button.clicked.connect(self._on_send_clicked)
        self._stop_button = QPushButton("Stop")
        self._stop_button.setObjectName("stopButton")
        self._stop_button.setToolTip("Stop the reply; the text so far is kept")
        self._stop_button.clicked.connect(self._on_stop_clicked)
        buttons = QVBoxLayout()
        buttons.addWidget(self._send_button)
        buttons.addWidget(self._stop_button)
        buttons.addStretch(1)
        input_row = QHBoxLayout()
        input_row.addWidget(self._input, 1)
        input_row.addLayout(buttons)
        main = QWidget()
        main_layout = QVBoxLayout(main)
        main_layout.setContentsMargins(6, 0, 0, 0)
        main_layout.addWidget(self._view, 1)
        main_layout.addLayout(input_row)

        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.setObjectName("chatSplitter")
        splitter.addWidget(side)
        splitter.addWidget(main)
        splitter.setStretchFactor(0, 0)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([190, 600])
        splitter.setChildrenCollapsible(False)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addWidget(splitter)
        self.setFocusProxy(self._input)
        self._update_controls()

    # -- public API -------------------------------------------------------------------------------

    @property
    def store(self) -> ConversationStore:
        return self._store

    @property
    def current_conversation(self) -> Conversation | None:
        if self._current_id is None or self._current_id not in self._store:
            return None
        return self._store.get(self._current_id)

    @property
    def view(self) -> MessageView:
        return self._view

    @property
    def num_streaming(self) -> int:
        return len(self._requests)

    def new_conversation(self) -> Conversation:
        """Create an empty conversation and switch to it."""
        conversation = self._store.create()
        self._refresh_list(select=conversation.id)
        self._input.setFocus()
        return conversation

    def select_conversation(self, conversation_id: str) -> None:
        self._refresh_list(select=conversation_id)

    def delete_conversation(self, conversation_id: str) -> None:
        """Delete a conversation, stopping its reply if one is streaming."""
        for rid, (cid, _) in list(self._requests.items()):
            if cid == conversation_id:
                self._bridge.cancel(rid)
                del self._requests[rid]
                self._dirty.discard(rid)
        self._store.delete(conversation_id)
        self.streaming_changed.emit(len(self._requests))
        remaining = self._store.list()
        if not remaining:
            self.new_conversation()
        else:
            self._refresh_list(select=remaining[0].id if conversation_id == self._current_id
                               else self._current_id)

    def set_sampling_params(self, params: dict[str, Any]) -> None:
        """Set the ``SamplingParams`` keyword arguments used for the next replies."""
        self._params = dict(params)

    def set_model_ready(self, is_ready: bool) -> None:
        """Enable sending while a model is loaded or loading (requests wait for the load)."""
        self._is_model_ready = is_ready
        self._update_controls()
        if is_ready:
            self._input.setFocus()

    def send(self, text: str) -> str | None:
        """Send ``text`` in the current conversation; returns the request id, or None if not sent."""
        text = text.strip()
        conversation = self.current_conversation
        if not text or conversation is None or not self._can_send(conversation):
            return None
        conversation.add("user", text)
        self._view.append_message(conversation.messages[-1])
        history = conversation.prompt_messages()
        reply = conversation.add("assistant", status=STATUS_STREAMING)
        reply.request_id = self._bridge.submit(conversation.id, history, self._params)
        self._requests[reply.request_id] = (conversation.id, len(conversation.messages) - 1)
        self._view.append_message(reply)
        log.ui.debug("sent %s in %s", reply.request_id, conversation.id)
        self._refresh_list(select=conversation.id)
        self._update_controls()
        self.streaming_changed.emit(len(self._requests))
        return reply.request_id

    def stop(self) -> None:
        """Stop the reply streaming in the current conversation, keeping its text."""
        for rid, (cid, _) in self._requests.items():
            if cid == self._current_id:
                self._bridge.cancel(rid)

    # -- engine events ----------------------------------------------------------------------------

    @Slot(str, str)
    def _on_token_delta(self, request_id: str, text: str) -> None:
        message = self._message(request_id)
        if message is None:
            return
        message.content += text
        self._dirty.add(request_id)
        if not self._flush_timer.isActive():
            self._flush_timer.start()

    @Slot(str, object)
    def _on_request_finished(self, request_id: str, info: RequestInfo) -> None:
        message = self._message(request_id)
        if message is None:
            return
        message.status = STATUS_STOPPED if info.finish_reason == "abort" else STATUS_DONE
        message.finish_reason = info.finish_reason
        message.stats = dict(info.metrics)
        self._end_request(request_id)

    @Slot(str, str)
    def _on_request_failed(self, request_id: str, text: str) -> None:
        message = self._message(request_id)
        if message is None:
            return
        message.status = STATUS_ERROR
        message.error = text
        self._end_request(request_id)

    @Slot()
    def _on_flush_timeout(self) -> None:
        dirty, self._dirty = self._dirty, set()
        for rid in dirty:
            self._repaint_request(rid)

    # -- widget events ----------------------------------------------------------------------------

    @Slot()
    def _on_input_submitted(self) -> None:
        self._on_send_clicked()

    @Slot()
    def _on_send_clicked(self) -> None:
        if self.send(self._input.toPlainText()) is not None:
            self._input.clear()
        self._input.setFocus()

    @Slot()
    def _on_stop_clicked(self) -> None:
        self.stop()
        self._input.setFocus()

    @Slot()
    def _on_input_changed(self) -> None:
        self._update_controls()

    @Slot()
    def _on_new_clicked(self) -> None:
        self.new_conversation()

    @Slot()
    def _on_delete_clicked(self) -> None:
        if self._current_id is not None:
            self.delete_conversation(self._current_id)

    @Slot(QListWidgetItem, QListWidgetItem)
    def _on_current_item_changed(self, current: QListWidgetItem | None,
                                 previous: QListWidgetItem | None) -> None:
        conversation_id = current.data(Qt.ItemDataRole.UserRole) if current is not None else None
        if conversation_id == self._current_id:
            return
        self._current_id = conversation_id
        self._view.show_conversation(self.current_conversation)
        self._update_controls()

    # -- helpers ----------------------------------------------------------------------------------

    def _message(self, request_id: str) -> Any:
        entry = self._requests.get(request_id)
        if entry is None or entry[0] not in self._store:
            return None
        conversation_id, index = entry
        return self._store.get(conversation_id).messages[index]

    def _end_request(self, request_id: str) -> None:
        self._dirty.discard(request_id)
        self._repaint_request(request_id)
        del self._requests[request_id]
        self._refresh_list(select=self._current_id)
        self._update_controls()
        self.streaming_changed.emit(len(self._requests))

    def _repaint_request(self, request_id: str) -> None:
        entry = self._requests.get(request_id)
        if entry is None or entry[0] != self._current_id:
            return
        conversation_id, index = entry
        self._view.update_message(index, self._store.get(conversation_id).messages[index])

    def _can_send(self, conversation: Conversation) -> bool:
        return self._is_model_ready and not conversation.is_streaming

    def _update_controls(self) -> None:
        conversation = self.current_conversation
        is_streaming = conversation is not None and conversation.is_streaming
        can_send = conversation is not None and self._can_send(conversation)
        self._send_button.setEnabled(can_send and bool(self._input.toPlainText().strip()))
        self._stop_button.setEnabled(is_streaming)
        self._delete_button.setEnabled(conversation is not None)
        if not self._is_model_ready:
            self._input.setPlaceholderText("Load a model in the Model pane to start chatting…")
        elif is_streaming:
            self._input.setPlaceholderText("Hearth is replying… (Stop keeps the text so far)")
        else:
            self._input.setPlaceholderText("Message Hearth… (Enter sends, Shift+Enter for a new line)")

    def _refresh_list(self, select: str | None) -> None:
        self._conversation_list.blockSignals(True)
        self._conversation_list.clear()
        selected_item = None
        for conversation in self._store.list():
            label = conversation.title + (" …" if conversation.is_streaming else "")
            item = QListWidgetItem(label)
            item.setData(Qt.ItemDataRole.UserRole, conversation.id)
            item.setToolTip(conversation.title)
            self._conversation_list.addItem(item)
            if conversation.id == select:
                selected_item = item
        self._conversation_list.blockSignals(False)
        if selected_item is not None:
            self._conversation_list.setCurrentItem(selected_item)
        if select != self._current_id or selected_item is None:
            self._on_current_item_changed(selected_item, None)
