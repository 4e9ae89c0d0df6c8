"""Hearth's main window: three rearrangeable panes around the engine bridge."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import platformdirs
from PySide6.QtCore import QByteArray, Qt, Slot
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import QDockWidget, QLabel, QMainWindow, QMessageBox, QWidget

from app import log
from app.chat_pane import ChatPane
from app.engine_bridge import EngineBridge, ModelInfo
from app.icon import app_icon
from app.model_pane import ModelPane
from app.monitor_pane import MonitorPane

DATA_DIR_ENV = "HEARTH_DATA_DIR"


def default_data_dir() -> Path:
    """Hearth's data folder; mirrors ``engine.paths.data_dir()`` without importing the engine."""
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_data_dir("Hearth", appauthor=False))


class MainWindow(QMainWindow):
    """The window: chat, model and monitor panes as dock widgets the user can move, tab or hide.

    The docks are named ``chatPane``, ``modelPane`` and ``monitorPane``. Every connection from the
    bridge's signals to the panes is made in :meth:`_connect_engine`. Closing the window shuts the
    bridge down (stops the engine loop and frees the model).
    """

    def __init__(self, data_dir: Path | None = None, bridge: EngineBridge | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.data_dir = data_dir if data_dir is not None else default_data_dir()
        self.bridge = bridge if bridge is not None else EngineBridge()
        self.bridge.setParent(self)
        self.setWindowTitle("Hearth")
        self.setWindowIcon(app_icon())
        self.setObjectName("mainWindow")
        self.setDockNestingEnabled(True)
        self.setDockOptions(QMainWindow.DockOption.AnimatedDocks | QMainWindow.DockOption.AllowNestedDocks
                            | QMainWindow.DockOption.AllowTabbedDocks)
        self.resize(1280, 820)

        self.chat_pane = ChatPane(self.bridge)
        self.model_pane = ModelPane(self.bridge)
        self.monitor_pane = MonitorPane()
        self.chat_dock = self._make_dock("Chat", "chatPane", self.chat_pane)
        self.model_dock = self._make_dock("Model", "modelPane", self.model_pane)
        self.monitor_dock = self._make_dock("Monitor", "monitorPane", self.monitor_pane)
        self._place_docks()
        self._default_state = QByteArray(self.saveState())

        self._model_status = QLabel("No model loaded")
        self._model_status.setObjectName("modelStatusLabel")
        self._activity_status = QLabel("")
        self._activity_status.setObjectName("activityStatusLabel")
        for label in (self._model_status, self._activity_status):
            label.setContentsMargins(8, 0, 8, 0)
        self.statusBar().addPermanentWidget(self._activity_status)
        self.statusBar().addPermanentWidget(self._model_status)
        self.statusBar().showMessage("Load a model to start.", 5000)
        self._build_menus()

        self.chat_pane.set_sampling_params(self.model_pane.sampling_params())
        self._connect_engine()
        self.bridge.detect_hardware()
        self.chat_pane.setFocus()

    # -- layout -----------------------------------------------------------------------------------

    def _make_dock(self, title: str, name: str, pane: QWidget) -> QDockWidget:
        dock = QDockWidget(title, self)
        dock.setObjectName(name)
        dock.setWidget(pane)
        dock.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetMovable
                         | QDockWidget.DockWidgetFeature.DockWidgetFloatable
                         | QDockWidget.DockWidgetFeature.DockWidgetClosable)
        return dock

    def _place_docks(self) -> None:
        """Chat on the left; model above monitor on the right."""
        self.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, self.chat_dock)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.model_dock)
        self.splitDockWidget(self.model_dock, self.monitor_dock, Qt.Orientation.Vertical)
        self.resizeDocks([self.chat_dock, self.model_dock], [820, 440], Qt.Orientation.Horizontal)
        self.resizeDocks([self.model_dock, self.monitor_dock], [430, 370], Qt.Orientation.Vertical)

    def _build_menus(self) -> None:
        file_menu = self.menuBar().addMenu("&File")
        new_chat = QAction("&New chat", self)
        new_chat.setShortcut(QKeySequence.StandardKey.New)
        new_chat.triggered.connect(self._on_new_chat_triggered)
        file_menu.addAction(new_chat)
        file_menu.addSeparator()
        quit_action = QAction("&Quit", self)
        quit_action.setShortcut(QKeySequence.StandardKey.Quit)
        quit_action.triggered.connect(self.close)
        file_menu.addAction(quit_action)

        view_menu = self.menuBar().addMenu("&View")
        for dock in (self.chat_dock, self.model_dock, self.monitor_dock):
            view_menu.addAction(dock.toggleViewAction())
        view_menu.addSeparator()
        reset = QAction("&Reset layout", self)
        reset.triggered.connect(self._on_reset_layout_triggered)
        view_menu.addAction(reset)

        help_menu = self.menuBar().addMenu("&Help")
        about = QAction("&About Hearth", self)
        about.triggered.connect(self._on_about_triggered)
        help_menu.addAction(about)

    # -- wiring -----------------------------------------------------------------------------------

    def _connect_engine(self) -> None:
        """Every connection from the engine bridge to the panes, in one place."""
        signals = self.bridge.signals
        signals.token_delta.connect(self.chat_pane._on_token_delta)
        signals.request_finished.connect(self.chat_pane._on_request_finished)
        signals.request_failed.connect(self.chat_pane._on_request_failed)
        signals.model_load_progress.connect(self.model_pane._on_model_load_progress)
        signals.model_load_progress.connect(self._on_model_load_progress)
        signals.model_loaded.connect(self.model_pane._on_model_loaded)
        signals.model_loaded.connect(self._on_model_loaded)
        signals.model_load_failed.connect(self.model_pane._on_model_load_failed)
        signals.model_load_failed.connect(self._on_model_load_failed)
        signals.model_unloaded.connect(self.model_pane._on_model_unloaded)
        signals.model_unloaded.connect(self.monitor_pane._on_model_unloaded)
        signals.model_unloaded.connect(self._on_model_unloaded)
        signals.metrics_updated.connect(self.monitor_pane._on_metrics_updated)
        signals.hardware_detected.connect(self.model_pane._on_hardware_detected)
        signals.hardware_detected.connect(self.monitor_pane._on_hardware_detected)
        signals.error.connect(self._on_engine_error)
        # Pane to pane.
        self.model_pane.sampling_params_changed.connect(self._on_sampling_params_changed)
        self.chat_pane.streaming_changed.connect(self._on_streaming_changed)

    # -- events -----------------------------------------------------------------------------------

    @Slot(float, str)
    def _on_model_load_progress(self, fraction: float, stage: str) -> None:
        if self.bridge.is_loading:
            self._model_status.setText(f"Loading… {fraction * 100:.0f} %")
            self.chat_pane.set_model_ready(True)

    @Slot(object)
    def _on_model_loaded(self, info: ModelInfo) -> None:
        self._model_status.setText(f"{info.model_name} · {info.device} · {info.dtype}")
        self.statusBar().showMessage(f"{info.model_name} is ready.", 4000)
        self.chat_pane.set_model_ready(True)

    @Slot(str)
    def _on_model_load_failed(self, message: str) -> None:
        self._model_status.setText("No model loaded")
        self.statusBar().showMessage("The model could not be loaded; see the Model pane.", 6000)
        self.chat_pane.set_model_ready(False)
        self.model_dock.show()
        self.model_dock.raise_()

    @Slot()
    def _on_model_unloaded(self) -> None:
        self._model_status.setText("No model loaded")
        self.chat_pane.set_model_ready(False)

    @Slot(str)
    def _on_engine_error(self, message: str) -> None:
        log.ui.error("engine error: %s", message)
        self.statusBar().showMessage(message, 10000)

    @Slot(object)
    def _on_sampling_params_changed(self, params: dict[str, Any]) -> None:
        self.chat_pane.set_sampling_params(params)

    @Slot(int)
    def _on_streaming_changed(self, count: int) -> None:
        self._activity_status.setText("" if count == 0 else
                                      f"{count} {'reply' if count == 1 else 'replies'} streaming")

    @Slot()
    def _on_new_chat_triggered(self) -> None:
        self.chat_dock.show()
        self.chat_pane.new_conversation()

    @Slot()
    def _on_reset_layout_triggered(self) -> None:
        for dock in (self.chat_dock, self.model_dock, self.monitor_dock):
            dock.setFloating(False)
            dock.show()
        self.restoreState(self._default_state)

    @Slot()
    def _on_about_triggered(self) -> None:
        QMessageBox.about(self, "About Hearth",
                          "<h3>Hearth</h3><p>Chat with language models on your own computer, "
                          "on Hearth's own inference engine.</p>")

    def closeEvent(self, event: QCloseEvent) -> None:
        self.bridge.shutdown()
        super().closeEvent(event)
