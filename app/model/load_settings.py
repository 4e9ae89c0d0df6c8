"""The model pane's engine settings: batch size, batch timeout and KV-cache budget, used on the next load."""

from __future__ import annotations

from PySide6.QtWidgets import QDoubleSpinBox, QFormLayout, QGroupBox, QSpinBox, QWidget

from app.bridge.types import LoadSettings


class LoadSettingsForm(QGroupBox):
    """The "Engine settings" box; :meth:`load_settings` reads it."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Engine settings (used on the next load)", parent)
        defaults = LoadSettings()
        self._batch_spin = QSpinBox()
        self._batch_spin.setObjectName("maxBatchSizeSpin")
        self._batch_spin.setRange(1, 256)
        self._batch_spin.setValue(defaults.max_batch_size)
        self._batch_spin.setToolTip("How many requests the engine runs together")
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
        self._kv_spin.setToolTip("Memory for the KV cache; Automatic sizes it from free memory")
        form = QFormLayout(self)
        form.addRow("Max batch size", self._batch_spin)
        form.addRow("Batch timeout", self._wait_spin)
        form.addRow("KV-cache budget", self._kv_spin)

    def load_settings(self, quantization: str) -> LoadSettings:
        """The settings in the box, with the quantization level chosen elsewhere in the pane."""
        return LoadSettings(max_batch_size=self._batch_spin.value(), max_wait_ms=self._wait_spin.value(),
                            kv_cache_mb=self._kv_spin.value(), quantization=quantization)
