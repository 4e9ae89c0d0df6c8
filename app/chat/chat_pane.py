"""The chat pane: conversation sidebar, per-conversation settings, transcript and message box.

The widgets live in their own modules, the replies stream through :mod:`app.chat.reply_controller`, and the
settings bar's edits (preset, sampling, reply format) are stored by :mod:`app.chat.settings_controller`. What stays
here is the pane's public API (the window's menus call it) and the glue between them: each user action (send, edit,
regenerate, continue, switch branch, delete, undo) writes the store and then updates the sidebar, transcript and
message box in a fixed order, one method beside the others.

Long because it is the pane's whole API: every action the menus and the composer can start is a short method
here, and splitting them by kind would scatter that fixed order of updates over several classes.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal, Slot
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QSplitter, QVBoxLayout, QWidget

from app.chat.composer import Composer
from app.chat.context_meter import ContextMeterController
from app.chat.conversation_list import ConversationList
from app.chat.conversation_settings import ConversationSettings
from app.chat.documents_controller import DocumentsController
from app.chat.markdown import code_blocks, split_reasoning
from app.chat.message_view import MessageView
from app.chat.preset_dialog import PresetDialog
from app.chat.reply_controller import ReplyController
from app.chat.search_highlight import highlight_matches
from app.chat.settings_controller import ConversationSettingsController
from app.data.conversations import Conversation, ConversationStore, Message
from app.data.storage_errors import storage_error_text


class ChatPane(QWidget):
    """Lets the user hold several conversations with the loaded model, kept in the database.

    Replies are started, streamed, saved and stopped by a :class:`ReplyController`; the pane repaints a
    reply when the controller says it changed, and its controls when a reply starts or ends.

    Messages can be edited (a new branch), replies regenerated (another branch) or continued when
    they hit the token limit; "‹ 1/2 ›" under a message switches between its branches.

    Signals:
        notice(str): a short message for the status bar.
        storage_failed(str): the database refused a write (another Hearth holds it, the disk is full); what
            happened and what to do, in words. What the user typed stays in the message box.
        conversation_shown(int): a conversation is shown (its id).

    Args:
        store: the conversations.
        replies: streams the model's replies into them.
    """

    notice = Signal(str)
    storage_failed = Signal(str)
    conversation_shown = Signal(int)

    def __init__(self, store: ConversationStore, replies: ReplyController,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("chatPaneWidget")
        self._store = store
        self._replies = replies
        self._current_id: int | None = None
        self._is_model_ready = False
        #: The chats' attached files and the sources their replies are given.
        self.documents = DocumentsController(store.storage, self)
        #: The preset new conversations start from.
        self.default_preset_id: int | None = None
        self._replies.reply_changed.connect(self._on_reply_changed)
        self._replies.streaming_changed.connect(self._on_streaming_changed)
        self._build()
        self._settings.show_presets()
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
        self._settings = ConversationSettingsController(self._store, self._settings_bar,
                                                        lambda: self.current_conversation, self)
        self._settings.presets_edited.connect(self._on_presets_edited)
        self._view = MessageView()
        self._view.action_requested.connect(self._on_action_requested)
        self._composer = Composer()
        self._composer.send_requested.connect(self._on_send_requested)
        self._composer.stop_requested.connect(self._on_stop_requested)
        self._composer.text_changed.connect(self._on_composer_text_changed)
        self.context_meter = ContextMeterController(self, self._replies, self._composer.context_meter)
        self.documents.notice.connect(self.notice)
        self.documents.connect_widgets(self, self._composer, self._view, lambda: self._current_id)
        self.documents.files_dropped.connect(self.attach_files)
        main = QWidget()
        main_layout = QVBoxLayout(main)
        main_layout.setContentsMargins(6, 0, 0, 0)
        main_layout.addWidget(self._settings_bar)
        main_layout.addWidget(self._view, 1)
        main_layout.addWidget(self._composer)

        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.setObjectName("chatSplitter")
        splitter.addWidget(self._sidebar)
        splitter.addWidget(main)
        splitter.setStretchFactor(0, 1)  # a wide window gives the titles some room too
        splitter.setStretchFactor(1, 5)
        splitter.setSizes([200, 600])
        splitter.setChildrenCollapsible(False)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addWidget(splitter)
        self.setFocusProxy(self._composer)

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
    def composer(self) -> Composer:
        return self._composer

    @property
    def sidebar(self) -> ConversationList:
        return self._sidebar

    @property
    def settings_bar(self) -> ConversationSettings:
        return self._settings_bar

    def new_conversation(self) -> Conversation | None:
        """Switch to an empty conversation: the current one if it is empty, else a new one.

        Returns:
            It, or None when the database could not store a new one (``storage_failed`` says why).
        """
        current = self.current_conversation
        if current is not None and not current.messages:
            conversation = current
        else:
            try:
                conversation = self._store.create(preset_id=self._settings.valid_preset(self.default_preset_id))
            except Exception as exc:
                if (why := storage_error_text(exc)) is None:
                    raise
                # deferred: at start-up the window connects to the signal only after the pane is built
                QTimer.singleShot(0, self, lambda: self.storage_failed.emit(why))
                self._update_controls()
                return None
        self.select_conversation(conversation.id)
        self._composer.setFocus()
        return conversation

    def select_conversation(self, conversation_id: int) -> None:
        """Show a conversation (raises KeyError for an unknown or deleted one)."""
        conversation = self._store.get(conversation_id)
        self._composer.set_editing(None)
        self._current_id = conversation.id
        self._view.show_conversation(conversation)
        highlight_matches(self._view, self._sidebar.search_text)  # a search result opens at its match
        self._settings_bar.show_conversation(conversation)
        self.documents.show(conversation.id)
        self._refresh_list()
        self._update_controls()
        self.conversation_shown.emit(conversation.id)

    @Slot(list)
    def attach_files(self, paths: list[str]) -> list[str]:
        """Attach files to the current conversation; they are read in the background. Returns those taken."""
        conversation = self.current_conversation
        return self.documents.attach(conversation.id, paths) if conversation is not None else []

    def delete_conversation(self, conversation_id: int) -> None:
        """Move a conversation to the trash, stopping its reply; "Undo" brings it back."""
        self._replies.abort(conversation_id)
        title = self._store.get(conversation_id).title
        self._store.delete(conversation_id)
        self._sidebar.offer_undo(conversation_id, title)
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
        self._composer.setFocus()

    def refresh(self) -> None:
        """Re-read the sidebar and presets (after an import, or preset changes)."""
        self._settings.show_presets()
        self._refresh_list()

    # -- public API: settings ---------------------------------------------------------------------

    def set_sampling_params(self, params: dict[str, Any]) -> None:
        """Set the default ``SamplingParams`` keyword arguments (conversations may override them)."""
        self._settings.set_defaults(params)

    def sampling_params(self, conversation: Conversation) -> dict[str, Any]:
        """The parameters a reply in ``conversation`` is generated with (its reply format included)."""
        return self._settings.sampling_params(conversation)

    def open_presets_dialog(self) -> PresetDialog:
        """Open the presets dialog (window-modal); the lists refresh when it closes."""
        return self._settings.open_presets_dialog()

    def set_model_ready(self, is_ready: bool) -> None:
        """Enable sending while a model is loaded or loading (requests wait for the load)."""
        self._is_model_ready = is_ready
        self._update_controls()
        if is_ready:
            self._composer.setFocus()

    def set_font_size(self, points: int) -> None:
        """Use ``points`` for the transcript and the message box (0: the system's size)."""
        self._view.set_font_size(points)
        self._composer.set_font_size(points)

    # -- public API: chatting ---------------------------------------------------------------------

    def send(self, text: str) -> str | None:
        """Send ``text`` in the current conversation; returns the request id, or None if not sent."""
        text = text.strip()
        conversation = self.current_conversation
        if not text or conversation is None or not self._can_send(conversation):
            return None
        try:
            self._store.add_user(conversation, text)
            self._view.append_message(conversation.messages[-1])
            return self._start_reply(conversation, conversation.prompt_messages())
        except Exception as exc:
            if (why := storage_error_text(exc)) is None:
                raise
            self.storage_failed.emit(why)  # not sent: the text stays in the box, to send again
            self._view.show_conversation(conversation)
            return None

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
            index = conversation.last_reply_index()
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
        if conversation.is_json_reply:  # the grammar starts a new document: it cannot finish a cut one
            self.notice.emit("A JSON reply cut at its token limit cannot be continued. "
                             "Raise Max tokens and regenerate it.")
            return None
        return self._replies.resume(conversation, message, self.sampling_params(conversation))

    def switch_branch(self, index: int, step: int) -> bool:
        """Show the previous (``step`` -1) or next (+1) version of message ``index``."""
        conversation = self.current_conversation
        if conversation is None or conversation.is_streaming or not 0 <= index < len(conversation.messages):
            return False
        if not self._store.switch_branch(conversation, index, step):
            return False
        self._composer.set_editing(None)
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
        blocks = code_blocks(split_reasoning(conversation.messages[index].content).answer)
        if 0 <= block < len(blocks):
            QGuiApplication.clipboard().setText(blocks[block].code)
            self.notice.emit("Code copied.")

    def start_editing(self, index: int) -> None:
        """Put user message ``index`` in the message box; sending it makes a new branch."""
        conversation = self.current_conversation
        if conversation is None or not self._can_branch(conversation, index, "user"):
            return
        self._composer.set_editing(index)
        self._composer.set_text(conversation.messages[index].content)
        self._composer.setFocus()
        self._update_controls()

    @property
    def is_editing(self) -> bool:
        return self._composer.editing_index is not None

    def stop(self) -> None:
        """Stop the reply streaming in the current conversation, keeping its text."""
        self._replies.stop(self._current_id)

    @Slot()
    def escape(self) -> None:
        """Esc: cancel an edit if one is under way, else stop the reply."""
        if self.is_editing:
            self._composer.set_editing(None)
            self._composer.clear()
        else:
            self.stop()

    # -- reply events -----------------------------------------------------------------------------

    @Slot(int, object)
    def _on_reply_changed(self, conversation_id: int, reply: Message) -> None:
        conversation = self.current_conversation if conversation_id == self._current_id else None
        index = conversation.index_of(reply) if conversation is not None else -1
        if index >= 0:
            self._view.update_message(index, reply)

    @Slot(int)
    def _on_streaming_changed(self, count: int) -> None:
        self._refresh_list()
        self._update_controls()

    # -- widget events ----------------------------------------------------------------------------

    @Slot()
    def _on_send_requested(self) -> None:
        text = self._composer.text()
        index = self._composer.editing_index
        if index is not None:
            self._composer.set_editing(None)
            sent = self.edit_message(index, text)
        else:
            sent = self.send(text)
        if sent is not None:
            self._composer.clear()
        self._composer.setFocus()

    @Slot()
    def _on_stop_requested(self) -> None:
        self.stop()
        self._composer.setFocus()

    @Slot()
    def _on_composer_text_changed(self) -> None:
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
        highlight_matches(self._view, text, scroll=False)

    @Slot()
    def _on_presets_edited(self) -> None:
        self.refresh()

    @Slot(str, int, int)
    def _on_action_requested(self, action: str, index: int, extra: int) -> None:
        conversation = self.current_conversation
        if action == "source" and conversation is not None and 0 <= index < len(conversation.messages):
            self.documents.open_source(conversation.messages[index], extra, self)
        elif action == "copy":
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
        params = self.sampling_params(conversation)
        history, sources = self.documents.prepare(conversation.id, history, params, self._replies.context_length)
        reply = self._replies.new_reply(conversation)
        self.documents.remember_sources(reply, sources)
        self._view.append_message(reply)
        return self._replies.submit(conversation, reply, history, params)

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

    def _update_controls(self) -> None:
        conversation = self.current_conversation
        is_streaming = conversation is not None and conversation.is_streaming
        can_send = conversation is not None and self._can_send(conversation)
        self._composer.update_controls(can_send=can_send, is_streaming=is_streaming,
                                       is_model_ready=self._is_model_ready, is_editing=self.is_editing)

    def _refresh_list(self) -> None:
        text = self._sidebar.search_text
        entries = self._store.search(text) if text else [(c, "") for c in self._store.list()]
        self._sidebar.show_conversations(entries, self._current_id, self._replies.streaming_conversations())
