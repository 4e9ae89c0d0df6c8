"""Chunks follow paragraphs and headings, overlap within a section, are sized in WordLlama's tokens (in words when
its tokenizer cannot load), and know their place in the page."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from engine.docs import chunking
from engine.docs.chunking import chunk_text
from engine.docs.embedders import wordllama_files
from engine.docs.readers import read_pages


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    """The tokenizer the chunker counts with, loaded here on its own from the wordllama wheel."""
    return Tokenizer.from_file(str(wordllama_files()[1]))


def num_tokens(tokenizer: Tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


@pytest.fixture
def no_tokenizer(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """WordLlama's files cannot be found: the chunker loads its tokenizer again and counts words."""

    def missing() -> None:
        raise FileNotFoundError("the wordllama package is not installed")

    monkeypatch.setattr(chunking, "wordllama_files", missing)
    monkeypatch.setattr(chunking, "_tokenizer", [])
    yield


def test_sizes_and_overlap_are_counted_in_wordllama_tokens(tokenizer: Tokenizer) -> None:
    # numbers take 2 to 5 tokens each (the ▁ and a token per digit), so words and tokens differ widely
    text = " ".join(str(i * 37) for i in range(400))
    chunks = chunk_text(text, tokens=120, overlap=30)
    assert chunks[0].start == 0 and chunks[-1].end == len(text)
    sizes = [num_tokens(tokenizer, c.text) for c in chunks]
    assert all(size <= 120 for size in sizes)
    # full: one more word would not have fitted (the next number's tokens)
    for chunk, following in itertools.pairwise(chunks):
        next_word = text[chunk.end :].split()[0]
        assert num_tokens(tokenizer, chunk.text + " " + next_word) > 120
        assert following.start < chunk.end
    assert len(chunks[0].text.split()) < 60  # by words, 120 would have been the size
    for a, b in itertools.pairwise(chunks):
        shared = text[b.start : a.end]
        assert 30 - 5 <= num_tokens(tokenizer, shared) <= 30  # as much as fits, whole words
        assert text[b.start - 1] == " " and (a.end == len(text) or text[a.end] == " ")


def test_offsets_are_exact_and_paragraphs_end_chunks(tokenizer: Tokenizer) -> None:
    text = "\n\n".join(
        f"Paragraph {i} naïve café " + " ".join(f"w{i}_{j}" for j in range(30)) + " — «fin» 🙂" for i in range(12)
    )
    chunks = chunk_text(text, page=4, tokens=300, overlap=40)
    assert len(chunks) > 3
    for chunk in chunks:
        assert chunk.page == 4
        assert text[chunk.start : chunk.end] == chunk.text
        assert chunk.text == chunk.text.strip()
        assert num_tokens(tokenizer, chunk.text) <= 300
    assert chunks[0].start == 0 and chunks[-1].end == len(text)
    for a, b in itertools.pairwise(chunks):
        assert b.start < a.end
        assert num_tokens(tokenizer, text[b.start : a.end]) <= 40
    # a chunk ends at a paragraph boundary when one lies in its second half
    for chunk in chunks[:-1]:
        assert text[chunk.end : chunk.end + 2] == "\n\n"
        assert num_tokens(tokenizer, chunk.text) > 150


def test_a_heading_starts_a_new_chunk_without_overlap() -> None:
    text = "# One\n\nalpha beta gamma.\n\n## Two\n\ndelta epsilon.\n\n## Three\n\nzeta"
    chunks = chunk_text(text, tokens=50, overlap=10)
    assert [c.text for c in chunks] == [
        "# One\n\nalpha beta gamma.",
        "## Two\n\ndelta epsilon.",
        "## Three\n\nzeta",
    ]
    long = "# Heading\n\n" + " ".join(["word"] * 100) + "\n\n## Next\n\nlast words"
    cut = chunk_text(long, tokens=60, overlap=10)
    assert cut[0].text.startswith("# Heading") and cut[-1].text == "## Next\n\nlast words"
    assert "## Next" not in "".join(c.text for c in cut[:-1])


def test_a_word_longer_than_the_size_is_a_chunk_of_its_own(tokenizer: Tokenizer) -> None:
    blob = "x7Qz" * 40
    text = f"before it {blob} after it"
    chunks = chunk_text(text, tokens=20, overlap=5)
    assert [c.text for c in chunks] == ["before it", blob, "after it"]
    assert num_tokens(tokenizer, blob) > 20
    assert chunk_text("   \n ") == []
    with pytest.raises(ValueError, match="overlap"):
        chunk_text("x", tokens=10, overlap=10)


def test_without_the_tokenizer_sizes_are_words_and_a_warning_says_so(
    no_tokenizer: None, caplog: pytest.LogCaptureFixture
) -> None:
    text = " ".join(str(i) for i in range(250))
    with caplog.at_level(logging.WARNING, logger="engine"):
        chunks = chunk_text(text, tokens=100, overlap=25)
        again = chunk_text("# One\n\nalpha beta\n\n## Two\n\ngamma", tokens=50, overlap=10)
    assert chunking.chunk_tokenizer() is None
    assert [c.text.split()[0] for c in chunks] == ["0", "75", "150"]
    assert [len(c.text.split()) for c in chunks] == [100, 100, 100]
    assert chunks[-1].text.split()[-1] == "249"
    assert [c.text for c in again] == ["# One\n\nalpha beta", "## Two\n\ngamma"]
    warnings = [r.getMessage() for r in caplog.records if "counted in words" in r.getMessage()]
    assert warnings == [
        "chunk sizes are counted in words: WordLlama's tokenizer cannot load (the wordllama package is not installed)"
    ]


def test_a_real_document_keeps_its_sizes_in_tokens(tokenizer: Tokenizer) -> None:
    pages = read_pages(Path(__file__).parents[2] / "data" / "retrieval" / "solar_system.pdf")
    for page in pages:
        chunks = chunk_text(page.text, page.number, tokens=100, overlap=24)
        assert chunks and chunks[0].start >= 0
        for chunk in chunks:
            assert page.text[chunk.start : chunk.end] == chunk.text
            assert num_tokens(tokenizer, chunk.text) <= 100
        for a, b in itertools.pairwise(chunks):
            assert num_tokens(tokenizer, page.text[b.start : a.end]) <= 24
        assert sum(num_tokens(tokenizer, c.text) for c in chunks) >= num_tokens(tokenizer, page.text) - len(chunks)
