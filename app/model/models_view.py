"""The Models view: every model already on this computer, described, with one click to load it.

The list comes from ``engine.loading.discovery.discover_models`` through the bridge
(:meth:`~app.bridge.engine_bridge.EngineBridge.discover_models`, run on its pool): the Hugging Face cache, LM
Studio, Ollama, GPT4All and Jan, and the folders the user adds here. Each row shows the name, where it was
found, architecture, parameters, the file's quantization, its size in GiB and whether it fits this machine; a
model Hearth cannot run is greyed out and says why. The model that is running is listed too (first, in bold,
"(running)" after its name), also when it was loaded from a path no scan reaches. Long names elide in the middle,
and their tooltip holds the whole name.

The list is looked up again on Refresh, when a folder is added, and by itself when a model appears in or leaves
a watched folder (:meth:`ModelsView.watch_folders`, :class:`~app.model.folder_watch.FolderWatch`).
"""

from __future__ import annotations

import html
import os
from typing import Any

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.model.folder_watch import FolderWatch

COLUMNS = ("Name", "Source", "Architecture", "Parameters", "Quantization", "Size", "Fits")
SOURCE_NAMES = {"huggingface": "Hugging Face", "lmstudio": "LM Studio", "ollama": "Ollama", "gpt4all": "GPT4All",
                "jan": "Jan", "user": "Added folder", "loaded": "Loaded by path"}
#: The most of the list's width the name column takes before names elide, and the least it keeps.
NAME_SHARE = 0.6
MIN_NAME_WIDTH = 120
#: Follows the running model's name in the list.
RUNNING_MARK = " (running)"
FIT_WORDS = {"yes": "Yes", "tight": "Only just", "no": "No"}
_PATH_ROLE = Qt.ItemDataRole.UserRole
_RUNNING_ROLE = Qt.ItemDataRole.UserRole + 1


def _same_model(model: dict[str, Any], spec: str) -> bool:
    """Whether the found ``model`` is the one loaded from ``spec`` (the same path, however it is spelled)."""
    path = str(model.get("path", ""))
    if path == spec:
        return True
    try:
        return os.path.realpath(path) == os.path.realpath(spec) and os.path.exists(spec)
    except (OSError, ValueError):
        return False


def parameters_text(count: int | None) -> str:
    """135M, 1.5B, ... ("" when unknown)."""
    if not count:
        return ""
    if count >= 1e9:
        return f"{count / 1e9:.1f}B"
    return f"{count / 1e6:.0f}M"


