"""The model pane: pick, load and unload a model; serving, engine and generation settings; hardware.

A failed load keeps the model in use (the bridge checks the files before freeing it) and says why; the pane asks
for a recommendation whenever the path, device or sizing changes, and shows only the answer for the current choice.

The boxes with a role of their own live beside it: :mod:`app.model.device_precision_form` (device, precision and
the advice under them), :mod:`app.model.model_card` (the line saying what is loaded), :mod:`app.model.server_box`,
:mod:`app.model.load_settings`, :mod:`app.model.generation_form`, :mod:`app.model.hardware_box`, :mod:`app.model.loaded_models_box`,
:mod:`app.model.load_status` (the progress, stage, build and error lines).

Long because it is where those boxes meet the bridge: each box keeps its own widgets and rules, and this module
holds the wiring between them and the load, unload, reload and recommendation flow they share.
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
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from app import log
from app.bridge.engine_bridge import EngineBridge
from app.bridge.types import REMOTE_DEVICE, LoadSettings, ModelInfo, NativeBuild, QuantizationAdvice
from app.fitting import FoldingSection, narrow_combo
from app.model.device_precision_form import DevicePrecisionForm
from app.model.discover import show_discover
from app.model.generation_form import GenerationForm
from app.model.hardware_box import HardwareBox
from app.model.load_settings import PENDING_TITLE, TITLE, LoadSettingsForm
from app.model.load_stage import load_stage_text
from app.model.load_status import LoadStatus
from app.model.loaded_models_box import LoadedModelsBox
from app.model.model_card import model_card
from app.model.server_box import ServerBox
from engine.api import LEVEL_DTYPES

#: The empty path box's text: the default model needs no path.
DEFAULT_MODEL_TEXT = "Empty: the default demo model"
#: The path box's tooltip: what it takes, and where else models come from.
PATH_TOOLTIP = ("A Hugging Face model folder or a .gguf file. Leave it empty to use the default model, a small demo "
                "model that comes with Hearth; the Models tab lists the models already on this computer.")
SOURCES = (("local", "This computer"), ("remote", "Remote server (OpenAI API)"))
DEFAULT_REMOTE_URL = "http://localhost:8000/v1"
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
        self._hardware: Any = None  # the machine as last detected
        self._build()
        self._set_state(loaded=False, loading=False)
        self._connect_bridge()

    def _connect_bridge(self) -> None:
        """The bridge signals only this pane uses (the shared ones are wired in ``MainWindow``)."""
        self._bridge.signals.remote_models_listed.connect(self._on_remote_models_listed)
        self._bridge.signals.recommendation_ready.connect(self._on_recommendation_ready)
        self._bridge.signals.native_build_changed.connect(self._on_native_build_changed)

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
        layout.setSpacing(6)
        layout.addWidget(self._build_model_group())
        self._server_box = ServerBox(self._bridge)
        self.loaded_models_box = self._loaded_box = LoadedModelsBox(self._bridge)
        self._load_settings_form = LoadSettingsForm()
        self._load_settings_form.sizing_changed.connect(self._recommend_timer.start)
        self._load_settings_form.overflow_changed.connect(self._bridge.set_overflow_policy)
        self._load_settings_form.reload_requested.connect(self._on_reload_requested)
        self._load_settings_form.pending_changed.connect(self._on_settings_pending_changed)
        self._generation_form = GenerationForm()
        self._generation_form.sampling_params_changed.connect(self.sampling_params_changed)
        self._hardware_box = HardwareBox()
        # Read less often, these fold to a line, so the pane fits a 768-pixel-high screen without scrolling.
        self.engine_section = FoldingSection(self._load_settings_form, "engineSection", is_folded=True)
        self.hardware_section = FoldingSection(self._hardware_box, "hardwareSection", is_folded=True)
        self.loaded_section = FoldingSection(self._loaded_box, "loadedModelsSection", is_folded=True)
        layout.addWidget(self._generation_form)
        layout.addWidget(self.loaded_section)
        layout.addWidget(self._server_box)
        layout.addWidget(self.engine_section)
        layout.addWidget(self.hardware_section)
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
        narrow_combo(self._source_combo)
        self._source_combo.currentIndexChanged.connect(self._on_source_changed)
        source_form = QFormLayout()
        source_form.addRow("Run on", self._source_combo)
        self._path_edit = QLineEdit()
        self._path_edit.setObjectName("modelPathEdit")
        self._path_edit.setPlaceholderText(DEFAULT_MODEL_TEXT)
        self._path_edit.setClearButtonEnabled(True)
        self._path_edit.setToolTip(PATH_TOOLTIP)
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

        discover_button = QPushButton("Find models on Hugging Face…")
        discover_button.setObjectName("discoverButton")
        discover_button.setToolTip("Search Hugging Face and download a model (Discover)")
        discover_button.clicked.connect(self._on_discover_clicked)

        self._choices = DevicePrecisionForm()
        self._path_edit.textChanged.connect(lambda _text: self._recommend_timer.start())
        self._choices.device_changed.connect(self._recommend_timer.start)
        self._auto_load_check = QCheckBox("Load at start")  # beside the buttons: the pane fits a laptop screen
        self._auto_load_check.setObjectName("autoLoadCheck")
        self._auto_load_check.setToolTip("Load this model when Hearth starts")

        self._load_button = QPushButton("Load model")
        self._load_button.setObjectName("loadModelButton")
        self._load_button.clicked.connect(self._on_load_clicked)
        self._unload_button = QPushButton("Unload")
        self._unload_button.setObjectName("unloadModelButton")
        self._unload_button.setToolTip("Free the model's memory")
        self._unload_button.clicked.connect(self._on_unload_clicked)
        buttons = QHBoxLayout()
        buttons.addWidget(self._auto_load_check)
        buttons.addWidget(self._load_button, 1)
        buttons.addWidget(self._unload_button)

        self.load_status = LoadStatus()
        self._progress, self._error_label = self.load_status.progress, self.load_status.error_label
        self._info_label = QLabel("No model loaded.")
        self._info_label.setObjectName("modelInfoLabel")
        self._info_label.setWordWrap(True)
        self._info_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self._local_box = QWidget()
        local_layout = QVBoxLayout(self._local_box)
        local_layout.setContentsMargins(0, 0, 0, 0)
        local_layout.addLayout(path_row)
        local_layout.addWidget(discover_button, 0, Qt.AlignmentFlag.AlignLeft)
        local_layout.addWidget(self._choices)

        layout = QVBoxLayout(group)
        layout.addLayout(source_form)
        layout.addWidget(self._local_box)
        layout.addWidget(self._build_remote_box())
        layout.addLayout(buttons)
        layout.addWidget(self.load_status)
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
        return self._choices.quantization()

    def request_recommendation(self) -> None:
        """Ask the bridge (in the background) which quantization the chosen model should load at."""
        self._recommend_timer.stop()
        if self.is_remote():
            return
        self._choices.show_estimating()
        self._bridge.recommend_quantization(self.model_spec(), self._choices.device(), self.load_settings())
        self.model_spec_changed.emit(self.model_spec())

    @property
    def load_settings_form(self) -> LoadSettingsForm:
        return self._load_settings_form

    @property
    def server_box(self) -> ServerBox:
        return self._server_box

    def auto_load(self) -> bool:
        """Whether "Load at start" (this model when Hearth starts) is ticked."""
        return self._auto_load_check.isChecked()

    def set_auto_load(self, value: bool) -> None:
        self._auto_load_check.setChecked(value)

    def sampling_params(self) -> dict[str, Any]:
        """``SamplingParams`` keyword arguments from the Generation box."""
        return self._generation_form.sampling_params()

    def set_sampling_params(self, params: dict[str, Any]) -> None:
        """Show generation defaults (``sampling_params()`` keys) in the Generation box."""
        self._generation_form.set_sampling_params(params)

    def load(self, spec: str | None = None) -> None:
        """Load the chosen model (or ``spec``) with the chosen device, precision and settings.

        The weights' dtype follows the precision (``engine.api.LEVEL_DTYPES``; "auto" leaves both to the engine).
        """
        self._error_label.hide()
        self._progress.setValue(0)
        self.load_status.show_build(None)  # a build still under way is told again once this load is done
        self.load_status.set_stage("Starting…")
        self._info_label.setText("Loading…")
        self._set_state(loaded=False, loading=True)
        if self.is_remote():
            self.load_status.set_stage("Connecting…")
            self._bridge.connect_remote(self._remote_url_edit.text(), self._remote_key_edit.text(),
                                        self._remote_model_combo.currentText().strip())
            return
        level = self.quantization()
        self._bridge.load_model(spec or self.model_spec(), self._choices.device(), LEVEL_DTYPES.get(level, "auto"),
                                self.load_settings())

    # -- widget events ----------------------------------------------------------------------------

    @Slot()
    def _on_load_clicked(self) -> None:
        self.load()

    @Slot()
    def _on_unload_clicked(self) -> None:
        self._bridge.unload_model()
        self._set_state(loaded=False, loading=False)
        self.load_status.set_stage("Unloading…")

    @Slot()
    def _on_reload_requested(self) -> None:
        """Load the model in use again, with the settings shown."""
        info = self._bridge.model_info
        if info is not None and info.device != REMOTE_DEVICE and not self._bridge.is_loading:
            self.load(info.spec)

    @Slot(bool)
    def _on_settings_pending_changed(self, pending: bool) -> None:
        self.engine_section.set_title(PENDING_TITLE if pending else TITLE)

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

    @Slot()
    def _on_discover_clicked(self) -> None:
        show_discover(self.window())

    @Slot(int)
    def _on_source_changed(self, _index: int) -> None:
        remote = self.is_remote()
        self._local_box.setVisible(not remote)
        self._remote_box.setVisible(remote)
        self._auto_load_check.setVisible(not remote)
        if not remote and self._choices.advice is None:
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
        if advice.spec != self.model_spec() or advice.device != self._choices.device():
            return  # an answer for a model or device no longer chosen
        self._choices.show_advice(advice)

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
        self.load_status.set_stage(load_stage_text(stage, fraction))

    @Slot(object)
    def _on_model_loaded(self, info: ModelInfo) -> None:
        self._set_state(loaded=True, loading=False)
        self._progress.setValue(1000)
        self._error_label.hide()
        self._load_settings_form.set_loaded(info.settings)
        if info.device == REMOTE_DEVICE:
            self.load_status.set_stage(f"Connected in {info.load_s:.1f} s")
            self._remote_model_combo.setCurrentText(info.model_name)
            self._info_label.setText(f"<b>{html.escape(info.model_name)}</b> on "
                                     f"<b>{html.escape(info.spec)}</b>")
            return
        self.load_status.set_stage("")  # the card says how long the load took
        self._server_box.start_if_on()
        self._generation_form.apply_model_defaults(info.model_name, info.sampling_defaults)
        self._info_label.setText(model_card(info))

    @Slot(str)
    def _on_model_load_failed(self, message: str) -> None:
        kept = self._bridge.model_info
        self._set_state(loaded=kept is not None, loading=False)
        self._progress.setValue(1000 if kept is not None else 0)
        self.load_status.set_stage("")
        self._info_label.setText(model_card(kept) if kept is not None else "No model loaded.")
        verb = "connect to the server" if self.is_remote() else "load the model"
        still = f" {kept.model_name} stays in use." if kept is not None else ""
        self._error_label.setText(f"Could not {verb}. {message}{still}")
        self._error_label.show()
        log.ui.info("showing load error: %s", message)

    @Slot()
    def _on_model_unloaded(self) -> None:
        self._load_settings_form.set_loaded(None)
        self._progress.setValue(0)
        self.load_status.set_stage("Model unloaded")
        self._info_label.setText("No model loaded.")

    @Slot(object)
    def _on_native_build_changed(self, build: NativeBuild) -> None:
        info = self._bridge.model_info
        self.load_status.show_build(build, info.precision if info is not None else "")

    @Slot(object)
    def _on_hardware_detected(self, info: Any) -> None:
        self._hardware = info
        self._choices.set_hardware(info)
        self._hardware_box.show_hardware(info)

    # -- helpers ----------------------------------------------------------------------------------

    def _set_state(self, *, loaded: bool, loading: bool) -> None:
        self._load_button.setEnabled(not loading)
        if self.is_remote():
            self._load_button.setText("Connecting…" if loading else ("Reconnect" if loaded else "Connect"))
        else:
            self._load_button.setText("Loading…" if loading else ("Load another" if loaded else "Load model"))
        self._unload_button.setEnabled(loaded or loading)
        self._progress.setVisible(loading)  # a full bar says nothing the card does not

    def _browse_start(self) -> str:
        current = Path(self._path_edit.text().strip()).expanduser()
        if self._path_edit.text().strip() and current.exists():
            return str(current if current.is_dir() else current.parent)
        return str(Path.home())

