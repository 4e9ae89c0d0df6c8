"""A chat's documents: attaching files, indexing them off the GUI thread, and the sources each reply is given.

Not a widget. :class:`DocumentsController` keeps the attachments of every conversation (in the conversation
database, :mod:`app.data.attachments`) and their index (:mod:`app.docs.index`, ``documents/`` in the data folder).
Files are indexed by one :class:`~app.docs.attach_job.AttachJob` per conversation at a time (files attached
meanwhile wait for it), so two runs never write the same collection at once. Before a reply, :meth:`prepare` puts
the numbered sources into the prompt; the sources a reply was given are kept with it, for its Sources list.
A chat may also use folder collections (:attr:`DocumentsController.collections`, watched and re-indexed while the
app runs; chosen per chat in :mod:`app.data.chat_collections`): its sources then come from both.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QUrl, Signal, Slot
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QFileDialog, QMessageBox, QWidget

from app import log
from app.chat.composer import Composer
from app.chat.file_drop import FileDropFilter
from app.chat.message_view import MessageView
from app.data.attachments import Attachment, AttachmentStore, Source
from app.data.chat_collections import ChatCollectionStore
from app.data.conversations import Message
from app.data.storage import Storage
from app.docs.attach_job import AttachJob, AttachResult
from app.docs.citations import ShownSources, shown_sources, snippet
from app.docs.collection_watcher import CollectionWatcher
from app.docs.index import DocumentIndex, sources_budget, with_sources


class DocumentsController(QObject):
    """Attachments, their indexing and the replies' sources, for every conversation.

    Signals:
        attachments_changed(int): a conversation's attached files or their state changed (its id).
        progress_changed(int): a conversation's indexing progressed, started or ended (its id).
        notice(str): a short message for the status bar.
        files_dropped(list): local files were dropped on the chat (their paths).

    Args:
        storage: the conversation database; the index lives in ``documents/`` beside it.
    """

    attachments_changed = Signal(int)
    progress_changed = Signal(int)
    notice = Signal(str)
    files_dropped = Signal(list)

    def __init__(self, storage: Storage, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._attachments = AttachmentStore(storage)
        in_memory = str(storage.path) == ":memory:"
        home = Path(tempfile.mkdtemp(prefix="hearth-documents-")) if in_memory else storage.path.parent / "documents"
        self.index = DocumentIndex(home)
        self._chosen = ChatCollectionStore(storage)
        #: The folder collections: made, watched and re-indexed in the background.
        self.collections = CollectionWatcher(self.index, self)
        self.collections.notice.connect(self.notice)
        self.collections.progress_changed.connect(self._on_collections_progress)
        self.collections.collections_changed.connect(self._on_collections_progress)
        self._jobs: dict[int, AttachJob] = {}
        self._waiting: dict[int, list[str]] = {}
        self._progress: dict[int, tuple[int, int, str]] = {}
        self._sources: dict[int, list[Source]] = {}
        self._questions: dict[int, str] = {}  # a reply's id: the question it answers
        self._composer: Composer | None = None
        self._current_id: Callable[[], int | None] = lambda: None
        #: Takes drops of files on the chat pane, its transcript and its message box.
        self.drops = FileDropFilter(self)
        self.drops.files_dropped.connect(self.files_dropped)
        self.attachments_changed.connect(self.show)
        self.progress_changed.connect(self.show)
        self.collections.start()

    def connect_widgets(self, pane: QWidget, composer: Composer, view: MessageView,
                        current_id: Callable[[], int | None]) -> None:
        """Wire the chat pane's widgets: Attach, the chips, drops, and the replies' Sources lists."""
        self._composer, self._current_id = composer, current_id
        composer.attach_requested.connect(self._on_attach_requested)
        composer.collections_requested.connect(self.open_collections_dialog)
        composer.attachments_bar.remove_requested.connect(self._on_remove_requested)
        composer.attachments_bar.collection_remove_requested.connect(self._on_collection_remove_requested)
        view.set_sources_provider(self.shown_sources)
        for target in (pane, view.viewport(), composer.input_box.viewport()):
            target.setAcceptDrops(True)
            target.installEventFilter(self.drops)

    @Slot(int)
    def show(self, conversation_id: int) -> None:
        """Show a conversation's attachments and progress above the message box (when it is the one shown)."""
        if self._composer is not None and conversation_id == self._current_id():
            self._composer.attachments_bar.show_attachments(self.attachments(conversation_id))
            self._composer.attachments_bar.show_collections(self.chat_collections(conversation_id))
            self._composer.attachments_bar.show_progress(self.progress(conversation_id))

    @Slot()
    def _on_attach_requested(self) -> None:
        cid = self._current_id()
        paths, _ = QFileDialog.getOpenFileNames(self._composer, "Attach files to this chat")
        if paths and cid is not None:
            self.attach(cid, paths)

    @Slot(str)
    def _on_remove_requested(self, path: str) -> None:
        if (cid := self._current_id()) is not None:
            self.remove(cid, path)

    @Slot(str)
    def _on_collection_remove_requested(self, name: str) -> None:
        if (cid := self._current_id()) is not None:
            self.set_chat_collections(cid, [n for n in self.chat_collections(cid) if n != name])

    @Slot()
    def _on_collections_progress(self) -> None:
        if (cid := self._current_id()) is not None:
            self.show(cid)

    @Slot()
    def open_collections_dialog(self) -> None:
        """The folder collections, and which of them the current chat uses."""
        from app.chat.collections_dialog import CollectionsDialog  # the dialog's widgets only when asked for

        dialog = CollectionsDialog(self, self._current_id(), self._composer)
        dialog.open()

    # -- folder collections -----------------------------------------------------------------------

    def chat_collections(self, conversation_id: int) -> list[str]:
        """The folder collections a conversation answers from besides its own files."""
        return self._chosen.chosen(conversation_id)

    def set_chat_collections(self, conversation_id: int, names: list[str]) -> None:
        """Make ``names`` the collections the conversation answers from (kept in the conversation database)."""
        self._chosen.set_chosen(conversation_id, names)
        self.attachments_changed.emit(conversation_id)

    def remove_collection(self, name: str) -> None:
        """Drop a collection from the index; no chat uses it any more (the files on disk stay)."""
        self._chosen.forget(name)
        self.collections.remove(name)
        if (cid := self._current_id()) is not None:
            self.attachments_changed.emit(cid)

    # -- attachments ------------------------------------------------------------------------------

    def attachments(self, conversation_id: int) -> list[Attachment]:
        return self._attachments.attachments(conversation_id)

    def progress(self, conversation_id: int) -> tuple[int, int, str] | None:
        """(files done, files to do, the file being read) while the conversation's files, or a collection it
        uses, are read, else None."""
        if conversation_id not in self._jobs:
            busy = self.collections.progress()
            if busy is not None and busy[0] in self.chat_collections(conversation_id):
                return busy[1:]
            return None
        return self._progress.get(conversation_id, (0, 0, ""))

    def is_indexing(self, conversation_id: int) -> bool:
        return conversation_id in self._jobs

    def attach(self, conversation_id: int, paths: list[str]) -> list[str]:
        """Attach files (or folders) to a conversation and read them in the background; returns those taken."""
        taken = [str(Path(p).resolve()) for p in paths if Path(p).exists()]
        missing = [p for p in paths if not Path(p).exists()]
        if missing:
            self.notice.emit(f"Not attached (no such file): {', '.join(Path(p).name for p in missing)}")
        if not taken:
            return []
        self._attachments.attach(conversation_id, taken)
        self._attachments.set_reasons(conversation_id, dict.fromkeys(taken, ""))
        self.attachments_changed.emit(conversation_id)
        if conversation_id in self._jobs:
            self._waiting.setdefault(conversation_id, []).extend(taken)
        else:
            self._start(conversation_id, taken)
        return taken

    def remove(self, conversation_id: int, path: str) -> None:
        """Detach a file: the chat stops answering from it."""
        self._attachments.detach(conversation_id, path)
        waiting = self._waiting.get(conversation_id, [])
        if path in waiting:
            waiting.remove(path)
        try:
            self.index.remove(conversation_id, path)
        except Exception as exc:  # noqa: BLE001 (the index is rebuilt from the attachments; say it, go on)
            log.ui.warning("could not drop %s from the index: %s", path, exc)
        self.attachments_changed.emit(conversation_id)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop indexing after the file being read (the rest stays queued for the next attachment)."""
        self._waiting.clear()
        self.collections.shutdown(timeout_s)
        for job in list(self._jobs.values()):
            job.cancel()
        for job in list(self._jobs.values()):
            job.wait(timeout_s)

    def _start(self, conversation_id: int, paths: list[str]) -> None:
        job = AttachJob(self.index, conversation_id, paths)
        job.progress.connect(self._on_progress)
        job.finished.connect(self._on_finished)
        self._jobs[conversation_id] = job
        self._progress[conversation_id] = (0, len(paths), "")
        self.progress_changed.emit(conversation_id)
        job.start()

    @Slot(int, int, int, str)
    def _on_progress(self, conversation_id: int, done: int, total: int, path: str) -> None:
        if conversation_id in self._jobs:
            self._progress[conversation_id] = (done, total, path)
            self.progress_changed.emit(conversation_id)

    @Slot(object)
    def _on_finished(self, result: AttachResult) -> None:
        cid = result.conversation_id
        self._jobs.pop(cid, None)
        self._progress.pop(cid, None)
        attached = {a.path for a in self.attachments(cid)}
        reasons: dict[str, str] = {}
        for path in result.paths:
            if path not in attached:
                continue
            if result.error:
                reasons[path] = f"could not be indexed ({result.error})"
                continue
            inside = [(p, why) for p, why in result.outcome.skipped if p == path or Path(p).is_relative_to(path)]
            reasons[path] = "; ".join(why if p == path else f"{Path(p).name}: {why}" for p, why in inside)
        try:
            self._attachments.set_reasons(cid, reasons)
        except Exception as exc:  # noqa: BLE001 (a locked database loses only the reasons' record)
            log.ui.warning("could not record attachment reasons: %s", exc)
        read = len(result.outcome.indexed)
        if not result.error:
            embedder = result.outcome.embedder_reason  # which embedder searches them, and why that one
            self.notice.emit(f"Read {read} file{'s' if read != 1 else ''}"
                             + (f"; {len(result.outcome.skipped)} could not be read." if result.outcome.skipped
                                else ".")
                             + (f" Search: {embedder}." if embedder else ""))
        self.attachments_changed.emit(cid)
        self.progress_changed.emit(cid)
        waiting = self._waiting.pop(cid, [])
        if waiting:
            self._start(cid, waiting)

    # -- sources ----------------------------------------------------------------------------------

    def uses_documents(self, conversation_id: int) -> bool:
        """Whether the chat has document collections or a readable attached file (GUI thread: reads the database)."""
        return bool(self.chat_collections(conversation_id)) or \
            any(not a.reason for a in self.attachments(conversation_id))

    def prepare(self, conversation_id: int, history: list[dict[str, str]], params: dict[str, Any],
                context_length: int) -> tuple[list[dict[str, str]], list[Source]]:
        """``history`` with the chat's documents put before its last turn, and the numbered sources given.

        Unchanged (and no sources) when the chat has no readable documents, or the context has no room for them.
        """
        collections = self.chat_collections(conversation_id)
        if not self.uses_documents(conversation_id) or not history:
            return history, []
        budget = sources_budget(history, params, context_length)
        try:
            prepared = self.index.prepare(conversation_id, history[-1].get("content", ""), budget, collections)
        except Exception as exc:  # noqa: BLE001 (the reply goes on without documents, and says so)
            log.ui.warning("document retrieval failed: %s", exc)
            self.notice.emit(f"The documents could not be searched ({exc}); replying without them.")
            return history, []
        if prepared is None:
            if budget <= 0:
                self.notice.emit("The chat is too long to add its documents; replying without them.")
            return history, []
        if self.progress(conversation_id) is not None:
            self.notice.emit("Some files are still being read: this reply uses those read so far.")
        return with_sources(history, prepared.block), prepared.sources

    def remember_sources(self, reply: Message, sources: list[Source]) -> None:
        """Keep the sources ``reply`` was given, with it in the database."""
        if reply.id is None or not sources:
            return
        self._sources[reply.id] = sources
        try:
            self._attachments.set_sources(reply.id, sources)
        except Exception as exc:  # noqa: BLE001 (shown now; lost after a restart)
            log.ui.warning("could not save a reply's sources: %s", exc)

    def shown_sources(self, message: Message) -> ShownSources | None:
        """The Sources list under a finished reply, or None for one given no sources."""
        if message.role != "assistant" or message.id is None or message.is_streaming:
            return None
        if message.id not in self._sources:
            if self._attachments.storage.is_closed:  # a closed window's transcript redrawn by a theme change
                return None
            self._sources[message.id] = self._attachments.sources(message.id)
        sources = self._sources[message.id]
        return shown_sources(message.content, sources, self._question(message)) if sources else None

    def _question(self, reply: Message) -> str:
        """The user message ``reply`` answers ("" when it cannot be read): its words credit no source."""
        if reply.id in self._questions:
            return self._questions[reply.id]
        if reply.id is None or reply.parent_id is None or self._attachments.storage.is_closed:
            return ""
        try:
            parent = self._attachments.storage.get_message(reply.parent_id)
        except ValueError:
            return ""
        self._questions[reply.id] = parent.content if parent.role == "user" else ""
        return self._questions[reply.id]

    def open_source(self, message: Message, number: int, parent: QWidget | None = None) -> None:
        """Open source ``number`` of ``message`` in the file's own app; show its passage when the file is gone."""
        sources = self._sources.get(message.id or -1) or []
        if not 1 <= number <= len(sources):
            return
        source = sources[number - 1]
        if Path(source.file).is_file() and QDesktopServices.openUrl(QUrl.fromLocalFile(source.file)):
            return
        box = QMessageBox(QMessageBox.Icon.Information, f"[{number}] {source.label}",
                          f"The file could not be opened. The passage the reply was given:\n\n{snippet(source)}",
                          QMessageBox.StandardButton.Close, parent)
        box.setDetailedText(source.text)
        box.open()
