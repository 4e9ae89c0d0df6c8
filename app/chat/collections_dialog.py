"""The folder collections dialog: make a named collection from folders, see its files and indexing state and the
embedder its search uses (and why that one), add a folder, re-index, remove, and tick the collections the current
chat answers from.

Not modal: the chat stays usable while a collection is read, and the dialog's count and bar follow the reading.
The work is the :class:`~app.chat.documents_controller.DocumentsController`'s (its ``collections`` watcher and the
chat's choice); this module only shows it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Slot
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.docs.collections import CollectionInfo, embedder_label

if TYPE_CHECKING:
    from app.chat.documents_controller import DocumentsController

NAME, FOLDERS, FILES, STATE = range(4)


def state_text(info: CollectionInfo, progress: tuple[str, int, int, str] | None) -> str:
    """A collection's indexing state in words."""
    if progress is not None and progress[0] == info.name:
        _, done, total, _path = progress
        return f"Reading {min(done + 1, total)} of {total}" if total and done < total else "Scanning…"
    state = f"{info.queued} waiting" if info.queued else "Up to date"
    return state + (f"; {info.skipped} could not be read" if info.skipped else "")


def search_line(info: CollectionInfo, reason: str) -> str:
    """The embedder a collection is searched with and why (``reason``, from its indexing), in one line; the
    embedder alone when the reason is not known yet, "" before the collection is indexed."""
    what = reason or embedder_label(info.embedder)
    return f"Search in “{info.name}”: {what}." if what else ""


