"""A conversation's attached files and the numbered sources each reply was given, in the conversation database.

No Qt here. Two tables of schema 4 (:mod:`app.data.migrations`): ``attachments`` (one row per file attached to a
chat, with the reason it could not be read, if any) and ``reply_sources`` (the sources a reply's prompt carried,
as JSON, so its Sources list shows again after a restart). The rows go through :class:`~app.data.storage.Storage`'s
own lock and transactions, so they are safe to write from any thread.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.data.storage import Storage


@dataclass(frozen=True, slots=True)
class Attachment:
    """A file attached to a conversation; ``reason`` says why it could not be read ("" when it was)."""

    path: str
    reason: str = ""

    @property
    def name(self) -> str:
        return Path(self.path).name


@dataclass(frozen=True, slots=True)
class Source:
    """One numbered source of a reply's prompt: ``text`` is ``file``'s ``page`` from ``start`` to ``end``."""

    file: str
    page: int | None
    start: int
    end: int
    text: str
    score: float
    #: The passage to show under the label (the best-matching chunk of a whole page); "" shows ``text``.
    snippet: str = ""

    @property
    def label(self) -> str:
        """``name.pdf, page 3`` (the page only where the file has pages)."""
        name = Path(self.file).name
        return f"{name}, page {self.page}" if self.page is not None else name


class AttachmentStore:
    """Reads and writes attachments and reply sources through an open :class:`Storage` (which it does not close).

    It uses the storage's own query helpers, so each write takes the storage's lock and commits as its own
    methods do.
    """

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    # --- attachments ---

    def attachments(self, conversation_id: int) -> list[Attachment]:
        """The files attached to a conversation, oldest first."""
        rows = self.storage._all(
            "SELECT path, reason FROM attachments WHERE conversation_id = ? ORDER BY added_at, path",
            (conversation_id,),
        )
        return [Attachment(path, reason or "") for path, reason in rows]

    def attach(self, conversation_id: int, paths: list[str]) -> list[Attachment]:
        """Attach ``paths`` (absolute) to a conversation; a file attached already keeps its row. Returns all."""
        now = self.storage._clock()
        with self.storage.batch():
            for path in paths:
                self.storage._write(
                    "INSERT OR IGNORE INTO attachments (conversation_id, path, added_at) VALUES (?, ?, ?)",
                    (conversation_id, path, now),
                )
        return self.attachments(conversation_id)

    def set_reasons(self, conversation_id: int, reasons: dict[str, str]) -> None:
        """Record why each of ``reasons``'s files could not be read ("" clears it: the file was read)."""
        with self.storage.batch():
            for path, reason in reasons.items():
                self.storage._write(
                    "UPDATE attachments SET reason = ? WHERE conversation_id = ? AND path = ?",
                    (reason or None, conversation_id, path),
                )

    def detach(self, conversation_id: int, path: str) -> None:
        self.storage._write(
            "DELETE FROM attachments WHERE conversation_id = ? AND path = ?", (conversation_id, path)
        )

    # --- reply sources ---

    def set_sources(self, message_id: int, sources: list[Source]) -> None:
        """Keep the numbered sources (in the prompt's order) that reply ``message_id`` was given."""
        data = json.dumps([asdict(s) for s in sources], ensure_ascii=False)
        self.storage._write(
            "INSERT OR REPLACE INTO reply_sources (message_id, sources) VALUES (?, ?)", (message_id, data)
        )

    def sources(self, message_id: int) -> list[Source]:
        """The sources reply ``message_id`` was given ([] when it had none)."""
        row = self.storage._one("SELECT sources FROM reply_sources WHERE message_id = ?", (message_id,))
        if row is None:
            return []
        try:
            items: list[dict[str, Any]] = json.loads(row[0])
            return [Source(**item) for item in items]
        except (ValueError, TypeError):
            return []  # a damaged row shows no Sources list rather than failing the transcript
