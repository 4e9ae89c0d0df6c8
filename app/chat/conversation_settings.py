"""The bar above the transcript: the conversation's system prompt preset, its sampling parameters, and whether
replies are JSON (with an optional schema)."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.chat.schema_dialog import SchemaDialog
from app.data.conversations import Conversation
from app.data.records import Preset

_NO_PROMPT = 0
_CUSTOM_PROMPT = -1


class ConversationSettings(QWidget):
    """Lets the user pick the conversation's system prompt from the presets, and its sampling.

    Sampling starts at the app's defaults (the Model pane's Generation box); ticking "Own
    sampling" stores temperature, top-p and max tokens with the conversation.

    "Reply as JSON" makes every reply of the conversation a JSON document; "Schema…" sets the JSON schema those
    replies must follow (checked as it is typed, see :class:`~app.chat.schema_dialog.SchemaDialog`).

    Signals:
        preset_chosen(object): a preset id, or None for no system prompt.
        sampling_changed(object): ``{"temperature", "top_p", "max_tokens"}``, or None for the defaults.
        reply_format_changed(bool, object): whether replies are JSON, and the schema (a dict, or None for any
            JSON object).
        manage_presets_requested(): the user wants to add, edit or delete presets.
    """

    preset_chosen = Signal(object)
    sampling_changed = Signal(object)
    reply_format_changed = Signal(bool, object)
    manage_presets_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("conversationSettings")
        self._defaults: dict[str, Any] = {}
        self._preset_combo = QComboBox()
        self._preset_combo.setObjectName("presetCombo")
        self._preset_combo.setToolTip("The system prompt of this conversation")
        self._preset_combo.activated.connect(self._on_preset_activated)
        manage = QPushButton("Presets…")
        manage.setObjectName("managePresetsButton")
        manage.setToolTip("Add, edit or delete system prompt presets")
        manage.clicked.connect(self.manage_presets_requested)
        self._sampling_toggle = QToolButton()
        self._sampling_toggle.setObjectName("samplingToggle")
        self._sampling_toggle.setText("Sampling")
        self._sampling_toggle.setToolTip("Temperature, top-p and reply length for this conversation")
        self._sampling_toggle.setCheckable(True)
        self._sampling_toggle.toggled.connect(self._on_sampling_toggled)
        self._schema: dict[str, Any] | None = None
        self._schema_dialog: SchemaDialog | None = None
        self._json_check = QCheckBox("Reply as JSON")
        self._json_check.setObjectName("jsonReplyCheck")
        self._json_check.setToolTip("Every reply in this chat is a JSON document (an object unless the schema "
                                    "says otherwise)")
        self._json_check.toggled.connect(self._on_json_toggled)
        self._schema_button = QToolButton()
        self._schema_button.setText("Schema…")
        self._schema_button.setObjectName("jsonSchemaButton")
        self._schema_button.clicked.connect(self.open_schema_dialog)
        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        top.addWidget(QLabel("System prompt"))
        top.addWidget(self._preset_combo, 1)
        top.addWidget(manage)
        top.addWidget(self._sampling_toggle)
        reply_row = QHBoxLayout()  # a row of its own, so the bar stays narrow enough for a laptop screen
        reply_row.setContentsMargins(0, 0, 0, 0)
        reply_row.addWidget(self._json_check)
        reply_row.addWidget(self._schema_button)
        reply_row.addStretch(1)

        self._custom_check = QCheckBox("Own sampling for this chat")
        self._custom_check.setObjectName("customSamplingCheck")
        self._custom_check.setToolTip("Unticked, the Model pane's Generation settings apply")
        self._custom_check.toggled.connect(self._on_custom_toggled)
        self._temperature_spin = QDoubleSpinBox()
        self._temperature_spin.setObjectName("chatTemperatureSpin")
        self._temperature_spin.setRange(0.0, 2.0)
        self._temperature_spin.setSingleStep(0.1)
        self._top_p_spin = QDoubleSpinBox()
        self._top_p_spin.setObjectName("chatTopPSpin")
        self._top_p_spin.setRange(0.05, 1.0)
        self._top_p_spin.setSingleStep(0.05)
        self._max_tokens_spin = QSpinBox()
        self._max_tokens_spin.setObjectName("chatMaxTokensSpin")
        self._max_tokens_spin.setRange(1, 32768)
        self._sampling_row = QWidget()  # the check above the values: one line of both widened the window
        grid = QGridLayout(self._sampling_row)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.addWidget(self._custom_check, 0, 0, 1, 7)
        spins: tuple[tuple[str, QDoubleSpinBox | QSpinBox], ...] = (
            ("Temperature", self._temperature_spin), ("Top-p", self._top_p_spin), ("Max tokens", self._max_tokens_spin))
        for n, (label, spin) in enumerate(spins):
            grid.addWidget(QLabel(label), 1, 2 * n)
            grid.addWidget(spin, 1, 2 * n + 1)
            spin.valueChanged.connect(self._on_value_changed)
        grid.setColumnStretch(6, 1)
        self._sampling_row.hide()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 4)
        layout.addLayout(top)
        layout.addLayout(reply_row)
        layout.addWidget(self._sampling_row)
        self._set_spins_enabled(False)

    # -- public API -------------------------------------------------------------------------------

    def set_presets(self, presets: list[Preset], conversation: Conversation | None) -> None:
        """Refill the preset list and select the conversation's preset."""
        self._preset_combo.blockSignals(True)
        self._preset_combo.clear()
        self._preset_combo.addItem("No system prompt", _NO_PROMPT)
        for preset in presets:
            self._preset_combo.addItem(preset.name, preset.id)
            self._preset_combo.setItemData(self._preset_combo.count() - 1, preset.system_prompt,
                                           Qt.ItemDataRole.ToolTipRole)
        self._preset_combo.blockSignals(False)
        self.show_conversation(conversation)

    def set_defaults(self, params: dict[str, Any]) -> None:
        """The app's sampling defaults, shown while the conversation has no own sampling."""
        self._defaults = dict(params)
        if not self._custom_check.isChecked():
            self._show_values(self._defaults)

    def show_conversation(self, conversation: Conversation | None) -> None:
        """Show the preset and sampling of ``conversation``, without emitting signals."""
        self.setEnabled(conversation is not None)
        combo = self._preset_combo
        combo.blockSignals(True)
        custom = combo.findData(_CUSTOM_PROMPT)
        if custom >= 0:
            combo.removeItem(custom)
        index = 0
        if conversation is not None and conversation.system_prompt:
            index = combo.findData(conversation.preset_id) if conversation.preset_id else -1
            if index < 0:
                combo.addItem("Custom prompt", _CUSTOM_PROMPT)
                index = combo.count() - 1
            combo.setToolTip(conversation.system_prompt)
        else:
            combo.setToolTip("This conversation has no system prompt")
        combo.setCurrentIndex(index)
        combo.blockSignals(False)
        overrides = conversation.sampling_overrides() if conversation is not None else {}
        self._custom_check.blockSignals(True)
        self._custom_check.setChecked(bool(overrides))
        self._custom_check.blockSignals(False)
        self._set_spins_enabled(bool(overrides))
        self._show_values({**self._defaults, **overrides})
        self._json_check.blockSignals(True)
        self._json_check.setChecked(conversation is not None and conversation.is_json_reply)
        self._json_check.blockSignals(False)
        self._schema = conversation.json_schema if conversation is not None else None
        self._show_schema()

    @property
    def is_json_reply(self) -> bool:
        """Whether "Reply as JSON" is ticked."""
        return self._json_check.isChecked()

    @property
    def schema(self) -> dict[str, Any] | None:
        """The conversation's JSON schema, or None for any JSON object."""
        return self._schema

    @Slot()
    def open_schema_dialog(self) -> SchemaDialog:
        """Open the schema dialog (window-modal); saving it stores the schema and ticks "Reply as JSON"."""
        dialog = SchemaDialog(self._schema, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(self._on_schema_accepted)
        self._schema_dialog = dialog
        dialog.open()
        return dialog

    def sampling(self) -> dict[str, Any] | None:
        """The conversation's own sampling, or None when it uses the defaults."""
        if not self._custom_check.isChecked():
            return None
        return {"temperature": round(self._temperature_spin.value(), 3),
                "top_p": round(self._top_p_spin.value(), 3),
                "max_tokens": self._max_tokens_spin.value()}

    # -- events -----------------------------------------------------------------------------------

    @Slot(int)
    def _on_preset_activated(self, index: int) -> None:
        data = self._preset_combo.itemData(index)
        if data == _CUSTOM_PROMPT:
            return
        self.preset_chosen.emit(None if data == _NO_PROMPT else int(data))

    @Slot(bool)
    def _on_sampling_toggled(self, is_shown: bool) -> None:
        self._sampling_row.setVisible(is_shown)

    @Slot(bool)
    def _on_custom_toggled(self, is_custom: bool) -> None:
        self._set_spins_enabled(is_custom)
        if not is_custom:
            self._show_values(self._defaults)
        self.sampling_changed.emit(self.sampling())

    @Slot()
    def _on_value_changed(self) -> None:
        if self._custom_check.isChecked():
            self.sampling_changed.emit(self.sampling())

    @Slot(bool)
    def _on_json_toggled(self, is_json: bool) -> None:
        self._show_schema()
        self.reply_format_changed.emit(is_json, self._schema)

    @Slot()
    def _on_schema_accepted(self) -> None:
        if self._schema_dialog is None:
            return
        self._schema = self._schema_dialog.schema
        self._json_check.blockSignals(True)
        self._json_check.setChecked(True)
        self._json_check.blockSignals(False)
        self._show_schema()
        self.reply_format_changed.emit(True, self._schema)

    # -- helpers ----------------------------------------------------------------------------------

    def _show_schema(self) -> None:
        self._schema_button.setText("Schema ✓" if self._schema is not None else "Schema…")
        if self._schema is None:
            self._schema_button.setToolTip("Set a JSON schema that replies must follow (none set: any JSON object)")
        else:
            properties = self._schema.get("properties")
            keys = ", ".join(properties) if isinstance(properties, dict) and properties else "no named fields"
            self._schema_button.setToolTip(f"Replies follow a JSON schema ({keys}). Click to change it.")

    def _set_spins_enabled(self, is_enabled: bool) -> None:
        for spin in (self._temperature_spin, self._top_p_spin, self._max_tokens_spin):
            spin.setEnabled(is_enabled)

    def _show_values(self, params: dict[str, Any]) -> None:
        for spin, name in ((self._temperature_spin, "temperature"), (self._top_p_spin, "top_p"),
                           (self._max_tokens_spin, "max_tokens")):
            if name in params:
                spin.blockSignals(True)
                spin.setValue(params[name])
                spin.blockSignals(False)