class CollectionsDialog(QDialog):
    """Lists every collection; ticks say which the chat ``conversation_id`` uses (none to tick without a chat)."""

    def __init__(self, documents: DocumentsController, conversation_id: int | None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("collectionsDialog")
        self.setWindowTitle("Folder collections")
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self._documents = documents
        self._conversation_id = conversation_id
        self._infos: list[CollectionInfo] = []
        intro = QLabel("A collection is a set of folders Hearth keeps indexed while it runs: new files are read, "
                       "changed ones read again, deleted ones dropped. Tick the collections this chat answers from.")
        intro.setWordWrap(True)
        self._tree = QTreeWidget()
        self._tree.setObjectName("collectionsList")
        self._tree.setHeaderLabels(["Collection", "Folders", "Files", "State"])
        self._tree.setRootIsDecorated(False)
        self._tree.itemChanged.connect(self._on_item_changed)
        self._tree.itemSelectionChanged.connect(self._update_buttons)
        self._search = QLabel()
        self._search.setObjectName("collectionsSearch")
        self._search.setWordWrap(True)
        self._search.setStyleSheet("color: #8a8a8a;")
        self._status = QLabel()
        self._status.setObjectName("collectionsStatus")
        self._bar = QProgressBar()
        self._bar.setObjectName("collectionsProgress")
        self._bar.setMaximumHeight(12)
        self._bar.setTextVisible(False)
        self._error = QLabel()
        self._error.setObjectName("collectionsError")
        self._error.setWordWrap(True)
        self._error.setStyleSheet("color: #c62828;")
        self._error.hide()
        self._new_button = self._button("New collection…", "newCollectionButton", self._on_new_clicked)
        self._add_button = self._button("Add folder…", "addFolderButton", self._on_add_clicked)
        self._reindex_button = self._button("Re-index", "reindexButton", self._on_reindex_clicked)
        self._remove_button = self._button("Remove", "removeCollectionButton", self._on_remove_clicked)
        buttons = QHBoxLayout()
        for button in (self._new_button, self._add_button, self._reindex_button, self._remove_button):
            buttons.addWidget(button)
        buttons.addStretch(1)
        progress = QHBoxLayout()
        progress.addWidget(self._status, 1)
        progress.addWidget(self._bar, 1)
        close = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        close.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(self._tree, 1)
        layout.addWidget(self._search)
        layout.addLayout(buttons)
        layout.addLayout(progress)
        layout.addWidget(self._error)
        layout.addWidget(close)
        self.resize(640, 360)
        documents.collections.collections_changed.connect(self.refresh)
        documents.collections.progress_changed.connect(self._on_progress_changed)
        self.refresh()

    def _button(self, text: str, name: str, slot: Callable[[], None]) -> QPushButton:
        button = QPushButton(text)
        button.setObjectName(name)
        button.clicked.connect(slot)
        return button

    # -- public API -------------------------------------------------------------------------------

    @Slot()
    def refresh(self) -> None:
        """List the collections again, with their counts, states and embedders."""
        selected = self.selected_name
        self._infos = self._documents.collections.collections()
        used = set(self._documents.chat_collections(self._conversation_id)) if self._conversation_id else set()
        progress = self._documents.collections.progress()
        self._tree.blockSignals(True)
        self._tree.clear()
        searches = []
        for info in self._infos:
            item = QTreeWidgetItem([info.name, "; ".join(info.roots), str(info.files), state_text(info, progress)])
            item.setData(NAME, Qt.ItemDataRole.UserRole, info.name)
            item.setToolTip(FOLDERS, "\n".join(info.roots))
            search = search_line(info, self._documents.collections.embedder_reason(info.name))
            for column in (NAME, FILES, STATE):
                item.setToolTip(column, search)
            searches.append(search)
            if self._conversation_id is not None:
                item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
                item.setCheckState(NAME, Qt.CheckState.Checked if info.name in used else Qt.CheckState.Unchecked)
            self._tree.addTopLevelItem(item)
            item.setSelected(info.name == selected)
        self._tree.blockSignals(False)
        self._search.setText("\n".join(s for s in searches if s))
        self._search.setVisible(bool(self._search.text()))
        self._on_progress_changed()
        self._update_buttons()

    def _items(self) -> list[QTreeWidgetItem]:
        items = (self._tree.topLevelItem(i) for i in range(self._tree.topLevelItemCount()))
        return [item for item in items if item is not None]

    @property
    def selected_name(self) -> str | None:
        items = self._tree.selectedItems()
        return str(items[0].data(NAME, Qt.ItemDataRole.UserRole)) if items else None

    def select(self, name: str) -> None:
        for item in self._items():
            item.setSelected(item.data(NAME, Qt.ItemDataRole.UserRole) == name)

    def row(self, name: str) -> list[str]:
        """The texts of collection ``name``'s row (empty when it is not listed)."""
        for item in self._items():
            if item.data(NAME, Qt.ItemDataRole.UserRole) == name:
                return [item.text(c) for c in range(self._tree.columnCount())]
        return []

    def set_used(self, name: str, used: bool) -> None:
        """Tick (or untick) collection ``name`` for the chat."""
        for item in self._items():
            if item.data(NAME, Qt.ItemDataRole.UserRole) == name:
                item.setCheckState(NAME, Qt.CheckState.Checked if used else Qt.CheckState.Unchecked)

    def create_collection(self, name: str, folders: list[str], use: bool = True) -> str | None:
        """Make a collection (ticked for the chat when ``use``); the reason shown when it cannot be made."""
        try:
            name = self._documents.collections.create(name, folders)
        except ValueError as exc:
            self._show_error(str(exc))
            return None
        self._show_error("")
        if use and self._conversation_id is not None:
            chosen = self._documents.chat_collections(self._conversation_id)
            self._documents.set_chat_collections(self._conversation_id, [*chosen, name])
        self.refresh()
        return name

    @property
    def status_text(self) -> str:
        return self._status.text() if self._status.isVisible() else ""

    @property
    def search_text(self) -> str:
        """The embedder each collection is searched with, and why: one line per collection."""
        return self._search.text() if self._search.isVisible() else ""

    @property
    def error_text(self) -> str:
        return self._error.text()

    # -- widget events ----------------------------------------------------------------------------

    @Slot(QTreeWidgetItem, int)
    def _on_item_changed(self, item: QTreeWidgetItem, column: int) -> None:
        if column != NAME or self._conversation_id is None:
            return
        used = [str(i.data(NAME, Qt.ItemDataRole.UserRole))
                for i in self._items() if i.checkState(NAME) == Qt.CheckState.Checked]
        known = {info.name for info in self._infos}
        kept = [n for n in self._documents.chat_collections(self._conversation_id) if n in used or n not in known]
        self._documents.set_chat_collections(self._conversation_id, [*kept, *used])

    @Slot()
    def _on_progress_changed(self) -> None:
        progress = self._documents.collections.progress()
        self._status.setVisible(progress is not None)
        self._bar.setVisible(progress is not None)
        if progress is not None:
            name, done, total, _path = progress
            self._status.setText(f"{name}: read {done} of {total} files" if total else f"{name}: scanning…")
            self._bar.setRange(0, max(total, 1))
            self._bar.setValue(done)
            for item in self._items():
                info = next((x for x in self._infos if x.name == item.text(NAME)), None)
                if info is not None:
                    item.setText(STATE, state_text(info, progress))

    @Slot()
    def _update_buttons(self) -> None:
        has_selection = self.selected_name is not None
        for button in (self._add_button, self._reindex_button, self._remove_button):
            button.setEnabled(has_selection)

    @Slot()
    def _on_new_clicked(self) -> None:
        name, ok = QInputDialog.getText(self, "New collection", "Name of the collection:")
        if not ok or not name.strip():
            return
        folder = QFileDialog.getExistingDirectory(self, f"A folder for “{name.strip()}”")
        if folder:
            self.create_collection(name, [folder])

    @Slot()
    def _on_add_clicked(self) -> None:
        name = self.selected_name
        folder = QFileDialog.getExistingDirectory(self, f"Add a folder to “{name}”") if name else ""
        if name and folder:
            try:
                self._documents.collections.add_folders(name, [folder])
            except ValueError as exc:
                self._show_error(str(exc))

    @Slot()
    def _on_reindex_clicked(self) -> None:
        if (name := self.selected_name) is not None:
            self._documents.collections.reindex(name)

    @Slot()
    def _on_remove_clicked(self) -> None:
        name = self.selected_name
        if name is None:
            return
        answer = QMessageBox.question(self, "Remove collection",
                                      f"Remove the collection “{name}”? Its index goes; the files stay where "
                                      "they are, and no chat answers from them any more.")
        if answer == QMessageBox.StandardButton.Yes:
            self._documents.remove_collection(name)

    def _show_error(self, text: str) -> None:
        self._error.setText(text)
        self._error.setVisible(bool(text))
