"""Document collections kept up to date while the app runs: their folders watched, re-indexed off the GUI thread.

Every change to a collection (made, folders added, re-indexed, removed) is a task for one worker, a Python thread
(as :mod:`app.docs.attach_job`: a Python callable handed to ``QThreadPool.start`` once crashed this app), so two
runs never write one collection at once and the chat stays usable meanwhile. A rescan (every collection brought up
to date: new files read, changed ones read again, deleted ones dropped) is queued when a watched folder changes
(``QFileSystemWatcher`` on each folder and subfolder, after a short pause so a copy of many files makes one scan)
and every :data:`RESCAN_MS` while the app is open, for changes the watcher misses (a file edited in place, a folder
beyond :data:`~app.docs.collections.MAX_WATCHED_FOLDERS`). An unchanged folder costs a scan of file sizes and
times, no file is read.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field

from PySide6.QtCore import QFileSystemWatcher, QObject, QTimer, Signal, Slot

from app import log
from app.docs.collections import (
    CollectionInfo,
    check_folders,
    check_new,
    index_folders,
    list_collections,
    remove_collection,
    watched_folders,
)
from app.docs.index import DocumentIndex, IndexOutcome

#: How often every collection is scanned while the app is open.
RESCAN_MS = 20_000
#: The pause after a watched folder changes before the scan starts.
SETTLE_MS = 1_000


class _Stopped(Exception):
    pass


@dataclass(frozen=True)
class Task:
    """One job for the worker: ``index`` (with ``folders`` to add, if any) or ``remove`` collection ``name``."""

    kind: str
    name: str
    folders: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TaskResult:
    """How a task ended; ``watch`` is the folders to watch afterwards (every collection's)."""

    task: Task
    outcome: IndexOutcome = field(default_factory=IndexOutcome)
    error: str = ""
    watch: list[str] = field(default_factory=list)


class _Signals(QObject):
    """The worker's signals. No parent: the thread holds it until its last signal is sent."""

    progress = Signal(str, int, int, str)
    finished = Signal(object)


class CollectionWatcher(QObject):
    """Makes, re-indexes, watches and removes document collections in ``index``.

    Signals:
        progress_changed(): a collection's indexing started, went on or ended (see :meth:`progress`).
        collections_changed(): a task ended: the collections or their counts may have changed.
        scan_finished(object): a task ended (its :class:`TaskResult`).
        notice(str): a short message for the status bar.
    """

    progress_changed = Signal()
    collections_changed = Signal()
    scan_finished = Signal(object)
    notice = Signal(str)

    def __init__(self, index: DocumentIndex, parent: QObject | None = None, rescan_ms: int = RESCAN_MS) -> None:
        super().__init__(parent)
        self.index = index
        self._tasks: queue.Queue[Task | None] = queue.Queue()
        self._pending = 0
        self._progress: tuple[str, int, int, str] | None = None
        self._is_stopped = False
        self._is_rescan_due = False
        self._embedders: dict[str, tuple[str, str]] = {}  # a collection's name: (its embedder, why that one)
        self._signals = _Signals()
        self._signals.progress.connect(self._on_progress)
        self._signals.finished.connect(self._on_finished)
        self._thread: threading.Thread | None = None
        self._fs = QFileSystemWatcher(self)
        self._fs.directoryChanged.connect(self._on_directory_changed)
        self._settle = QTimer(self)
        self._settle.setSingleShot(True)
        self._settle.setInterval(SETTLE_MS)
        self._settle.timeout.connect(self.rescan)
        self._timer = QTimer(self)
        self._timer.setInterval(rescan_ms)
        self._timer.timeout.connect(self.rescan)

    # -- public API -------------------------------------------------------------------------------

    def start(self) -> None:
        """Watch the collections' folders and scan them now and then; scan once now (files changed while the
        app was closed)."""
        if not self._is_stopped and not self._timer.isActive():
            self._timer.start()
            if self.collections():
                self.rescan()

    def collections(self) -> list[CollectionInfo]:
        try:
            return list_collections(self.index)
        except Exception as exc:  # noqa: BLE001 (a damaged index lists nothing; the chat goes on)
            log.ui.warning("could not list the document collections: %s", exc)
            return []

    def create(self, name: str, folders: list[str]) -> str:
        """Make collection ``name`` over ``folders`` and index it in the background; returns the name as kept.

        Raises:
            ValueError: a bad name or folder, in words.
        """
        name, folders = check_new(self.index, name, folders)
        self._put(Task("index", name, folders))
        return name

    def add_folders(self, name: str, folders: list[str]) -> None:
        """Add ``folders`` to collection ``name`` (read in the background). Raises ValueError for a bad folder."""
        self._put(Task("index", name, check_folders(folders)))

    def reindex(self, name: str) -> None:
        """Bring collection ``name`` up to date with its folders now."""
        self._put(Task("index", name))

    def remove(self, name: str) -> None:
        """Drop collection ``name`` from the index (after any task before it)."""
        self._put(Task("remove", name))

    @Slot()
    def rescan(self) -> None:
        """Bring every collection up to date with its folders (once the tasks under way end, if any)."""
        if self._pending:
            self._is_rescan_due = True
            return
        for info in self.collections():
            self._put(Task("index", info.name))

    @property
    def is_busy(self) -> bool:
        return self._pending > 0

    def progress(self) -> tuple[str, int, int, str] | None:
        """(collection, files done, files to do, the file being read) while one is indexed, else None."""
        return self._progress if self.is_busy else None

    def embedder_reason(self, name: str) -> str:
        """The embedder collection ``name`` is searched with and why, as its indexing said this session ("" before
        it was indexed). A later run that kept the embedder does not replace why it was chosen."""
        return self._embedders.get(name, ("", ""))[1]

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop watching, and stop the worker after the file being read (the rest stays queued in the index)."""
        self._is_stopped = True
        self._timer.stop()
        self._settle.stop()
        if self._thread is not None:
            self._tasks.put(None)
            self._thread.join(timeout_s)

    # -- the worker -------------------------------------------------------------------------------

    def _put(self, task: Task) -> None:
        if self._is_stopped:
            return
        if not self._pending:
            self._progress = (task.name, 0, 0, "")
        self._pending += 1
        self._tasks.put(task)
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, args=(self._tasks, self._signals, self.index),
                                            name="hearth-collections", daemon=True)
            self._thread.start()
        self.progress_changed.emit()

    def _work(self, tasks: queue.Queue[Task | None], signals: _Signals, index: DocumentIndex) -> None:
        while (task := tasks.get()) is not None:
            def progress(done: int, total: int, path: str, name: str = task.name) -> None:
                if self._is_stopped:
                    raise _Stopped
                signals.progress.emit(name, done, total, path)

            outcome, error = IndexOutcome(), ""
            try:
                if task.kind == "remove":
                    remove_collection(index, task.name)
                else:
                    outcome = index_folders(index, task.name, task.folders, progress)
            except _Stopped:
                return
            except Exception as exc:  # noqa: BLE001 (a failed scan is reported, and the next one tries again)
                log.ui.warning("collection %s: %s failed: %s: %s", task.name, task.kind, type(exc).__name__, exc)
                error = f"{type(exc).__name__}: {exc}"
            try:
                roots = [r for info in list_collections(index) for r in info.roots]
            except Exception:  # noqa: BLE001 (nothing new to watch; the periodic scan still runs)
                roots = []
            signals.finished.emit(TaskResult(task, outcome, error, watched_folders(roots)))

    @Slot(str, int, int, str)
    def _on_progress(self, name: str, done: int, total: int, path: str) -> None:
        self._progress = (name, done, total, path)
        self.progress_changed.emit()

    @Slot(object)
    def _on_finished(self, result: TaskResult) -> None:
        self._pending = max(0, self._pending - 1)
        name, outcome = result.task.name, result.outcome
        if result.task.kind == "remove":
            self._embedders.pop(name, None)
        elif outcome.embedder_reason and self._embedders.get(name, ("", ""))[0] != outcome.embedder:
            self._embedders[name] = (outcome.embedder, outcome.embedder_reason)
        if not self._is_stopped:
            self._watch(result.watch)
        if result.error:
            self.notice.emit(f"The collection “{result.task.name}” could not be indexed: {result.error}")
        elif result.outcome.indexed and result.task.folders:
            self.notice.emit(f"Collection “{result.task.name}”: read {len(result.outcome.indexed)} files.")
        self.progress_changed.emit()
        self.collections_changed.emit()
        self.scan_finished.emit(result)
        if not self._pending and self._is_rescan_due:
            self._is_rescan_due = False
            self.rescan()

    def _watch(self, folders: list[str]) -> None:
        current, wanted = set(self._fs.directories()), set(folders)
        if current - wanted:
            self._fs.removePaths(sorted(current - wanted))
        if wanted - current:
            self._fs.addPaths(sorted(wanted - current))

    @Slot(str)
    def _on_directory_changed(self, _path: str) -> None:
        self._settle.start()
