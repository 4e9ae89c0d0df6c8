"""The Discover view's download box: downloads with a progress bar (bytes, speed, time left), Cancel, and what
happened in words; several may run at once.

The box's bar, Cancel and words follow the file chosen in the list: its running download, how its last one ended,
or the part an earlier one kept. The other downloads running meanwhile (up to :data:`MAX_DOWNLOADS` in all) are
listed under it, each with its progress and a Cancel link, and how each ended stays there.

Each download runs on a thread of its own (:class:`app.bridge.hub_jobs.DownloadJob`); this box only shows its
signals. A cancelled or failed download keeps the part already fetched, so the next Download of the same file
resumes it, in this run of Hearth or after a restart.
"""

from __future__ import annotations

import html

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from app import log
from app.bridge.hub_jobs import DownloadJob, DownloadResult, FileEntry, HubClient, Progress, partial_bytes
from app.formatting import format_bytes

_ERROR_STYLE = ("QLabel { color: #b71c1c; background: #fdecea; border: 1px solid #f5c2c0;"
                " border-radius: 4px; padding: 6px; }")
_PERMILLE = 1000
#: Downloads that may run at once: more only share the same network link.
MAX_DOWNLOADS = 3
#: How many ended downloads of other files the list below the bar keeps.
_KEPT_OUTCOMES = 4
_Key = tuple[str, str]  # (repository, entry name)


def progress_text(p: Progress) -> str:
    """"12.0 MiB of 40.0 MiB at 5.2 MiB/s, 6 s left" while fetching; "Checking the sha256" while verifying."""
    total = f" of {format_bytes(p.total_bytes)}" if p.total_bytes else ""
    if p.stage == "verify":
        return f"{p.filename}: checking its sha256 against the hub's, {format_bytes(p.done_bytes)}{total}"
    if p.stage == "done":
        return f"{p.filename}: done, {format_bytes(p.done_bytes)}"
    eta = f", {p.eta_s:.0f} s left" if p.eta_s is not None else ""
    return f"{p.filename}: {format_bytes(p.done_bytes)}{total} at {format_bytes(p.speed_bps)}/s{eta}"


def outcome_text(result: DownloadResult) -> str:
    """How a download ended, in words."""
    if result.cancelled:
        return (f"Download of {result.entry_name} cancelled. The part downloaded is kept: Resume continues from "
                "there, now or after a restart.")
    if result.error:
        return f"Could not download {result.entry_name}. {result.error}"
    where = result.paths[0].parent if result.paths else ""
    return f"Downloaded {result.entry_name} into {where}. It is in the Models list now."


