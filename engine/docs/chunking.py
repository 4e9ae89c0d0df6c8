"""Pages to chunks that follow the text's structure.

Sizes are counted in words, a stand-in for tokens that needs no tokenizer (English runs about 1.3 tokens a word, so
the default 180 words is about 240 tokens: several fit any chat's context). A chunk ends at a paragraph boundary
when one lies in its second half, and a heading always starts a new chunk, so a passage stays with its heading.
Consecutive chunks of one section overlap by ``overlap`` words, so a sentence cut at a boundary is whole in one of
them. Each chunk keeps its page and its start/end character offsets in that page's text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from engine.docs.readers import Page

WORD = re.compile(r"\S+")
PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
HEADING = re.compile(r"^[ \t]{0,3}#{1,6}[ \t]", re.MULTILINE)

DEFAULT_WORDS = 180
DEFAULT_OVERLAP = 30


@dataclass(frozen=True)
class Chunk:
    """A passage of one page: ``text == page_text[start:end]``."""

    page: int | None
    start: int
    end: int
    text: str


def chunk_pages(
    pages: Iterable[Page], words: int = DEFAULT_WORDS, overlap: int = DEFAULT_OVERLAP
) -> list[Chunk]:
    """All chunks of a file's pages, in order."""
    return [chunk for page in pages for chunk in chunk_text(page.text, page.number, words, overlap)]


def chunk_text(
    text: str, page: int | None = None, words: int = DEFAULT_WORDS, overlap: int = DEFAULT_OVERLAP
) -> list[Chunk]:
    """Split one page's text into chunks of at most ``words`` words, ``overlap`` words shared within a section.

    Raises:
        ValueError: when ``overlap`` is not smaller than ``words``.
    """
    if not 0 <= overlap < words:
        raise ValueError(f"overlap ({overlap}) must be at least 0 and below words ({words})")
    spans = [(m.start(), m.end()) for m in WORD.finditer(text)]
    if not spans:
        return []
    starts = [s for s, _ in spans]
    breaks = {0}
    headings = set()
    for m in PARAGRAPH_BREAK.finditer(text):
        breaks.add(_word_at(starts, m.end()))
    for m in HEADING.finditer(text):
        index = _word_at(starts, m.start())
        breaks.add(index)
        headings.add(index)
    heading_list = sorted(headings)
    n = len(spans)
    chunks = []
    a = 0
    while a < n:
        limit = min(a + words, n)
        b = next((h for h in heading_list if a < h <= limit), None)
        if b is None:
            if limit == n:
                b = n
            else:
                b = max((x for x in breaks if a + words // 2 < x <= limit), default=limit)
        chunks.append(Chunk(page, spans[a][0], spans[b - 1][1], text[spans[a][0] : spans[b - 1][1]]))
        if b >= n:
            break
        a = b if b in headings or overlap == 0 else max(b - overlap, a + 1)
    return chunks


def _word_at(starts: list[int], offset: int) -> int:
    """Index of the first word starting at or after ``offset``."""
    lo, hi = 0, len(starts)
    while lo < hi:
        mid = (lo + hi) // 2
        if starts[mid] < offset:
            lo = mid + 1
        else:
            hi = mid
    return lo
