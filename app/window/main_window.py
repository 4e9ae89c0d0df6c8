"""Hearth's main window: the chat in the middle, the model, models and monitor panes beside it.

The window is where every pane meets: the wiring between them and the settings that carry over between launches
(layout, last model, serving, context) live here, so no pane knows another. The menus and their shortcuts are in
:mod:`app.window.menus`.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import platformdirs
from PySide6.QtCore import QByteArray, Qt, QTimer, Signal, Slot
from PySide6.QtGui import QCloseEvent, QGuiApplication, QShowEvent
from PySide6.QtWidgets import QDockWidget, QFileDialog, QLabel, QMainWindow, QMessageBox, QWidget

from app import log
from app.bridge.engine_bridge import EngineBridge
from app.bridge.types import REMOTE_DEVICE, ModelInfo
from app.chat.chat_pane import ChatPane
from app.chat.reply_controller import ReplyController
from app.data import export
from app.data.conversations import ConversationStore
from app.data.settings import Settings
from app.data.storage import Storage
from app.data.storage_errors import storage_error_text
from app.fitting import ReadableWidth
from app.icon import app_icon
from app.model.model_pane import ModelPane
from app.model.models_view import ModelsView
from app.monitor.monitor_pane import MonitorPane
from app.tools.chat_tools import ChatTools
from app.window.importer import ConversationImport, ImportResult, import_error_text
from app.window.menus import WindowMenus
from app.window.theme import apply_theme

DATA_DIR_ENV = "HEARTH_DATA_DIR"
#: ``saveState`` version of the pane layout; a layout saved under another version is not restored.
LAYOUT_VERSION = 3
#: The window's size on first start, shrunk to fit a smaller screen.
DEFAULT_SIZE = (1280, 820)
#: Width of the side panel (model and monitor tabs) in the default layout.
SIDE_PANEL_WIDTH = 430
#: The conversation database, in the data dir.
DATABASE_FILE = "hearth.db"
#: The same "Could not save" dialog is shown again only after this many seconds (the status bar says it each time).
STORAGE_WARNING_REPEAT_S = 60.0


def default_data_dir() -> Path:
    """Hearth's data folder; mirrors ``engine.system.paths.data_dir()`` without importing the engine."""
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_data_dir("Hearth", appauthor=False))



