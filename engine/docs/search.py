"""Retrieval: BM25 through FTS5, exact vector search with numpy, and the two fused by reciprocal rank fusion.

Reciprocal rank fusion (Cormack et al., 2009) scores a chunk ``sum(1 / (K + rank))`` over the rankings it appears
in. It needs no calibration between BM25's scores and cosine similarities, which live on unrelated scales, and it is
what GPT4All's LocalDocs uses. A collection indexed without an embedder is searched by BM25 alone.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import asdict, dataclass

import numpy as np

from engine.docs import store
from engine.docs.embedders import embed_query, load_embedder

#: RRF's constant: larger values flatten the advantage of the very first ranks (60 is the paper's value).
RRF_K = 60
#: How many candidates each ranking contributes to the fusion, at least.
CANDIDATES = 50
MODES = ("hybrid", "bm25", "vector")


@dataclass(frozen=True)
class Hit:
    """One retrieved chunk: ``text == page_text[start:end]`` of ``file``'s ``page`` (``None`` without pages)."""

    file: str
    page: int | None
    start: int
    end: int
    text: str
    score: float
    chunk_id: int

    def to_json(self) -> dict[str, object]:
        """The fields ``python -m engine.docs search --json`` prints."""
        out = asdict(self)
        del out["chunk_id"]
        return out


_vectors: dict[tuple[str, int], tuple[int, np.ndarray, np.ndarray]] = {}


def _collection_vectors(conn: sqlite3.Connection, cid: int, generation: int) -> tuple[np.ndarray, np.ndarray]:
    """The collection's chunk ids and vectors, read once and kept until the collection's generation changes."""
    database = str(conn.execute("PRAGMA database_list").fetchone()[2])
    cached = _vectors.get((database, cid))
    if cached is not None and cached[0] == generation:
        return cached[1], cached[2]
    rows = conn.execute(
        "SELECT id, vector FROM chunks WHERE collection_id = ? AND vector IS NOT NULL ORDER BY id", (cid,)
    ).fetchall()
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    matrix = (
        np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), -1)
        if rows
        else np.zeros((0, 0), dtype=np.float32)
    )
    _vectors[(database, cid)] = (generation, ids, matrix)
    return ids, matrix


def fts_query(text: str) -> str:
    """A user's query as an FTS5 expression: each word quoted (no operator can be injected), any word may match."""
    words = re.findall(r"\w+", text.lower())
    return " OR ".join(f'"{w}"' for w in dict.fromkeys(words))


def bm25_ranking(
    conn: sqlite3.Connection, cid: int, query: str, limit: int, members: frozenset[int] | None = None
) -> list[tuple[int, float]]:
    """Chunk ids best first, with BM25 scores made positive (higher is better).

    With ``members`` (the collection's chunk ids), FTS5 ranks every collection's chunks and those of others are
    dropped afterwards, which needs no lookup per match; when too many of the best matches belong to other
    collections for that to fill ``limit``, the ranking is made again with a join that keeps the collection's own.
    """
    expression = fts_query(query)
    if not expression:
        return []
    if members is not None:
        wide = 4 * limit
        rows = conn.execute(
            "SELECT rowid, bm25(chunks_fts) AS s FROM chunks_fts WHERE chunks_fts MATCH ? ORDER BY s LIMIT ?",
            (expression, wide),
        ).fetchall()
        kept = [(int(r[0]), -float(r[1])) for r in rows if int(r[0]) in members]
        if len(rows) < wide or len(kept) >= limit:
            return kept[:limit]
    # A join on the chunk's primary key, not ``rowid IN (SELECT ...)``: SQLite runs that subquery's scan of the
    # collection's chunks again for every FTS5 match (docs/BENCHMARKS.md, "Documents: speed").
    rows = conn.execute(
        "SELECT chunks_fts.rowid, bm25(chunks_fts) AS s FROM chunks_fts JOIN chunks c ON c.id = chunks_fts.rowid"
        " WHERE chunks_fts MATCH ? AND c.collection_id = ? ORDER BY s LIMIT ?",
        (expression, cid, limit),
    ).fetchall()
    return [(int(r[0]), -float(r[1])) for r in rows]


_members: dict[tuple[str, int], tuple[int, frozenset[int]]] = {}


