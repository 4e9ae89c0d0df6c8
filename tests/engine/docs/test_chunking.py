"""Chunks follow paragraphs and headings, overlap within a section, and know their place in the page."""

from __future__ import annotations

import itertools

import pytest

from engine.docs.chunking import chunk_text


def test_offsets_point_into_the_page_and_sizes_hold() -> None:
    text = "\n\n".join(f"Paragraph {i} " + " ".join(f"w{i}_{j}" for j in range(37)) for i in range(12))
    chunks = chunk_text(text, page=4, words=100, overlap=20)
    assert len(chunks) > 3
    for chunk in chunks:
        assert chunk.page == 4
        assert text[chunk.start : chunk.end] == chunk.text
        assert len(chunk.text.split()) <= 100
    assert chunks[0].start == 0 and chunks[-1].end == len(text)
    # consecutive chunks overlap by up to `overlap` words, and every word is in some chunk
    for a, b in itertools.pairwise(chunks):
        assert b.start < a.end
        assert len(text[b.start : a.end].split()) <= 20
    # a chunk ends at a paragraph boundary when one lies in its second half
    assert text[chunks[0].end : chunks[0].end + 2] == "\n\n"


def test_a_heading_starts_a_new_chunk_without_overlap() -> None:
    text = "# One\n\nalpha beta gamma.\n\n## Two\n\ndelta epsilon.\n\n## Three\n\nzeta"
    chunks = chunk_text(text, words=50, overlap=10)
    assert [c.text for c in chunks] == [
        "# One\n\nalpha beta gamma.",
        "## Two\n\ndelta epsilon.",
        "## Three\n\nzeta",
    ]


def test_one_long_paragraph_is_cut_by_words_with_overlap() -> None:
    text = " ".join(str(i) for i in range(250))
    chunks = chunk_text(text, words=100, overlap=25)
    assert [c.text.split()[0] for c in chunks] == ["0", "75", "150"]
    assert chunks[-1].text.split()[-1] == "249"
    assert chunk_text("   \n ") == []
    with pytest.raises(ValueError, match="overlap"):
        chunk_text("x", words=10, overlap=10)
