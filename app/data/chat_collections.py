"""Which document collections (watched folders) each conversation answers from, in the conversation database.

No Qt here. One table of schema 5 (:mod:`app.data.migrations`): ``conversation_collections``, a row per collection
a chat uses besides its own attached files. A collection is named as in the document index (``documents/`` in the
data folder), which keeps its folders, files and chunks; this table keeps only the choice, so it survives a
restart. Writes go through :class:`~app.data.storage.Storage`'s own lock and transactions.
"""

from __future__ import annotations

from app.data.storage import Storage


class ChatCollectionStore:
    """Reads and writes each conversation's chosen collections through an open :class:`Storage` (not closed here)."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    def chosen(self, conversation_id: int) -> list[str]:
        """The collections a conversation uses, in the order they were chosen."""
        rows = self.storage._all(
            "SELECT name FROM conversation_collections WHERE conversation_id = ? ORDER BY added_at, name",
            (conversation_id,),
        )
        return [name for (name,) in rows]

    def set_chosen(self, conversation_id: int, names: list[str]) -> list[str]:
        """Make ``names`` the conversation's collections (those chosen already keep their place). Returns them."""
        now = self.storage._clock()
        wanted = list(dict.fromkeys(names))
        with self.storage.batch():
            for name in set(self.chosen(conversation_id)) - set(wanted):
                self.storage._write(
                    "DELETE FROM conversation_collections WHERE conversation_id = ? AND name = ?",
                    (conversation_id, name),
                )
            for n, name in enumerate(wanted):
                self.storage._write(
                    "INSERT OR IGNORE INTO conversation_collections (conversation_id, name, added_at)"
                    " VALUES (?, ?, ?)",
                    (conversation_id, name, now + n * 1e-6),
                )
        return self.chosen(conversation_id)

    def forget(self, name: str) -> None:
        """A collection was removed: no conversation uses it any more."""
        self.storage._write("DELETE FROM conversation_collections WHERE name = ?", (name,))
