"""The document index in SQLite: collections, files, chunks with their positions and vectors, FTS5 for BM25.

One database file, ``documents.sqlite3``, in the index's home folder (by default ``documents/`` in Hearth's data
folder). Tables:

- ``collections``: a name, the embedder its vectors come from, and a generation bumped by every change, so a
  process holding vectors in memory knows when to reload them.
- ``roots``: the files and folders a collection watches; every indexing run scans them all again.
- ``files``: one row per file seen: mtime, size, SHA-256, and ``reason`` when it was skipped.
- ``chunks``: file, page, start/end character offsets, text, and the vector as a float32 BLOB.
- ``chunks_fts``: an FTS5 index over ``chunks.text`` (external content, kept by triggers), ranked by ``bm25()``.
- ``queue``: files still to index. Each file is indexed in one transaction that also removes it from the queue,
  so a process killed at any point (``kill -9`` included) leaves either the old or the new chunks, never both,
  and the next run picks up the files still queued.

Vectors are searched exactly with numpy, not with ``sqlite-vec``: that extension must be loaded into SQLite, and
Python's ``sqlite3`` module is often built without ``enable_load_extension`` (the Python Hearth is developed on is),
so it cannot be relied on. A dot product over a collection's vectors, read lazily into memory once per collection
(``engine/docs/search.py``), is exact where an approximate index is not, and needs no extension at all.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from engine.system.paths import data_dir, ensure_private_dir

DB_NAME = "documents.sqlite3"
#: How long a connection waits for another one's write before "database is locked".
BUSY_TIMEOUT_S = 30.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS collections (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    embedder TEXT NOT NULL,
    dim INTEGER NOT NULL DEFAULT 0,
    chunking TEXT NOT NULL DEFAULT '',
    generation INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS roots (
    collection_id INTEGER NOT NULL REFERENCES collections(id) ON DELETE CASCADE,
    path TEXT NOT NULL,
    PRIMARY KEY (collection_id, path)
);
CREATE TABLE IF NOT EXISTS files (
    id INTEGER PRIMARY KEY,
    collection_id INTEGER NOT NULL REFERENCES collections(id) ON DELETE CASCADE,
    path TEXT NOT NULL,
    mtime REAL NOT NULL,
    size INTEGER NOT NULL,
    sha256 TEXT,
    reason TEXT,
    indexed REAL NOT NULL,
    UNIQUE (collection_id, path)
);
CREATE TABLE IF NOT EXISTS chunks (
    id INTEGER PRIMARY KEY,
    file_id INTEGER NOT NULL REFERENCES files(id) ON DELETE CASCADE,
    collection_id INTEGER NOT NULL,
    page INTEGER,
    start INTEGER NOT NULL,
    "end" INTEGER NOT NULL,
    text TEXT NOT NULL,
    vector BLOB
);
CREATE INDEX IF NOT EXISTS chunks_by_file ON chunks(file_id);
CREATE INDEX IF NOT EXISTS chunks_by_collection ON chunks(collection_id);
CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5(text, content='chunks', content_rowid='id');
CREATE TRIGGER IF NOT EXISTS chunks_ai AFTER INSERT ON chunks BEGIN
    INSERT INTO chunks_fts(rowid, text) VALUES (new.id, new.text);
END;
CREATE TRIGGER IF NOT EXISTS chunks_ad AFTER DELETE ON chunks BEGIN
    INSERT INTO chunks_fts(chunks_fts, rowid, text) VALUES ('delete', old.id, old.text);
END;
CREATE TABLE IF NOT EXISTS queue (
    collection_id INTEGER NOT NULL REFERENCES collections(id) ON DELETE CASCADE,
    path TEXT NOT NULL,
    PRIMARY KEY (collection_id, path)
);
"""


def default_home() -> Path:
    """The index's default home folder: ``documents/`` in Hearth's data folder."""
    return data_dir() / "documents"


