"""Discover: find a model on Hugging Face, see which of its files fit this machine, and download one.

A search (GGUF repositories by default; a keyword, ``owner/name`` or a pasted hub link) lists repositories with
their downloads, likes and last update. Choosing one lists its files: each GGUF (a split one as one entry) or
safetensors folder, with its format, quantization, size and fit label ("fits", "fits with a shorter context",
"too large for this machine", judged by :mod:`engine.hub.fit` against the memory available now); the
recommended one is chosen at first and says why. Searches and lists run on threads of their own
(:class:`app.bridge.hub_jobs.HubClient`), downloads in :class:`app.model.download_box.DownloadBox`. Without a
network the view says so in words, and the rest of Hearth works as before.

Downloads go into the Hugging Face cache (:func:`app.bridge.hub_jobs.download_folder`), where the Models list
looks, or into a folder the user chooses (remembered in the settings, in ``<folder>/<owner>/<name>/``), which the
Models list then reads too; ``downloaded`` tells the window to look again. Several downloads may run at once.
:func:`show_discover` opens the one view a window has.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from PySide6.QtCore import QCoreApplication, Qt, Signal, Slot
from PySide6.QtWidgets import (
    QCheckBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QSplitter,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app import log
from app.bridge.hub_jobs import (
    FITS,
    SHORTER,
    DownloadResult,
    FileEntry,
    HubClient,
    RepoFiles,
    RepoHit,
    download_folder,
)
from app.formatting import format_bytes
from app.model.download_box import DownloadBox

RESULT_COLUMNS = ("Model", "Downloads", "Likes", "Updated")
FILE_COLUMNS = ("File", "Format", "Quantization", "Size", "Fit")
FIT_WORDS = {FITS: "Fits", SHORTER: "Fits with a shorter context"}
RECOMMENDED_MARK = " (recommended)"
_DATA = Qt.ItemDataRole.UserRole
_ERROR_STYLE = "QLabel { color: #b71c1c; }"


def _count(value: int | None) -> str:
    return "" if value is None else f"{value:,}"


class DiscoverView(QWidget):
    """Search, a repository's files, and the download box, in a window of its own.

    Signals:
        downloaded(list): a download finished; the local paths of its files (as str).
        download_folder_changed(str): the user chose where downloads go ("" for the Hugging Face cache).

    Args:
        settings: where the download folder is remembered (``download_folder``); None: not remembered.
    """

    downloaded = Signal(object)
    download_folder_changed = Signal(str)

    def __init__(self, client: HubClient | None = None, parent: QWidget | None = None,
                 settings: Any = None) -> None:
        super().__init__(parent, Qt.WindowType.Window)
        self.setObjectName("discoverView")
        self.setWindowTitle("Discover models")
        self.client = client or HubClient(parent=self)
        self._settings = settings
        folder = str(getattr(settings, "download_folder", "") or "")
        self.client.dest_dir = Path(folder) if folder else None
        self._search_serial = 0  # the search whose answer is awaited
        self._files_serial = 0
        self._repo_files: RepoFiles | None = None
        self._build()
        self._connect_client()

    def _build(self) -> None:
        self.search_edit = QLineEdit()
        self.search_edit.setObjectName("discoverSearchEdit")
        self.search_edit.setPlaceholderText("Search Hugging Face: a name (SmolLM2), owner/name, or a link")
        self.search_edit.setClearButtonEnabled(True)
        self.search_edit.returnPressed.connect(self.search)
        self.gguf_check = QCheckBox("GGUF only")
        self.gguf_check.setObjectName("discoverGgufCheck")
        self.gguf_check.setToolTip("Only repositories with GGUF files (the format LM Studio, Ollama and llama.cpp "
                                   "use); a repository named outright is shown whatever it holds")
        self.gguf_check.setChecked(True)
        self.search_button = QPushButton("Search")
        self.search_button.setObjectName("discoverSearchButton")
        self.search_button.clicked.connect(self.search)
        row = QHBoxLayout()
        row.addWidget(self.search_edit, 1)
        row.addWidget(self.gguf_check)
        row.addWidget(self.search_button)
        self.status = QLabel("Search for a model to download. Files go to "
                             f"{self.target_folder()}, where the Models list finds them.")
        self.status.setObjectName("discoverStatusLabel")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.results = self._tree("discoverResultsTree", RESULT_COLUMNS)
        self.results.currentItemChanged.connect(self._on_result_changed)
        self.files = self._tree("discoverFilesTree", FILE_COLUMNS)
        self.files.currentItemChanged.connect(self._on_file_changed)
        self.detail = QLabel("")
        self.detail.setObjectName("discoverFileDetail")
        self.detail.setWordWrap(True)
        self.detail.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.download_box = DownloadBox(self.client)
        self.download_box.finished.connect(self._on_download_finished)
        self.folder_label = QLabel("")
        self.folder_label.setObjectName("discoverFolderLabel")
        self.folder_label.setWordWrap(True)
        self.folder_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.folder_button = QPushButton("Change…")
        self.folder_button.setObjectName("discoverFolderButton")
        self.folder_button.setToolTip("Download into a folder of your own (the Models list reads it too)")
        self.folder_button.clicked.connect(self._on_folder_clicked)
        self.cache_button = QPushButton("Use the Hugging Face cache")
        self.cache_button.setObjectName("discoverCacheButton")
        self.cache_button.setToolTip("Download into the Hugging Face cache, where other tools find the files too")
        self.cache_button.clicked.connect(lambda: self.set_download_folder(""))
        folder_row = QHBoxLayout()
        folder_row.addWidget(self.folder_label, 1)
        folder_row.addWidget(self.folder_button)
        folder_row.addWidget(self.cache_button)
        self._show_folder()
        lower = QWidget()
        lower_layout = QVBoxLayout(lower)
        lower_layout.setContentsMargins(0, 0, 0, 0)
        lower_layout.addWidget(self.files, 1)
        lower_layout.addWidget(self.detail)
        lower_layout.addLayout(folder_row)
        lower_layout.addWidget(self.download_box)
        splitter = QSplitter(Qt.Orientation.Vertical)
        splitter.addWidget(self.results)
        splitter.addWidget(lower)
        layout = QVBoxLayout(self)
        layout.addLayout(row)
        layout.addWidget(self.status)
        layout.addWidget(splitter, 1)
        self.resize(760, 620)

    @staticmethod
    def _tree(name: str, columns: tuple[str, ...]) -> QTreeWidget:
        tree = QTreeWidget()
        tree.setObjectName(name)
        tree.setColumnCount(len(columns))
        tree.setHeaderLabels(list(columns))
        tree.setRootIsDecorated(False)
        tree.setUniformRowHeights(True)
        tree.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        header = tree.header()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        header.setStretchLastSection(False)
        return tree

    # -- public API -------------------------------------------------------------------------------

    @Slot()
    def search(self) -> None:
        """Search for what the box holds, off the GUI thread; the results replace the list."""
        query = self.search_edit.text().strip()
        if not query:
            self._say("Type a model name, owner/name, or paste a Hugging Face link.")
            return
        self._search_serial = self.client.search(query, "gguf" if self.gguf_check.isChecked() else None)
        self._files_serial = 0
        self.results.clear()
        self.files.clear()
        self._repo_files = None
        self.download_box.set_choice(None, None)
        self._say(f"Searching Hugging Face for “{query}”…")

    def target_folder(self) -> Path:
        """Where the next download goes: the user's folder, else the Hugging Face cache."""
        return self.client.dest_dir if self.client.dest_dir is not None else download_folder()

    def set_download_folder(self, folder: str) -> None:
        """Download into ``folder`` from now on ("" for the Hugging Face cache), remembered in the settings;
        downloads running already finish where they started."""
        folder = folder.strip()
        self.client.dest_dir = Path(folder) if folder else None
        if self._settings is not None:
            self._settings.download_folder = folder
            self._settings.sync()
        self._show_folder()
        self.download_box.set_choice(*self._choice())  # a part kept there, or not
        self.download_folder_changed.emit(folder)

    def selected_entry(self) -> FileEntry | None:
        item = self.files.currentItem()
        entry = item.data(0, _DATA) if item is not None else None
        return entry if isinstance(entry, FileEntry) else None

    @Slot()
    def shutdown(self) -> None:
        """Cancel a running download (its part is kept) and wait for its thread."""
        self.download_box.shutdown()

    # -- hub answers ------------------------------------------------------------------------------

    def _connect_client(self) -> None:
        self.client.searched.connect(self._on_searched)
        self.client.files_listed.connect(self._on_files_listed)
        self.client.failed.connect(self._on_failed)

    @Slot(int, object)
    def _on_searched(self, serial: int, hits: list[RepoHit]) -> None:
        if serial != self._search_serial:
            return
        for hit in hits:
            item = QTreeWidgetItem([hit.repo_id, _count(hit.downloads), _count(hit.likes),
                                    (hit.last_modified or "")[:10]])
            item.setData(0, _DATA, hit)
            item.setToolTip(0, hit.repo_id + ("\nGated: accept its terms on Hugging Face first" if hit.gated else ""))
            for column in (1, 2):
                item.setTextAlignment(column, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            self.results.addTopLevelItem(item)
        if not hits:
            kind = "GGUF models" if self.gguf_check.isChecked() else "models"
            self._say(f"No {kind} found for “{self.search_edit.text().strip()}”.")
            return
        self._say(f"{len(hits)} repositor{'ies' if len(hits) != 1 else 'y'} found. Choose one to see its files.")
        first = self.results.topLevelItem(0)
        if first is not None:
            self.results.setCurrentItem(first)

    @Slot(int, object)
    def _on_files_listed(self, serial: int, repo: RepoFiles) -> None:
        if serial != self._files_serial:
            return
        self._repo_files = repo
        self.files.clear()
        recommended: QTreeWidgetItem | None = None
        for entry in repo.entries:
            fit = entry.fit
            label = FIT_WORDS.get(fit.label, "Too large for this machine") if fit is not None else "?"
            if fit is not None and fit.label == SHORTER:
                label = f"Fits with {fit.context} tokens of context"
            name = entry.name + (RECOMMENDED_MARK if entry.recommended else "")
            item = QTreeWidgetItem([name, entry.format.upper() if entry.format == "gguf" else entry.format,
                                    entry.quant, format_bytes(entry.size_bytes), label])
            item.setData(0, _DATA, entry)
            item.setToolTip(0, "\n".join(entry.files))
            item.setToolTip(4, fit.reason if fit is not None else "")
            if entry.recommended:
                recommended = item
                font = item.font(0)
                font.setBold(True)
                item.setFont(0, font)
            self.files.addTopLevelItem(item)
        if not repo.entries:
            self._say(f"{repo.repo_id} has no GGUF files or safetensors folders Hearth can use.")
            return
        gib = repo.available_bytes / 2**30
        self._say(f"{repo.repo_id}: {len(repo.entries)} file choice{'s' if len(repo.entries) != 1 else ''}, "
                  f"judged at {repo.context} tokens of context with {gib:.1f} GiB of memory available now.")
        chosen = recommended or self.files.topLevelItem(0)
        if chosen is not None:
            self.files.setCurrentItem(chosen)

    @Slot(int, str)
    def _on_failed(self, serial: int, message: str) -> None:
        if serial not in (self._search_serial, self._files_serial):
            return
        self._say(message, error=True)

    # -- widget events ----------------------------------------------------------------------------

    @Slot(QTreeWidgetItem, QTreeWidgetItem)
    def _on_result_changed(self, current: QTreeWidgetItem | None, _previous: QTreeWidgetItem | None) -> None:
        hit = current.data(0, _DATA) if current is not None else None
        self.files.clear()
        self.detail.setText("")
        self.download_box.set_choice(None, None)
        if not isinstance(hit, RepoHit):
            return
        self._files_serial = self.client.list_files(hit.repo_id)
        self._say(f"Listing the files of {hit.repo_id}…")

    @Slot(QTreeWidgetItem, QTreeWidgetItem)
    def _on_file_changed(self, current: QTreeWidgetItem | None, _previous: QTreeWidgetItem | None) -> None:
        entry = current.data(0, _DATA) if current is not None else None
        repo = self._repo_files
        if not isinstance(entry, FileEntry) or repo is None:
            self.detail.setText("")
            self.download_box.set_choice(None, None)
            return
        lines = [f"<b>{html.escape(entry.name)}</b> · {html.escape(entry.quant)} · {format_bytes(entry.size_bytes)}"]
        if entry.fit is not None:
            lines.append(html.escape(entry.fit.reason))
        if entry.recommended:
            lines.append(f"Recommended: {html.escape(entry.why)}.")
        self.detail.setText("<br>".join(lines))
        self.download_box.set_choice(repo.repo_id, entry)

    @Slot(object)
    def _on_download_finished(self, result: DownloadResult) -> None:
        if result.paths:
            log.ui.info("downloaded %s from %s", result.entry_name, result.repo_id)
            self.downloaded.emit([str(p) for p in result.paths])

    @Slot()
    def _on_folder_clicked(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Download models into", str(self.target_folder()))
        if folder:
            self.set_download_folder(folder)

    def _show_folder(self) -> None:
        own = self.client.dest_dir is not None
        where = "your folder" if own else "the Hugging Face cache"
        self.folder_label.setText(f"Downloads go to {where}: {html.escape(str(self.target_folder()))}")
        self.folder_label.setToolTip(str(self.target_folder()))
        self.cache_button.setEnabled(own)

    def _choice(self) -> tuple[str | None, FileEntry | None]:
        entry = self.selected_entry()
        repo = self._repo_files
        return (repo.repo_id, entry) if repo is not None and entry is not None else (None, None)

    def _say(self, text: str, error: bool = False) -> None:
        self.status.setStyleSheet(_ERROR_STYLE if error else "")
        self.status.setText(text)


def show_discover(window: QWidget) -> DiscoverView:
    """Open ``window``'s Discover view (made the first time), raised and with the search box focused.

    The download folder is remembered in the window's ``settings``. Finished downloads refresh the window's Models
    list (its ``models_view``), when it has one; a download folder of the user's is added to that list's folders
    when chosen, and again after a download when the user has removed it meanwhile. Quitting Hearth stops running
    downloads (their parts are kept for Resume).
    """
    view = window.findChild(DiscoverView, "discoverView")
    if view is None:
        view = DiscoverView(parent=window, settings=getattr(window, "settings", None))
        app = QCoreApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(view.shutdown)
        models_view: Any = getattr(window, "models_view", None)
        if models_view is not None:
            def on_finished(result: DownloadResult) -> None:
                if not result.paths:
                    return
                if result.folder is not None and str(result.folder) not in models_view.folders:
                    models_view.add_folder(str(result.folder))  # adds it and looks again
                else:
                    models_view.refresh()

            view.download_box.finished.connect(on_finished)
            view.download_folder_changed.connect(lambda f: models_view.add_folder(f) if f else None)
    view.show()
    view.raise_()
    view.activateWindow()
    view.search_edit.setFocus()
    return view

