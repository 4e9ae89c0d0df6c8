"""The Model pane's "Loaded models" box: how many models stay loaded, when idle ones are unloaded, and the models
loaded now, each with its memory, the time until it is unloaded, and an Unload button.

Loading a model kept loaded (the Load button, with its spec, device and settings unchanged) makes it the one in use
at once; the bridge decides that (``app.bridge.kept_models``), this box only shows and sets.
"""

from __future__ import annotations

import html

from PySide6.QtCore import Slot
from PySide6.QtWidgets import (
    QComboBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.bridge.engine_bridge import EngineBridge
from app.bridge.kept_models import MAX_KEPT, LoadedModel
from app.formatting import format_bytes

#: "Unload idle models after": the label and the seconds (None: never).
IDLE_CHOICES: tuple[tuple[str, float | None], ...] = (
    ("Never", None), ("1 minute", 60.0), ("5 minutes", 300.0), ("15 minutes", 900.0), ("1 hour", 3600.0))


def row_text(model: LoadedModel) -> str:
    """One loaded model's line: name, memory, in use or not, and when it is unloaded."""
    parts = [f"<b>{html.escape(model.name)}</b>", format_bytes(model.memory_bytes)]
    if model.is_active:
        parts.append("in use")
    if model.is_busy:
        parts.append("answering")
    elif model.unloads_in_s is None:
        parts.append("stays loaded")
    else:
        left = int(model.unloads_in_s + 0.5)
        parts.append(f"unloads in {left // 60}:{left % 60:02d}")
    return " · ".join(parts)


class LoadedModelsBox(QGroupBox):
    """The models loaded now, and the two settings that keep them.

    Args:
        bridge: applies the settings (:meth:`EngineBridge.set_models_kept`), sends the list
            (``bridge.loaded_models.changed``) and unloads one (:meth:`EngineBridge.unload_loaded`).
    """

    def __init__(self, bridge: EngineBridge, parent: QWidget | None = None) -> None:
        super().__init__("Loaded models", parent)
        self.setObjectName("loadedModelsBox")
        self._bridge = bridge
        self._keep_spin = QSpinBox()
        self._keep_spin.setObjectName("modelsKeptSpin")
        self._keep_spin.setRange(1, MAX_KEPT)
        self._keep_spin.setToolTip("1: loading a model frees the one in use. More: the others stay loaded, and "
                                   "loading one of them again switches to it at once")
        self._idle_combo = QComboBox()
        self._idle_combo.setObjectName("idleUnloadCombo")
        for label, seconds in IDLE_CHOICES:
            self._idle_combo.addItem(label, seconds)
        self._idle_combo.setToolTip("Free a model's memory once it has answered nothing for this long")
        form = QFormLayout()
        form.addRow("Models kept loaded", self._keep_spin)
        form.addRow("Unload idle models after", self._idle_combo)
        self._rows = QVBoxLayout()
        self._empty_label = QLabel("No model loaded.")
        self._empty_label.setObjectName("loadedModelsEmpty")
        self._rows.addWidget(self._empty_label)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addLayout(self._rows)
        #: What the list shows now.
        self.models: list[LoadedModel] = []
        self._labels: list[QLabel] = []
        self._keep_spin.valueChanged.connect(self._apply)
        self._idle_combo.currentIndexChanged.connect(self._apply)
        bridge.loaded_models.changed.connect(self.show_models)

    def restore(self, count: int, idle_unload_s: float | None) -> None:
        """Show and apply stored settings (a time not offered becomes the nearest longer choice, else Never)."""
        self._keep_spin.setValue(min(max(count, 1), MAX_KEPT))
        index = next((i for i, (_, s) in enumerate(IDLE_CHOICES)
                      if s is not None and idle_unload_s is not None and s >= idle_unload_s), 0)
        self._idle_combo.setCurrentIndex(index)
        self._apply()

    def models_kept(self) -> int:
        return self._keep_spin.value()

    def idle_unload_s(self) -> float | None:
        value = self._idle_combo.currentData()
        return None if value is None else float(value)

    @Slot()
    def _apply(self) -> None:
        self._bridge.set_models_kept(self.models_kept(), self.idle_unload_s())

    @Slot(list)
    def show_models(self, models: list[LoadedModel]) -> None:
        """Show the models loaded now, one line each with its Unload button."""
        if models == self.models:
            return
        same_rows = [m.spec for m in models] == [m.spec for m in self.models]
        self.models = list(models)
        if same_rows:  # the countdown: the lines change, not the buttons
            for label, model in zip(self._labels, models, strict=True):
                label.setText(row_text(model))
            return
        self._labels = []
        while self._rows.count() > 1:
            item = self._rows.takeAt(1)
            widget = item.widget() if item is not None else None
            if widget is not None:
                widget.deleteLater()
        self._empty_label.setVisible(not models)
        for model in models:
            line = QWidget()
            line.setObjectName("loadedModelRow")
            row = QHBoxLayout(line)
            row.setContentsMargins(0, 0, 0, 0)
            label = QLabel(row_text(model))
            label.setObjectName("loadedModelLabel")
            label.setWordWrap(True)
            label.setToolTip(model.spec)
            self._labels.append(label)
            button = QPushButton("Unload")
            button.setObjectName("unloadLoadedButton")
            button.setToolTip(f"Free {model.name}'s memory")
            button.clicked.connect(lambda _checked=False, spec=model.spec: self._bridge.unload_loaded(spec))
            row.addWidget(label, 1)
            row.addWidget(button)
            self._rows.addWidget(line)