def connect(home: Path | None = None) -> sqlite3.Connection:
    """Open (creating if needed) the index database in ``home``, in WAL mode so readers never wait for indexing."""
    folder = ensure_private_dir(Path(home) if home is not None else default_home())
    conn = sqlite3.connect(folder / DB_NAME, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    conn.row_factory = sqlite3.Row
    _use_wal(conn)
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.executescript(SCHEMA)
    _add_column(conn, "collections", "chunking", "TEXT NOT NULL DEFAULT ''")
    return conn


def _add_column(conn: sqlite3.Connection, table: str, column: str, declaration: str) -> None:
    """Give an index made by an earlier version the column it lacks (its rows take the default)."""
    if column not in {row["name"] for row in conn.execute(f"PRAGMA table_info({table})")}:
        try:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
        except sqlite3.OperationalError as exc:  # another connection added it meanwhile
            if "duplicate column" not in str(exc):
                raise


def _use_wal(conn: sqlite3.Connection) -> None:
    """Switch to WAL, waiting while another connection holds the database: SQLite answers this pragma "database is
    locked" at once rather than waiting its busy timeout, so two connections opening a new index together (the
    app's indexing thread and its GUI thread) would fail."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                conn.close()
                raise
            time.sleep(0.01)


def collection_row(conn: sqlite3.Connection, name: str) -> sqlite3.Row | None:
    """The collection called ``name``, or ``None``."""
    row: sqlite3.Row | None = conn.execute("SELECT * FROM collections WHERE name = ?", (name,)).fetchone()
    return row


def create_collection(conn: sqlite3.Connection, name: str, embedder: str, dim: int,
                      chunking: str = "") -> sqlite3.Row:
    """Create the collection ``name`` with chunks cut as ``chunking`` says (an existing one is returned as it is)."""
    if not name.strip():
        raise ValueError("a collection needs a name")
    conn.execute(
        "INSERT OR IGNORE INTO collections(name, embedder, dim, chunking, created) VALUES (?, ?, ?, ?, ?)",
        (name, embedder, dim, chunking, time.time()),
    )
    row = collection_row(conn, name)
    assert row is not None
    return row


def list_collections(conn: sqlite3.Connection) -> list[dict[str, object]]:
    """Every collection with its embedder, roots and counts of files, skipped files, chunks and queued files."""
    out: list[dict[str, object]] = []
    for row in conn.execute("SELECT * FROM collections ORDER BY name").fetchall():
        cid = row["id"]

        def count(sql: str, cid: int = cid) -> int:
            return int(conn.execute(sql, (cid,)).fetchone()[0])

        out.append(
            {
                "name": row["name"],
                "embedder": row["embedder"],
                "roots": [
                    r[0] for r in conn.execute("SELECT path FROM roots WHERE collection_id = ?", (cid,))
                ],
                "files": count("SELECT COUNT(*) FROM files WHERE collection_id = ? AND reason IS NULL"),
                "skipped": count("SELECT COUNT(*) FROM files WHERE collection_id = ? AND reason IS NOT NULL"),
                "chunks": count("SELECT COUNT(*) FROM chunks WHERE collection_id = ?"),
                "queued": count("SELECT COUNT(*) FROM queue WHERE collection_id = ?"),
            }
        )
    return out


def remove_root(conn: sqlite3.Connection, name: str, path: str) -> int:
    """Stop watching ``path`` in collection ``name``: the root goes, with the files under it that no other root
    holds and their chunks. Returns how many files were dropped (0 for an unknown collection or root)."""
    row = collection_row(conn, name)
    if row is None:
        return 0
    cid, root = int(row["id"]), str(Path(path).resolve())
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("DELETE FROM roots WHERE collection_id = ? AND path = ?", (cid, root))
        others = [Path(r[0]) for r in conn.execute("SELECT path FROM roots WHERE collection_id = ?", (cid,))]
        gone = [
            r[0]
            for r in conn.execute("SELECT path FROM files WHERE collection_id = ?", (cid,))
            if Path(r[0]).is_relative_to(root) and not any(Path(r[0]).is_relative_to(o) for o in others)
        ]
        for file in gone:
            conn.execute("DELETE FROM files WHERE collection_id = ? AND path = ?", (cid, file))
            conn.execute("DELETE FROM queue WHERE collection_id = ? AND path = ?", (cid, file))
        conn.execute("UPDATE collections SET generation = generation + 1 WHERE id = ?", (cid,))
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return len(gone)
