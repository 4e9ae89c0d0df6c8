"""The app's way to the Hugging Face hub (:mod:`engine.hub`): searches, file lists and downloads, each on a Python
thread of its own, their results delivered to the GUI thread as Qt signals.

A Python ``threading.Thread`` rather than a callable handed to ``QThreadPool.start``: such a callable once crashed
the app while the GUI thread ran (see :mod:`app.window.importer`). Every failure arrives as a sentence
(:class:`engine.hub.HubError`'s words: no network, a 404, a gated repository, a damaged file, a full disk). Files
go into the Hugging Face cache (``huggingface_hub``'s ``HF_HUB_CACHE``), the folder the Models list reads first, so
a finished download is found by the next scan; or, when the user sets a folder of their own, into
``<folder>/<owner>/<name>/`` (:func:`entry_folder`, the layout LM Studio uses), which the Models list then reads as
an added folder. Several downloads may run at once, each a :class:`DownloadJob` on its own thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub import constants
from PySide6.QtCore import QObject, Signal

from app import log
from engine.hub import (
    DownloadCancelled,
    FileEntry,
    HubError,
    Progress,
    RepoFiles,
    RepoHit,
    download_entry,
    list_files,
    search,
)
from engine.hub.download import partial_path
from engine.hub.fit import FITS, SHORTER, TOO_LARGE

__all__ = [
    "FITS", "SHORTER", "TOO_LARGE", "DownloadJob", "DownloadResult", "FileEntry", "HubClient", "Progress",
    "RepoFiles", "RepoHit", "download_folder", "entry_folder", "partial_bytes",
]

#: Keyword results asked of the hub per search.
SEARCH_LIMIT = 30


def download_folder() -> Path:
    """Where downloads go: the Hugging Face cache as ``huggingface_hub`` finds it (``HF_HUB_CACHE``, ``HF_HOME``,
    then ``~/.cache``), which is where the Models list looks for Hugging Face models."""
    return Path(constants.HF_HUB_CACHE)


def entry_folder(dest_dir: Path, repo_id: str) -> Path:
    """Where a repository's files go in a folder of the user's: ``<folder>/<owner>/<name>``, so that two
    repositories' files of the same name stay apart."""
    return Path(dest_dir, *repo_id.split("/"))


def partial_bytes(repo_id: str, entry: FileEntry, cache_dir: Path | None = None, dest_dir: Path | None = None) -> int:
    """The bytes of ``entry`` that an earlier, stopped download left in the cache, or in the user's folder
    ``dest_dir`` (0 when none): Download resumes from there."""
    dest = entry_folder(dest_dir, repo_id) if dest_dir is not None else None
    total = 0
    for name in entry.files:
        sha = entry.sha256.get(name)
        if sha:
            try:
                total += partial_path(repo_id, sha, name, dest, cache_dir).stat().st_size
            except OSError:
                continue
    return total


def _error_text(exc: BaseException) -> str:
    """A failure in words: the hub's own sentence, or what else broke."""
    if isinstance(exc, HubError):
        return str(exc)
    if isinstance(exc, OSError):
        return f"The download could not be written: {(exc.strerror or str(exc)).lower()}."
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def _emit(send: Callable[[], object]) -> None:
    """Emit from a worker thread (``send`` emits); a view closed meanwhile (its C++ object gone) gets nothing."""
    try:
        send()
    except RuntimeError:
        log.ui.debug("a hub result arrived after its receiver was deleted")


@dataclass(frozen=True, slots=True)
class DownloadResult:
    """How a download ended: its local paths, or the error in words; ``cancelled`` when the user stopped it;
    ``folder`` the user's folder it went to (None: the Hugging Face cache)."""

    repo_id: str
    entry_name: str
    paths: list[Path] = field(default_factory=list)
    error: str = ""
    cancelled: bool = False
    folder: Path | None = None


