"""The model pane's generation defaults: temperature, top-p, repetition penalty, its window and the reply length limit.

A loaded model brings its own (``ModelInfo.sampling_defaults``: its ``generation_config.json`` or Hearth's preset);
:meth:`GenerationForm.apply_model_defaults` shows them and says where they came from.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Signal, Slot
from PySide6.QtWidgets import QDoubleSpinBox, QGridLayout, QGroupBox, QLabel, QSpinBox, QWidget

#: The largest penalty window the box offers, in tokens (its lowest value, -1, reads "All": the whole conversation).
MAX_PENALTY_WINDOW = 32768


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
        self._penalty_spin = QDoubleSpinBox()
        self._penalty_spin.setObjectName("repetitionPenaltySpin")
        self._penalty_spin.setRange(1.0, 2.0)
        self._penalty_spin.setSingleStep(0.05)
        self._penalty_spin.setValue(1.0)
        self._penalty_spin.setToolTip("Above 1 makes words already used less likely: fewer loops")
        self._window_spin = QSpinBox()
        self._window_spin.setObjectName("penaltyWindowSpin")
        self._window_spin.setRange(-1, MAX_PENALTY_WINDOW)
        self._window_spin.setSpecialValueText("All")  # shown for -1
        self._window_spin.setValue(64)
        self._window_spin.setToolTip(
            "In tokens: how many of the latest tokens the repetition penalty looks at. A short window (64) stops "
            "loops without keeping the model from quoting an attached document; All counts the whole conversation "
            "and its documents; 0 turns the penalty off")
        self._source_label = QLabel("")
        self._source_label.setObjectName("generationSourceLabel")
        self._source_label.setWordWrap(True)
        self._source_label.setEnabled(False)
        self._spins: dict[str, QDoubleSpinBox | QSpinBox] = {
            "temperature": self._temperature_spin, "top_p": self._top_p_spin, "max_tokens": self._max_tokens_spin,
            "repetition_penalty": self._penalty_spin, "repeat_last_n": self._window_spin}
        for spin in self._spins.values():
            spin.valueChanged.connect(self._on_value_changed)
        grid = QGridLayout(self)  # two settings a line, so the model pane fits a laptop screen
        rows: tuple[tuple[str, QDoubleSpinBox | QSpinBox], ...] = (
            ("Temperature", self._temperature_spin), ("Top-p", self._top_p_spin),
            ("Repetition penalty", self._penalty_spin), ("Max reply tokens", self._max_tokens_spin),
            ("Penalty window", self._window_spin))
        for n, (label, spin) in enumerate(rows):
            name = QLabel(label)
            name.setToolTip(spin.toolTip())
            grid.addWidget(name, n // 2, 2 * (n % 2))
            grid.addWidget(spin, n // 2, 2 * (n % 2) + 1)
        grid.setColumnStretch(1, 1)
        grid.setColumnStretch(3, 1)
        # in the third line's free half: a fourth line would not fit a laptop screen with a model loaded
        grid.addWidget(self._source_label, len(rows) // 2, 2, 1, 2)

    def sampling_params(self) -> dict[str, Any]:
        """``SamplingParams`` keyword arguments from the box."""
        return {"temperature": round(self._temperature_spin.value(), 3),
                "top_p": round(self._top_p_spin.value(), 3),
                "max_tokens": self._max_tokens_spin.value(),
                "repetition_penalty": round(self._penalty_spin.value(), 3),
                "repeat_last_n": self._window_spin.value()}

    def set_sampling_params(self, params: dict[str, Any]) -> None:
        """Show the values in ``params`` (keys as in :meth:`sampling_params`; others are ignored)."""
        for name, value in params.items():
            spin = self._spins.get(name)
            if spin is not None:
                spin.setValue(value)

    def apply_model_defaults(self, model_name: str, defaults: dict[str, Any]) -> None:
        """Start from a just-loaded model's own sampling settings (temperature, top-p, repetition penalty and its
        window); the reply length stays the user's. A model that sets a penalty but no window gets the whole
        history (-1), as its ``generation_config.json`` means it (Hugging Face's ``generate``)."""
        if not defaults:
            self._source_label.setText("")
            return
        self.set_sampling_params({"repetition_penalty": 1.0, "top_p": 1.0, "repeat_last_n": -1, **defaults})
        self._source_label.setText("Model's defaults")  # short: it shares a line with the window
        self._source_label.setToolTip(f"Set for {model_name}; change them at will.")

    @Slot()
    def _on_value_changed(self) -> None:
        self.sampling_params_changed.emit(self.sampling_params())
