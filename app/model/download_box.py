"""The Discover view's download box: one file's download with a progress bar (bytes, speed, time left), Cancel, and
what happened in words.

The download itself runs on a thread of its own (:class:`app.bridge.hub_jobs.DownloadJob`); this box only shows
its signals. A cancelled or failed download keeps the part already fetched, so the next Download of the same file
resumes it, in this run of Hearth or after a restart.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from app import log
from app.bridge.hub_jobs import DownloadJob, DownloadResult, FileEntry, HubClient, Progress, partial_bytes
from app.formatting import format_bytes

_ERROR_STYLE = ("QLabel { color: #b71c1c; background: #fdecea; border: 1px solid #f5c2c0;"
                " border-radius: 4px; padding: 6px; }")
_PERMILLE = 1000


def progress_text(p: Progress) -> str:
    """"12.0 MiB of 40.0 MiB at 5.2 MiB/s, 6 s left" while fetching; "Checking the sha256" while verifying."""
    total = f" of {format_bytes(p.total_bytes)}" if p.total_bytes else ""
    if p.stage == "verify":
        return f"{p.filename}: checking its sha256 against the hub's, {format_bytes(p.done_bytes)}{total}"
    if p.stage == "done":
        return f"{p.filename}: done, {format_bytes(p.done_bytes)}"
    eta = f", {p.eta_s:.0f} s left" if p.eta_s is not None else ""
    return f"{p.filename}: {format_bytes(p.done_bytes)}{total} at {format_bytes(p.speed_bps)}/s{eta}"


class DownloadBox(QWidget):
    """Download, Cancel, the progress bar and the outcome of the one download this view runs at a time.

    Signals:
        finished(DownloadResult): a download ended: done, cancelled or failed.
    """

    finished = Signal(object)

    def __init__(self, client: HubClient, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._client = client
        self._job: DownloadJob | None = None
        self._choice: tuple[str, FileEntry] | None = None
        self.download_button = QPushButton("Download")
        self.download_button.setObjectName("discoverDownloadButton")
        self.download_button.setEnabled(False)
        self.download_button.clicked.connect(self._on_download_clicked)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setObjectName("discoverCancelButton")
        self.cancel_button.setToolTip("Stop the download; the part already downloaded is kept for Resume")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.cancel)
        self.progress = QProgressBar()
        self.progress.setObjectName("discoverProgress")
        self.progress.setRange(0, _PERMILLE)
        self.progress.hide()
        self.status = QLabel("")
        self.status.setObjectName("discoverDownloadLabel")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.error = QLabel("")
        self.error.setObjectName("discoverDownloadError")
        self.error.setWordWrap(True)
        self.error.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.error.setStyleSheet(_ERROR_STYLE)
        self.error.hide()
        buttons = QHBoxLayout()
        buttons.addWidget(self.download_button, 1)
        buttons.addWidget(self.cancel_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(buttons)
        layout.addWidget(self.progress)
        layout.addWidget(self.status)
        layout.addWidget(self.error)

    # -- public API -------------------------------------------------------------------------------

    @property
    def job(self) -> DownloadJob | None:
        """The running download, or None."""
        return self._job

    def is_running(self) -> bool:
        return self._job is not None

    def set_choice(self, repo_id: str | None, entry: FileEntry | None) -> None:
        """The file the Download button would fetch (None: nothing chosen)."""
        self._choice = (repo_id, entry) if repo_id and entry is not None else None
        self._update_buttons()
        if self._choice is not None and not self.is_running():
            self.error.hide()
            self.progress.hide()
            kept = self._kept_bytes()
            self.status.setText(f"{format_bytes(kept)} of {format_bytes(self._choice[1].size_bytes)} downloaded "
                                "earlier: Resume continues from there." if kept else "")

    def start(self) -> bool:
        """Download the chosen file (resuming what an earlier download left); False when none is chosen or one
        is running already."""
        if self._choice is None or self._job is not None:
            return False
        repo_id, entry = self._choice
        self.error.hide()
        self.progress.setValue(0)
        self.progress.show()
        self.status.setText(f"Starting the download of {entry.name} ({format_bytes(entry.size_bytes)})…")
        job = self._job = self._client.download(repo_id, entry)
        job.progress.connect(self._on_progress)
        job.finished.connect(self._on_finished)
        job.start()
        log.ui.info("downloading %s from %s", entry.name, repo_id)
        self._update_buttons()
        return True

    @Slot()
    def cancel(self) -> None:
        """Stop the running download at its next chunk (its part is kept)."""
        if self._job is not None:
            self._job.cancel()
            self.cancel_button.setEnabled(False)
            self.status.setText("Cancelling…")

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Cancel the running download and wait for its thread (the part is kept for a later resume)."""
        job = self._job
        if job is not None:
            job.cancel()
            job.wait(timeout_s)

    # -- events -----------------------------------------------------------------------------------

    @Slot()
    def _on_download_clicked(self) -> None:
        self.start()

    @Slot(object)
    def _on_progress(self, p: Progress) -> None:
        if p.total_bytes:
            self.progress.setValue(int(_PERMILLE * min(p.done_bytes / p.total_bytes, 1.0)))
        self.status.setText(progress_text(p))

    @Slot(object)
    def _on_finished(self, result: DownloadResult) -> None:
        job, self._job = self._job, None
        if job is not None:
            job.deleteLater()
        if result.cancelled:
            self.status.setText(f"Download of {result.entry_name} cancelled. The part downloaded is kept: "
                                "Resume continues from there, now or after a restart.")
        elif result.error:
            self.status.setText("")
            self.error.setText(f"Could not download {result.entry_name}. {result.error}")
            self.error.show()
            self.progress.hide()
        else:
            self.progress.setValue(_PERMILLE)
            where = result.paths[0].parent if result.paths else ""
            self.status.setText(f"Downloaded {result.entry_name} into {where}. It is in the Models list now.")
        self._update_buttons()
        self.finished.emit(result)

    def _kept_bytes(self) -> int:
        return partial_bytes(*self._choice, self._client.cache_dir) if self._choice is not None else 0

    def _update_buttons(self) -> None:
        running = self._job is not None
        self.download_button.setEnabled(self._choice is not None and not running)
        self.download_button.setText("Downloading…" if running else "Resume" if self._kept_bytes() else "Download")
        self.cancel_button.setEnabled(running)