class ModelsView(QWidget):
    """The list of models on disk.

    Signals:
        load_requested(str): the user asked to load the model at this path.
        refresh_requested(list): the list should be looked up again, with these added folders.
        folders_changed(list): the user added or removed a folder (the list of them, to keep).
    """

    load_requested = Signal(str)
    refresh_requested = Signal(object)
    folders_changed = Signal(object)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("modelsView")
        self._folders: list[str] = []
        self._models: list[dict[str, Any]] = []
        self._running: tuple[str, str] | None = None  # (spec, name) of the model that is running
        self._folder_watch = FolderWatch(self)
        self._folder_watch.changed.connect(self.refresh)
        self._status = QLabel("Looking for models…")
        self._status.setObjectName("modelsStatusLabel")
        self._status.setWordWrap(True)
        self._unreadable = QLabel("")
        self._unreadable.setObjectName("modelsUnreadableLabel")
        self._unreadable.setWordWrap(True)
        self._unreadable.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._unreadable.hide()
        self._tree = QTreeWidget()
        self._tree.setObjectName("modelsTree")
        self._tree.setColumnCount(len(COLUMNS))
        self._tree.setHeaderLabels(list(COLUMNS))
        self._tree.setRootIsDecorated(False)
        self._tree.setAlternatingRowColors(True)
        self._tree.setUniformRowHeights(True)
        header = self._tree.header()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        # the name is as wide as the longest one, up to NAME_SHARE of the list (_fit_name_column); the columns after
        # it keep their contents' width and scroll into view: in the side pane they would leave it ~100 px
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Interactive)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.Interactive)  # architectures elide; may be widened
        header.resizeSection(2, 90)
        header.setStretchLastSection(False)
        self._tree.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self._tree.itemDoubleClicked.connect(self._on_item_double_clicked)
        self._tree.currentItemChanged.connect(self._on_current_changed)
        self._detail = QLabel("")
        self._detail.setObjectName("modelDetailLabel")
        self._detail.setWordWrap(True)
        self._detail.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._load_button = QPushButton("Load")
        self._load_button.setObjectName("loadFoundModelButton")
        self._load_button.setEnabled(False)
        self._load_button.clicked.connect(self._on_load_clicked)
        add_button = QPushButton("Add folder…")
        add_button.setObjectName("addModelFolderButton")
        add_button.setToolTip("Look for models in a folder of your own too")
        add_button.clicked.connect(self._on_add_folder_clicked)
        refresh_button = QPushButton("Refresh")
        refresh_button.setObjectName("refreshModelsButton")
        refresh_button.clicked.connect(self.refresh)
        buttons = QHBoxLayout()
        buttons.addWidget(self._load_button, 1)
        buttons.addWidget(add_button)
        buttons.addWidget(refresh_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addWidget(self._status)
        layout.addWidget(self._unreadable)
        layout.addWidget(self._tree, 1)
        layout.addWidget(self._detail)
        layout.addLayout(buttons)

    # -- public API -------------------------------------------------------------------------------

    @property
    def folders(self) -> list[str]:
        """The folders the user added."""
        return list(self._folders)

    def set_folders(self, folders: list[str]) -> None:
        self._folders = list(dict.fromkeys(folders))

    def refresh(self) -> None:
        """Ask for the list again (``refresh_requested``)."""
        self._status.setText("Looking for models…")
        self.refresh_requested.emit(self.folders)

    def watch_folders(self, folders: list[str]) -> None:
        """Look the list up again (as Refresh does) whenever something is made, renamed or deleted in ``folders``
        (the ones the last scan looked in: ``model_folders_scanned``), and only in them."""
        self._folder_watch.set_paths(folders)

    @property
    def watched_folders(self) -> list[str]:
        return self._folder_watch.paths

    def show_unreadable(self, folders: list[str]) -> None:
        """Say which folders could not be read ("folder: why" each); the models elsewhere are listed still."""
        self._unreadable.setVisible(bool(folders))
        shown = [str(folder)[:300] for folder in folders[:10]]
        more = f"\n… and {len(folders) - 10} more" if len(folders) > 10 else ""
        self._unreadable.setText("Some folders could not be read, so their models are not listed:\n"
                                 + "\n".join(shown) + more if folders else "")

    @property
    def unreadable_text(self) -> str:
        """The note about folders that could not be read ("" when none)."""
        return self._unreadable.text()

    def set_running(self, spec: str | None, name: str = "") -> None:
        """Mark the model loaded from ``spec`` as running (None: none runs), adding it to the list if no scan
        found it."""
        self._running = (spec, name or spec) if spec else None
        self._fill()

    @property
    def running_item(self) -> QTreeWidgetItem | None:
        """The row of the running model, or None."""
        for i in range(self._tree.topLevelItemCount()):
            item = self._tree.topLevelItem(i)
            if item is not None and item.data(0, _RUNNING_ROLE):
                return item
        return None

    def show_models(self, models: list[dict[str, Any]]) -> None:
        """Fill the list with ``FoundModel.to_json()`` dicts; embedding models (``kind`` "embedding") are left out:
        they cannot chat (the documents' index uses them)."""
        self._models = [m for m in models if m.get("kind", "chat") != "embedding"]
        embedding = len(models) - len(self._models)
        self._fill()
        runnable = sum(1 for m in self._models if m.get("runnable"))
        if not self._models:
            self._status.setText("No models found in the Hugging Face cache, LM Studio, Ollama, GPT4All or Jan. "
                                 "Add a folder that holds some, or give a path in the Model tab.")
        else:
            found = f"{len(self._models)} model{'s' if len(self._models) != 1 else ''} found"
            hidden = f" ({embedding} embedding model{'s' if embedding != 1 else ''} not listed)" if embedding else ""
            self._status.setText(
                f"{found}, {runnable} of them Hearth can run{hidden}. Double-click one to load it."
            )

    # -- helpers ----------------------------------------------------------------------------------

    def _fill(self) -> None:
        """Show the found models, the running one first (added when no scan found it)."""
        current = self._selected()
        models = list(self._models)
        running = [m for m in models if self._running and _same_model(m, self._running[0])][:1]
        if self._running and not running:
            spec, name = self._running
            running = [{"name": name, "path": spec, "source": "loaded", "runnable": True, "fits": "yes"}]
        else:
            models = [m for m in models if m is not running[0]] if running else models
        self._tree.clear()
        for model in running + models:
            item = self._item(model)
            if running and model is running[0]:
                item.setData(0, _RUNNING_ROLE, True)
                item.setText(0, item.text(0) + RUNNING_MARK)
                for column in range(len(COLUMNS)):
                    font = item.font(column)
                    font.setBold(True)
                    item.setFont(column, font)
            self._tree.addTopLevelItem(item)
            if current is not None and model.get("path") == current.get("path") \
                    and model.get("name") == current.get("name"):
                self._tree.setCurrentItem(item)
        self._fit_name_column()
        self._on_current_changed(self._tree.currentItem(), None)

    def _fit_name_column(self) -> None:
        """The name column as wide as its longest name, but at most NAME_SHARE of the list's width (names past it
        elide in the middle and show whole in their tooltip)."""
        widest = max(self._tree.sizeHintForColumn(0), self._tree.header().sectionSizeHint(0))
        room = int(self._tree.viewport().width() * NAME_SHARE)
        self._tree.header().resizeSection(0, max(MIN_NAME_WIDTH, min(widest + 8, room)))

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._fit_name_column()

    def _item(self, model: dict[str, Any]) -> QTreeWidgetItem:
        fits = FIT_WORDS.get(str(model.get("fits")), "")
        values = (str(model.get("name", "")), self._source(model), str(model.get("architecture", "")),
                  parameters_text(model.get("num_parameters")),
                  str(model.get("quantization", "")), f"{int(model.get('size_bytes') or 0) / 2**30:.2f} GiB",
                  fits if model.get("runnable") else "Can't run")
        item = QTreeWidgetItem(list(values))
        item.setData(0, _PATH_ROLE, model)
        where = f"{model.get('name', '')}\n{self._source(model)}: {model.get('path', '')}"  # the whole name
        item.setToolTip(0, where)
        item.setToolTip(1, where)
        if not model.get("runnable"):
            for column in range(len(COLUMNS)):
                item.setForeground(column, self.palette().placeholderText())
                item.setToolTip(column, str(model.get("reason", "")))
            item.setToolTip(0, f"{where}\n{model.get('reason', '')}")
        elif model.get("fit_reason"):
            item.setToolTip(len(COLUMNS) - 1, str(model["fit_reason"]))
        return item

    @staticmethod
    def _source(model: dict[str, Any]) -> str:
        return SOURCE_NAMES.get(str(model.get("source")), str(model.get("source")))

    def _selected(self) -> dict[str, Any] | None:
        item = self._tree.currentItem()
        return item.data(0, _PATH_ROLE) if item is not None else None

    @Slot(QTreeWidgetItem, QTreeWidgetItem)
    def _on_current_changed(self, current: QTreeWidgetItem | None, _previous: QTreeWidgetItem | None) -> None:
        model = current.data(0, _PATH_ROLE) if current is not None else None
        self._load_button.setEnabled(bool(model and model.get("runnable")))
        if not model:
            self._detail.setText("")
            return
        why = model.get("fit_reason") if model.get("runnable") else f"Hearth can't run it: {model.get('reason')}"
        self._detail.setText(f"<b>{html.escape(str(model.get('name')))}</b> · {self._source(model)} · "
                             f"{html.escape(str(model.get('path')))}<br>{html.escape(str(why or ''), quote=False)}")

    @Slot(QTreeWidgetItem, int)
    def _on_item_double_clicked(self, item: QTreeWidgetItem, _column: int) -> None:
        model = item.data(0, _PATH_ROLE)
        if model and model.get("runnable"):
            self.load_requested.emit(str(model["path"]))

    @Slot()
    def _on_load_clicked(self) -> None:
        model = self._selected()
        if model and model.get("runnable"):
            self.load_requested.emit(str(model["path"]))

    @Slot()
    def _on_add_folder_clicked(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a folder with models")
        if folder:
            self.add_folder(folder)

    def add_folder(self, folder: str) -> None:
        """Look for models in ``folder`` too, from now on (``folders_changed``), and refresh the list."""
        if folder not in self._folders:
            self._folders.append(folder)
            self.folders_changed.emit(self.folders)
        self.refresh()
