"""Attached files indexed on a thread of their own, so that the chat stays usable while they are read.

A Python thread, as for conversation imports (:mod:`app.window.importer`): a Python callable handed to
``QThreadPool.start`` once crashed this app. Progress and the result come back as signals, received on the GUI
thread. Each file is committed on its own, so a job cut short (the app closing, ``kill -9``) leaves whole files
and the rest queued; the next job on the collection finishes them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, Signal

from app import log
from app.docs.index import DocumentIndex, IndexOutcome


class _Cancelled(Exception):
    pass


@dataclass(frozen=True)
class AttachResult:
    """How a job ended: what was read, what could not be and why, or ``error`` when indexing failed as a whole."""

    conversation_id: int
    paths: list[str]
    outcome: IndexOutcome = field(default_factory=IndexOutcome)
    error: str = ""


class AttachJob(QObject):
    """Indexes ``paths`` into a conversation's collection on a thread of its own.

    Signals:
        progress(int, int, int, str): conversation id, files done, files to do, the file being read.
        finished(AttachResult): the job ended (emitted once).
    """

    progress = Signal(int, int, int, str)
    finished = Signal(object)

    def __init__(self, index: DocumentIndex, conversation_id: int, paths: list[str]) -> None:
        super().__init__()  # no parent: the thread keeps it alive until it has emitted its last signal
        self.index = index
        self.conversation_id = conversation_id
        self.paths = list(paths)
        self.done = threading.Event()
        self._is_cancelled = False
        self._thread = threading.Thread(target=self._run, name="hearth-attach", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        """Stop after the file being read (it is committed whole or not at all)."""
        self._is_cancelled = True

    def wait(self, timeout_s: float | None = None) -> bool:
        return self.done.wait(timeout_s)

    def _on_progress(self, done: int, total: int, path: str) -> None:
        if self._is_cancelled:
            raise _Cancelled
        self.progress.emit(self.conversation_id, done, total, path)

    def _run(self) -> None:
        try:
            outcome = self.index.index(self.conversation_id, self.paths, self._on_progress)
            result = AttachResult(self.conversation_id, self.paths, outcome)
        except _Cancelled:
            result = AttachResult(self.conversation_id, self.paths, error="stopped")
        except Exception as exc:  # noqa: BLE001 (any failure ends as a result the chat shows, never a crash)
            log.ui.warning("indexing %s failed: %s: %s", self.paths, type(exc).__name__, exc)
            result = AttachResult(self.conversation_id, self.paths, error=f"{type(exc).__name__}: {exc}")
        self.done.set()
        self.finished.emit(result)