class DownloadBox(QWidget):
    """Download, Cancel, the progress bar and the outcome of the chosen file's download, and the other downloads.

    Signals:
        finished(DownloadResult): a download ended: done, cancelled or failed.
    """

    finished = Signal(object)

    def __init__(self, client: HubClient, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._client = client
        self._jobs: dict[_Key, DownloadJob] = {}
        self._last: dict[_Key, Progress] = {}
        self._outcomes: dict[_Key, DownloadResult] = {}  # ended downloads not shown above, newest last
        self._other_keys: list[_Key] = []  # the Cancel links' targets, by index
        self._choice: tuple[str, FileEntry] | None = None
        self._shown: _Key | None = None  # the download the bar and words show
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
        self.others = QLabel("")
        self.others.setObjectName("discoverOtherDownloads")
        self.others.setWordWrap(True)
        self.others.setTextFormat(Qt.TextFormat.RichText)
        self.others.linkActivated.connect(self._on_other_link)
        self.others.hide()
        buttons = QHBoxLayout()
        buttons.addWidget(self.download_button, 1)
        buttons.addWidget(self.cancel_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(buttons)
        layout.addWidget(self.progress)
        layout.addWidget(self.status)
        layout.addWidget(self.error)
        layout.addWidget(self.others)

    # -- public API -------------------------------------------------------------------------------

    @property
    def job(self) -> DownloadJob | None:
        """The chosen file's running download, or None."""
        return self._jobs.get(self._choice_key()) if self._choice is not None else None

    def jobs(self) -> list[DownloadJob]:
        """Every running download, oldest first."""
        return list(self._jobs.values())

    def is_running(self) -> bool:
        """Whether any download runs."""
        return bool(self._jobs)

    def set_choice(self, repo_id: str | None, entry: FileEntry | None) -> None:
        """The file the Download button would fetch (None: nothing chosen); the bar and words follow it."""
        self._choice = (repo_id, entry) if repo_id and entry is not None else None
        if self._choice is not None:
            key = self._choice_key()
            if key != self._shown:
                self._show(key)
        self._update_buttons()

    def start(self) -> bool:
        """Download the chosen file (resuming what an earlier download left); False when none is chosen, it is
        running already, or :data:`MAX_DOWNLOADS` run."""
        if self._choice is None or self.job is not None or len(self._jobs) >= MAX_DOWNLOADS:
            return False
        repo_id, entry = self._choice
        key = self._choice_key()
        self._outcomes.pop(key, None)
        job = self._jobs[key] = self._client.download(repo_id, entry)
        job.progress.connect(self._on_progress)
        job.finished.connect(self._on_finished)
        self._show(key)
        self.status.setText(f"Starting the download of {entry.name} ({format_bytes(entry.size_bytes)})…")
        job.start()
        log.ui.info("downloading %s from %s%s", entry.name, repo_id, f" into {job.dest}" if job.dest else "")
        self._update_buttons()
        return True

    @Slot()
    def cancel(self) -> None:
        """Stop the download the bar shows at its next chunk (its part is kept)."""
        if self._shown is not None:
            self.cancel_download(self._shown)

    def cancel_download(self, key: _Key) -> None:
        """Stop the download of ``(repository, entry name)`` at its next chunk (its part is kept)."""
        job = self._jobs.get(key)
        if job is None:
            return
        job.cancel()
        if key == self._shown:
            self.cancel_button.setEnabled(False)
            self.status.setText("Cancelling…")

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Cancel every running download and wait for their threads (the parts are kept for a later resume)."""
        jobs = self.jobs()
        for job in jobs:
            job.cancel()
        for job in jobs:
            job.wait(timeout_s)

    # -- events -----------------------------------------------------------------------------------

    @Slot()
    def _on_download_clicked(self) -> None:
        self.start()

    @Slot(object)
    def _on_progress(self, p: Progress) -> None:
        key = self._key_of(self.sender())
        if key is None:
            return
        self._last[key] = p
        if key == self._shown:
            self._show_progress(p)
        else:
            self._show_others()

    @Slot(object)
    def _on_finished(self, result: DownloadResult) -> None:
        key = (result.repo_id, result.entry_name)
        job = self._jobs.pop(key, None)
        self._last.pop(key, None)
        if job is not None:
            job.deleteLater()
        if key == self._shown:
            self._show_outcome(result)
        else:
            self._outcomes[key] = result
            while len(self._outcomes) > _KEPT_OUTCOMES:
                del self._outcomes[next(iter(self._outcomes))]
        self._show_others()
        self._update_buttons()
        self.finished.emit(result)

    @Slot(str)
    def _on_other_link(self, link: str) -> None:
        kind, _, index = link.partition(":")
        if kind == "cancel" and index.isdigit() and int(index) < len(self._other_keys):
            self.cancel_download(self._other_keys[int(index)])

    # -- inside -----------------------------------------------------------------------------------

    def _choice_key(self) -> _Key:
        assert self._choice is not None
        return self._choice[0], self._choice[1].name

    def _key_of(self, sender: object) -> _Key | None:
        for key, job in self._jobs.items():
            if job is sender:
                return key
        return None

    def _show(self, key: _Key) -> None:
        """Let the bar and words show ``key``'s download: running, ended, or the part an earlier one kept."""
        self._shown = key
        self.error.hide()
        if key in self._jobs:
            self.progress.show()
            last = self._last.get(key)
            if last is not None:
                self._show_progress(last)
            else:
                self.progress.setValue(0)
                self.status.setText(f"Downloading {key[1]}…")
        elif key in self._outcomes:
            self.progress.hide()
            self._show_outcome(self._outcomes.pop(key))
        else:
            self.progress.hide()
            kept = self._kept_bytes()
            size = self._choice[1].size_bytes if self._choice is not None else 0
            self.status.setText(f"{format_bytes(kept)} of {format_bytes(size)} downloaded earlier: Resume continues "
                                "from there." if kept else "")
        self._show_others()

    def _show_progress(self, p: Progress) -> None:
        if p.total_bytes:
            self.progress.setValue(int(_PERMILLE * min(p.done_bytes / p.total_bytes, 1.0)))
        self.status.setText(progress_text(p))

    def _show_outcome(self, result: DownloadResult) -> None:
        if result.error and not result.cancelled:
            self.status.setText("")
            self.error.setText(outcome_text(result))
            self.error.show()
            self.progress.hide()
            return
        if not result.cancelled:
            self.progress.setValue(_PERMILLE)
        self.status.setText(outcome_text(result))

    def _show_others(self) -> None:
        """One line for each download the bar does not show: its progress and a Cancel link, or how it ended."""
        lines, self._other_keys = [], []
        for key in self._jobs:
            if key == self._shown:
                continue
            last = self._last.get(key)
            done = f"{100 * last.done_bytes / last.total_bytes:.0f}%, " if last and last.total_bytes else ""
            speed = f"{format_bytes(last.speed_bps)}/s" if last is not None and last.stage == "download" else \
                "checking" if last is not None else "starting"
            lines.append(f"Downloading {html.escape(key[1])} from {html.escape(key[0])}: {done}{speed} · "
                         f"<a href='cancel:{len(self._other_keys)}'>Cancel</a>")
            self._other_keys.append(key)
        lines += [html.escape(outcome_text(result)) for result in self._outcomes.values()]
        self.others.setText("<br>".join(lines))
        self.others.setVisible(bool(lines))

    def _kept_bytes(self) -> int:
        if self._choice is None:
            return 0
        return partial_bytes(*self._choice, self._client.cache_dir, self._client.dest_dir)

    def _update_buttons(self) -> None:
        running = self.job is not None
        full = len(self._jobs) >= MAX_DOWNLOADS
        self.download_button.setEnabled(self._choice is not None and not running and not full)
        self.download_button.setText("Downloading…" if running else "Resume" if self._kept_bytes() else "Download")
        self.download_button.setToolTip(f"{MAX_DOWNLOADS} downloads run already; wait for one to end" if full and
                                        not running else "")
        self.cancel_button.setEnabled(self._shown is not None and self._shown in self._jobs)