def _collection_members(conn: sqlite3.Connection, cid: int, generation: int) -> frozenset[int]:
    """The ids of the collection's chunks, read once and kept until the collection's generation changes."""
    database = str(conn.execute("PRAGMA database_list").fetchone()[2])
    cached = _members.get((database, cid))
    if cached is not None and cached[0] == generation:
        return cached[1]
    ids = frozenset(r[0] for r in conn.execute("SELECT id FROM chunks WHERE collection_id = ?", (cid,)))
    _members[(database, cid)] = (generation, ids)
    return ids


def vector_ranking(
    ids: np.ndarray, matrix: np.ndarray, query: np.ndarray, limit: int
) -> list[tuple[int, float]]:
    """Chunk ids best first by cosine similarity (the vectors are unit length), exact."""
    if len(ids) == 0:
        return []
    # einsum runs on the calling thread: BLAS's threads for a matrix-vector product gain nothing on a memory-bound
    # product and keep spinning afterwards, taking the cores from the BM25 query that runs next.
    scores = np.einsum("ij,j->i", matrix, query.astype(np.float32).ravel())
    k = min(limit, len(ids))
    top = np.argpartition(-scores, k - 1)[:k]
    top = top[np.argsort(-scores[top], kind="stable")]
    return [(int(ids[i]), float(scores[i])) for i in top]


def reciprocal_rank_fusion(
    rankings: list[list[tuple[int, float]]], k: int = RRF_K
) -> list[tuple[int, float]]:
    """Fuse rankings (ids best first) into one: score ``sum(1 / (k + rank))``, rank counted from 1."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, (chunk_id, _) in enumerate(ranking, start=1):
            scores[chunk_id] = scores.get(chunk_id, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))


def search(
    conn: sqlite3.Connection, collection: str, query: str, top_k: int = 5, mode: str = "hybrid"
) -> list[Hit]:
    """The ``top_k`` chunks of ``collection`` for ``query``.

    Args:
        mode: ``hybrid`` (BM25 and vectors fused by RRF; BM25 alone for a collection without vectors), ``bm25``
            or ``vector``. Scores are RRF scores for ``hybrid``, BM25 scores for ``bm25`` and cosine
            similarities for ``vector``.

    Raises:
        KeyError: for an unknown collection.
        ValueError: for an unknown mode, ``top_k`` below 1, or ``vector`` on a collection without vectors.
    """
    if mode not in MODES:
        raise ValueError(f"unknown search mode {mode!r}: choose one of {', '.join(MODES)}")
    if top_k < 1:
        raise ValueError("top_k must be at least 1")
    row = store.collection_row(conn, collection)
    if row is None:
        raise KeyError(f"no collection named {collection!r}")
    cid = int(row["id"])
    limit = max(CANDIDATES, top_k)
    embedder = load_embedder(row["embedder"])
    if embedder is None and mode == "vector":
        raise ValueError(f"collection {collection!r} has no vectors (indexed with BM25 alone)")
    rankings = []
    if mode in ("hybrid", "bm25"):
        members = _collection_members(conn, cid, int(row["generation"]))
        rankings.append(bm25_ranking(conn, cid, query, limit, members))
    if mode in ("hybrid", "vector") and embedder is not None:
        ids, matrix = _collection_vectors(conn, cid, int(row["generation"]))
        rankings.append(vector_ranking(ids, matrix, embed_query(embedder, query), limit))
    ranked = reciprocal_rank_fusion(rankings) if len(rankings) > 1 else rankings[0]
    return _hits(conn, ranked[:top_k])


def _hits(conn: sqlite3.Connection, ranked: list[tuple[int, float]]) -> list[Hit]:
    if not ranked:
        return []
    marks = ",".join("?" * len(ranked))
    rows = {
        r["id"]: r
        for r in conn.execute(
            f'SELECT c.id, c.page, c.start, c."end", c.text, f.path FROM chunks c JOIN files f ON f.id = c.file_id'
            f" WHERE c.id IN ({marks})",
            [i for i, _ in ranked],
        )
    }
    return [
        Hit(
            rows[i]["path"],
            rows[i]["page"],
            rows[i]["start"],
            rows[i]["end"],
            rows[i]["text"],
            round(score, 6),
            i,
        )
        for i, score in ranked
        if i in rows
    ]
