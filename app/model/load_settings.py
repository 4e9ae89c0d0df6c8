"""The model pane's engine settings, used on the next load: context length, what to do when a chat outgrows it,
concurrent chats (the batch size), batch timeout, KV-cache budget, speculative decoding and repeatable replies.

The KV cache holds the context length for each concurrent chat, so those two settings size its memory; the
recommendation above them shows the figure.

Only the overflow policy applies at once. While another setting differs from what the model in use was loaded with
(:meth:`LoadSettingsForm.set_loaded`), a note above the fields names it and offers to reload.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QSpinBox,
    QWidget,
)

from app.bridge.types import DEFAULT_CONTEXT, MIN_CONTEXT, OVERFLOW_POLICIES, LoadSettings
from app.fitting import narrow_combo

#: The box's title, and the title while a changed setting waits for a load.
TITLE = "Engine settings (used on the next load)"
PENDING_TITLE = "Engine settings (reload to apply)"
#: ``LoadSettings.speculative`` choices, in words.
SPECULATIVE_CHOICES = {"off": "Off", "ngram": "From the chat's own text (no second model)",
                       "self-int4": "The model's own 4-bit copy drafts"}
#: The settings that take effect on a load, by their labels in the box, each with how it is read from a
#: ``LoadSettings`` (the context as the engine gets it: "Automatic" and its figure are one choice).
RELOAD_SETTINGS: dict[str, Callable[[LoadSettings], object]] = {
    "Context length": lambda s: s.max_model_len,
    "Concurrent chats": lambda s: s.max_batch_size,
    "Batch timeout": lambda s: s.max_wait_ms,
    "KV-cache budget": lambda s: s.kv_cache_mb,
    "Speculative decoding": lambda s: s.speculative,
    "Repeatable replies": lambda s: s.deterministic,
}


def changed_on_reload(loaded: LoadSettings, chosen: LoadSettings) -> list[str]:
    """The labels of the settings in ``chosen`` that differ from ``loaded`` and take effect only on a load."""
    return [label for label, value in RELOAD_SETTINGS.items() if value(chosen) != value(loaded)]


class LoadSettingsForm(QGroupBox):
    """The "Engine settings" box; :meth:`load_settings` reads it.

    Signals:
        sizing_changed(): the context length or the number of concurrent chats changed (the memory estimate
            depends on them).
        overflow_changed(str): the overflow policy changed (it applies at once, no reload needed).
        reload_requested(): the user clicked "Reload" in the note that changed settings wait for a load.
        pending_changed(bool): settings came to differ from the loaded model's (True), or no longer do (False).
    """

    sizing_changed = Signal()
    overflow_changed = Signal(str)
    reload_requested = Signal()
    pending_changed = Signal(bool)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(TITLE, parent)
        defaults = LoadSettings()
        self._loaded: LoadSettings | None = None  # what the model in use was loaded with
        self._pending_label = QLabel("")
        self._pending_label.setObjectName("reloadPendingLabel")
        self._pending_label.setWordWrap(True)
        self._pending_label.setTextFormat(Qt.TextFormat.RichText)
        self._pending_label.linkActivated.connect(self._on_pending_link_activated)
        self._pending_label.hide()
        self._context_spin = QSpinBox()
        self._context_spin.setObjectName("contextLengthSpin")
        self._context_spin.setRange(MIN_CONTEXT - 1, 1 << 20)
        self._context_spin.setSingleStep(1024)
        self._context_spin.setSuffix(" tokens")
        self._context_spin.setSpecialValueText("Automatic")
        self._context_spin.setValue(MIN_CONTEXT - 1)
        self._context_spin.setToolTip("The longest chat (prompt plus reply) the model reads; kept per model. "
                                      f"Automatic: {DEFAULT_CONTEXT} tokens or the model's limit")
        self._overflow_combo = QComboBox()
        self._overflow_combo.setObjectName("overflowCombo")
        for key, label in OVERFLOW_POLICIES.items():
            self._overflow_combo.addItem(label, key)
        narrow_combo(self._overflow_combo)
        self._overflow_combo.setToolTip("What happens when a chat grows longer than the context; Regenerate "
                                        "follows it too")
        self._batch_spin = QSpinBox()
        self._batch_spin.setObjectName("maxBatchSizeSpin")
        self._batch_spin.setRange(1, 256)
        self._batch_spin.setValue(defaults.max_batch_size)
        self._batch_spin.setToolTip("How many replies the engine writes at once (chats here and API clients); "
                                    "each holds a full context in the KV cache")
        self._wait_spin = QDoubleSpinBox()
        self._wait_spin.setObjectName("batchTimeoutSpin")
        self._wait_spin.setRange(0.0, 1000.0)
        self._wait_spin.setDecimals(1)
        self._wait_spin.setSuffix(" ms")
        self._wait_spin.setValue(defaults.max_wait_ms)
        self._wait_spin.setToolTip("How long the engine waits to fill a batch")
        self._kv_spin = QSpinBox()
        self._kv_spin.setObjectName("kvCacheSpin")
        self._kv_spin.setRange(0, 1024 * 1024)
        self._kv_spin.setSingleStep(256)
        self._kv_spin.setSuffix(" MiB")
        self._kv_spin.setSpecialValueText("Automatic")
        self._kv_spin.setValue(defaults.kv_cache_mb)
        self._kv_spin.setToolTip("Memory for the KV cache; Automatic gives every concurrent chat a full context")
        self._repeatable_check = QCheckBox("Repeatable replies (about a quarter slower)")
        self._repeatable_check.setObjectName("repeatableCheck")
        self._repeatable_check.setChecked(defaults.deterministic)
        self._repeatable_check.setToolTip("At temperature 0, the same question gives the same answer whatever "
                                          "else is running or cached; the engine then uses slower kernels")
        self._speculative_combo = QComboBox()
        self._speculative_combo.setObjectName("speculativeCombo")
        for key, label in SPECULATIVE_CHOICES.items():
            self._speculative_combo.addItem(label, key)
        self._speculative_combo.setCurrentIndex(self._speculative_combo.findData(defaults.speculative))
        narrow_combo(self._speculative_combo)
        self._speculative_combo.setToolTip(
            "Guess a few tokens ahead and let the model check them in one step. Replies stay the same; it pays when "
            "the reply repeats text from the chat (quoting, editing code), and pauses itself when guesses miss")
        form = QFormLayout(self)
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)  # a narrow side pane puts fields under
        form.addRow(self._pending_label)
        form.addRow("Context length", self._context_spin)
        form.addRow("When a chat is longer", self._overflow_combo)
        form.addRow("Concurrent chats", self._batch_spin)
        form.addRow("Batch timeout", self._wait_spin)
        form.addRow("KV-cache budget", self._kv_spin)
        form.addRow("Speculative decoding", self._speculative_combo)
        form.addRow(self._repeatable_check)
        self._context_spin.valueChanged.connect(lambda _value: self.sizing_changed.emit())
        self._batch_spin.valueChanged.connect(lambda _value: self.sizing_changed.emit())
        self._overflow_combo.currentIndexChanged.connect(self._on_overflow_changed)
        for spin in (self._context_spin, self._batch_spin, self._wait_spin, self._kv_spin):
            spin.valueChanged.connect(self._show_pending)
        self._speculative_combo.currentIndexChanged.connect(self._show_pending)
        self._repeatable_check.toggled.connect(self._show_pending)

    def load_settings(self, quantization: str) -> LoadSettings:
        """The settings in the box, with the quantization level chosen elsewhere in the pane."""
        return LoadSettings(max_batch_size=self._batch_spin.value(), max_wait_ms=self._wait_spin.value(),
                            kv_cache_mb=self._kv_spin.value(), quantization=quantization,
                            context_length=self.context_length(), overflow=self.overflow(),
                            deterministic=self._repeatable_check.isChecked(),
                            speculative=str(self._speculative_combo.currentData()))

    def set_loaded(self, settings: LoadSettings | None) -> None:
        """The settings the model in use was loaded with (None: no local model runs); the note says which fields
        differ from them."""
        self._loaded = settings
        self._show_pending()

    @property
    def pending(self) -> list[str]:
        """The labels of the settings that wait for a load to take effect (none when no local model runs)."""
        if self._loaded is None:
            return []
        return changed_on_reload(self._loaded, self.load_settings(self._loaded.quantization))

    @property
    def pending_text(self) -> str:
        """The note's text while it shows, else ""."""
        return self._pending_label.text() if not self._pending_label.isHidden() else ""

    def context_length(self) -> int:
        """The chosen context length; 0 for automatic."""
        value = self._context_spin.value()
        return 0 if value < MIN_CONTEXT else value

    def set_context_length(self, value: int) -> None:
        self._context_spin.setValue(value if value >= MIN_CONTEXT else MIN_CONTEXT - 1)

    def overflow(self) -> str:
        return str(self._overflow_combo.currentData())

    def is_repeatable(self) -> bool:
        """Whether "Repeatable replies" (``LoadSettings.deterministic``) is on."""
        return self._repeatable_check.isChecked()

    def set_repeatable(self, on: bool) -> None:
        self._repeatable_check.setChecked(on)

    def set_overflow(self, policy: str) -> None:
        index = self._overflow_combo.findData(policy)
        if index >= 0:
            self._overflow_combo.setCurrentIndex(index)

    @Slot(int)
    def _on_overflow_changed(self, _index: int) -> None:
        self.overflow_changed.emit(self.overflow())

    @Slot()
    def _show_pending(self) -> None:
        pending = self.pending
        was_shown = not self._pending_label.isHidden()
        if pending:
            names = ", ".join(pending)
            self._pending_label.setText(f"<b>{names}</b>: changed since the model was loaded; applies on the next "
                                        "load. <a href=\"reload\">Reload now</a>")
        self._pending_label.setVisible(bool(pending))
        if bool(pending) != was_shown:
            self.pending_changed.emit(bool(pending))

    @Slot(str)
    def _on_pending_link_activated(self, _link: str) -> None:
        self.reload_requested.emit()
