"""``FolderWatch``: says, once the folders it watches have been still a moment, that one of them changed.

A ``QFileSystemWatcher`` reports each entry made, renamed or deleted in a watched folder (and each change to a
watched file); a copy of many files makes many reports, so they restart a short single-shot timer and
``changed`` is emitted once, :data:`SETTLE_MS` after the last. The Models list re-runs its scan on it.
"""

from __future__ import annotations

import os

from PySide6.QtCore import QFileSystemWatcher, QObject, QTimer, Signal, Slot

#: The pause after the last change before ``changed`` is emitted.
SETTLE_MS = 700


class FolderWatch(QObject):
    """Watches folders (and files) and reports their changes, debounced.

    Signals:
        changed(): something in a watched folder was made, renamed or deleted, and nothing since for
            :data:`SETTLE_MS`.
    """

    changed = Signal()

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._watcher = QFileSystemWatcher(self)
        self._watcher.directoryChanged.connect(self._on_path_changed)
        self._watcher.fileChanged.connect(self._on_path_changed)
        self._settle_timer = QTimer(self)
        self._settle_timer.setObjectName("folderWatchSettleTimer")
        self._settle_timer.setSingleShot(True)
        self._settle_timer.setInterval(SETTLE_MS)
        self._settle_timer.timeout.connect(self.changed)

    @property
    def paths(self) -> list[str]:
        """What is watched now (a path that vanished is dropped by the watcher itself)."""
        return self._watcher.directories() + self._watcher.files()

    def set_paths(self, paths: list[str]) -> None:
        """Watch ``paths`` (folders or files) and nothing else; one that does not exist is left out.

        A folder added to a watch already running was made (or reached) since the last look, and may have filled
        before its watch began (a model copied into a new folder): that counts as a change, so ``changed`` follows.
        """
        wanted = {os.path.normpath(p) for p in paths}
        watched = {os.path.normpath(p): p for p in self.paths}
        gone = [p for key, p in watched.items() if key not in wanted]
        new = [p for p in dict.fromkeys(map(os.path.normpath, paths)) if p not in watched and os.path.exists(p)]
        if gone:
            self._watcher.removePaths(gone)
        if new:
            self._watcher.addPaths(new)
            if watched:
                self._settle_timer.start()

    @Slot(str)
    def _on_path_changed(self, _path: str) -> None:
        self._settle_timer.start()
