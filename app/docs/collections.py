"""Document collections: named sets of watched folders in the document index, any of which a chat may use.

No Qt. A collection lives in the ``engine.docs`` index (``documents/`` in the data folder) under its own name: its
folders are the collection's roots, and every indexing run scans them all again, so new files are read, changed
ones read again and deleted ones dropped. The collections holding one chat's attached files (``chat-<id>``,
:func:`app.docs.index.collection_name`) are not listed here and their names cannot be taken. Collections made with
``python -m engine.docs index ... --collection NAME`` are listed too. Every call opens its own connection.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from app.docs.index import DocumentIndex, IndexOutcome, Progress
from engine.docs import store
from engine.docs.indexer import index_collection

#: The names the chats' own collections take (see :func:`app.docs.index.collection_name`).
CHAT_COLLECTION = re.compile(r"chat-\d+")
#: Folders watched for changes at most, over all collections (each costs an inotify watch on Linux).
MAX_WATCHED_FOLDERS = 2000


@dataclass(frozen=True)
class CollectionInfo:
    """A collection as the dialog lists it: its folders, files read, files that could not be, files waiting, and
    the embedder its vectors come from (``wordllama``, ``bm25`` or a model's path)."""

    name: str
    roots: list[str] = field(default_factory=list)
    files: int = 0
    skipped: int = 0
    chunks: int = 0
    queued: int = 0
    embedder: str = ""


def embedder_label(embedder: str) -> str:
    """A collection's embedder (as the index records it) in words, for when the reason it was chosen is not known."""
    if embedder == "wordllama":
        return "WordLlama static embeddings"
    if embedder == "bm25":
        return "BM25 alone"
    return f"the embedding model {Path(embedder).name}" if embedder else ""


def is_chat_collection(name: str) -> bool:
    return CHAT_COLLECTION.fullmatch(name) is not None


def check_new(index: DocumentIndex, name: str, folders: list[str]) -> tuple[str, list[str]]:
    """The name (trimmed) and folders (absolute) of a collection about to be made.

    Raises:
        ValueError: no name, a name a chat's own collection uses or one taken already, no folder, or a folder
            that does not exist; in words for the user.
    """
    name = name.strip()
    if not name:
        raise ValueError("A collection needs a name.")
    if is_chat_collection(name):
        raise ValueError(f"“{name}” is kept for a chat's attached files: choose another name.")
    if any(info.name == name for info in list_collections(index)):
        raise ValueError(f"There is a collection called “{name}” already.")
    return name, check_folders(folders)


def check_folders(folders: list[str]) -> list[str]:
    """``folders`` as absolute paths. Raises ValueError (in words) for none, or for one that is not a folder."""
    if not folders:
        raise ValueError("Choose at least one folder.")
    missing = [f for f in folders if not Path(f).is_dir()]
    if missing:
        raise ValueError(f"Not a folder: {', '.join(missing)}")
    return [str(Path(f).resolve()) for f in folders]


def list_collections(index: DocumentIndex) -> list[CollectionInfo]:
    """Every collection in the index but the chats' own, by name (none before the index is first used)."""
    if not (index.home / store.DB_NAME).exists():
        return []
    conn = store.connect(index.home)
    try:
        rows = store.list_collections(conn)
    finally:
        conn.close()
    out = []
    for r in rows:
        if is_chat_collection(str(r["name"])):
            continue
        roots = r["roots"]
        files, skipped, chunks, queued = (int(str(r[key])) for key in ("files", "skipped", "chunks", "queued"))
        out.append(CollectionInfo(str(r["name"]), [str(p) for p in roots] if isinstance(roots, list) else [],
                                  files, skipped, chunks, queued, str(r["embedder"])))
    return out


def index_folders(index: DocumentIndex, name: str, folders: list[str] | None = None,
                  progress: Progress | None = None) -> IndexOutcome:
    """Add ``folders`` to collection ``name`` (made if new) and bring it up to date with all its folders (any
    thread; it takes a while). Folders gone from the disk are skipped, and their files dropped."""
    conn = store.connect(index.home)
    try:
        report = index_collection(conn, name, [Path(f) for f in folders or [] if Path(f).exists()],
                                  progress=progress)
    finally:
        conn.close()
    return IndexOutcome(list(report.indexed), list(report.skipped), report.embedder_reason, report.embedder)


def remove_collection(index: DocumentIndex, name: str) -> None:
    """Drop collection ``name`` with its files and chunks (the files on disk are left alone)."""
    conn = store.connect(index.home)
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("DELETE FROM collections WHERE name = ?", (name,))  # roots, files, chunks cascade
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    finally:
        conn.close()


def watched_folders(roots: list[str], limit: int = MAX_WATCHED_FOLDERS) -> list[str]:
    """The folders to watch for changes: each root folder and its subfolders (hidden ones skipped, as the indexer
    skips them), at most ``limit``; a periodic scan covers the rest."""
    out: list[str] = []
    for root in roots:
        if not Path(root).is_dir():
            continue
        for folder, dirs, _files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            out.append(folder)
            if len(out) >= limit:
                return out
    return out