class MainWindow(QMainWindow):
    """The window: the chat as the central widget, the model and monitor panes as tabbed docks beside it.

    The chat cannot be closed, so no layout leaves the window blank; the docks (``modelPane`` and
    ``monitorPane``) can be moved, floated or closed, and View → Reset layout brings them back as tabs
    on the right. Every connection from the
    bridge's signals to the panes (and to the chat's :class:`ReplyController`) is made in
    :meth:`_connect_engine`; the panes talk to each other only through the window. Conversations live in
    ``hearth.db`` and preferences in ``settings.ini``, both in the data dir; window geometry and the
    pane layout are restored from the settings. Closing the window saves them, shuts the bridge
    down (stops the engine loop and frees the model) and closes the database.

    Signals:
        import_finished(object): an import started by :meth:`import_conversation` ended: the new
            conversation's id, or None when it failed (the "Import failed" dialog said why).
    """

    import_finished = Signal(object)

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
        self._resize_to_screen()

        self._is_closed = False
        self._import: ConversationImport | None = None
        self._storage_warning = ("", 0.0)  # the last "Could not save" dialog: its text and when
        self.settings = Settings(self.data_dir)
        apply_theme(self.settings.theme)  # before the panes draw anything in the palette
        self.storage = self._open_storage()
        self.store = ConversationStore(self.storage)
        try:
            self.store.purge_deleted()  # the trash only lives as long as the "Undo" offer
        except (sqlite3.Error, OSError) as exc:  # another Hearth is writing: the trash waits for the next start
            log.ui.warning("could not empty the trash: %s", exc)
        self.replies = ReplyController(self.bridge, self.store, self)
        self.chat_pane = ChatPane(self.store, self.replies)
        self.chat_pane.default_preset_id = self.settings.default_preset_id
        self.tools = ChatTools(self.data_dir, self.bridge, self.storage, self)  # MCP tools in the chats
        self.tools.attach(self.chat_pane, self.replies)
        self.readable_width = ReadableWidth(self.chat_pane.view)  # lines a wide screen does not stretch
        self.model_pane = ModelPane(self.bridge)
        self.monitor_pane = MonitorPane()
        self.models_view = ModelsView()
        self.setCentralWidget(self.chat_pane)
        self.model_dock = self._make_dock("Model", "modelPane", self.model_pane)
        self.models_dock = self._make_dock("Models", "modelsPane", self.models_view)
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
        self.menus = WindowMenus(self)

        self._restore_settings()
        self.chat_pane.set_sampling_params(self.model_pane.sampling_params())
        self._connect_engine()
        self.bridge.detect_hardware()
        self.models_view.refresh()
        if self.settings.auto_load and self.settings.last_model:
            self.model_pane.load()
        self.chat_pane.setFocus()

    def _open_storage(self) -> Storage:
        """Open the conversation database; if it cannot be opened, keep chats in memory and say so."""
        try:
            return Storage(self.data_dir / DATABASE_FILE)
        except (ValueError, sqlite3.Error, OSError) as exc:
            log.ui.error("cannot open %s: %s", self.data_dir / DATABASE_FILE, exc)
            why = storage_error_text(exc) or f"Your conversations could not be opened: {exc}."
            QMessageBox.warning(self, "Hearth", f"{why}\n\nThis session's chats are kept in memory only, "
                                "and your saved conversations are untouched.")
            return Storage(Path(":memory:"))

    def _restore_settings(self) -> None:
        """Apply the stored font, defaults, window geometry and pane layout (the theme is applied first)."""
        self.chat_pane.set_font_size(self.settings.font_size)
        last = self.settings.last_model  # the one chosen in Settings, else the model loaded last
        self.model_pane.set_model_spec(self.settings.default_model or ("" if last == "default" else last))
        self.model_pane.set_sampling_params(self.settings.generation)
        self.model_pane.set_auto_load(self.settings.auto_load)
        self.model_pane.server_box.restore(self.settings.server_enabled, self.settings.server_port)
        self.model_pane.loaded_models_box.restore(self.settings.models_kept, self.settings.idle_unload_s)
        form = self.model_pane.load_settings_form
        form.set_overflow(self.settings.overflow)
        form.set_repeatable(self.settings.repeatable)
        form.set_context_length(self.settings.context_length(self.model_pane.model_spec()))
        self.models_view.set_folders(self.settings.model_folders)
        geometry, state = self.settings.geometry, self.settings.window_state
        if geometry is not None:
            self.restoreGeometry(geometry)
        self._is_layout_restored = state is not None and self.restoreState(state, LAYOUT_VERSION)

    def save_settings(self) -> None:
        """Store the window geometry, pane layout and generation defaults."""
        self.settings.geometry = self.saveGeometry()
        self.settings.window_state = self.saveState(LAYOUT_VERSION)
        self.settings.generation = self.model_pane.sampling_params()
        self.settings.auto_load = self.model_pane.auto_load()
        self.settings.server_enabled = self.model_pane.server_box.is_on()
        self.settings.server_port = self.model_pane.server_box.port()
        self.settings.models_kept = self.model_pane.loaded_models_box.models_kept()
        self.settings.idle_unload_s = self.model_pane.loaded_models_box.idle_unload_s()
        self.settings.overflow = self.model_pane.load_settings_form.overflow()
        self.settings.repeatable = self.model_pane.load_settings_form.is_repeatable()
        self.settings.model_folders = self.models_view.folders
        self.settings.sync()

    def apply_settings(self) -> None:
        """Apply the theme, font size and default preset from :attr:`settings`."""
        apply_theme(self.settings.theme)
        self.chat_pane.set_font_size(self.settings.font_size)
        self.chat_pane.default_preset_id = self.settings.default_preset_id

    # -- layout -----------------------------------------------------------------------------------

    def _make_dock(self, title: str, name: str, pane: QWidget) -> QDockWidget:
        dock = QDockWidget(title, self)
        dock.setObjectName(name)
        dock.setWidget(pane)
        dock.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetMovable
                         | QDockWidget.DockWidgetFeature.DockWidgetFloatable
                         | QDockWidget.DockWidgetFeature.DockWidgetClosable)
        return dock

    def _resize_to_screen(self) -> None:
        """Start at :data:`DEFAULT_SIZE`, or smaller where the screen is (a 1366×768 laptop)."""
        width, height = DEFAULT_SIZE
        screen = QGuiApplication.primaryScreen()
        if screen is not None:
            available = screen.availableGeometry()
            width, height = min(width, available.width()), min(height, available.height() - 40)
        self.resize(width, height)

    def _place_docks(self) -> None:
        """Model, models list and monitor as tabs of one side panel on the right, the model tab in front."""
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.model_dock)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.models_dock)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.monitor_dock)
        self.tabifyDockWidget(self.model_dock, self.models_dock)
        self.tabifyDockWidget(self.models_dock, self.monitor_dock)
        self.model_dock.raise_()

    def reset_layout(self) -> None:
        """Put the model and monitor panes back as tabs on the right, shown, the model tab in front."""
        for dock in (self.model_dock, self.models_dock, self.monitor_dock):
            dock.setFloating(False)
            dock.show()
        self.restoreState(self._default_state)
        self.model_dock.raise_()
        self._size_side_panel()

    # -- wiring -----------------------------------------------------------------------------------

    def _connect_engine(self) -> None:
        """Every connection from the engine bridge to the panes, in one place."""
        signals = self.bridge.signals
        signals.token_delta.connect(self.replies._on_token_delta)
        signals.request_finished.connect(self.replies._on_request_finished)
        signals.request_failed.connect(self.replies._on_request_failed)
        signals.model_load_progress.connect(self.model_pane._on_model_load_progress)
        signals.model_load_progress.connect(self._on_model_load_progress)
        signals.model_loaded.connect(self.model_pane._on_model_loaded)
        signals.model_loaded.connect(self._on_model_loaded)
        signals.model_loaded.connect(self.replies.set_model_info)
        signals.model_loaded.connect(self.monitor_pane._on_model_loaded)
        signals.model_load_failed.connect(self.model_pane._on_model_load_failed)
        signals.model_load_failed.connect(self._on_model_load_failed)
        signals.model_unloaded.connect(self.model_pane._on_model_unloaded)
        signals.model_unloaded.connect(self.monitor_pane._on_model_unloaded)
        signals.model_unloaded.connect(self._on_model_unloaded)
        signals.metrics_updated.connect(self.monitor_pane._on_metrics_updated)
        signals.hardware_detected.connect(self.model_pane._on_hardware_detected)
        signals.hardware_detected.connect(self.monitor_pane._on_hardware_detected)
        signals.error.connect(self._on_engine_error)
        signals.models_discovered.connect(self.models_view.show_models)
        signals.model_folders_unreadable.connect(self.models_view.show_unreadable)
        signals.model_folders_scanned.connect(self.models_view.watch_folders)
        self.models_view.refresh_requested.connect(self.bridge.discover_models)
        self.models_view.load_requested.connect(self._on_found_model_load_requested)
        self.models_view.folders_changed.connect(self._on_model_folders_changed)
        self.model_pane.model_spec_changed.connect(self._on_model_spec_changed)
        # Pane to pane, and the chat's replies to the status bar.
        self.model_pane.sampling_params_changed.connect(self._on_sampling_params_changed)
        self.replies.streaming_changed.connect(self._on_streaming_changed)
        self.chat_pane.notice.connect(self._on_notice)
        self.chat_pane.storage_failed.connect(self._on_storage_failed)
        self.replies.storage_failed.connect(self._on_storage_failed)

    # -- events -----------------------------------------------------------------------------------

    @Slot(float, str)
    def _on_model_load_progress(self, fraction: float, stage: str) -> None:
        if self.bridge.is_loading:
            self._model_status.setText(f"Loading… {fraction * 100:.0f} %")
            self.chat_pane.set_model_ready(True)

    @Slot(str)
    def _on_found_model_load_requested(self, path: str) -> None:
        self.model_pane.set_model_spec(path)
        self.model_pane.load()
        self.model_dock.show()
        self.model_dock.raise_()

    @Slot(object)
    def _on_model_folders_changed(self, folders: list[str]) -> None:
        self.settings.model_folders = folders
        self.settings.sync()

    @Slot(str)
    def _on_model_spec_changed(self, spec: str) -> None:
        """Show the context length chosen for this model before."""
        stored = self.settings.context_length(spec)
        if stored:
            self.model_pane.load_settings_form.set_context_length(stored)

    @Slot(object)
    def _on_model_loaded(self, info: ModelInfo) -> None:
        if info.device != REMOTE_DEVICE:
            self.settings.last_model = info.spec
            self.settings.set_context_length(info.spec, self.model_pane.load_settings_form.context_length())
            self.settings.sync()
        self._model_status.setText(f"{info.model_name} · {info.device} · {info.precision}")
        self.models_view.set_running(info.spec if info.device != REMOTE_DEVICE else None, info.model_name)
        self.statusBar().showMessage(f"{info.model_name} is ready.", 4000)
        self.chat_pane.set_model_ready(True)

    @Slot(str)
    def _on_model_load_failed(self, message: str) -> None:
        kept = self.bridge.model_info
        self.statusBar().showMessage("The model could not be loaded; see the Model pane.", 6000)
        if kept is None:
            self._model_status.setText("No model loaded")
            self.chat_pane.set_model_ready(False)
        self.model_dock.show()
        self.model_dock.raise_()

    @Slot()
    def _on_model_unloaded(self) -> None:
        self._model_status.setText("No model loaded")
        self.models_view.set_running(None)
        self.chat_pane.set_model_ready(False)
        self.replies.set_model_info(None)

    @Slot(str)
    def _on_notice(self, message: str) -> None:
        self.statusBar().showMessage(message, 4000)

    @Slot(str)
    def _on_storage_failed(self, message: str) -> None:
        """The database refused a write: say so in the status bar, and in a dialog unless one just said it."""
        log.ui.warning("storage: %s", message)
        self.statusBar().showMessage(message, 15000)
        now = time.monotonic()
        if self._storage_warning[0] != message or now - self._storage_warning[1] > STORAGE_WARNING_REPEAT_S:
            self._storage_warning = (message, now)
            QMessageBox.warning(self, "Could not save", message)

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

    # -- export and import ------------------------------------------------------------------------

    def export_conversation(self, kind: str) -> Path | None:
        """Ask for a file and write the current conversation as "markdown" or "json" to it."""
        conversation = self.chat_pane.current_conversation
        if conversation is None:
            return None
        suffix, label = (".md", "Markdown (*.md)") if kind == "markdown" else (".json", "JSON (*.json)")
        stem = re.sub(r"[^\w\- ]+", "", conversation.title).strip() or "conversation"
        path_text, _ = QFileDialog.getSaveFileName(self, "Export conversation",
                                                   str(Path.home() / f"{stem}{suffix}"),
                                                   f"{label};;All files (*)")
        if not path_text:
            return None
        path = Path(path_text)
        if kind == "markdown":
            text = export.to_markdown(self.storage, conversation.id)
        else:
            text = json.dumps(export.to_json(self.storage, conversation.id), ensure_ascii=False, indent=2)
        try:
            path.write_text(text, encoding="utf-8")
        except OSError as exc:
            QMessageBox.warning(self, "Export failed", f"Could not write {path}:\n{exc}")
            return None
        self.statusBar().showMessage(f"Exported to {path}", 5000)
        return path

    @property
    def is_importing(self) -> bool:
        """Whether an import is running."""
        return self._import is not None

    def import_conversation(self, path: str | Path | None = None) -> bool:
        """Import a JSON file (``path``, else one the user picks) as a new conversation, in the background.

        The window stays usable meanwhile; :attr:`import_finished` says how it ended, and a failure shows the
        "Import failed" dialog with the reason.

        Returns:
            Whether an import started.
        """
        if self._import is not None:
            self.statusBar().showMessage("An import is already running; wait for it to finish.", 5000)
            return False
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Import conversation", str(Path.home()),
                                                  "JSON (*.json);;All files (*)")
            if not path:
                return False
        job = ConversationImport(self.storage, Path(path))
        job.finished.connect(self._on_import_finished)
        self._import = job
        self.statusBar().showMessage(f"Importing {job.path.name}…")
        job.start()  # off the GUI thread; one import at a time (self._import)
        return True

    @Slot(object)
    def _on_import_finished(self, result: ImportResult) -> None:
        self._import = None
        if self._is_closed:
            return
        self.statusBar().clearMessage()
        if result.error is not None or result.conversation_id is None:
            reason = import_error_text(result.error or ValueError("nothing was imported"))
            QMessageBox.warning(self, "Import failed", f"{result.path.name} could not be imported.\n\n{reason}")
            self.import_finished.emit(None)
            return
        self.chat_pane.refresh()
        self.chat_pane.select_conversation(result.conversation_id)
        self.statusBar().showMessage(f"Imported “{result.title}”.", 5000)
        self.import_finished.emit(result.conversation_id)

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if not self._is_layout_restored:  # dock sizes only take once the window is laid out
            self._is_layout_restored = True
            QTimer.singleShot(0, self, self._size_side_panel)

    @Slot()
    def _size_side_panel(self) -> None:
        self.resizeDocks([self.model_dock], [SIDE_PANEL_WIDTH], Qt.Orientation.Horizontal)

    def closeEvent(self, event: QCloseEvent) -> None:
        if not self._is_closed:
            self._is_closed = True
            self.save_settings()
            self.replies.shutdown()
            self.chat_pane.documents.shutdown()
            self.bridge.shutdown()
            self.tools.close()  # after the bridge ended the tools replies
            if self._import is not None:
                self._import.wait()  # an import writes in one transaction: let it land before closing
            self.storage.close()
        super().closeEvent(event)
