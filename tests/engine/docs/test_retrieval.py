"""Hybrid retrieval with the real WordLlama weights: it finds passages BM25 cannot (synonyms, no shared word), it is
at least as good as each of its parts on a small hand-made set, it does not bury a code BM25 alone finds among
look-alike passages, and the chat sees numbered sources whose invented citations are dropped."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from engine.docs.context import build_context, strip_invalid_citations, valid_citations
from engine.docs.embedders import choose_embedder, wordllama_files
from engine.docs.indexer import index_collection
from engine.docs.search import BM25_MARGIN, RRF_K, Hit, fuse, reciprocal_rank_fusion, search

PASSAGES = {
    "clinic": "The physician prescribed antibiotics for the infection and told the patient to rest.",
    "garage": "Our automobile broke down on the highway, so we called a tow truck.",
    "bakery": "The recipe needs flour, sugar, butter and two eggs, baked for thirty minutes.",
    "bank": "Stock prices fell sharply after the central bank raised interest rates.",
    "pets": "The kitten chased a ball of yarn around the living room.",
    "weather": "Heavy rainfall caused the river to flood several villages.",
    "music": "The orchestra performed a symphony by Beethoven to a full concert hall.",
    "bridge": "Engineers repaired the bridge after cracks appeared in its steel beams.",
}
#: Query → the passage that answers it. The first four share no word with their passage (BM25 cannot find them).
QUERIES = {
    "doctor medicine": "clinic",
    "car trouble on the road": "garage",
    "cat playing": "pets",
    "storm water damage": "weather",
    "steel bridge cracks": "bridge",
    "Beethoven concert": "music",
    "interest rates and stock prices": "bank",
    "flour and eggs recipe": "bakery",
}


@pytest.fixture
def collection(tmp_path: Path, conn: sqlite3.Connection) -> sqlite3.Connection:
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in PASSAGES.items():
        (docs / f"{name}.txt").write_text(text + "\n")
    index_collection(conn, "set", [docs], embedder="wordllama")
    return conn


def _rank(conn: sqlite3.Connection, query: str, answer: str, mode: str) -> int | None:
    names = [Path(h.file).stem for h in search(conn, "set", query, top_k=len(PASSAGES), mode=mode)]
    return names.index(answer) + 1 if answer in names else None


def test_the_offline_default_is_wordllama_from_the_wheel() -> None:
    weights, tokenizer = wordllama_files()
    assert weights.name == "l2_supercat_256.safetensors" and tokenizer.suffix == ".json"
    choice = choose_embedder("auto")
    assert choice.name == "wordllama" and "best embedder available offline" in choice.reason
    assert choice.embedder is not None and choice.embedder.dim == 256
    vectors = choice.embedder.embed(["a car", "an automobile", "interest rates"])
    assert vectors.dtype == np.float32 and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]
    assert choose_embedder("bm25").embedder is None


def test_hybrid_finds_a_synonym_passage_that_bm25_misses(collection: sqlite3.Connection) -> None:
    assert _rank(collection, "doctor medicine", "clinic", "bm25") is None
    assert _rank(collection, "doctor medicine", "clinic", "hybrid") == 1


def test_fusion_is_at_least_as_good_as_each_part(collection: sqlite3.Connection) -> None:
    def mrr(mode: str) -> float:
        ranks = [_rank(collection, q, a, mode) for q, a in QUERIES.items()]
        return sum(1 / r for r in ranks if r is not None) / len(QUERIES)

    bm25, vector, hybrid = mrr("bm25"), mrr("vector"), mrr("hybrid")
    assert bm25 < 0.7  # four queries share no word (or only "on the") with their answer
    assert hybrid >= bm25 and hybrid >= vector - 1e-9, (bm25, vector, hybrid)


def test_reciprocal_rank_fusion() -> None:
    fused = reciprocal_rank_fusion([[(1, 9.0), (2, 5.0), (3, 1.0)], [(3, 0.9), (1, 0.8)]], k=60)
    assert [i for i, _ in fused] == [1, 3, 2]
    assert fused[0][1] == pytest.approx(1 / 61 + 1 / 62)
    assert reciprocal_rank_fusion([]) == []
    weighted = reciprocal_rank_fusion([[(1, 9.0)], [(2, 0.9)]], k=10, weights=[1.0, 2.0])
    assert weighted == [(2, pytest.approx(2 / 11)), (1, pytest.approx(1 / 11))]
    with pytest.raises(ValueError, match="1 weights for 2 rankings"):
        reciprocal_rank_fusion([[(1, 9.0)], [(2, 0.9)]], weights=[1.0])


def test_a_first_place_is_outranked_only_by_a_chunk_both_rankings_place_high() -> None:
    """RRF_K = 10: BM25's first (1/11) beats any chunk only one ranking holds and any both rank 12th or lower,
    but not one both rank second (2/12); the margin guard is off here (BM25's first is not twice its second)."""
    bm25 = [(1, 5.0), (2, 4.9), *((i, 4.0) for i in range(10, 22))]
    vector = [(3, 0.9), (2, 0.8), *((i, 0.5) for i in range(30, 42))]
    order = [i for i, _ in fuse(bm25, vector)]
    assert order[:3] == [2, 1, 3]  # both second, then each first place (a tie, broken by id)
    far = [(1, 5.0), (2, 4.9), *((i, 4.0) for i in range(30, 41)), (99, 1.0)]
    far_vector = [(3, 0.9), *((i, 0.5) for i in range(50, 61)), (99, 0.1)]
    assert [i for i, _ in fuse(far, far_vector)][:2] == [1, 3]  # chunk 99 ranks 14th and 13th: below both firsts
    assert RRF_K == 10


def test_bm25s_standout_first_goes_first() -> None:
    bm25 = [(1, 8.0), (2, 1.0), (3, 0.5)]
    vector = [(3, 0.9), (2, 0.8), (4, 0.7), (1, 0.1)]
    assert fuse(bm25, vector)[0][0] == 1  # eight times its second: put first
    assert [i for i, _ in fuse(bm25, vector, bm25_margin=None)][:2] == [3, 2]  # plain RRF: both rankings hold 3, 2
    assert fuse([(1, 8.0), (2, 6.0)], vector)[0][0] == 2  # no standout: plain RRF
    assert fuse([(5, 3.0)], vector)[0][0] == 5  # BM25's only match
    assert fuse([], vector) == reciprocal_rank_fusion([[], vector])
    assert fuse(bm25, vector)[0][1] == fuse(bm25, vector, bm25_margin=None)[0][1]  # it takes the first's score


def test_a_code_among_look_alike_passages_is_not_buried(tmp_path: Path, conn: sqlite3.Connection) -> None:
    """A service manual of sixty fault codes worded alike: the vectors cannot tell F-137 from the rest, BM25 can,
    and hybrid puts it first; without the margin guard RRF alone let chunks ranked high by both bury it."""
    parts = ["pump", "motor", "valve", "sensor", "relay", "fuse", "cable", "float switch", "impeller", "strainer"]
    faults = ["stopped", "overheated", "drew too much current", "did not answer", "reported a low level", "stuck",
              "leaked", "tripped"]
    codes = [f"## F-{n} {parts[n % 10].title()} fault\n\nThe {parts[n % 10]} {faults[n * 7 % 8]} while the controller"
             f" was running. Check the {parts[n % 10]} and its wiring, then restart the controller.\n"
             for n in range(100, 160)]
    docs = tmp_path / "manual"
    docs.mkdir()
    (docs / "codes.md").write_text("# Fault codes\n\n" + "\n".join(codes))
    index_collection(conn, "manual", [docs], embedder="wordllama")

    def rank(mode: str, margin: float | None = BM25_MARGIN) -> int | None:
        hits = search(conn, "manual", "What does F-137 mean?", top_k=60, mode=mode, bm25_margin=margin)
        return next((r for r, h in enumerate(hits, start=1) if h.text.startswith("## F-137 ")), None)

    assert rank("bm25") == 1
    assert (rank("vector") or 99) > 5
    assert rank("hybrid") == 1
    assert (rank("hybrid", margin=None) or 99) > 1


def _hit(file: str, page: int | None, text: str) -> Hit:
    return Hit(file, page, 0, len(text), text, 0.5, 1)


def test_context_numbers_the_sources_and_invented_citations_are_dropped() -> None:
    hits = [_hit("/d/report.pdf", 3, "Paint cost 420 pounds."), _hit("/d/notes.md", None, "Keys: ask Mary.")]
    context = build_context(hits)
    assert "[1] report.pdf, page 3\nPaint cost 420 pounds." in context
    assert "[2] notes.md\nKeys: ask Mary." in context
    assert build_context([]) == ""
    reply = "Paint cost 420 pounds [1][3]. Ask Mary [2], as [1] says; see also [0] and [12]."
    assert valid_citations(reply, len(hits)) == [1, 2]
    assert (
        strip_invalid_citations(reply, len(hits))
        == "Paint cost 420 pounds [1]. Ask Mary [2], as [1] says; see also  and ."
    )
