"""The conversation database's schema, and the steps that bring an older file up to date.

The schema version lives in ``PRAGMA user_version``; :data:`MIGRATIONS` upgrades it step by step, each
step in one transaction with its version bump.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable

#: The presets a new database starts with (schema 1 seeds them).
DEFAULT_PRESETS: tuple[tuple[str, str], ...] = (
    ("Helpful assistant", "You are a helpful assistant."),
    ("Concise", "You are a helpful assistant. Answer briefly and directly, without preamble."),
    (
        "Code reviewer",
        (
            "You are a careful code reviewer. Point out bugs, unclear names and missing tests, "
            "and suggest concrete fixes."
        ),
    ),
    ("Translator", "Translate the user's text into English, keeping its meaning and tone."),
)


# Each migration runs inside one transaction together with its ``user_version`` bump. Statements are
# listed one by one because ``executescript`` would commit the surrounding transaction.

_SCHEMA_1 = (
    """CREATE TABLE presets (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL UNIQUE,
        system_prompt TEXT NOT NULL,
        created_at REAL NOT NULL
    )""",
    """CREATE TABLE conversations (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        title TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        system_prompt TEXT,
        preset_id INTEGER REFERENCES presets(id) ON DELETE SET NULL,
        temperature REAL,
        top_p REAL,
        max_tokens INTEGER,
        model TEXT,
        deleted_at REAL,
        active_leaf_id INTEGER REFERENCES messages(id) ON DELETE SET NULL
    )""",
    """CREATE TABLE messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE,
        role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
        content TEXT NOT NULL,
        model TEXT,
        quantization TEXT,
        num_prompt_tokens INTEGER,
        num_generated_tokens INTEGER,
        ttft_s REAL,
        tok_s REAL,
        finish_reason TEXT,
        created_at REAL NOT NULL,
        is_complete INTEGER NOT NULL DEFAULT 1
    )""",
    "CREATE INDEX messages_by_conversation ON messages(conversation_id)",
    "CREATE INDEX messages_by_parent ON messages(parent_id)",
    "CREATE INDEX conversations_by_updated ON conversations(deleted_at, updated_at)",
)

_FTS_TABLE = (
    "CREATE VIRTUAL TABLE messages_fts USING fts5("
    "content, content='messages', content_rowid='id', tokenize='trigram')"
)
_FTS_STATEMENTS = (
    """CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
        INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
    END""",
    """CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
    END""",
    """CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN
        INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
        INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
    END""",
    # Backfill: index the messages written under schema 1.
    "INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')",
)


def _migrate_1_initial_schema(conn: sqlite3.Connection) -> None:
    """Create conversations, messages and presets, and seed the default presets."""
    for statement in _SCHEMA_1:
        conn.execute(statement)
    now = time.time()
    conn.executemany(
        "INSERT INTO presets (name, system_prompt, created_at) VALUES (?, ?, ?)",
        [(name, prompt, now) for name, prompt in DEFAULT_PRESETS],
    )


def _migrate_2_message_search_index(conn: sqlite3.Connection) -> None:
    """Add an FTS5 trigram index over message content, kept current by triggers.

    Where this SQLite lacks FTS5 or its trigram tokenizer, the step is a no-op and
    :meth:`Storage.search` falls back to ``LIKE``.
    """
    try:
        conn.execute(_FTS_TABLE)
    except sqlite3.OperationalError:
        return
    for statement in _FTS_STATEMENTS:
        conn.execute(statement)


def _migrate_3_reply_format(conn: sqlite3.Connection) -> None:
    """Add the conversation's reply format ("json" or NULL for free text) and its optional JSON schema (text)."""
    conn.execute("ALTER TABLE conversations ADD COLUMN response_format TEXT")
    conn.execute("ALTER TABLE conversations ADD COLUMN json_schema TEXT")


