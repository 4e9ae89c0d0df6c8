"""Pages to chunks that follow the text's structure.

Sizes are counted in tokens of WordLlama's tokenizer, the one the offline default embedder uses (the ``wordllama``
wheel ships it and the bundle carries it, so it is there wherever documents are indexed; it is found as
``engine.docs.embedders.wordllama_files`` finds it). Each page is tokenized once, with offsets, and each token counts
toward the word it starts in, or the next word when it starts in the blank between two (the ``▁`` of a word, the
newlines of a paragraph break). A chunk's text tokenized on its own then holds at most the tokens counted (its
first word loses the line breaks before it and gains a ``▁``). When the tokenizer cannot load, sizes fall back to
words (one warning, once per process): the same rules with every word counted as one token.

The default 256 tokens is about 175 words of English prose (WordLlama's Llama-2 vocabulary runs about 1.45 tokens a
word, so chunks stay the size the word count gave them), and several fit any chat's context. A chunk ends at a
paragraph boundary when one lies in its second half, and a heading always starts a new chunk, so a passage stays with
its heading. Consecutive chunks of one section overlap by at most ``overlap`` tokens, so a sentence cut at a boundary
is whole in one of them. Chunks start and end at words (a single word longer than ``tokens`` is a chunk of its own).
Each chunk keeps its page and its start/end character offsets in that page's text.
"""

from __future__ import annotations

import bisect
import logging
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from engine.docs.embedders import wordllama_files
from engine.docs.readers import Page

if TYPE_CHECKING:
    from tokenizers import Tokenizer

log = logging.getLogger("engine")

WORD = re.compile(r"\S+")
PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
HEADING = re.compile(r"^[ \t]{0,3}#{1,6}[ \t]", re.MULTILINE)

DEFAULT_TOKENS = 256
DEFAULT_OVERLAP = 48

_tokenizer_lock = threading.Lock()
_tokenizer: list[Tokenizer | None] = []


@dataclass(frozen=True)
class Chunk:
    """A passage of one page: ``text == page_text[start:end]``."""

    page: int | None
    start: int
    end: int
    text: str


def chunk_tokenizer() -> Tokenizer | None:
    """WordLlama's tokenizer, loaded once; ``None`` (and a warning, logged once) when it cannot load."""
    with _tokenizer_lock:
        if not _tokenizer:
            loaded: Tokenizer | None = None
            try:
                from tokenizers import Tokenizer

                loaded = Tokenizer.from_file(str(wordllama_files()[1]))
                loaded.no_truncation()
            except Exception as exc:  # noqa: BLE001 -- no package or file, or one tokenizers cannot parse: words
                log.warning("chunk sizes are counted in words: WordLlama's tokenizer cannot load (%s)", exc)
                loaded = None
            _tokenizer.append(loaded)
        return _tokenizer[0]


def chunking_key() -> str:
    """How :func:`chunk_pages` cuts text here, as an index records it: a collection whose chunks were cut another
    way (an index from before sizes were counted in tokens, or without the tokenizer) is chunked again."""
    unit = "tokens" if chunk_tokenizer() is not None else "words"
    return f"{unit} {DEFAULT_TOKENS}/{DEFAULT_OVERLAP}"


def chunk_pages(
    pages: Iterable[Page], tokens: int = DEFAULT_TOKENS, overlap: int = DEFAULT_OVERLAP
) -> list[Chunk]:
    """All chunks of a file's pages, in order."""
    return [chunk for page in pages for chunk in chunk_text(page.text, page.number, tokens, overlap)]


def chunk_text(
    text: str, page: int | None = None, tokens: int = DEFAULT_TOKENS, overlap: int = DEFAULT_OVERLAP
) -> list[Chunk]:
    """Split one page's text into chunks of at most ``tokens`` tokens, ``overlap`` tokens shared within a section.

    Raises:
        ValueError: when ``overlap`` is not smaller than ``tokens``.
    """
    if not 0 <= overlap < tokens:
        raise ValueError(f"overlap ({overlap}) must be at least 0 and below tokens ({tokens})")
    spans = [(m.start(), m.end()) for m in WORD.finditer(text)]
    if not spans:
        return []
    starts = [s for s, _ in spans]
    # ends[i]: the tokens counted up to and including word i, so words a..b-1 hold ends[b-1] - ends[a-1] tokens
    ends = _token_ends(text, spans)
    breaks = {0}
    headings = set()
    for m in PARAGRAPH_BREAK.finditer(text):
        breaks.add(bisect.bisect_left(starts, m.end()))
    for m in HEADING.finditer(text):
        index = bisect.bisect_left(starts, m.start())
        breaks.add(index)
        headings.add(index)
    heading_list = sorted(headings)
    n = len(spans)
    chunks = []
    a = 0
    while a < n:
        before = ends[a - 1] if a else 0
        limit = max(bisect.bisect_right(ends, before + tokens), a + 1)
        b = next((h for h in heading_list if a < h <= limit), None)
        if b is None:
            if limit == n:
                b = n
            else:
                b = max((x for x in breaks if a < x <= limit and ends[x - 1] - before > tokens // 2), default=limit)
        chunks.append(Chunk(page, spans[a][0], spans[b - 1][1], text[spans[a][0] : spans[b - 1][1]]))
        if b >= n:
            break
        if b in headings or overlap == 0:
            a = b
        else:
            # the first word from which words up to b-1 hold at most `overlap` tokens, unless word b (longer
            # than the rest of the size) would not fit after them: then no overlap
            shared = max(bisect.bisect_left(ends, ends[b - 1] - overlap) + 1, a + 1)
            a = shared if ends[b] - ends[shared - 1] <= tokens else b
    return chunks


def _token_ends(text: str, spans: list[tuple[int, int]]) -> list[int]:
    """For each word, the number of the page's tokens that start before its end (words alone: its 1-based index)."""
    tokenizer = chunk_tokenizer()
    if tokenizer is None:
        return list(range(1, len(spans) + 1))
    offsets = tokenizer.encode(text, add_special_tokens=False).offsets
    token_starts = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)[:, 0]
    word_ends = np.fromiter((e for _, e in spans), dtype=np.int64, count=len(spans))
    ends: list[int] = np.searchsorted(token_starts, word_ends, side="left").tolist()
    return ends
