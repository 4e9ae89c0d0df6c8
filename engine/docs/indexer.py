"""Indexing a collection: scan its roots, queue what changed, index each queued file in its own transaction.

A file is queued when its mtime or size differs from the index; a queued file whose content hash is unchanged only
has its mtime updated. Files gone from the roots are dropped with their chunks. Reading, chunking and embedding run
outside any transaction; the write of one file's chunks and its removal from the queue commit together, so an
interrupted run (even ``kill -9``) resumes from the queue with no duplicate and no half-written file.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.docs import store
from engine.docs.chunking import chunk_pages, chunking_key
from engine.docs.embedders import Embedder, EmbedderChoice, choose_embedder, load_embedder
from engine.docs.readers import MAX_FILE_BYTES, UnreadableFile, is_supported, read_pages

#: Chunks embedded per call: bounds the memory one large file takes while it is embedded.
EMBED_BATCH = 256

Progress = Callable[[int, int, str], None]


@dataclass
class IndexReport:
    """What one indexing run did. ``skipped`` holds (path, reason) for each file that could not be read."""

    collection: str
    embedder: str
    embedder_reason: str
    indexed: list[str] = field(default_factory=list)
    unchanged: int = 0
    removed: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    chunks: int = 0


def scan(roots: list[str]) -> Iterator[Path]:
    """Every file under the roots: a root that is a file is taken whatever its suffix; folders are walked for the
    supported suffixes, skipping hidden files and folders."""
    for root in roots:
        path = Path(root)
        if path.is_file():
            yield path
        elif path.is_dir():
            for folder, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(files):
                    candidate = Path(folder) / name
                    if not name.startswith(".") and is_supported(candidate):
                        yield candidate


def _resolve_embedder(
    conn: sqlite3.Connection, name: str, requested: str
) -> tuple[sqlite3.Row, EmbedderChoice]:
    row = store.collection_row(conn, name)
    lost = ""
    kept: EmbedderChoice | None = None
    if row is not None and requested == "auto":
        # the collection keeps the embedder its vectors came from, while it loads and gives vectors of their size
        try:
            embedder = load_embedder(row["embedder"])
        except (OSError, ValueError, ImportError) as exc:
            lost = f" ({row['embedder']}, which made the collection's vectors, cannot load: {exc}; indexing again)"
        else:
            if embedder is None or embedder.dim == row["dim"]:
                what = _described(embedder, row["embedder"])
                kept = EmbedderChoice(embedder, row["embedder"], f"{what}: the collection's embedder")
            else:
                lost = f" ({row['embedder']} now gives {embedder.dim} dimensions, not {row['dim']}; indexing again)"
    choice = kept or choose_embedder(requested)
    if lost:
        choice = EmbedderChoice(choice.embedder, choice.name, choice.reason + lost)
    dim = choice.embedder.dim if choice.embedder is not None else 0
    chunking = chunking_key()
    if row is None:
        return store.create_collection(conn, name, choice.name, dim, chunking), choice
    if row["embedder"] != choice.name or row["dim"] != dim or row["chunking"] != chunking:
        # Vectors of two embedders cannot be compared, and chunks cut another way would sit beside new ones: every
        # file is indexed again with the new embedder and chunking.
        with _transaction(conn):
            conn.execute("DELETE FROM chunks WHERE collection_id = ?", (row["id"],))
            conn.execute("UPDATE files SET sha256 = NULL, mtime = -1 WHERE collection_id = ?", (row["id"],))
            conn.execute(
                "UPDATE collections SET embedder = ?, dim = ?, chunking = ?, generation = generation + 1 WHERE id = ?",
                (choice.name, dim, chunking, row["id"]),
            )
        row = store.collection_row(conn, name)
        assert row is not None
    return row, choice


def _described(embedder: Embedder | None, name: str) -> str:
    """An embedder in words, as :func:`~engine.docs.embedders.choose_embedder` names it."""
    if embedder is None:
        return "BM25 alone"
    if name == "wordllama":
        return f"WordLlama static embeddings ({embedder.dim} dimensions)"
    return str(getattr(embedder, "description", None) or name)


class _transaction:
    """``BEGIN IMMEDIATE`` … ``COMMIT``, rolled back on an exception."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, kind: object, value: object, traceback: object) -> None:
        self.conn.execute("ROLLBACK" if kind is not None else "COMMIT")