class DownloadJob(QObject):
    """One entry's download (every part of a split GGUF, a whole safetensors folder) on a thread of its own.

    Signals:
        progress(Progress): bytes, speed and ETA of the file being fetched, or its check ("verify").
        finished(DownloadResult): the download ended (emitted once).
    """

    progress = Signal(object)
    finished = Signal(object)

    def __init__(self, client: HubClient, repo_id: str, entry: FileEntry, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.repo_id, self.entry = repo_id, entry
        self._endpoint, self._cache_dir = client.endpoint, client.cache_dir
        self.folder = client.dest_dir
        self.dest = entry_folder(client.dest_dir, repo_id) if client.dest_dir is not None else None
        self._cancel = threading.Event()
        self.done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hearth-download", daemon=True)
        self._thread.start()

    def cancel(self) -> None:
        """Stop at the next chunk; the part downloaded is kept, so the next download of it resumes."""
        self._cancel.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Until the thread has ended (True) or ``timeout`` passed (False)."""
        return self.done.wait(timeout)

    def _run(self) -> None:
        try:
            paths = download_entry(self.repo_id, self.entry, dest=self.dest, cache_dir=self._cache_dir,
                                   endpoint=self._endpoint,
                                   on_progress=lambda p: _emit(lambda: self.progress.emit(p)), cancel=self._cancel)
            result = DownloadResult(self.repo_id, self.entry.name, paths, folder=self.folder)
        except DownloadCancelled as exc:
            result = DownloadResult(self.repo_id, self.entry.name, error=str(exc), cancelled=True, folder=self.folder)
        except Exception as exc:  # noqa: BLE001 (a worker thread must report, not die)
            log.ui.info("download of %s from %s failed: %s", self.entry.name, self.repo_id, exc)
            result = DownloadResult(self.repo_id, self.entry.name, error=_error_text(exc), folder=self.folder)
        self.done.set()
        _emit(lambda: self.finished.emit(result))


class HubClient(QObject):
    """Searches and file lists off the GUI thread; downloads as :class:`DownloadJob` objects.

    Each answer carries the number of the request it answers, so a view can drop answers it no longer waits for.

    Signals:
        searched(int, list[RepoHit]): a search's results.
        files_listed(int, RepoFiles): a repository's files, each with its fit on this machine (memory measured now).
        failed(int, str): a search or file list failed; why, in words.

    Args:
        endpoint: The hub's address; None means ``huggingface_hub``'s (``HF_ENDPOINT``, else huggingface.co).
        cache_dir: The HF cache downloads go to; None means :func:`download_folder`.
        dest_dir: A folder of the user's that downloads go to instead of the cache (set it any time: a download
            takes the folder when it is made); None means the cache.
    """

    searched = Signal(int, object)
    files_listed = Signal(int, object)
    failed = Signal(int, str)

    def __init__(self, endpoint: str | None = None, cache_dir: Path | None = None, dest_dir: Path | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.endpoint, self.cache_dir, self.dest_dir = endpoint, cache_dir, dest_dir
        self._serial = 0
        self._lock = threading.Lock()

    def search(self, query: str, library: str | None = "gguf") -> int:
        """Look ``query`` up (a keyword, ``owner/name`` or a link), keeping keyword hits to ``library``; returns
        the request's number."""
        endpoint = self.endpoint
        return self._start("search", lambda: search(query, limit=SEARCH_LIMIT, endpoint=endpoint, library=library),
                           lambda serial, hits: self.searched.emit(serial, hits))

    def list_files(self, repo_id: str) -> int:
        """List ``repo_id``'s files with their fit at the memory available now; returns the request's number."""
        endpoint = self.endpoint
        return self._start("files", lambda: list_files(repo_id, endpoint=endpoint),
                           lambda serial, files: self.files_listed.emit(serial, files))

    def download(self, repo_id: str, entry: FileEntry) -> DownloadJob:
        """A download of ``entry``, not started: connect to its signals, then call its ``start`` (a quick failure
        would otherwise end before anyone listens). It resumes whatever an earlier, stopped download left."""
        return DownloadJob(self, repo_id, entry, self)

    def _start(self, name: str, work: Callable[[], object], deliver: Callable[[int, object], object]) -> int:
        with self._lock:
            self._serial += 1
            serial = self._serial

        def run() -> None:
            try:
                result = work()
            except Exception as exc:  # noqa: BLE001 (a worker thread must report, not die)
                log.ui.info("hub %s failed: %s", name, exc)
                why = _error_text(exc)
                _emit(lambda: self.failed.emit(serial, why))
                return
            _emit(lambda: deliver(serial, result))

        threading.Thread(target=run, name=f"hearth-hub-{name}", daemon=True).start()
        return serial
