"""The model pane's "Device" and "Precision" choices, and the advice under them.

The two depend on the machine and on each other, which is why they sit together: a device this machine lacks is
refused with the reason (and Device goes back to Automatic); a recommendation sets the precision until the user
picks one, and then never again; the advice warns when the precision chosen will not fit.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Signal, Slot
from PySide6.QtWidgets import QComboBox, QFormLayout, QLabel, QVBoxLayout, QWidget

from app.bridge.types import DEVICES, QuantizationAdvice
from app.fitting import narrow_combo
from app.model.quantization_view import QuantizationView
from engine.api import LEVEL_LABELS, QUANTIZATION_LEVELS

DEVICE_LABELS = {"auto": "Automatic", "cpu": "CPU", "cuda": "NVIDIA GPU (CUDA)"}
#: The "Precision" choices: how the weights are stored (``QUANTIZATION_LEVELS``), in the engine's plain words.
PRECISION_LABELS = {
    level: f"Automatic ({words})" if level == "auto" else f"{level} · {words}" for level, words in LEVEL_LABELS.items()
}


class DevicePrecisionForm(QWidget):
    """Device and precision for a local model, the note on a refused device, and the quantization advice.

    Signals:
        device_changed(): the device choice changed (the advice for the old one no longer holds).
    """

    device_changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._is_precision_chosen = False  # the user picked a precision: recommendations no longer change it
        self._hardware: Any = None
        self._device_combo = QComboBox()
        self._device_combo.setObjectName("deviceCombo")
        for device in DEVICES:
            self._device_combo.addItem(DEVICE_LABELS[device], device)
        self._device_combo.currentIndexChanged.connect(self._on_device_changed)
        self._device_combo.activated.connect(self._on_device_activated)
        self._quantization_combo = QComboBox()
        self._quantization_combo.setObjectName("quantizationCombo")
        self._quantization_combo.setToolTip(
            "How the model's weights are stored. Smaller uses less memory and can be faster, at some cost "
            "in quality. Automatic picks the most exact one that fits; \"Why?\" below gives the reason.")
        for level in QUANTIZATION_LEVELS:
            self._quantization_combo.addItem(PRECISION_LABELS[level], level)
        narrow_combo(self._quantization_combo)
        self._quantization_combo.currentIndexChanged.connect(self._on_quantization_changed)
        self._quantization_combo.activated.connect(self._on_quantization_activated)
        self._quantization_view = QuantizationView()
        self._device_note = QLabel("")
        self._device_note.setObjectName("deviceNoteLabel")
        self._device_note.setWordWrap(True)
        self._device_note.hide()
        form = QFormLayout()
        form.addRow("Device", self._device_combo)
        form.addRow("Precision", self._quantization_combo)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(form)
        layout.addWidget(self._device_note)
        layout.addWidget(self._quantization_view)

    def device(self) -> str:
        """The chosen device: one of ``DEVICES``."""
        return str(self._device_combo.currentData())

    def quantization(self) -> str:
        """The chosen precision: a quantization level (one of ``QUANTIZATION_LEVELS``)."""
        return str(self._quantization_combo.currentData())

    @property
    def advice(self) -> QuantizationAdvice | None:
        """The advice shown; None while it is asked for (or before)."""
        return self._quantization_view.advice

    def show_estimating(self) -> None:
        """Drop the advice shown while a new one is asked for."""
        self._quantization_view.show_estimating()

    def show_advice(self, advice: QuantizationAdvice) -> None:
        """Show the advice, and take its level unless the user picked a precision."""
        self._quantization_view.show_advice(advice)
        rec = advice.recommendation
        if rec is not None and not self._is_precision_chosen:
            index = self._quantization_combo.findData(rec.quantization)
            if index >= 0:
                self._quantization_combo.setCurrentIndex(index)
        self._quantization_view.update_warning(self.quantization())

    def set_hardware(self, info: Any) -> None:
        """The machine as detected (``HardwareInfo``): whether a CUDA choice can stand."""
        self._hardware = info

    @Slot(int)
    def _on_device_changed(self, _index: int) -> None:
        self.device_changed.emit()

    @Slot(int)
    def _on_device_activated(self, _index: int) -> None:
        """Refuse CUDA on a machine without a usable NVIDIA GPU, with the reason, and fall back to Automatic."""
        info = self._hardware
        if self._device_combo.currentData() != "cuda" or info is None or \
                (info.gpus and info.torch_cuda_available):
            self._device_note.hide()
            return
        reason = str(getattr(info, "gpu_reason", "") or "").rstrip(".")
        self._device_note.setText(
            "No NVIDIA GPU that Hearth can use was found" + (f" ({reason})" if reason else "")
            + ", so the model runs on the CPU. Device is back on Automatic.")
        self._device_note.show()
        self._device_combo.setCurrentIndex(self._device_combo.findData("auto"))

    @Slot(int)
    def _on_quantization_activated(self, _index: int) -> None:
        self._is_precision_chosen = self.quantization() != "auto"

    @Slot(int)
    def _on_quantization_changed(self, _index: int) -> None:
        self._quantization_view.update_warning(self.quantization())
