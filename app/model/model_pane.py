"""The model pane: pick, load and unload a model; serving, engine and generation settings; hardware.

A failed load keeps the model in use (the bridge checks the files before freeing it); the precision the user
picked stays picked when the path or device changes; a device this machine lacks is refused with the reason.
Long because it is the one form the user fills in to run a model (source, path, device, precision,
loading, the model card), and its choices depend on each other.

The boxes with a role of their own live beside it: :mod:`app.model.quantization_view` (the advice under
the level choice), :mod:`app.model.server_box`, :mod:`app.model.load_settings`,
:mod:`app.model.generation_form` and :mod:`app.model.hardware_box`.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSize, Qt, QTimer, Signal, Slot
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from app import log
from app.bridge.engine_bridge import EngineBridge
from app.bridge.types import (
    DEFAULT_MODEL_SPEC,
    DEVICES,
    REMOTE_DEVICE,
    LoadSettings,
    ModelInfo,
    QuantizationAdvice,
)
from app.formatting import format_bytes
from app.model.generation_form import GenerationForm
from app.model.hardware_box import HardwareBox
from app.model.load_settings import LoadSettingsForm
from app.model.quantization_view import QuantizationView, level_name
from app.model.server_box import ServerBox
from engine.api import LEVEL_DTYPES, LEVEL_LABELS, QUANTIZATION_LEVELS

DEFAULT_MODEL_TEXT = ("Leave the path empty to use the default model, a small demo model that comes with "
                      "Hearth; the Models tab lists the models already on this computer.")
#: The model card line's note on the bundled default model.
DEMO_NOTE = ("A small demo model: quick, but often wrong on facts. For real use, load a larger model from the "
             "Models tab, or give the path of a Hugging Face folder or a .gguf file above.")
_DEVICE_LABELS = {"auto": "Automatic", "cpu": "CPU", "cuda": "NVIDIA GPU (CUDA)"}
SOURCES = (("local", "This computer"), ("remote", "Remote server (OpenAI API)"))
DEFAULT_REMOTE_URL = "http://localhost:8000/v1"
#: The "Precision" choices: how the weights are stored (``QUANTIZATION_LEVELS``), in the engine's plain words.
PRECISION_LABELS = {
    level: f"Automatic ({words})" if level == "auto" else f"{level} · {words}" for level, words in LEVEL_LABELS.items()
}
#: How long the path box must stay unchanged before a recommendation is asked for.
RECOMMEND_DELAY_MS = 400


class ModelPane(QWidget):
    """Model choice and engine settings. Loading goes through :meth:`EngineBridge.load_model`.

    Signals:
        sampling_params_changed(dict): the generation settings changed (``SamplingParams`` kwargs).
    """

    sampling_params_changed = Signal(object)
    model_spec_changed = Signal(str)

    def __init__(self, bridge: EngineBridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("modelPaneWidget")
        self._bridge = bridge
        self._shown_once = False  # the first show asks for a recommendation
        self._is_precision_chosen = False  # the user picked a precision: recommendations no longer change it
        self._hardware: Any = None
        self._build()
        self._set_state(loaded=False, loading=False)
        self._connect_bridge()

    def _connect_bridge(self) -> None:
        """The bridge signals only this pane uses (the shared ones are wired in ``MainWindow``)."""
        self._bridge.signals.remote_models_listed.connect(self._on_remote_models_listed)
        self._bridge.signals.recommendation_ready.connect(self._on_recommendation_ready)

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if not self._shown_once:
            self._shown_once = True
            self.request_recommendation()

    # -- layout -----------------------------------------------------------------------------------

    def _build(self) -> None:
        self._recommend_timer = QTimer(self)
        self._recommend_timer.setSingleShot(True)
        self._recommend_timer.setInterval(RECOMMEND_DELAY_MS)
        self._recommend_timer.timeout.connect(self.request_recommendation)
        content = QWidget()
        layout = QVBoxLayout(content)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.setSpacing(10)
        layout.addWidget(self._build_model_group())
        self._server_box = ServerBox(self._bridge)
        self._load_settings_form = LoadSettingsForm()
        self._load_settings_form.sizing_changed.connect(self._recommend_timer.start)
        self._load_settings_form.overflow_changed.connect(self._bridge.set_overflow_policy)
        self._generation_form = GenerationForm()
        self._generation_form.sampling_params_changed.connect(self.sampling_params_changed)
        layout.addWidget(self._server_box)
        layout.addWidget(self._load_settings_form)
        layout.addWidget(self._generation_form)
        self._hardware_box = HardwareBox()
        layout.addWidget(self._hardware_box)
        layout.addStretch(1)
        scroll = self._scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(content)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(scroll)

    def _build_model_group(self) -> QGroupBox:
        group = QGroupBox("Model")
        self._source_combo = QComboBox()
        self._source_combo.setObjectName("sourceCombo")
        for key, label in SOURCES:
            self._source_combo.addItem(label, key)
        self._source_combo.currentIndexChanged.connect(self._on_source_changed)
        source_form = QFormLayout()
        source_form.addRow("Run on", self._source_combo)
        self._path_edit = QLineEdit()
        self._path_edit.setObjectName("modelPathEdit")
        self._path_edit.setPlaceholderText("Default model")
        self._path_edit.setClearButtonEnabled(True)
        self._path_edit.setToolTip("A Hugging Face model folder or a .gguf file")
        self._path_edit.returnPressed.connect(self._on_load_clicked)
        folder_button = QPushButton("Folder…")
        folder_button.setObjectName("browseFolderButton")
        folder_button.setToolTip("Pick a Hugging Face model folder")
        folder_button.clicked.connect(self._on_browse_folder_clicked)
        file_button = QPushButton("GGUF…")
        file_button.setObjectName("browseFileButton")
        file_button.setToolTip("Pick a .gguf file")
        file_button.clicked.connect(self._on_browse_file_clicked)
        path_row = QHBoxLayout()
        path_row.addWidget(self._path_edit, 1)
        path_row.addWidget(folder_button)
        path_row.addWidget(file_button)

        hint = QLabel(DEFAULT_MODEL_TEXT)
        hint.setObjectName("defaultModelLabel")
        hint.setWordWrap(True)
        hint.setEnabled(False)

        self._device_combo = QComboBox()
        self._device_combo.setObjectName("deviceCombo")
        for device in DEVICES:
            self._device_combo.addItem(_DEVICE_LABELS[device], device)
        self._quantization_combo = QComboBox()
        self._quantization_combo.setObjectName("quantizationCombo")
        self._quantization_combo.setToolTip(
            "How the model's weights are stored. Smaller uses less memory and can be faster, at some cost "
            "in quality. Automatic picks the most exact one that fits; the reason is shown below.")
        for level in QUANTIZATION_LEVELS:
            self._quantization_combo.addItem(PRECISION_LABELS[level], level)
        self._quantization_combo.currentIndexChanged.connect(self._on_quantization_changed)
        self._quantization_combo.activated.connect(self._on_quantization_activated)
        self._quantization_view = QuantizationView()
        self._path_edit.textChanged.connect(lambda _text: self._recommend_timer.start())
        self._device_combo.currentIndexChanged.connect(lambda _index: self._recommend_timer.start())
        self._device_combo.activated.connect(self._on_device_activated)
        self._device_note = QLabel("")
        self._device_note.setObjectName("deviceNoteLabel")
        self._device_note.setWordWrap(True)
        self._device_note.hide()
        self._auto_load_check = QCheckBox("Load this model when Hearth starts")
        self._auto_load_check.setObjectName("autoLoadCheck")
        form = QFormLayout()
        form.addRow("Device", self._device_combo)
        form.addRow("Precision", self._quantization_combo)

        self._load_button = QPushButton("Load model")
        self._load_button.setObjectName("loadModelButton")
        self._load_button.clicked.connect(self._on_load_clicked)
        self._unload_button = QPushButton("Unload")
        self._unload_button.setObjectName("unloadModelButton")
        self._unload_button.setToolTip("Free the model's memory")
        self._unload_button.clicked.connect(self._on_unload_clicked)
        buttons = QHBoxLayout()
        buttons.addWidget(self._load_button, 1)
        buttons.addWidget(self._unload_button)

        self._progress = QProgressBar()
        self._progress.setObjectName("modelLoadProgress")
        self._progress.setRange(0, 1000)
        self._progress.setTextVisible(False)
        self._progress.setMaximumHeight(8)
        self._stage_label = QLabel()
        self._stage_label.setObjectName("modelStageLabel")
        self._error_label = QLabel()
        self._error_label.setObjectName("modelErrorLabel")
        self._error_label.setWordWrap(True)
        self._error_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._error_label.setStyleSheet(
            "QLabel { color: #b71c1c; background: #fdecea; border: 1px solid #f5c2c0;"
            " border-radius: 4px; padding: 6px; }")
        self._error_label.hide()
        self._info_label = QLabel("No model loaded.")
        self._info_label.setObjectName("modelInfoLabel")
        self._info_label.setWordWrap(True)
        self._info_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self._local_box = QWidget()
        local_layout = QVBoxLayout(self._local_box)
        local_layout.setContentsMargins(0, 0, 0, 0)
        local_layout.addLayout(path_row)
        local_layout.addWidget(hint)
        local_layout.addLayout(form)
        local_layout.addWidget(self._device_note)
        local_layout.addWidget(self._quantization_view)
        local_layout.addWidget(self._auto_load_check)

        layout = QVBoxLayout(group)
        layout.addLayout(source_form)
        layout.addWidget(self._local_box)
        layout.addWidget(self._build_remote_box())
        layout.addLayout(buttons)
        layout.addWidget(self._progress)
        layout.addWidget(self._stage_label)
        layout.addWidget(self._error_label)
        layout.addWidget(self._info_label)
        return group

    def _build_remote_box(self) -> QWidget:
        self._remote_box = QWidget()
        self._remote_box.setObjectName("remoteBox")
        self._remote_url_edit = QLineEdit(DEFAULT_REMOTE_URL)
        self._remote_url_edit.setObjectName("remoteUrlEdit")
        self._remote_url_edit.setToolTip("A vLLM, Ollama, LM Studio or Hearth server, e.g. http://gpu-box:8000/v1")
        self._remote_key_edit = QLineEdit()
        self._remote_key_edit.setObjectName("remoteKeyEdit")
        self._remote_key_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self._remote_key_edit.setPlaceholderText("Optional")
        self._remote_model_combo = QComboBox()
        self._remote_model_combo.setObjectName("remoteModelCombo")
        self._remote_model_combo.setEditable(True)
        self._remote_model_combo.setToolTip("Filled from the server's /v1/models when you connect")
        self._remote_model_combo.activated.connect(self._on_remote_model_activated)
        form = QFormLayout(self._remote_box)
        form.setContentsMargins(0, 0, 0, 0)
        form.addRow("Server", self._remote_url_edit)
        form.addRow("API key", self._remote_key_edit)
        form.addRow("Model", self._remote_model_combo)
        self._remote_box.hide()
        return self._remote_box

    def minimumSizeHint(self) -> QSize:
        """As narrow as the content allows without scrolling sideways (the scroll area alone would allow less)."""
        hint = super().minimumSizeHint()
        widget = self._scroll.widget()
        content = (widget.minimumSizeHint().width() if widget is not None else 0) \
            + self._scroll.verticalScrollBar().sizeHint().width()
        return QSize(max(hint.width(), content), hint.height())

    # -- public API -------------------------------------------------------------------------------

    def model_spec(self) -> str:
        """The path in the box, or "default"."""
        return self._path_edit.text().strip() or "default"

    def is_remote(self) -> bool:
        """Whether the "Remote server" choice is selected."""
        return self._source_combo.currentData() == "remote"

    def set_model_spec(self, text: str) -> None:
        """Put a model path in the box ("" for the default model)."""
        self._path_edit.setText(text)

    def load_settings(self) -> LoadSettings:
        return self._load_settings_form.load_settings(self.quantization())

    def quantization(self) -> str:
        """The chosen precision: a quantization level (one of ``QUANTIZATION_LEVELS``)."""
        return str(self._quantization_combo.currentData())

    def request_recommendation(self) -> None:
        """Ask the bridge (in the background) which quantization the chosen model should load at."""
        self._recommend_timer.stop()
        if self.is_remote():
            return
        self._quantization_view.show_estimating()
        self._bridge.recommend_quantization(self.model_spec(), self._device_combo.currentData(),
                                            self.load_settings())
        self.model_spec_changed.emit(self.model_spec())

    @property
    def load_settings_form(self) -> LoadSettingsForm:
        return self._load_settings_form

    @property
    def server_box(self) -> ServerBox:
        return self._server_box

    def auto_load(self) -> bool:
        """Whether "Load this model when Hearth starts" is ticked."""
        return self._auto_load_check.isChecked()

    def set_auto_load(self, value: bool) -> None:
        self._auto_load_check.setChecked(value)

    def sampling_params(self) -> dict[str, Any]:
        """``SamplingParams`` keyword arguments from the Generation box."""
        return self._generation_form.sampling_params()

    def set_sampling_params(self, params: dict[str, Any]) -> None:
        """Show generation defaults (``sampling_params()`` keys) in the Generation box."""
        self._generation_form.set_sampling_params(params)

    def load(self) -> None:
        """Load the chosen model with the chosen device, precision and settings.

        The weights' dtype follows the precision (``engine.api.LEVEL_DTYPES``; "auto" leaves both to the engine).
        """
        self._error_label.hide()
        self._progress.setValue(0)
        self._stage_label.setText("Starting…")
        self._info_label.setText("Loading…")
        self._set_state(loaded=False, loading=True)
        if self.is_remote():
            self._stage_label.setText("Connecting…")
            self._bridge.connect_remote(self._remote_url_edit.text(), self._remote_key_edit.text(),
                                        self._remote_model_combo.currentText().strip())
            return
        level = self.quantization()
        self._bridge.load_model(self.model_spec(), self._device_combo.currentData(),
                                LEVEL_DTYPES.get(level, "auto"), self.load_settings())

    # -- widget events ----------------------------------------------------------------------------

    @Slot()
    def _on_load_clicked(self) -> None:
        self.load()

    @Slot()
    def _on_unload_clicked(self) -> None:
        self._bridge.unload_model()
        self._set_state(loaded=False, loading=False)
        self._stage_label.setText("Unloading…")

    @Slot()
    def _on_browse_folder_clicked(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Choose a Hugging Face model folder",
                                                  self._browse_start())
        if folder:
            self._path_edit.setText(folder)

    @Slot()
    def _on_browse_file_clicked(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose a GGUF model file", self._browse_start(),
                                              "GGUF models (*.gguf);;All files (*)")
        if path:
            self._path_edit.setText(path)

    @Slot(int)
    def _on_source_changed(self, _index: int) -> None:
        remote = self.is_remote()
        self._local_box.setVisible(not remote)
        self._remote_box.setVisible(remote)
        if not remote and self._quantization_view.advice is None:
            self._recommend_timer.start()
        self._set_state(loaded=self._bridge.model_info is not None, loading=self._bridge.is_loading)

    @Slot(int)
    def _on_remote_model_activated(self, _index: int) -> None:
        info = self._bridge.model_info
        if info is not None and info.device == REMOTE_DEVICE and \
                self._remote_model_combo.currentText() != info.model_name:
            self.load()

    @Slot(object)
    def _on_recommendation_ready(self, advice: QuantizationAdvice) -> None:
        if advice.spec != self.model_spec() or advice.device != self._device_combo.currentData():
            return  # an answer for a model or device no longer chosen
        self._quantization_view.show_advice(advice)
        rec = advice.recommendation
        if rec is not None and not self._is_precision_chosen:
            index = self._quantization_combo.findData(rec.quantization)
            if index >= 0:
                self._quantization_combo.setCurrentIndex(index)
        self._quantization_view.update_warning(self.quantization())

    @Slot(int)
    def _on_quantization_activated(self, _index: int) -> None:
        self._is_precision_chosen = self.quantization() != "auto"

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
    def _on_quantization_changed(self, _index: int) -> None:
        self._quantization_view.update_warning(self.quantization())

    @Slot(object)
    def _on_remote_models_listed(self, models: list[str]) -> None:
        current = self._remote_model_combo.currentText().strip()
        self._remote_model_combo.clear()
        self._remote_model_combo.addItems(models)
        if current in models:
            self._remote_model_combo.setCurrentText(current)

    # -- engine events ----------------------------------------------------------------------------

    @Slot(float, str)
    def _on_model_load_progress(self, fraction: float, stage: str) -> None:
        self._progress.setValue(int(max(0.0, min(fraction, 1.0)) * 1000))
        stage = stage[:1].upper() + stage[1:]
        self._stage_label.setText(f"{stage}…" if fraction < 1.0 else stage)

    @Slot(object)
    def _on_model_loaded(self, info: ModelInfo) -> None:
        self._set_state(loaded=True, loading=False)
        self._progress.setValue(1000)
        self._error_label.hide()
        if info.device == REMOTE_DEVICE:
            self._stage_label.setText(f"Connected in {info.load_s:.1f} s")
            self._remote_model_combo.setCurrentText(info.model_name)
            self._info_label.setText(f"<b>{html.escape(info.model_name)}</b> on "
                                     f"<b>{html.escape(info.spec)}</b>")
            return
        self._stage_label.setText(f"Loaded in {info.load_s:.1f} s")
        self._server_box.start_if_on()
        self._generation_form.apply_model_defaults(info.model_name, info.sampling_defaults)
        self._info_label.setText(model_card(info))

    @Slot(str)
    def _on_model_load_failed(self, message: str) -> None:
        kept = self._bridge.model_info
        self._set_state(loaded=kept is not None, loading=False)
        self._progress.setValue(1000 if kept is not None else 0)
        self._stage_label.setText("")
        self._info_label.setText(model_card(kept) if kept is not None else "No model loaded.")
        verb = "connect to the server" if self.is_remote() else "load the model"
        still = f" {kept.model_name} stays in use." if kept is not None else ""
        self._error_label.setText(f"Could not {verb}. {message}{still}")
        self._error_label.show()
        log.ui.info("showing load error: %s", message)

    @Slot()
    def _on_model_unloaded(self) -> None:
        self._progress.setValue(0)
        self._stage_label.setText("Model unloaded")
        self._info_label.setText("No model loaded.")

    @Slot(object)
    def _on_hardware_detected(self, info: Any) -> None:
        self._hardware = info
        self._hardware_box.show_hardware(info)

    # -- helpers ----------------------------------------------------------------------------------

    def _set_state(self, *, loaded: bool, loading: bool) -> None:
        self._load_button.setEnabled(not loading)
        if self.is_remote():
            self._load_button.setText("Connecting…" if loading else ("Reconnect" if loaded else "Connect"))
        else:
            self._load_button.setText("Loading…" if loading else ("Load another" if loaded else "Load model"))
        self._unload_button.setEnabled(loaded or loading)
        self._progress.setVisible(loading or loaded)

    def _browse_start(self) -> str:
        current = Path(self._path_edit.text().strip()).expanduser()
        if self._path_edit.text().strip() and current.exists():
            return str(current if current.is_dir() else current.parent)
        return str(Path.home())


def model_card(info: ModelInfo) -> str:
    """The model card line: name, device, precision and memory (weights and KV cache), the device's reason, and
    for the bundled default model a note that it is a small demo model."""
    if info.device == REMOTE_DEVICE:
        return f"<b>{html.escape(info.model_name)}</b> on <b>{html.escape(info.spec)}</b>"
    details = [f"<b>{html.escape(info.model_name)}</b>",
               f"runs on <b>{html.escape(info.device)}</b> in {html.escape(info.dtype)}"]
    if info.quantization:
        details.append(f"precision <b>{html.escape(level_name(info.quantization))}</b>")
    if info.weights_bytes:
        details.append(f"{format_bytes(info.weights_bytes)} of weights")
    if info.kv_cache_bytes:
        details.append(f"{format_bytes(info.kv_cache_bytes)} KV cache ({info.context_length} tokens per chat)")
    text = " · ".join(details)
    if info.device_reason:
        text += f"<br><span style='color: #8a8a8a'>{html.escape(info.device_reason)}</span>"
    if info.spec == DEFAULT_MODEL_SPEC:
        text += f"<br><i>{html.escape(DEMO_NOTE)}</i>"
    return text
