"""The model pane's generation defaults: temperature, top-p and the reply length limit."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Signal, Slot
from PySide6.QtWidgets import QDoubleSpinBox, QFormLayout, QGroupBox, QSpinBox, QWidget


class GenerationForm(QGroupBox):
    """The "Generation" box: the ``SamplingParams`` every conversation uses unless it sets its own.

    Signals:
        sampling_params_changed(dict): a value changed; carries :meth:`sampling_params`.
    """

    sampling_params_changed = Signal(object)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Generation", parent)
        self._temperature_spin = QDoubleSpinBox()
        self._temperature_spin.setObjectName("temperatureSpin")
        self._temperature_spin.setRange(0.0, 2.0)
        self._temperature_spin.setSingleStep(0.1)
        self._temperature_spin.setValue(0.7)
        self._temperature_spin.setToolTip("0 always picks the most likely word")
        self._top_p_spin = QDoubleSpinBox()
        self._top_p_spin.setObjectName("topPSpin")
        self._top_p_spin.setRange(0.05, 1.0)
        self._top_p_spin.setSingleStep(0.05)
        self._top_p_spin.setValue(0.95)
        self._max_tokens_spin = QSpinBox()
        self._max_tokens_spin.setObjectName("maxTokensSpin")
        self._max_tokens_spin.setRange(1, 32768)
        self._max_tokens_spin.setValue(512)
        self._spins: dict[str, QDoubleSpinBox | QSpinBox] = {
            "temperature": self._temperature_spin, "top_p": self._top_p_spin, "max_tokens": self._max_tokens_spin}
        for spin in self._spins.values():
            spin.valueChanged.connect(self._on_value_changed)
        form = QFormLayout(self)
        form.addRow("Temperature", self._temperature_spin)
        form.addRow("Top-p", self._top_p_spin)
        form.addRow("Max reply tokens", self._max_tokens_spin)

    def sampling_params(self) -> dict[str, Any]:
        """``SamplingParams`` keyword arguments from the box."""
        return {"temperature": round(self._temperature_spin.value(), 3),
                "top_p": round(self._top_p_spin.value(), 3),
                "max_tokens": self._max_tokens_spin.value()}

    def set_sampling_params(self, params: dict[str, Any]) -> None:
        """Show the values in ``params`` (keys as in :meth:`sampling_params`; others are ignored)."""
        for name, value in params.items():
            spin = self._spins.get(name)
            if spin is not None:
                spin.setValue(value)

    @Slot()
    def _on_value_changed(self) -> None:
        self.sampling_params_changed.emit(self.sampling_params())
