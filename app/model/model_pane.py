"""The model pane: pick, load and unload a model; engine and generation settings; hardware."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal, Slot
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
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
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app import log
from app.bridge.engine_bridge import (
    DEVICES,
    DTYPES,
    QUANTIZATION_LEVELS,
    REMOTE_DEVICE,
    EngineBridge,
    LoadSettings,
    ModelInfo,
    QuantizationAdvice,
    ServerState,
)
from app.formatting import format_bytes

DEFAULT_MODEL_TEXT = ("Leave the path empty to use the default model, "
                      "a small chat model that comes with Hearth.")
_DEVICE_LABELS = {"auto": "Automatic", "cpu": "CPU", "cuda": "NVIDIA GPU (CUDA)"}
SOURCES = (("local", "This computer"), ("remote", "Remote server (OpenAI API)"))
DEFAULT_REMOTE_URL = "http://localhost:8000/v1"
_DTYPE_LABELS = {"auto": "Automatic", "float32": "float32 (exact, large)",
                 "bfloat16": "bfloat16 (half size)", "float16": "float16 (half size, GPU)"}
_QUANTIZATION_LABELS = {"auto": "Automatic", "fp32": "fp32", "bf16": "bf16", "fp16": "fp16",
                        "int8": "int8", "int4": "int4"}
#: How long the path box must stay unchanged before a recommendation is asked for.
RECOMMEND_DELAY_MS = 400


def level_name(level: str) -> str:
    """A quantization level as the user reads it (the old name "none" is fp32)."""
    return "fp32" if level == "none" else level


def _gb(num_bytes: float) -> str:
    return f"{num_bytes / 1e9:.1f} GB"


def describe_recommendation(rec: Any) -> str:
    """Rich text for an ``engine.loading.recommend.Recommendation``: the level, the numbers and the reason."""
    per_token = rec.kv_bytes_per_token
    per_token_text = f"{per_token / 1e3:.0f} KB" if per_token >= 1000 else f"{per_token} B"
    numbers = (f"weights {_gb(rec.weights_bytes)} · KV cache {per_token_text} per token "
               f"({_gb(rec.kv_budget_bytes)} for {rec.context_length} tokens) · "
               f"{_gb(rec.free_bytes)} free · fits: {html.escape(str(rec.fits))}")
    return (f"Recommended: <b>{html.escape(level_name(rec.quantization))}</b> on {html.escape(str(rec.device))}"
            f"<br>{numbers}<br><span style='color: #757575'>{html.escape(str(rec.reason))}</span>")


def fit_warning(rec: Any) -> str:
    """A plain warning when the level in ``rec`` will not fit (or only just), else ""."""
    name = level_name(rec.quantization)
    need = rec.weights_bytes + rec.kv_budget_bytes
    if rec.fits == "no":
        return f"{name} needs {_gb(need)} but only {_gb(rec.free_bytes)} is free — it will not fit."
    if rec.fits == "tight":
        return f"{name} needs {_gb(need)} of the {_gb(rec.free_bytes)} free — it fits, but only just."
    return ""


class ModelPane(QWidget):
    """Model choice and engine settings. Loading goes through :meth:`EngineBridge.load_model`.

    Signals:
        sampling_params_changed(dict): the generation settings changed (``SamplingParams`` kwargs).
    """

    sampling_params_changed = Signal(object)

    def __init__(self, bridge: EngineBridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("modelPaneWidget")
        self._bridge = bridge
        self._build()
        self._set_state(loaded=False, loading=False)
        self._connect_bridge()

    def _connect_bridge(self) -> None:
        """The bridge signals only this pane uses (the shared ones are wired in ``MainWindow``)."""
        self._bridge.signals.remote_models_listed.connect(self._on_remote_models_listed)
        self._bridge.signals.server_state_changed.connect(self._on_server_state_changed)
        self._bridge.signals.recommendation_ready.connect(self._on_recommendation_ready)

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if not self._shown_once:
            self._shown_once = True
            self.request_recommendation()

    # -- layout -----------------------------------------------------------------------------------

    def _build(self) -> None:
        content = QWidget()
        layout = QVBoxLayout(content)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.setSpacing(10)
        layout.addWidget(self._build_model_group())
        layout.addWidget(self._build_server_group())
        layout.addWidget(self._build_settings_group())
        layout.addWidget(self._build_generation_group())
        layout.addWidget(self._build_hardware_group())
        layout.addStretch(1)
        scroll = QScrollArea()
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
        self._dtype_combo = QComboBox()
        self._dtype_combo.setObjectName("dtypeCombo")
        for dtype in DTYPES:
            self._dtype_combo.addItem(_DTYPE_LABELS[dtype], dtype)
        self._quantization_combo = QComboBox()
        self._quantization_combo.setObjectName("quantizationCombo")
        self._quantization_combo.setToolTip("How the weights are stored: smaller levels use less memory")
        for level in QUANTIZATION_LEVELS:
            self._quantization_combo.addItem(_QUANTIZATION_LABELS[level], level)
        self._quantization_combo.currentIndexChanged.connect(self._on_quantization_changed)
        self._recommendation_label = QLabel("")
        self._recommendation_label.setObjectName("recommendationLabel")
        self._recommendation_label.setWordWrap(True)
        self._recommendation_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._quantization_warning = QLabel("")
        self._quantization_warning.setObjectName("quantizationWarning")
        self._quantization_warning.setWordWrap(True)
        self._quantization_warning.setStyleSheet(
            "QLabel { color: #8a4b00; background: #fff4e5; border: 1px solid #ffd8a8;"
            " border-radius: 4px; padding: 6px; }")
        self._quantization_warning.hide()
        self._advice: QuantizationAdvice | None = None
        self._recommend_timer = QTimer(self)
        self._recommend_timer.setSingleShot(True)
        self._recommend_timer.setInterval(RECOMMEND_DELAY_MS)
        self._recommend_timer.timeout.connect(self.request_recommendation)
        self._path_edit.textChanged.connect(lambda _text: self._recommend_timer.start())
        self._device_combo.currentIndexChanged.connect(lambda _index: self._recommend_timer.start())
        self._shown_once = False
        form = QFormLayout()
        form.addRow("Device", self._device_combo)
        form.addRow("Precision", self._dtype_combo)
        form.addRow("Quantization", self._quantization_combo)

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
        local_layout.addWidget(self._recommendation_label)
        local_layout.addWidget(self._quantization_warning)

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

    def _build_server_group(self) -> QGroupBox:
        group = QGroupBox("Serve on localhost")
        self._serve_check = QCheckBox("Serve the loaded model to other programs (OpenAI API)")
        self._serve_check.setObjectName("serveCheck")
        self._serve_check.toggled.connect(self._on_serve_toggled)
        self._serve_port_spin = QSpinBox()
        self._serve_port_spin.setObjectName("servePortSpin")
        self._serve_port_spin.setRange(1, 65535)
        self._serve_port_spin.setValue(8000)
        self._serve_key_edit = QLineEdit()
        self._serve_key_edit.setObjectName("serveKeyEdit")
        self._serve_key_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self._serve_key_edit.setPlaceholderText("Optional: clients must send it as a Bearer token")
        self._serve_status_label = QLabel("Off. Only programs on this computer can connect (127.0.0.1).")
        self._serve_status_label.setObjectName("serveStatusLabel")
        self._serve_status_label.setWordWrap(True)
        self._serve_status_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        form = QFormLayout(group)
        form.addRow(self._serve_check)
        form.addRow("Port", self._serve_port_spin)
        form.addRow("API key", self._serve_key_edit)
        form.addRow(self._serve_status_label)
        return group

    def _build_settings_group(self) -> QGroupBox:
        group = QGroupBox("Engine settings (used on the next load)")
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
        form = QFormLayout(group)
        form.addRow("Max batch size", self._batch_spin)
        form.addRow("Batch timeout", self._wait_spin)
        form.addRow("KV-cache budget", self._kv_spin)
        return group

    def _build_generation_group(self) -> QGroupBox:
        group = QGroupBox("Generation")
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
        for spin in (self._temperature_spin, self._top_p_spin, self._max_tokens_spin):
            spin.valueChanged.connect(self._on_generation_changed)
        form = QFormLayout(group)
        form.addRow("Temperature", self._temperature_spin)
        form.addRow("Top-p", self._top_p_spin)
        form.addRow("Max reply tokens", self._max_tokens_spin)
        return group

    def _build_hardware_group(self) -> QGroupBox:
        group = QGroupBox("This computer")
        self._hardware_label = QLabel("Detecting hardware…")
        self._hardware_label.setObjectName("hardwareLabel")
        self._hardware_label.setWordWrap(True)
        self._hardware_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout = QVBoxLayout(group)
        layout.addWidget(self._hardware_label)
        return group

    # -- public API -------------------------------------------------------------------------------

    def model_spec(self) -> str:
        """The path in the box, or "default"."""
        return self._path_edit.text().strip() or "default"

    def is_remote(self) -> bool:
        """Whether the "Remote server" choice is selected."""
        return self._source_combo.currentData() == "remote"

    def load_settings(self) -> LoadSettings:
        return LoadSettings(max_batch_size=self._batch_spin.value(), max_wait_ms=self._wait_spin.value(),
                            kv_cache_mb=self._kv_spin.value(), quantization=self.quantization())

    def quantization(self) -> str:
        """The chosen quantization level (one of ``QUANTIZATION_LEVELS``)."""
        return str(self._quantization_combo.currentData())

    def request_recommendation(self) -> None:
        """Ask the bridge (in the background) which quantization the chosen model should load at."""
        self._recommend_timer.stop()
        if self.is_remote():
            return
        self._advice = None
        self._update_quantization_warning()
        self._recommendation_label.setText("Estimating the memory this model needs…")
        self._bridge.recommend_quantization(self.model_spec(), self._device_combo.currentData())

    def sampling_params(self) -> dict[str, Any]:
        """``SamplingParams`` keyword arguments from the Generation box."""
        return {"temperature": round(self._temperature_spin.value(), 3),
                "top_p": round(self._top_p_spin.value(), 3),
                "max_tokens": self._max_tokens_spin.value()}

    def load(self) -> None:
        """Load the chosen model with the chosen device, precision and settings."""
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
        self._bridge.load_model(self.model_spec(), self._device_combo.currentData(),
                                self._dtype_combo.currentData(), self.load_settings())

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
        if not remote and self._advice is None:
            self._recommend_timer.start()
        self._set_state(loaded=self._bridge.model_info is not None, loading=self._bridge.is_loading)

    @Slot(int)
    def _on_remote_model_activated(self, _index: int) -> None:
        info = self._bridge.model_info
        if info is not None and info.device == REMOTE_DEVICE and \
                self._remote_model_combo.currentText() != info.model_name:
            self.load()

    @Slot(bool)
    def _on_serve_toggled(self, checked: bool) -> None:
        info = self._bridge.model_info
        if not checked:
            self._bridge.stop_server()
        elif info is not None and info.device != REMOTE_DEVICE:
            self._serve_status_label.setText("Starting…")
            self._bridge.start_server(self._serve_port_spin.value(), self._serve_key_edit.text())
        else:
            self._serve_status_label.setText("Starts when a model is loaded on this computer.")

    @Slot(object)
    def _on_recommendation_ready(self, advice: QuantizationAdvice) -> None:
        if advice.spec != self.model_spec() or advice.device != self._device_combo.currentData():
            return  # an answer for a model or device no longer chosen
        self._advice = advice
        rec = advice.recommendation
        if rec is None:
            self._recommendation_label.setText(
                f"<span style='color: #757575'>No recommendation: {html.escape(advice.error)}</span>")
            self._update_quantization_warning()
            return
        self._recommendation_label.setText(describe_recommendation(rec))
        index = self._quantization_combo.findData(rec.quantization)
        if index >= 0:
            self._quantization_combo.setCurrentIndex(index)
        self._update_quantization_warning()

    @Slot(int)
    def _on_quantization_changed(self, _index: int) -> None:
        self._update_quantization_warning()

    def _update_quantization_warning(self) -> None:
        advice = self._advice
        rec = advice.estimates.get(self.quantization()) if advice is not None else None
        warning = fit_warning(rec) if rec is not None else ""
        self._quantization_warning.setText(warning)
        self._quantization_warning.setVisible(bool(warning))

    @Slot(object)
    def _on_remote_models_listed(self, models: list[str]) -> None:
        current = self._remote_model_combo.currentText().strip()
        self._remote_model_combo.clear()
        self._remote_model_combo.addItems(models)
        if current in models:
            self._remote_model_combo.setCurrentText(current)

    @Slot(object)
    def _on_server_state_changed(self, state: ServerState) -> None:
        if state.is_running:
            key = " with the API key" if self._serve_key_edit.text() else ""
            self._serve_status_label.setText(f"Serving at <b>{html.escape(state.url)}</b>{key}; "
                                             "chats here and API clients share the model.")
        else:
            self._serve_status_label.setText(state.message or "Off.")

    @Slot()
    def _on_generation_changed(self) -> None:
        self.sampling_params_changed.emit(self.sampling_params())

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
        if self._serve_check.isChecked():
            self._bridge.start_server(self._serve_port_spin.value(), self._serve_key_edit.text())
        details = [f"<b>{html.escape(info.model_name)}</b>",
                   f"runs on <b>{html.escape(info.device)}</b> in {html.escape(info.dtype)}"]
        if info.quantization:
            details.append(f"quantization <b>{html.escape(level_name(info.quantization))}</b>")
        if info.weights_bytes:
            details.append(f"{format_bytes(info.weights_bytes)} of weights")
        text = " · ".join(details)
        if info.device_reason:
            text += f"<br><span style='color: #757575'>{html.escape(info.device_reason)}</span>"
        self._info_label.setText(text)

    @Slot(str)
    def _on_model_load_failed(self, message: str) -> None:
        self._set_state(loaded=False, loading=False)
        self._progress.setValue(0)
        self._stage_label.setText("")
        self._info_label.setText("No model loaded.")
        verb = "connect to the server" if self.is_remote() else "load the model"
        self._error_label.setText(f"Could not {verb}. {message}")
        self._error_label.show()
        log.ui.info("showing load error: %s", message)

    @Slot()
    def _on_model_unloaded(self) -> None:
        self._progress.setValue(0)
        self._stage_label.setText("Model unloaded")
        self._info_label.setText("No model loaded.")

    @Slot(object)
    def _on_hardware_detected(self, info: Any) -> None:
        self._hardware_label.setText(describe_hardware(info))

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


def describe_hardware(info: Any) -> str:
    """Rich text for a ``hardware.detect()`` result, in plain words."""
    if info is None:
        return "Hardware could not be detected; the engine picks the device when it loads."
    features = [name for name, present in (("AVX2", info.avx2), ("AVX-512", info.avx512),
                                            ("AVX-512 BF16", info.avx512_bf16), ("AMX", info.amx)) if present]
    lines = [f"<b>CPU</b>: {html.escape(str(info.cpu_model))}, {info.physical_cores} cores"
             + (f" ({', '.join(features)})" if features else ""),
             (f"<b>Memory</b>: {format_bytes(info.ram_available_bytes)} free of "
              f"{format_bytes(info.ram_total_bytes)}")]
    if info.gpus:
        for gpu in info.gpus:
            lines.append(f"<b>GPU {gpu.index}</b>: {html.escape(str(gpu.name))}, "
                         f"{format_bytes(gpu.free_bytes)} free of {format_bytes(gpu.total_bytes)}")
    else:
        lines.append("<b>GPU</b>: none usable")
    if info.gpu_reason:
        lines.append(f"<span style='color: #757575'>{html.escape(str(info.gpu_reason))}</span>")
    return "<br>".join(lines)