def _migrate_4_documents(conn: sqlite3.Connection) -> None:
    """Add the files attached to each conversation (``reason``: why one could not be read, else NULL) and the
    numbered sources each reply was given (a JSON list, in the prompt's order)."""
    conn.execute(
        """CREATE TABLE attachments (
            conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            path TEXT NOT NULL,
            added_at REAL NOT NULL,
            reason TEXT,
            PRIMARY KEY (conversation_id, path)
        )"""
    )
    conn.execute(
        """CREATE TABLE reply_sources (
            message_id INTEGER PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
            sources TEXT NOT NULL
        )"""
    )


def _migrate_5_chat_collections(conn: sqlite3.Connection) -> None:
    """Add the document collections (watched folders, by their name in the document index) each conversation
    answers from besides its own attached files."""
    conn.execute(
        """CREATE TABLE conversation_collections (
            conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            name TEXT NOT NULL,
            added_at REAL NOT NULL,
            PRIMARY KEY (conversation_id, name)
        )"""
    )


def _migrate_6_tool_steps(conn: sqlite3.Connection) -> None:
    """Add each reply's tool steps (the call, its arguments as JSON text, the outcome: "ok", "error" or
    "denied", and the result's text, in the order they ran) and each chat's tools choice (on or off, and the
    MCP servers turned off for it, a JSON list)."""
    conn.execute(
        """CREATE TABLE tool_steps (
            message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            server TEXT NOT NULL,
            tool TEXT NOT NULL,
            arguments TEXT NOT NULL,
            outcome TEXT NOT NULL,
            result TEXT NOT NULL,
            PRIMARY KEY (message_id, position)
        )"""
    )
    conn.execute(
        """CREATE TABLE conversation_tools (
            conversation_id INTEGER PRIMARY KEY REFERENCES conversations(id) ON DELETE CASCADE,
            enabled INTEGER NOT NULL,
            servers_off TEXT NOT NULL
        )"""
    )


def _migrate_7_reply_context(conn: sqlite3.Connection) -> None:
    """Add the replies whose chat was cut to fit the context: how many messages were left out, and the context
    (in tokens) they were left out of, so the line over such a reply shows again after a restart."""
    conn.execute(
        """CREATE TABLE reply_context (
            message_id INTEGER PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
            num_dropped_messages INTEGER NOT NULL,
            context_length INTEGER NOT NULL
        )"""
    )


MIGRATIONS: tuple[Callable[[sqlite3.Connection], None], ...] = (
    _migrate_1_initial_schema,
    _migrate_2_message_search_index,
    _migrate_3_reply_format,
    _migrate_4_documents,
    _migrate_5_chat_collections,
    _migrate_6_tool_steps,
    _migrate_7_reply_context,
)
SCHEMA_VERSION = len(MIGRATIONS)


def schema_version(conn: sqlite3.Connection) -> int:
    """Return the schema version recorded in the database (0 for a new file)."""
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(conn: sqlite3.Connection, target: int | None = None) -> int:
    """Apply the pending migrations in order, each in its own transaction.

    Args:
        conn: A connection in autocommit mode (``isolation_level=None``).
        target: The version to stop at; the latest when ``None``. Tests use ``1`` to build an old file.

    Returns:
        The schema version after migrating.

    Raises:
        ValueError: The database is newer than this code, or ``target`` is out of range.
    """
    target = SCHEMA_VERSION if target is None else target
    if not 0 <= target <= SCHEMA_VERSION:
        raise ValueError(f"target schema version must be in 0..{SCHEMA_VERSION}, got {target}")
    if conn.isolation_level is not None:
        raise ValueError("migrate() needs a connection opened with isolation_level=None")
    version = schema_version(conn)
    if version > SCHEMA_VERSION:
        raise ValueError(
            f"database schema version {version} is newer than this Hearth supports ({SCHEMA_VERSION}); "
            "update Hearth to open it"
        )
    while version < target:
        conn.execute("BEGIN IMMEDIATE")
        try:
            MIGRATIONS[version](conn)
            version += 1
            conn.execute(f"PRAGMA user_version = {version:d}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    return version
