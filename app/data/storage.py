"""Conversation storage: one SQLite file holding conversations, their branching messages and presets.

No Qt here: the GUI calls :class:`Storage` from any thread (one connection, guarded by a lock).
Every write commits before the method returns, so a crash loses at most what was not yet written;
:meth:`Storage.batch` groups several writes into one transaction when they must land together.

Messages form a tree per conversation: editing a user message or regenerating a reply adds a
*sibling* (same parent), and ``conversations.active_leaf_id`` says which branch the UI shows.
The rows are the dataclasses of :mod:`app.data.records`; the schema and its upgrades are in
:mod:`app.data.migrations`.

Long because :class:`Storage` is the database's whole API, one method per query, and the queries of one table
run those of another inside one transaction (a new message moves its conversation's active leaf, a conversation
checks its preset, the search reads both conversations and messages): split by table, each part would reach into
the others' methods through the shared lock and :meth:`Storage.batch`.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any, Self

from app.data.migrations import migrate, schema_version
from app.data.private_files import create_private
from app.data.records import DEFAULT_TITLE, ROLES, Conversation, Message, MessageNode, Preset, make_title

BUSY_TIMEOUT_MS = 5000
SNIPPET_CONTEXT_CHARS = 30

_PRESET_COLS = ", ".join(f.name for f in fields(Preset))
_CONV_COLS = ", ".join(f.name for f in fields(Conversation))
_MSG_COLS = ", ".join(f.name for f in fields(Message))
_MSG_COLS_M = ", ".join(f"m.{f.name}" for f in fields(Message))


# --- helpers --------------------------------------------------------------------------------------


def _snippet(content: str, needle: str) -> str:
    """Return the text around the first case-insensitive match of ``needle``, on one line."""
    flat = " ".join(content.split())
    at = flat.lower().find(" ".join(needle.split()).lower())
    at = max(at, 0)
    start = max(at - SNIPPET_CONTEXT_CHARS, 0)
    end = at + len(needle) + SNIPPET_CONTEXT_CHARS
    return ("…" if start else "") + flat[start:end] + ("…" if end < len(flat) else "")


def _like_pattern(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _check_meta(
    num_prompt_tokens: int | None,
    num_generated_tokens: int | None,
    ttft_s: float | None,
    tok_s: float | None,
) -> None:
    for name, value in (
        ("num_prompt_tokens", num_prompt_tokens),
        ("num_generated_tokens", num_generated_tokens),
        ("ttft_s", ttft_s),
        ("tok_s", tok_s),
    ):
        if value is not None and value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")


def _conversation(row: Sequence[Any]) -> Conversation:
    return Conversation(*row)


def _message(row: Sequence[Any]) -> Message:
    values: list[Any] = [*row[:-1], bool(row[-1])]  # is_complete is stored as 0/1
    return Message(*values)


def _preset(row: Sequence[Any]) -> Preset:
    return Preset(*row)


# --- storage --------------------------------------------------------------------------------------


class Storage:
    """The conversation database: one SQLite file, one connection, safe to share between threads.

    Args:
        path: The database file; it and its folder are created when missing.
        clock: Returns the current time in seconds since the epoch (tests pass a fake).

    Raises:
        ValueError: The file's schema is newer than this code.
        sqlite3.DatabaseError: The file is not a SQLite database.
    """

    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self._clock = clock
        self._lock = threading.RLock()
        #: True once :meth:`close` ran: widgets that outlive their window (a theme change redraws them) read nothing
        self.is_closed = False
        self._depth = 0  # nesting of batch(); writes commit when it returns to 0
        self.has_fts = False  # whether the message search index exists (schema 2, FTS5 trigram)
        if str(path) != ":memory:":
            create_private(self.path)
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS:d}")
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute("PRAGMA synchronous = NORMAL")
            self._conn.execute("PRAGMA foreign_keys = ON")
            migrate(self._conn)
            found = self._conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'messages_fts'")
            self.has_fts = found.fetchone() is not None
        except BaseException:
            self._conn.close()
            raise

    # --- lifecycle ---

    def close(self) -> None:
        """Close the connection. The object is unusable afterwards (:attr:`is_closed` says so)."""
        with self._lock:
            self._conn.close()
            self.is_closed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        """The schema version of the open database."""
        with self._lock:
            return schema_version(self._conn)

    def check_integrity(self) -> list[str]:
        """Run SQLite's integrity check, and the search index's; return the problems (none: ``[]``)."""
        with self._lock:
            problems = [str(row[0]) for row in self._conn.execute("PRAGMA integrity_check")]
            if self.has_fts:
                try:
                    self._conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")
                except sqlite3.DatabaseError as error:
                    problems.append(f"message search index: {error}")
        return [] if problems == ["ok"] else problems

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Group writes into one transaction: all of them land, or none (on an exception).

        Nested batches join the outermost one. The lock is held throughout, so keep batches short.
        """
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            self._conn.execute("BEGIN IMMEDIATE")
            self._depth = 1
            try:
                yield
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
            finally:
                self._depth = 0

    def _one(self, sql: str, params: Sequence[object] = ()) -> tuple[Any, ...] | None:
        with self._lock:
            row: tuple[Any, ...] | None = self._conn.execute(sql, params).fetchone()
            return row

    def _all(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._conn.execute(sql, params).fetchall())

    def _write(self, sql: str, params: Sequence[object] = ()) -> sqlite3.Cursor:
        with self.batch():
            return self._conn.execute(sql, params)

    # --- conversations ---

    def create_conversation(
        self,
        title: str = DEFAULT_TITLE,
        system_prompt: str | None = None,
        preset_id: int | None = None,
        *,
        created_at: float | None = None,
    ) -> Conversation:
        """Start a conversation.

        Args:
            title: Shown in the sidebar.
            system_prompt: The conversation's system prompt; when ``None`` and ``preset_id`` is given,
                the preset's prompt is copied in.
            preset_id: The preset it was started from.
            created_at: Override the creation time (used by import).

        Raises:
            ValueError: ``title`` is blank or ``preset_id`` names no preset.
        """
        title = self._check_title(title)
        with self.batch():
            if preset_id is not None:
                preset = self.get_preset(preset_id)
                if system_prompt is None:
                    system_prompt = preset.system_prompt
            now = self._clock()
            created = now if created_at is None else created_at
            cursor = self._write(
                "INSERT INTO conversations (title, created_at, updated_at, system_prompt, preset_id) "
                "VALUES (?, ?, ?, ?, ?)",
                (title, created, now, system_prompt, preset_id),
            )
            return self.get_conversation(int(cursor.lastrowid or 0))

    def get_conversation(self, conversation_id: int) -> Conversation:
        """Return one conversation, deleted or not.

        Raises:
            ValueError: No conversation has this id.
        """
        row = self._one(f"SELECT {_CONV_COLS} FROM conversations WHERE id = ?", (conversation_id,))
        if row is None:
            raise ValueError(f"no conversation with id {conversation_id}")
        return _conversation(row)

    def list_conversations(self, include_deleted: bool = False) -> list[Conversation]:
        """Return conversations, most recently updated first."""
        where = "" if include_deleted else "WHERE deleted_at IS NULL"
        rows = self._all(f"SELECT {_CONV_COLS} FROM conversations {where} ORDER BY updated_at DESC, id DESC")
        return [_conversation(row) for row in rows]

    def rename_conversation(self, conversation_id: int, title: str) -> Conversation:
        """Set a conversation's title.

        Raises:
            ValueError: ``title`` is blank, or no conversation has this id.
        """
        return self._update_conversation(conversation_id, title=self._check_title(title))

    def auto_title(self, conversation_id: int, first_question: str) -> Conversation:
        """Title a conversation after its first question, unless the user already named it.

        Only a conversation still called :data:`DEFAULT_TITLE` is renamed; see :func:`make_title`.
        """
        with self.batch():
            conversation = self.get_conversation(conversation_id)
            title = make_title(first_question)
            if conversation.title != DEFAULT_TITLE or title == DEFAULT_TITLE:
                return conversation
            return self._update_conversation(conversation_id, title=title)

    def set_system_prompt(
        self, conversation_id: int, system_prompt: str | None, preset_id: int | None = None
    ) -> Conversation:
        """Replace the conversation's system prompt (and the preset it came from, if any)."""
        with self.batch():
            if preset_id is not None:
                self.get_preset(preset_id)
            return self._update_conversation(
                conversation_id, system_prompt=system_prompt, preset_id=preset_id
            )

    def set_sampling(
        self,
        conversation_id: int,
        temperature: float | None,
        top_p: float | None,
        max_tokens: int | None,
    ) -> Conversation:
        """Store the conversation's sampling parameters; ``None`` means the app's default.

        Raises:
            ValueError: ``temperature`` < 0, ``top_p`` outside (0, 1], or ``max_tokens`` < 1.
        """
        if temperature is not None and temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if top_p is not None and not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        return self._update_conversation(
            conversation_id, temperature=temperature, top_p=top_p, max_tokens=max_tokens
        )

    def set_reply_format(
        self, conversation_id: int, response_format: str | None, json_schema: str | None = None
    ) -> Conversation:
        """Store how replies are written: ``"json"`` (against ``json_schema``, JSON text, when set) or ``None``
        for free text. The schema is kept while the format is free text, for when JSON is turned back on.

        Raises:
            ValueError: an unknown format, or a schema that is not the text of a JSON object.
        """
        if response_format not in (None, "json"):
            raise ValueError(f"response_format must be 'json' or None, got {response_format!r}")
        if json_schema is not None:
            try:
                is_object = isinstance(json.loads(json_schema), dict)
            except ValueError:
                is_object = False
            if not is_object:
                raise ValueError("json_schema must be the text of a JSON object")
        return self._update_conversation(
            conversation_id, response_format=response_format, json_schema=json_schema
        )

    def set_model(self, conversation_id: int, model: str | None) -> Conversation:
        """Remember which model the conversation uses."""
        return self._update_conversation(conversation_id, model=model)

    def delete_conversation(self, conversation_id: int) -> Conversation:
        """Move a conversation to the trash; :meth:`undo_delete` brings it back."""
        return self._update_conversation(conversation_id, deleted_at=self._clock(), touch=False)

    def undo_delete(self, conversation_id: int) -> Conversation:
        """Restore a conversation from the trash."""
        return self._update_conversation(conversation_id, deleted_at=None, touch=False)

    def purge_deleted(self, older_than_s: float = 0.0) -> int:
        """Erase conversations in the trash for at least ``older_than_s`` seconds, with their messages.

        Returns:
            How many conversations were erased.
        """
        if older_than_s < 0:
            raise ValueError(f"older_than_s must be >= 0, got {older_than_s}")
        cursor = self._write(
            "DELETE FROM conversations WHERE deleted_at IS NOT NULL AND deleted_at <= ?",
            (self._clock() - older_than_s,),
        )
        return cursor.rowcount

    def search(self, text: str, limit: int = 50) -> list[tuple[Conversation, str]]:
        """Find conversations (not in the trash) whose title or any message contains ``text``.

        Matching is case-insensitive and by substring, across all branches.

        Returns:
            Up to ``limit`` pairs of conversation and a one-line snippet around the first match,
            most recently updated conversation first.
        """
        needle = text.strip()
        if not needle:
            return []
        pattern = _like_pattern(needle)
        hits: dict[int, tuple[Conversation, str]] = {}
        for row in self._all(
            f"SELECT {_CONV_COLS} FROM conversations WHERE deleted_at IS NULL AND title LIKE ? ESCAPE '\\'",
            (pattern,),
        ):
            conversation = _conversation(row)
            hits[conversation.id] = (conversation, conversation.title)
        if self.has_fts and len(needle) >= 3:  # the trigram index needs three characters
            match = "m.id IN (SELECT rowid FROM messages_fts WHERE messages_fts MATCH ?)"
            param = '"' + needle.replace('"', '""') + '"'
        else:
            match, param = "m.content LIKE ? ESCAPE '\\'", pattern
        for row in self._all(
            f"SELECT m.conversation_id, m.content FROM messages m "
            f"JOIN conversations c ON c.id = m.conversation_id "
            f"WHERE c.deleted_at IS NULL AND {match} ORDER BY m.id",
            (param,),
        ):
            conversation_id, content = int(row[0]), str(row[1])
            if conversation_id not in hits:
                hits[conversation_id] = (self.get_conversation(conversation_id), _snippet(content, needle))
        ordered = sorted(hits.values(), key=lambda hit: (-hit[0].updated_at, -hit[0].id))
        return ordered[:limit]

    def _check_title(self, title: str) -> str:
        title = " ".join(title.split())
        if not title:
            raise ValueError("a conversation title must not be blank")
        return title

    def _update_conversation(
        self, conversation_id: int, *, touch: bool = True, **values: object
    ) -> Conversation:
        """Set columns of one conversation (and ``updated_at`` when ``touch``), then return it."""
        if touch:
            values["updated_at"] = self._clock()
        assignments = ", ".join(f"{name} = ?" for name in values)
        with self.batch():
            cursor = self._write(
                f"UPDATE conversations SET {assignments} WHERE id = ?", (*values.values(), conversation_id)
            )
            if cursor.rowcount == 0:
                raise ValueError(f"no conversation with id {conversation_id}")
            return self.get_conversation(conversation_id)

    # --- messages ---

    def add_message(
        self,
        conversation_id: int,
        role: str,
        content: str,
        parent_id: int | None = None,
        *,
        model: str | None = None,
        quantization: str | None = None,
        num_prompt_tokens: int | None = None,
        num_generated_tokens: int | None = None,
        ttft_s: float | None = None,
        tok_s: float | None = None,
        finish_reason: str | None = None,
        is_complete: bool = True,
        created_at: float | None = None,
    ) -> Message:
        """Append a message under ``parent_id`` and make it the conversation's active leaf.

        A second child of the same parent is a branch: that is how an edited question or a
        regenerated reply is stored. A streaming reply starts with ``is_complete=False``.

        Raises:
            ValueError: Unknown role, conversation or parent, or a parent from another conversation.
        """
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}; got {role!r}")
        _check_meta(num_prompt_tokens, num_generated_tokens, ttft_s, tok_s)
        with self.batch():
            self.get_conversation(conversation_id)
            if parent_id is not None and self.get_message(parent_id).conversation_id != conversation_id:
                raise ValueError(f"message {parent_id} belongs to another conversation")
            now = self._clock()
            cursor = self._write(
                f"INSERT INTO messages ({_MSG_COLS.removeprefix('id, ')}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    conversation_id, parent_id, role, content, model, quantization,
                    num_prompt_tokens, num_generated_tokens, ttft_s, tok_s, finish_reason,
                    now if created_at is None else created_at, int(is_complete),
                ),
            )  # fmt: skip
            message_id = int(cursor.lastrowid or 0)
            self._update_conversation(conversation_id, active_leaf_id=message_id)
            return self.get_message(message_id)

    def add_message_tree(self, conversation_id: int, messages: Iterable[MessageNode],
                         active_key: object = None) -> Conversation:
        """Write a whole message tree (an import) at once, and show the branch ending at ``active_key``.

        Unlike :meth:`add_message`, nothing is read back per message, so the time grows with the number of
        messages only. Parents must come before their children.

        Returns:
            The conversation, with ``active_key``'s message as its active leaf (None: no active leaf).

        Raises:
            ValueError: an unknown role, conversation or parent key, a negative metric, or an unknown
                ``active_key``; nothing is written then.
        """
        with self.batch():
            self.get_conversation(conversation_id)
            now = self._clock()
            # Ids are given here (after the highest ever used, as AUTOINCREMENT would), so the rows go in with
            # one executemany and no read-back.
            used = self._conn.execute(
                "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'messages'), 0), "
                "coalesce((SELECT max(id) FROM messages), 0))"
            ).fetchone()
            next_id = int(used[0]) + 1
            new_ids: dict[object, int] = {}
            rows: list[tuple[object, ...]] = []
            for node in messages:
                if node.role not in ROLES:
                    raise ValueError(f"role must be one of {', '.join(ROLES)}; got {node.role!r:.60}")
                meta = node.metadata
                _check_meta(meta.get("num_prompt_tokens"), meta.get("num_generated_tokens"), meta.get("ttft_s"),
                            meta.get("tok_s"))
                if node.parent_key is not None and node.parent_key not in new_ids:
                    raise ValueError(f"message {node.key!r:.60}: its parent does not come before it")
                if node.key in new_ids:
                    raise ValueError(f"message {node.key!r:.60} appears twice")
                new_ids[node.key] = next_id
                rows.append((
                    next_id, conversation_id, None if node.parent_key is None else new_ids[node.parent_key],
                    node.role, node.content, meta.get("model"), meta.get("quantization"),
                    meta.get("num_prompt_tokens"), meta.get("num_generated_tokens"), meta.get("ttft_s"),
                    meta.get("tok_s"), meta.get("finish_reason"), now if node.created_at is None else node.created_at,
                    int(node.is_complete),
                ))
                next_id += 1
            if active_key is not None and active_key not in new_ids:
                raise ValueError(f"the active message {active_key!r:.60} is not in the tree")
            self._conn.executemany(f"INSERT INTO messages ({_MSG_COLS}) VALUES ({', '.join('?' * 14)})", rows)
            leaf = None if active_key is None else new_ids[active_key]
            return self._update_conversation(conversation_id, active_leaf_id=leaf)

    def update_message(
        self,
        message_id: int,
        *,
        content: str | None = None,
        is_complete: bool | None = None,
        model: str | None = None,
        quantization: str | None = None,
        num_prompt_tokens: int | None = None,
        num_generated_tokens: int | None = None,
        ttft_s: float | None = None,
        tok_s: float | None = None,
        finish_reason: str | None = None,
    ) -> Message:
        """Change a message in place: the streaming reply's partial saves and its final one.

        Arguments left ``None`` keep their stored value.

        Raises:
            ValueError: No message has this id, or a metric is negative.
        """
        _check_meta(num_prompt_tokens, num_generated_tokens, ttft_s, tok_s)
        values: dict[str, object] = {
            name: value
            for name, value in (
                ("content", content),
                ("is_complete", None if is_complete is None else int(is_complete)),
                ("model", model),
                ("quantization", quantization),
                ("num_prompt_tokens", num_prompt_tokens),
                ("num_generated_tokens", num_generated_tokens),
                ("ttft_s", ttft_s),
                ("tok_s", tok_s),
                ("finish_reason", finish_reason),
            )
            if value is not None
        }
        with self.batch():
            message = self.get_message(message_id)
            if values:
                assignments = ", ".join(f"{name} = ?" for name in values)
                self._write(f"UPDATE messages SET {assignments} WHERE id = ?", (*values.values(), message_id))
                self._update_conversation(message.conversation_id)
            return self.get_message(message_id)

    def get_message(self, message_id: int) -> Message:
        """Return one message.

        Raises:
            ValueError: No message has this id.
        """
        row = self._one(f"SELECT {_MSG_COLS} FROM messages WHERE id = ?", (message_id,))
        if row is None:
            raise ValueError(f"no message with id {message_id}")
        return _message(row)

    def messages(self, conversation_id: int) -> list[Message]:
        """Return every message of a conversation, all branches, oldest first."""
        rows = self._all(
            f"SELECT {_MSG_COLS} FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)
        )
        return [_message(row) for row in rows]

    def children(self, message_id: int) -> list[Message]:
        """Return the replies to a message, oldest first; more than one means branches."""
        rows = self._all(f"SELECT {_MSG_COLS} FROM messages WHERE parent_id = ? ORDER BY id", (message_id,))
        return [_message(row) for row in rows]

    def siblings(self, message_id: int) -> list[Message]:
        """Return the message and its alternatives (same parent, roots included), oldest first."""
        message = self.get_message(message_id)
        rows = self._all(
            f"SELECT {_MSG_COLS} FROM messages WHERE conversation_id = ? AND parent_id IS ? ORDER BY id",
            (message.conversation_id, message.parent_id),
        )
        return [_message(row) for row in rows]

    def path_to(self, leaf_id: int) -> list[Message]:
        """Return the messages from the root down to ``leaf_id``, inclusive.

        Raises:
            ValueError: No message has this id.
        """
        rows = self._all(
            f"""WITH RECURSIVE path(id, depth) AS (
                    SELECT id, 0 FROM messages WHERE id = ?
                    UNION ALL
                    SELECT m.parent_id, path.depth + 1 FROM messages m JOIN path ON m.id = path.id
                    WHERE m.parent_id IS NOT NULL
                )
                SELECT {_MSG_COLS_M} FROM path JOIN messages m ON m.id = path.id ORDER BY path.depth DESC""",
            (leaf_id,),
        )
        if not rows:
            raise ValueError(f"no message with id {leaf_id}")
        return [_message(row) for row in rows]

    def latest_leaf(self, message_id: int) -> Message:
        """Follow the newest reply from ``message_id`` down to a leaf (used when switching branch)."""
        message = self.get_message(message_id)
        while replies := self.children(message.id):
            message = replies[-1]
        return message

    def set_active_leaf(self, conversation_id: int, leaf_id: int | None) -> Conversation:
        """Choose which branch the conversation shows.

        Raises:
            ValueError: ``leaf_id`` belongs to another conversation or does not exist.
        """
        with self.batch():
            if leaf_id is not None and self.get_message(leaf_id).conversation_id != conversation_id:
                raise ValueError(f"message {leaf_id} belongs to another conversation")
            return self._update_conversation(conversation_id, active_leaf_id=leaf_id, touch=False)

    def active_path(self, conversation_id: int) -> list[Message]:
        """Return the branch the conversation shows, root first (empty for a new conversation)."""
        leaf_id = self.get_conversation(conversation_id).active_leaf_id
        return [] if leaf_id is None else self.path_to(leaf_id)

    # --- presets ---

    def add_preset(self, name: str, system_prompt: str) -> Preset:
        """Save a new preset.

        Raises:
            ValueError: ``name`` is blank or already taken.
        """
        name = self._check_preset_name(name)
        with self.batch():
            try:
                cursor = self._write(
                    "INSERT INTO presets (name, system_prompt, created_at) VALUES (?, ?, ?)",
                    (name, system_prompt, self._clock()),
                )
            except sqlite3.IntegrityError:
                raise ValueError(f"a preset named {name!r} already exists") from None
            return self.get_preset(int(cursor.lastrowid or 0))

    def get_preset(self, preset_id: int) -> Preset:
        """Return one preset.

        Raises:
            ValueError: No preset has this id.
        """
        row = self._one(f"SELECT {_PRESET_COLS} FROM presets WHERE id = ?", (preset_id,))
        if row is None:
            raise ValueError(f"no preset with id {preset_id}")
        return _preset(row)

    def update_preset(
        self, preset_id: int, *, name: str | None = None, system_prompt: str | None = None
    ) -> Preset:
        """Rename a preset or change its prompt; arguments left ``None`` keep their value.

        Conversations started from it keep the prompt they copied.

        Raises:
            ValueError: No such preset, or ``name`` is blank or taken.
        """
        with self.batch():
            preset = self.get_preset(preset_id)
            name = preset.name if name is None else self._check_preset_name(name)
            prompt = preset.system_prompt if system_prompt is None else system_prompt
            try:
                self._write(
                    "UPDATE presets SET name = ?, system_prompt = ? WHERE id = ?", (name, prompt, preset_id)
                )
            except sqlite3.IntegrityError:
                raise ValueError(f"a preset named {name!r} already exists") from None
            return self.get_preset(preset_id)

    def delete_preset(self, preset_id: int) -> None:
        """Remove a preset; conversations started from it keep their prompt.

        Raises:
            ValueError: No preset has this id.
        """
        if self._write("DELETE FROM presets WHERE id = ?", (preset_id,)).rowcount == 0:
            raise ValueError(f"no preset with id {preset_id}")

    def list_presets(self) -> list[Preset]:
        """Return all presets, oldest (the defaults) first."""
        return [_preset(row) for row in self._all(f"SELECT {_PRESET_COLS} FROM presets ORDER BY id")]

    def _check_preset_name(self, name: str) -> str:
        name = name.strip()
        if not name:
            raise ValueError("a preset name must not be blank")
        return name
