"""Imports a conversation file on a thread of its own, so that a large file never freezes the window.

Reading, parsing, checking and writing (:func:`app.data.export.import_file`) all run off the GUI thread; the
result comes back through :attr:`ConversationImport.finished`, on the GUI thread. Whatever the file holds, the
import ends in a result: the new conversation, or the exception that explains why not.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app import log
from app.data import export
from app.data.storage import Storage
from app.data.storage_errors import storage_error_text


def import_error_text(exc: BaseException) -> str:
    """Why a conversation file could not be imported, in sentences rather than parser output."""
    if isinstance(exc, export.ImportRefused):
        return str(exc)
    if (stored := storage_error_text(exc)) is not None:
        return f"The file was read, but not saved. {stored}"
    if isinstance(exc, json.JSONDecodeError):
        return (f"The file is not valid JSON: {exc.msg.lower()} on line {exc.lineno}, column {exc.colno}. "
                "It may be damaged or cut short, or not be a conversation exported by Hearth.")
    if isinstance(exc, UnicodeDecodeError):
        return "The file is not text (UTF-8), so it cannot be a conversation exported by Hearth."
    if isinstance(exc, OSError):
        return f"The file could not be read: {(exc.strerror or str(exc)).lower()}."
    if isinstance(exc, MemoryError):
        return "The file needs more memory to import than this computer has free."
    if isinstance(exc, RecursionError):
        return "The file nests lists or objects too deeply to be a conversation."
    if not isinstance(exc, ValueError):
        return f"The file could not be imported: {type(exc).__name__}: {str(exc)[:200]}."
    detail = str(exc)[:300].rstrip(".")
    return (f"The file is JSON, but not a conversation Hearth can read: {detail}. "
            "Hearth imports the JSON files it exports (File → Export as JSON).")


@dataclass(frozen=True, slots=True)
class ImportResult:
    """How an import ended: ``conversation_id`` and ``title`` when it worked, ``error`` when it did not."""

    path: Path
    conversation_id: int | None = None
    title: str = ""
    error: BaseException | None = None


class ConversationImport(QObject):
    """One file's import, run on a thread of its own.

    Signals:
        finished(ImportResult): the import ended (emitted once, received on the GUI thread).

    Args:
        storage: the database to add the conversation to (safe to use from any thread).
        path: the file to import.
    """

    finished = Signal(object)

    def __init__(self, storage: Storage, path: Path, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.storage = storage
        self.path = Path(path)
        self.done = threading.Event()

    def start(self) -> None:
        """Run the import on a thread of its own: a Python thread, which holds the GIL as any other (a Python
        callable handed to ``QThreadPool.start`` once ran the JSON parser beside the GUI thread and crashed)."""
        self._thread = threading.Thread(target=self._run, name="hearth-import", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Until the import has ended (it writes in one transaction: closing the database must wait for it)."""
        self.done.wait()

    def _run(self) -> None:
        try:
            conversation = export.import_file(self.storage, self.path)
            result = ImportResult(self.path, conversation.id, conversation.title)
        except Exception as exc:  # noqa: BLE001 (any file: every failure becomes the "Import failed" dialog)
            log.ui.info("import of %s failed: %s: %s", self.path, type(exc).__name__, str(exc)[:200])
            result = ImportResult(self.path, error=exc)
        self.done.set()
        self.finished.emit(result)
