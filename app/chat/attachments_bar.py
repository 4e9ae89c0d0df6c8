"""The files attached to the chat, above the message box: one removable chip per file and per folder collection the
chat uses, indexing progress (a count and a bar), and the files that could not be read, each with its reason."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal, Slot
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QToolButton, QVBoxLayout, QWidget

from app.data.attachments import Attachment


class AttachmentsBar(QWidget):
    """Shows a conversation's attachments; hidden while it has none and nothing is being read.

    Signals:
        remove_requested(str): the chip of this file (its path) was clicked.
        collection_remove_requested(str): the chip of this collection (its name) was clicked.
    """

    remove_requested = Signal(str)
    collection_remove_requested = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("attachmentsBar")
        self._chips_row = QHBoxLayout()
        self._chips_row.setContentsMargins(0, 0, 0, 0)
        self._chips_row.addStretch(1)
        self._status = QLabel()
        self._status.setObjectName("attachStatus")
        self._bar = QProgressBar()
        self._bar.setObjectName("attachProgress")
        self._bar.setMaximumHeight(12)
        self._bar.setTextVisible(False)
        progress_row = QHBoxLayout()
        progress_row.setContentsMargins(0, 0, 0, 0)
        progress_row.addWidget(self._status, 1)
        progress_row.addWidget(self._bar, 1)
        self._problems = QLabel()
        self._problems.setObjectName("attachProblems")
        self._problems.setWordWrap(True)
        self._problems.setStyleSheet("color: #c62828;")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 4)
        layout.addLayout(self._chips_row)
        layout.addLayout(progress_row)
        layout.addWidget(self._problems)
        self._chips: list[QToolButton] = []
        self._collection_chips: list[QToolButton] = []
        self._is_busy = False
        self.show_progress(None)
        self.show_attachments([])

    # -- public API -------------------------------------------------------------------------------

    def show_attachments(self, attachments: list[Attachment]) -> None:
        """One chip per file; the unreadable ones marked, with their reasons listed under the chips."""
        for chip in self._chips:
            self._chips_row.removeWidget(chip)
            chip.deleteLater()
        self._chips = []
        for n, attachment in enumerate(attachments):
            chip = QToolButton()
            chip.setObjectName("attachmentChip")
            chip.setAutoRaise(False)
            mark = "⚠ " if attachment.reason else "📄 "
            chip.setText(f"{mark}{attachment.name}  ✕")
            chip.setProperty("path", attachment.path)
            chip.setToolTip(f"{attachment.path}\n{attachment.reason or 'Read: the chat answers from it.'}\n"
                            "Click to remove it from this chat.")
            chip.clicked.connect(self._on_chip_clicked)
            self._chips_row.insertWidget(n, chip)
            self._chips.append(chip)
        problems = [f"Could not read {a.name}: {a.reason}" for a in attachments if a.reason]
        self._problems.setText("\n".join(problems))
        self._problems.setVisible(bool(problems))
        self._update_visibility()

    def show_collections(self, names: list[str]) -> None:
        """One chip per folder collection the chat uses, after the files' chips."""
        for chip in self._collection_chips:
            self._chips_row.removeWidget(chip)
            chip.deleteLater()
        self._collection_chips = []
        for name in names:
            chip = QToolButton()
            chip.setObjectName("collectionChip")
            chip.setText(f"🗂 {name}  ✕")
            chip.setProperty("collection", name)
            chip.setToolTip(f"The folder collection “{name}”: the chat answers from it too.\n"
                            "Click to stop using it in this chat.")
            chip.clicked.connect(self._on_collection_chip_clicked)
            self._chips_row.insertWidget(self._chips_row.count() - 1, chip)
            self._collection_chips.append(chip)
        self._update_visibility()

    @property
    def collection_names(self) -> list[str]:
        return [str(chip.property("collection")) for chip in self._collection_chips]

    def show_progress(self, progress: tuple[int, int, str] | None) -> None:
        """``(done, total, file)`` while files are read (a count and a bar); None when nothing is."""
        self._is_busy = progress is not None
        if progress is None:
            self._status.hide()
            self._bar.hide()
        else:
            done, total, path = progress
            name = Path(path).name if path else ""
            self._status.setText(f"Reading {min(done + 1, total)} of {total}: {name}" if name and done < total
                                 else f"Read {done} of {total}")
            self._bar.setRange(0, max(total, 1))
            self._bar.setValue(done)
            self._status.show()
            self._bar.show()
        self._update_visibility()

    @property
    def chip_paths(self) -> list[str]:
        return [str(chip.property("path")) for chip in self._chips]

    def chip(self, path: str) -> QToolButton | None:
        return next((c for c in self._chips if c.property("path") == path), None)

    @property
    def status_text(self) -> str:
        return self._status.text() if self._is_busy else ""

    @property
    def problems_text(self) -> str:
        return self._problems.text()

    # -- widget events ----------------------------------------------------------------------------

    @Slot()
    def _on_chip_clicked(self) -> None:
        chip = self.sender()
        if isinstance(chip, QToolButton):
            self.remove_requested.emit(str(chip.property("path")))

    @Slot()
    def _on_collection_chip_clicked(self) -> None:
        chip = self.sender()
        if isinstance(chip, QToolButton):
            self.collection_remove_requested.emit(str(chip.property("collection")))

    def _update_visibility(self) -> None:
        self.setVisible(bool(self._chips) or bool(self._collection_chips) or self._is_busy)
