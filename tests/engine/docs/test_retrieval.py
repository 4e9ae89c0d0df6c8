"""Hybrid retrieval with the real WordLlama weights: it finds passages BM25 cannot (synonyms, no shared word), it is
at least as good as each of its parts on a small hand-made set, and the chat sees numbered sources whose invented
citations are dropped."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from engine.docs.context import build_context, strip_invalid_citations, valid_citations
from engine.docs.embedders import choose_embedder, wordllama_files
from engine.docs.indexer import index_collection
from engine.docs.search import Hit, reciprocal_rank_fusion, search

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
