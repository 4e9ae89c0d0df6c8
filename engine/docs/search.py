"""Retrieval: BM25 through FTS5, exact vector search with numpy, and the two fused by reciprocal rank fusion.

Reciprocal rank fusion (Cormack et al., 2009) scores a chunk ``sum(weight / (k + rank))`` over the rankings it
appears in. It needs no calibration between BM25's scores and cosine similarities, which live on unrelated scales,
and it is what GPT4All's LocalDocs uses. A collection indexed without an embedder is searched by BM25 alone.

The paper's k = 60 flattens the first ranks (1/61 against 1/62), so a chunk both rankings put around their 60th
place outranks one that either puts first: on the retrieval set that made hybrid worse than the vectors alone, and
it buried the chunk BM25 alone finds for a code or a name (``F-204``, ``dry_run_delay``) under the vectors' near
misses. With k = 10 a chunk either ranking puts first (1/11) is still outranked only by a chunk both rankings
place high (1/(10 + a) + 1/(10 + b) > 1/11: both within about their first dozen), never by one that only one
ranking holds. :data:`RRF_K` was chosen by cross-validation over RRF constants and ranking weights
(``python -m engine.docs eval --sweep``; docs/BENCHMARKS.md, "Documents: retrieval quality"); equal weights won.

One guard on top: when BM25's first chunk scores at least :data:`BM25_MARGIN` times its second (or is its only
match), the query named something only that chunk holds (a code among many alike, where every chunk shares the
question's other words and the vectors see near-identical passages), and the fused ranking puts that chunk first.
On the retrieval set the guard changes no ranking that mattered; on a manual of sixty look-alike fault codes it
lifts the named code from fifth to first (tests/engine/docs/test_retrieval.py).
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import asdict, dataclass

import numpy as np

from engine.docs import store
from engine.docs.embedders import embed_query, load_embedder

#: RRF's constant: larger values flatten the advantage of the very first ranks (60 is the paper's value).
RRF_K = 10
#: The vector ranking's weight in the fusion (BM25's is 1).
VECTOR_WEIGHT = 1.0
#: How many times its second's score BM25's first must reach to be put first in the fused ranking.
BM25_MARGIN = 2.0
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
    rankings: list[list[tuple[int, float]]], k: float = RRF_K, weights: list[float] | None = None
) -> list[tuple[int, float]]:
    """Fuse rankings (ids best first) into one: score ``sum(weight / (k + rank))``, rank counted from 1, each
    ranking's weight 1 unless ``weights`` gives one per ranking."""
    if weights is not None and len(weights) != len(rankings):
        raise ValueError(f"{len(weights)} weights for {len(rankings)} rankings")
    scores: dict[int, float] = {}
    for ranking, weight in zip(rankings, weights or [1.0] * len(rankings), strict=True):
        for rank, (chunk_id, _) in enumerate(ranking, start=1):
            scores[chunk_id] = scores.get(chunk_id, 0.0) + weight / (k + rank)
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))


def fuse(
    bm25: list[tuple[int, float]], vector: list[tuple[int, float]], k: float = RRF_K,
    vector_weight: float = VECTOR_WEIGHT, bm25_margin: float | None = BM25_MARGIN,
) -> list[tuple[int, float]]:
    """Hybrid search's ranking: RRF of the two rankings (ids best first), then BM25's first put first when it
    stands out by ``bm25_margin`` (None: never). The chunk put first takes the first's score."""
    fused = reciprocal_rank_fusion([bm25, vector], k, [1.0, vector_weight])
    if bm25_margin is None or not bm25 or not fused or bm25[0][1] <= 0:
        return fused
    top_id = bm25[0][0]
    if fused[0][0] == top_id or (len(bm25) > 1 and bm25[0][1] < bm25_margin * bm25[1][1]):
        return fused
    return [(top_id, fused[0][1])] + [(i, score) for i, score in fused if i != top_id]


def search(
    conn: sqlite3.Connection, collection: str, query: str, top_k: int = 5, mode: str = "hybrid",
    rrf_k: float = RRF_K, vector_weight: float = VECTOR_WEIGHT, bm25_margin: float | None = BM25_MARGIN,
) -> list[Hit]:
    """The ``top_k`` chunks of ``collection`` for ``query``.

    Args:
        mode: ``hybrid`` (BM25 and vectors fused by :func:`fuse`; BM25 alone for a collection without vectors),
            ``bm25`` or ``vector``. Scores are RRF scores for ``hybrid``, BM25 scores for ``bm25`` and cosine
            similarities for ``vector``.
        rrf_k, vector_weight, bm25_margin: the fusion's settings for ``hybrid`` (the eval's sweep tries others).

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
    if len(rankings) > 1:
        ranked = fuse(rankings[0], rankings[1], rrf_k, vector_weight, bm25_margin)
    else:
        ranked = rankings[0]
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
