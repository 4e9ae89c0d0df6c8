"""What a conversation's replies are generated with, and the edits to it from the chat's settings bar.

No widgets of its own: the settings bar (:class:`~app.chat.conversation_settings.ConversationSettings`) shows a
conversation's system prompt, sampling and reply format and says what the user changed; this controller writes each
change into the conversation shown, merges the app's defaults with the conversation's own choices for a reply, and
runs the presets dialog. Kept apart from the chat pane, which deals with the transcript and the replies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal, Slot
from PySide6.QtWidgets import QWidget

from app.chat.conversation_settings import ConversationSettings
from app.chat.preset_dialog import PresetDialog
from app.data.conversations import Conversation, ConversationStore


class ConversationSettingsController(QObject):
    """Keeps the shown conversation's settings in the store, and the app's generation defaults.

    Signals:
        presets_edited(): the presets dialog closed; the lists of presets may have changed.

    Args:
        store: the conversations.
        bar: the settings bar whose edits are stored.
        current: returns the conversation shown (None when there is none).
        parent: the chat pane; presets dialogs open over it.
    """

    presets_edited = Signal()

    def __init__(self, store: ConversationStore, bar: ConversationSettings,
                 current: Callable[[], Conversation | None], parent: QWidget) -> None:
        super().__init__(parent)
        self._store = store
        self._bar = bar
        self._current = current
        self._dialog_parent = parent
        self._defaults: dict[str, Any] = {}
        bar.preset_chosen.connect(self._on_preset_chosen)
        bar.sampling_changed.connect(self._on_sampling_changed)
        bar.reply_format_changed.connect(self._on_reply_format_changed)
        bar.manage_presets_requested.connect(self._on_manage_presets_requested)

    def set_defaults(self, params: dict[str, Any]) -> None:
        """Set the default ``SamplingParams`` keyword arguments (conversations may override them)."""
        self._defaults = dict(params)
        self._bar.set_defaults(self._defaults)

    def sampling_params(self, conversation: Conversation) -> dict[str, Any]:
        """The parameters a reply in ``conversation`` is generated with (its reply format included)."""
        return {**self._defaults, **conversation.sampling_overrides(), **conversation.reply_format()}

    def valid_preset(self, preset_id: int | None) -> int | None:
        """``preset_id`` if that preset still exists, else None."""
        if preset_id is None:
            return None
        try:
            return self._store.storage.get_preset(preset_id).id
        except ValueError:
            return None

    def show_presets(self) -> None:
        """Fill the settings bar's preset choice from the store, the shown conversation's one selected."""
        self._bar.set_presets(self._store.storage.list_presets(), self._current())

    def open_presets_dialog(self) -> PresetDialog:
        """Open the presets dialog (window-modal); :attr:`presets_edited` is emitted when it closes."""
        dialog = PresetDialog(self._store.storage, self._dialog_parent)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        conversation = self._current()
        dialog.select(conversation.preset_id if conversation is not None else None)
        dialog.finished.connect(self._on_presets_dialog_finished)
        dialog.open()
        return dialog

    @Slot(object)
    def _on_preset_chosen(self, preset_id: int | None) -> None:
        conversation = self._current()
        if conversation is None:
            return
        prompt = self._store.storage.get_preset(preset_id).system_prompt if preset_id else None
        self._store.set_system_prompt(conversation, prompt, preset_id)
        self._bar.show_conversation(conversation)

    @Slot(object)
    def _on_sampling_changed(self, params: dict[str, Any] | None) -> None:
        conversation = self._current()
        if conversation is None:
            return
        params = params or {}
        self._store.set_sampling(conversation, params.get("temperature"), params.get("top_p"),
                                 params.get("max_tokens"))

    @Slot(bool, object)
    def _on_reply_format_changed(self, is_json: bool, schema: dict[str, Any] | None) -> None:
        conversation = self._current()
        if conversation is not None:
            self._store.set_reply_format(conversation, is_json, schema)

    @Slot()
    def _on_manage_presets_requested(self) -> None:
        self.open_presets_dialog()

    @Slot(int)
    def _on_presets_dialog_finished(self, result: int) -> None:
        self.presets_edited.emit()
