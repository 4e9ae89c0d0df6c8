"""The chat pane: conversation sidebar, per-conversation settings, transcript and message box."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal, Slot
from PySide6.QtGui import QFont, QGuiApplication
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app import log
from app.bridge.engine_bridge import EngineBridge, ModelInfo, RequestInfo
from app.chat.chat_input import ChatInput
from app.chat.conversation_list import ConversationList
from app.chat.conversation_settings import ConversationSettings
from app.chat.markdown import code_blocks
from app.chat.message_view import MessageView
from app.chat.preset_dialog import PresetDialog
from app.data.conversations import CONTINUE_PROMPT, Conversation, ConversationStore, Message

#: Token deltas are coalesced and painted at most this often.
FLUSH_INTERVAL_MS = 40
#: A streaming reply's text is saved to the database this often (and when it ends).
SAVE_INTERVAL_MS = 2000


class ChatPane(QWidget):
    """Lets the user hold several conversations with the loaded model, kept in the database.

    Sends go to :meth:`EngineBridge.submit`; replies come back through the ``_on_*`` slots, which
    ``MainWindow._connect_engine`` connects to the bridge's signals. Deltas are appended to the
    conversation model at once but painted by a ``FLUSH_INTERVAL_MS`` timer, and saved by a
    ``SAVE_INTERVAL_MS`` timer, so a crash loses at most the last seconds of a reply.

    Messages can be edited (a new branch), replies regenerated (another branch) or continued when
    they hit the token limit; "‹ 1/2 ›" under a message switches between its branches.

    Signals:
        streaming_changed(int): the number of replies streaming in all conversations.
        notice(str): a short message for the status bar.
    """

    streaming_changed = Signal(int)
    notice = Signal(str)

    def __init__(self, bridge: EngineBridge, store: ConversationStore,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("chatPaneWidget")
        self._bridge = bridge
        self._store = store
        self._current_id: int | None = None
        self._is_model_ready = False
        self._model: tuple[str | None, str | None] = (None, None)
        self._defaults: dict[str, Any] = {}
        self._editing_index: int | None = None
        #: The preset new conversations start from.
        self.default_preset_id: int | None = None
        # request id -> (conversation id, the reply it streams into)
        self._requests: dict[str, tuple[int, Message]] = {}
        self._saved_lengths: dict[str, int] = {}
        self._dirty: set[str] = set()
        self._flush_timer = QTimer(self)
        self._flush_timer.setObjectName("flush-timer")
        self._flush_timer.setSingleShot(True)
        self._flush_timer.setInterval(FLUSH_INTERVAL_MS)
        self._flush_timer.timeout.connect(self._on_flush_timeout)
        self._save_timer = QTimer(self)
        self._save_timer.setObjectName("save-timer")
        self._save_timer.setInterval(SAVE_INTERVAL_MS)
        self._save_timer.timeout.connect(self._on_save_timeout)
        self._build()
        self._settings_bar.set_presets(self._store.storage.list_presets(), None)
        existing = self._store.list()
        if existing:
            self.select_conversation(existing[0].id)
        else:
            self.new_conversation()

    # -- layout -----------------------------------------------------------------------------------

    def _build(self) -> None:
        self._sidebar = ConversationList()
        self._sidebar.conversation_selected.connect(self._on_conversation_selected)
        self._sidebar.new_requested.connect(self._on_new_requested)
        self._sidebar.delete_requested.connect(self._on_delete_requested)
        self._sidebar.rename_requested.connect(self._on_rename_requested)
        self._sidebar.undo_delete_requested.connect(self._on_undo_delete_requested)
        self._sidebar.search_changed.connect(self._on_search_changed)

        self._settings_bar = ConversationSettings()
        self._settings_bar.preset_chosen.connect(self._on_preset_chosen)
        self._settings_bar.sampling_changed.connect(self._on_sampling_changed)
        self._settings_bar.manage_presets_requested.connect(self._on_manage_presets_requested)
        self._view = MessageView()
        self._view.action_requested.connect(self._on_action_requested)
        self._edit_label = QLabel("Editing your message: Enter sends it as a new branch, Esc cancels.")
        self._edit_label.setObjectName("editBanner")
        self._edit_label.hide()
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
        self._stop_button.setToolTip("Stop the reply; the text so far is kept (Esc)")
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
        main_layout.addWidget(self._settings_bar)
        main_layout.addWidget(self._view, 1)
        main_layout.addWidget(self._edit_label)
        main_layout.addLayout(input_row)

        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.setObjectName("chatSplitter")
        splitter.addWidget(self._sidebar)
        splitter.addWidget(main)
        splitter.setStretchFactor(0, 0)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([200, 600])
        splitter.setChildrenCollapsible(False)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addWidget(splitter)
        self.setFocusProxy(self._input)

    # -- public API: conversations ----------------------------------------------------------------

    @property
    def store(self) -> ConversationStore:
        return self._store

    @property
    def current_conversation(self) -> Conversation | None:
        if self._current_id is None:
            return None
        try:
            return self._store.get(self._current_id)
        except KeyError:
            return None

    @property
    def view(self) -> MessageView:
        return self._view

    @property
    def sidebar(self) -> ConversationList:
        return self._sidebar

    @property
    def settings_bar(self) -> ConversationSettings:
        return self._settings_bar

    @property
    def num_streaming(self) -> int:
        return len(self._requests)

    def new_conversation(self) -> Conversation:
        """Switch to an empty conversation: the current one if it is empty, else a new one."""
        current = self.current_conversation
        if current is not None and not current.messages:
            conversation = current
        else:
            conversation = self._store.create(preset_id=self._valid_preset(self.default_preset_id))
        self.select_conversation(conversation.id)
        self._input.setFocus()
        return conversation

    def select_conversation(self, conversation_id: int) -> None:
        """Show a conversation (raises KeyError for an unknown or deleted one)."""
        conversation = self._store.get(conversation_id)
        self._cancel_editing()
        self._current_id = conversation.id
        self._view.show_conversation(conversation)
        self._settings_bar.show_conversation(conversation)
        self._refresh_list()
        self._update_controls()

    def delete_conversation(self, conversation_id: int) -> None:
        """Move a conversation to the trash, stopping its reply; "Undo" brings it back."""
        for rid, (cid, message) in list(self._requests.items()):
            if cid == conversation_id:
                self._bridge.cancel(rid)
                self._store.finish_reply(message, "abort", {})
                self._forget_request(rid)
        title = self._store.get(conversation_id).title
        self._store.delete(conversation_id)
        self._sidebar.offer_undo(conversation_id, title)
        self.streaming_changed.emit(len(self._requests))
        if conversation_id == self._current_id:
            self._current_id = None
            remaining = self._store.list()
            if remaining:
                self.select_conversation(remaining[0].id)
            else:
                self.new_conversation()
        else:
            self._refresh_list()

    def undo_delete(self, conversation_id: int) -> None:
        """Bring a deleted conversation back and show it."""
        self._store.undo_delete(conversation_id)
        self._sidebar.hide_undo()
        self.select_conversation(conversation_id)

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        try:
            self._store.rename(conversation_id, title)
        except ValueError as exc:
            self.notice.emit(str(exc))
        self._refresh_list()

    def search(self, text: str) -> None:
        """Filter the sidebar to conversations containing ``text`` (empty: show all)."""
        self._sidebar.set_search_text(text)
        self._refresh_list()

    def focus_search(self) -> None:
        self._sidebar.focus_search()

    def focus_input(self) -> None:
        self._input.setFocus()

    def refresh(self) -> None:
        """Re-read the sidebar and presets (after an import, or preset changes)."""
        self._settings_bar.set_presets(self._store.storage.list_presets(), self.current_conversation)
        self._refresh_list()

    # -- public API: settings ---------------------------------------------------------------------

    def set_sampling_params(self, params: dict[str, Any]) -> None:
        """Set the default ``SamplingParams`` keyword arguments (conversations may override them)."""
        self._defaults = dict(params)
        self._settings_bar.set_defaults(self._defaults)

    def sampling_params(self, conversation: Conversation) -> dict[str, Any]:
        """The parameters a reply in ``conversation`` is generated with."""
        return {**self._defaults, **conversation.sampling_overrides()}

    def set_model_ready(self, is_ready: bool) -> None:
        """Enable sending while a model is loaded or loading (requests wait for the load)."""
        self._is_model_ready = is_ready
        self._update_controls()
        if is_ready:
            self._input.setFocus()

    @Slot(object)
    def set_model_info(self, info: ModelInfo | None) -> None:
        """The model new replies are recorded as written by."""
        self._model = (info.model_name, info.dtype) if info is not None else (None, None)

    def set_font_size(self, points: int) -> None:
        """Use ``points`` for the transcript and the message box (0: the system's size)."""
        self._view.set_font_size(points)
        font = QFont(self._input.font())
        font.setPointSizeF(points if points > 0 else QFont().pointSizeF())
        self._input.setFont(font)

    # -- public API: chatting ---------------------------------------------------------------------

    def send(self, text: str) -> str | None:
        """Send ``text`` in the current conversation; returns the request id, or None if not sent."""
        text = text.strip()
        conversation = self.current_conversation
        if not text or conversation is None or not self._can_send(conversation):
            return None
        self._store.add_user(conversation, text)
        self._view.append_message(conversation.messages[-1])
        return self._start_reply(conversation, conversation.prompt_messages())

    def edit_message(self, index: int, text: str) -> str | None:
        """Replace user message ``index`` by ``text`` as a new branch, and get a reply to it."""
        text = text.strip()
        conversation = self.current_conversation
        if not text or conversation is None or not self._can_branch(conversation, index, "user"):
            return None
        self._store.truncate(conversation, index)
        self._store.add_user(conversation, text)
        self._view.show_conversation(conversation)
        return self._start_reply(conversation, conversation.prompt_messages())

    def regenerate(self, index: int | None = None) -> str | None:
        """Generate another version of reply ``index`` (default: the last reply), keeping the old one."""
        conversation = self.current_conversation
        if conversation is None:
            return None
        if index is None:
            index = next((i for i in range(len(conversation.messages) - 1, -1, -1)
                          if conversation.messages[i].role == "assistant"), -1)
        if not self._can_branch(conversation, index, "assistant"):
            return None
        self._store.truncate(conversation, index)
        self._view.show_conversation(conversation)
        return self._start_reply(conversation, conversation.prompt_messages())

    def continue_reply(self, index: int | None = None) -> str | None:
        """Have the model go on with the last reply, which stopped at its token limit."""
        conversation = self.current_conversation
        if conversation is None or not conversation.messages:
            return None
        last = len(conversation.messages) - 1
        index = last if index is None else index
        message = conversation.messages[index] if 0 <= index < len(conversation.messages) else None
        if message is None or index != last or not message.can_continue or not self._can_send(conversation):
            self.notice.emit("Only the last reply can be continued, once it stopped at its token limit.")
            return None
        # The partial reply goes last: the local engine continues a trailing assistant message exactly (no new
        # turn). A remote server may open a new turn instead, so it gets an explicit instruction.
        history = conversation.prompt_messages()
        if self._bridge.remote is not None:
            history.append({"role": "user", "content": CONTINUE_PROMPT})
        self._store.resume_reply(message)
        self._view.update_message(index, message)
        return self._submit(conversation, message, history)

    def switch_branch(self, index: int, step: int) -> bool:
        """Show the previous (``step`` -1) or next (+1) version of message ``index``."""
        conversation = self.current_conversation
        if conversation is None or conversation.is_streaming or not 0 <= index < len(conversation.messages):
            return False
        if not self._store.switch_branch(conversation, index, step):
            return False
        self._cancel_editing()
        self._view.show_conversation(conversation)
        self._update_controls()
        return True

    def copy_message(self, index: int) -> None:
        conversation = self.current_conversation
        if conversation is not None and 0 <= index < len(conversation.messages):
            QGuiApplication.clipboard().setText(conversation.messages[index].content)
            self.notice.emit("Message copied.")

    def copy_code(self, index: int, block: int) -> None:
        conversation = self.current_conversation
        if conversation is None or not 0 <= index < len(conversation.messages):
            return
        blocks = code_blocks(conversation.messages[index].content)
        if 0 <= block < len(blocks):
            QGuiApplication.clipboard().setText(blocks[block].code)
            self.notice.emit("Code copied.")

    def start_editing(self, index: int) -> None:
        """Put user message ``index`` in the message box; sending it makes a new branch."""
        conversation = self.current_conversation
        if conversation is None or not self._can_branch(conversation, index, "user"):
            return
        self._editing_index = index
        self._input.setPlainText(conversation.messages[index].content)
        self._edit_label.show()
        self._input.setFocus()
        self._update_controls()

    @property
    def is_editing(self) -> bool:
        return self._editing_index is not None

    def stop(self) -> None:
        """Stop the reply streaming in the current conversation, keeping its text."""
        for rid, (cid, _) in self._requests.items():
            if cid == self._current_id:
                self._bridge.cancel(rid)

    def shutdown(self) -> None:
        """Save the text of streaming replies and stop tracking them (the window is closing).

        They stay marked incomplete in the database and show as stopped next time.
        """
        self._on_save_timeout()
        for rid in list(self._requests):
            self._forget_request(rid)
        self._flush_timer.stop()

    @Slot()
    def escape(self) -> None:
        """Esc: cancel an edit if one is under way, else stop the reply."""
        if self.is_editing:
            self._cancel_editing()
            self._input.clear()
        else:
            self.stop()

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
        self._store.finish_reply(entry[1], info.finish_reason, dict(info.metrics))
        self._end_request(request_id)

    @Slot(str, str)
    def _on_request_failed(self, request_id: str, text: str) -> None:
        entry = self._requests.get(request_id)
        if entry is None:
            return
        self._store.fail_reply(entry[1], text)
        self._end_request(request_id)

    @Slot()
    def _on_flush_timeout(self) -> None:
        dirty, self._dirty = self._dirty, set()
        for rid in dirty:
            self._repaint_request(rid)

    @Slot()
    def _on_save_timeout(self) -> None:
        for rid, (_, message) in self._requests.items():
            if len(message.content) != self._saved_lengths.get(rid, 0):
                self._store.save_partial(message)
                self._saved_lengths[rid] = len(message.content)

    # -- widget events ----------------------------------------------------------------------------

    @Slot()
    def _on_input_submitted(self) -> None:
        self._on_send_clicked()

    @Slot()
    def _on_send_clicked(self) -> None:
        text = self._input.toPlainText()
        if self._editing_index is not None:
            index, self._editing_index = self._editing_index, None
            self._edit_label.hide()
            sent = self.edit_message(index, text)
        else:
            sent = self.send(text)
        if sent is not None:
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
    def _on_new_requested(self) -> None:
        self.new_conversation()

    @Slot(int)
    def _on_conversation_selected(self, conversation_id: int) -> None:
        if conversation_id != self._current_id:
            self.select_conversation(conversation_id)

    @Slot(int)
    def _on_delete_requested(self, conversation_id: int) -> None:
        self.delete_conversation(conversation_id)

    @Slot(int, str)
    def _on_rename_requested(self, conversation_id: int, title: str) -> None:
        self.rename_conversation(conversation_id, title)

    @Slot(int)
    def _on_undo_delete_requested(self, conversation_id: int) -> None:
        self.undo_delete(conversation_id)

    @Slot(str)
    def _on_search_changed(self, text: str) -> None:
        self._refresh_list()

    @Slot(object)
    def _on_preset_chosen(self, preset_id: int | None) -> None:
        conversation = self.current_conversation
        if conversation is None:
            return
        prompt = self._store.storage.get_preset(preset_id).system_prompt if preset_id else None
        self._store.set_system_prompt(conversation, prompt, preset_id)
        self._settings_bar.show_conversation(conversation)

    @Slot(object)
    def _on_sampling_changed(self, params: dict[str, Any] | None) -> None:
        conversation = self.current_conversation
        if conversation is None:
            return
        params = params or {}
        self._store.set_sampling(conversation, params.get("temperature"), params.get("top_p"),
                                 params.get("max_tokens"))

    @Slot()
    def _on_manage_presets_requested(self) -> None:
        self.open_presets_dialog()

    def open_presets_dialog(self) -> PresetDialog:
        """Open the presets dialog (window-modal); the lists refresh when it closes."""
        dialog = PresetDialog(self._store.storage, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        conversation = self.current_conversation
        dialog.select(conversation.preset_id if conversation is not None else None)
        dialog.finished.connect(self._on_presets_dialog_finished)
        dialog.open()
        return dialog

    @Slot(int)
    def _on_presets_dialog_finished(self, result: int) -> None:
        self.refresh()

    @Slot(str, int, int)
    def _on_action_requested(self, action: str, index: int, extra: int) -> None:
        if action == "copy":
            self.copy_message(index)
        elif action == "copy-code":
            self.copy_code(index, extra)
        elif action == "edit":
            self.start_editing(index)
        elif action == "regenerate":
            self.regenerate(index)
        elif action == "continue":
            self.continue_reply(index)
        elif action in ("prev", "next"):
            self.switch_branch(index, -1 if action == "prev" else 1)

    # -- helpers ----------------------------------------------------------------------------------

    def _start_reply(self, conversation: Conversation, history: list[dict[str, str]]) -> str:
        reply = self._store.start_reply(conversation, *self._model)
        self._view.append_message(reply)
        return self._submit(conversation, reply, history)

    def _submit(self, conversation: Conversation, reply: Message, history: list[dict[str, str]]) -> str:
        rid = self._bridge.submit(str(conversation.id), history, self.sampling_params(conversation))
        reply.request_id = rid
        self._requests[rid] = (conversation.id, reply)
        self._saved_lengths[rid] = len(reply.content)
        if not self._save_timer.isActive():
            self._save_timer.start()
        log.ui.debug("sent %s in conversation %s", rid, conversation.id)
        self._refresh_list()
        self._update_controls()
        self.streaming_changed.emit(len(self._requests))
        return rid

    def _end_request(self, request_id: str) -> None:
        self._dirty.discard(request_id)
        self._repaint_request(request_id)
        self._forget_request(request_id)
        self._refresh_list()
        self._update_controls()
        self.streaming_changed.emit(len(self._requests))

    def _forget_request(self, request_id: str) -> None:
        self._requests.pop(request_id, None)
        self._saved_lengths.pop(request_id, None)
        self._dirty.discard(request_id)
        if not self._requests:
            self._save_timer.stop()

    def _repaint_request(self, request_id: str) -> None:
        entry = self._requests.get(request_id)
        if entry is None or entry[0] != self._current_id:
            return
        conversation = self.current_conversation
        if conversation is not None:
            index = conversation.index_of(entry[1])
            if index >= 0:
                self._view.update_message(index, entry[1])

    def _can_send(self, conversation: Conversation) -> bool:
        return self._is_model_ready and not conversation.is_streaming

    def _can_branch(self, conversation: Conversation, index: int, role: str) -> bool:
        if not 0 <= index < len(conversation.messages) or conversation.messages[index].role != role:
            return False
        if not self._can_send(conversation):
            self.notice.emit("Wait for the reply to finish (or stop it) first." if self._is_model_ready
                             else "Load a model first.")
            return False
        return True

    def _cancel_editing(self) -> None:
        self._editing_index = None
        self._edit_label.hide()

    def _valid_preset(self, preset_id: int | None) -> int | None:
        if preset_id is None:
            return None
        try:
            return self._store.storage.get_preset(preset_id).id
        except ValueError:
            return None

    def _update_controls(self) -> None:
        conversation = self.current_conversation
        is_streaming = conversation is not None and conversation.is_streaming
        can_send = conversation is not None and self._can_send(conversation)
        self._send_button.setEnabled(can_send and bool(self._input.toPlainText().strip()))
        self._send_button.setText("Save & send" if self.is_editing else "Send")
        self._stop_button.setEnabled(is_streaming)
        if not self._is_model_ready:
            self._input.setPlaceholderText("Load a model in the Model pane to start chatting…")
        elif is_streaming:
            self._input.setPlaceholderText("Hearth is replying… (Stop keeps the text so far)")
        else:
            self._input.setPlaceholderText("Message Hearth… (Enter sends, Shift+Enter for a new line)")

    def _refresh_list(self) -> None:
        text = self._sidebar.search_text
        entries = self._store.search(text) if text else [(c, "") for c in self._store.list()]
        streaming = {cid for cid, _ in self._requests.values()}
        self._sidebar.show_conversations(entries, self._current_id, streaming)
