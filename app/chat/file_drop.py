"""Files dropped on the chat: an event filter that takes drops of local files on the widgets it watches."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QMimeData, QObject, Signal
from PySide6.QtGui import QDragEnterEvent, QDragMoveEvent, QDropEvent


def local_files(mime: QMimeData) -> list[str]:
    """The local files a drag carries (none for text, web links and the like)."""
    if not mime.hasUrls():
        return []
    return [url.toLocalFile() for url in mime.urls() if url.isLocalFile() and url.toLocalFile()]


class FileDropFilter(QObject):
    """Takes drops of local files on every widget it is installed on (drops of text go on as before).

    Signals:
        files_dropped(list): the paths dropped.
    """

    files_dropped = Signal(list)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if isinstance(event, QDragEnterEvent | QDragMoveEvent) and local_files(event.mimeData()):
            event.acceptProposedAction()
            return True
        if isinstance(event, QDropEvent) and (paths := local_files(event.mimeData())):
            event.acceptProposedAction()
            self.files_dropped.emit(paths)
            return True
        return super().eventFilter(watched, event)