def index_collection(
    conn: sqlite3.Connection,
    name: str,
    paths: list[Path] | None = None,
    embedder: str = "auto",
    progress: Progress | None = None,
) -> IndexReport:
    """Add ``paths`` to the collection's roots, then bring the index up to date with every root.

    Raises:
        ValueError: for an unknown or unavailable embedder, or an empty name.
        FileNotFoundError: for a path in ``paths`` that does not exist.
    """
    for path in paths or []:
        if not Path(path).exists():
            raise FileNotFoundError(f"no such file or folder: {path}")
    row, choice = _resolve_embedder(conn, name, embedder)
    cid = int(row["id"])
    report = IndexReport(name, choice.name, choice.reason)
    with _transaction(conn):
        for path in paths or []:
            conn.execute(
                "INSERT OR IGNORE INTO roots(collection_id, path) VALUES (?, ?)",
                (cid, str(Path(path).resolve())),
            )
    roots = [r[0] for r in conn.execute("SELECT path FROM roots WHERE collection_id = ?", (cid,))]
    known = {
        r["path"]: (r["mtime"], r["size"])
        for r in conn.execute("SELECT path, mtime, size FROM files WHERE collection_id = ?", (cid,))
    }
    seen: set[str] = set()
    with _transaction(conn):
        for path in scan(roots):
            key = str(path)
            if key in seen:
                continue
            seen.add(key)
            try:
                stat = path.stat()
            except OSError:
                continue
            if known.get(key) != (stat.st_mtime, stat.st_size):
                conn.execute("INSERT OR IGNORE INTO queue(collection_id, path) VALUES (?, ?)", (cid, key))
            else:
                report.unchanged += 1
        for key in sorted(set(known) - seen):
            conn.execute("DELETE FROM files WHERE collection_id = ? AND path = ?", (cid, key))
            conn.execute("DELETE FROM queue WHERE collection_id = ? AND path = ?", (cid, key))
            report.removed.append(key)
        if report.removed:
            conn.execute("UPDATE collections SET generation = generation + 1 WHERE id = ?", (cid,))
    queued = [
        r[0] for r in conn.execute("SELECT path FROM queue WHERE collection_id = ? ORDER BY path", (cid,))
    ]
    for done, key in enumerate(queued):
        if progress is not None:
            progress(done, len(queued), key)
        _index_file(conn, cid, Path(key), choice.embedder, report)
    if progress is not None:
        progress(len(queued), len(queued), "")
    return report


def _index_file(
    conn: sqlite3.Connection, cid: int, path: Path, embedder: Embedder | None, report: IndexReport
) -> None:
    key = str(path)
    try:
        stat = path.stat()
    except OSError:
        with _transaction(conn):
            conn.execute("DELETE FROM files WHERE collection_id = ? AND path = ?", (cid, key))
            conn.execute("DELETE FROM queue WHERE collection_id = ? AND path = ?", (cid, key))
            conn.execute("UPDATE collections SET generation = generation + 1 WHERE id = ?", (cid,))
        report.removed.append(key)
        return
    old = conn.execute(
        "SELECT id, sha256 FROM files WHERE collection_id = ? AND path = ?", (cid, key)
    ).fetchone()
    reason: str | None = None
    digest: str | None = None
    pages = []
    if stat.st_size > MAX_FILE_BYTES:
        reason = f"too large: {stat.st_size / 2**20:.0f} MiB (limit {MAX_FILE_BYTES // 2**20} MiB)"
    else:
        try:
            data = path.read_bytes()
        except OSError as exc:
            data, reason = b"", f"cannot open: {exc.strerror or exc}"
        if reason is None:
            digest = hashlib.sha256(data).hexdigest()
            if old is not None and old["sha256"] == digest:
                with _transaction(conn):
                    conn.execute(
                        "UPDATE files SET mtime = ?, size = ? WHERE id = ?",
                        (stat.st_mtime, stat.st_size, old["id"]),
                    )
                    conn.execute("DELETE FROM queue WHERE collection_id = ? AND path = ?", (cid, key))
                report.unchanged += 1
                return
            try:
                pages = read_pages(path, data)
            except UnreadableFile as exc:
                reason = str(exc)
    chunks = chunk_pages(pages) if reason is None else []
    vectors: list[bytes | None] = [None] * len(chunks)
    if embedder is not None and chunks:
        for i in range(0, len(chunks), EMBED_BATCH):
            batch = embedder.embed([c.text for c in chunks[i : i + EMBED_BATCH]]).astype(np.float32)
            vectors[i : i + len(batch)] = [v.tobytes() for v in batch]
    with _transaction(conn):
        if old is not None:
            conn.execute("DELETE FROM chunks WHERE file_id = ?", (old["id"],))
            conn.execute(
                "UPDATE files SET mtime = ?, size = ?, sha256 = ?, reason = ?, indexed = ? WHERE id = ?",
                (stat.st_mtime, stat.st_size, digest, reason, time.time(), old["id"]),
            )
            file_id = int(old["id"])
        else:
            cursor = conn.execute(
                "INSERT INTO files(collection_id, path, mtime, size, sha256, reason, indexed)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (cid, key, stat.st_mtime, stat.st_size, digest, reason, time.time()),
            )
            file_id = int(cursor.lastrowid or 0)
        conn.executemany(
            'INSERT INTO chunks(file_id, collection_id, page, start, "end", text, vector) VALUES (?, ?, ?, ?, ?, ?, ?)',
            [(file_id, cid, c.page, c.start, c.end, c.text, v) for c, v in zip(chunks, vectors, strict=True)],
        )
        conn.execute("DELETE FROM queue WHERE collection_id = ? AND path = ?", (cid, key))
        conn.execute("UPDATE collections SET generation = generation + 1 WHERE id = ?", (cid,))
    if reason is not None:
        report.skipped.append((key, reason))
    else:
        report.indexed.append(key)
        report.chunks += len(chunks)
