"""Retrieved chunks into a chat: the numbered sources block of the prompt, and the citations a reply may keep.

Sources are numbered [1]..[n] in the order retrieval ranked them, each with its file name and page, so the model
can cite them and the reply's Sources list can show them. A model may cite a number that was never given (an
invented source): `valid_citations` keeps only the numbers that exist, and `strip_invalid_citations` removes the
others from the reply text.

A small model often cites nothing, though it answers from the sources: `attribute` finds the sources a reply draws on
from its wording. Each sentence of the reply is matched against each source by the content words they share,
leaving out the words of the question (a reply that only restates the question draws on nothing), each word
weighted by how few sources hold it. A source is credited with a sentence when the words they share carry at least
half of the sentence's weight, or when they share several words; a sentence matching no source credits none, so a
reply from the model's own knowledge (or an invented one) is attributed to nothing. Lexical matching, not
embeddings: what it credits can be checked by eye against the snippet shown, and it needs no model.
"""

from __future__ import annotations

import math
import re
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.docs import store
from engine.docs.search import Hit

CITATION = re.compile(r"\[(\d{1,4})\]")
#: Where a text splits into sentences: after . ! ? (or a colon, or a semicolon) before a space, and at line breaks.
_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+|\n+")
_WORD = re.compile(r"[^\W_]+")
#: Words that say nothing about where an answer came from.
_STOPWORDS_TEXT = (
    "a about above after again all also am an and any are as at be because been before being below between both but"
    " by can could did do does doing don down during each else few for from further had has have having he her here"
    " hers him his how i if in into is it its just know let me more most my no nor not now of off on once only or"
    " other our out over own same says she should so some such than that the their them then there these they this"
    " those through to too under until up very was we were what when where which while who whom why will with"
    " would you your yes answer answers question questions source sources document documents text page pages"
)
STOPWORDS = frozenset(_STOPWORDS_TEXT.split())
#: The share of a sentence's word weight a source must hold to be credited with it.
MIN_COVERAGE = 0.5
#: Shared words that credit a source whatever the coverage (a long sentence that also says other things).
MIN_SHARED_WORDS = 3

INSTRUCTIONS = (
    "Answer from the sources below when they are relevant. Cite each source you use by its number in square "
    "brackets, like [1]. Do not cite a number that is not listed. If the sources do not answer the question, say so."
)


def source_label(hit: Hit) -> str:
    """``name.pdf, page 3`` (the page only where the file has pages)."""
    name = Path(hit.file).name
    return f"{name}, page {hit.page}" if hit.page is not None else name


def build_context(hits: Sequence[Hit], instructions: str = INSTRUCTIONS) -> str:
    """The prompt block for a chat: each hit as ``[n] file, page: text``, then the instructions, which the question
    follows. Empty without hits.

    The instructions come after the sources, beside the question: the default model (135M) answers from the right
    page more often so (12 questions on two PDFs: 9 right at bf16 and 8 at int4 and fp32, against 6 at each with the
    instructions first; ``tests/app/test_documents_real.py`` measures the app's preset), and a whole collection's
    sources are then the same prefix for every question, so their KV blocks are reused."""
    if not hits:
        return ""
    blocks = [f"[{n}] {source_label(hit)}\n{hit.text.strip()}" for n, hit in enumerate(hits, start=1)]
    return "Sources:\n\n" + "\n\n".join(blocks) + "\n\n" + instructions


def collection_pages(conn: sqlite3.Connection, collection: str) -> list[Hit]:
    """Every page of every file in ``collection`` as one source each (file order, then page order), its text
    rebuilt from the page's overlapping chunks by their offsets: the whole collection, for a chat whose documents
    fit its context (score 0). Empty for an unknown collection."""
    row = store.collection_row(conn, collection)
    if row is None:
        return []
    rows = conn.execute(
        'SELECT c.id, c.page, c.start, c."end", c.text, f.path FROM chunks c JOIN files f ON f.id = c.file_id'
        " WHERE c.collection_id = ? ORDER BY f.path, c.page, c.start",
        (int(row["id"]),),
    ).fetchall()
    pages: list[Hit] = []
    for r in rows:
        last = pages[-1] if pages else None
        if last is not None and (last.file, last.page) == (r["path"], r["page"]) and r["start"] <= last.end:
            extra = r["text"][last.end - r["start"]:] if r["end"] > last.end else ""
            pages[-1] = Hit(last.file, last.page, last.start, max(last.end, r["end"]), last.text + extra, 0.0,
                            last.chunk_id)
        elif last is not None and (last.file, last.page) == (r["path"], r["page"]):
            pages[-1] = Hit(last.file, last.page, last.start, r["end"], last.text + "\n\n" + r["text"], 0.0,
                            last.chunk_id)
        else:
            pages.append(Hit(r["path"], r["page"], r["start"], r["end"], r["text"], 0.0, int(r["id"])))
    return pages


def valid_citations(reply: str, n_sources: int) -> list[int]:
    """The source numbers a reply cites that exist (1..n_sources), each once, in order of first citation."""
    cited = (int(m.group(1)) for m in CITATION.finditer(reply))
    return list(dict.fromkeys(n for n in cited if 1 <= n <= n_sources))


def strip_invalid_citations(reply: str, n_sources: int) -> str:
    """The reply with every ``[n]`` that names no source removed."""
    return CITATION.sub(lambda m: m.group(0) if 1 <= int(m.group(1)) <= n_sources else "", reply)


@dataclass(frozen=True, slots=True)
class Attribution:
    """Source ``number`` ([1] first) is drawn on by the reply; ``passage`` is the source's sentence that matches the
    reply best (the snippet to show)."""

    number: int
    passage: str


def _stem(word: str) -> str:
    """A crude English stem, enough for "rises"/"rise" and "opened"/"opens"/"opening" to meet."""
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and not word.endswith("ss") and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)] if suffix != "es" or word[-3] in "sxz" else word[:-1]
            break
    return word[:-1] if word.endswith("e") and len(word) > 3 else word


def content_words(text: str) -> set[str]:
    """The stems of ``text``'s words that can tell sources apart: no stopwords, no citation markers, no one-letter
    words (numbers of any length are kept)."""
    words = _WORD.findall(CITATION.sub(" ", text).lower())
    stems = {_stem(w) for w in words if w not in STOPWORDS and (len(w) > 1 or w.isdigit())}
    return stems - STOPWORDS  # "answering" as well as "answer"


def sentences(text: str) -> list[str]:
    """``text`` cut into sentences (and lines), stripped, empty ones dropped."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def attribute(reply: str, sources: Sequence[str], question: str = "") -> list[Attribution]:
    """The sources (their texts, [1] first) that ``reply`` draws on, in the order the reply first uses them.

    Words of ``question`` do not count: a reply that echoes the question is not thereby drawn from a source that
    holds the question's words. See the module docstring for the rule.
    """
    if not sources:
        return []
    asked = content_words(question)
    source_words = [content_words(text) for text in sources]
    weight = _weights(source_words)
    credited: dict[int, set[str]] = {}
    for sentence in sentences(reply):
        said = content_words(sentence) - asked
        if not said:
            continue
        total = sum(weight(w) for w in said)
        for i, words in enumerate(source_words):
            shared = said & words
            if shared and (sum(weight(w) for w in shared) >= MIN_COVERAGE * total
                           or len(shared) >= MIN_SHARED_WORDS):
                credited.setdefault(i, set()).update(shared)
    return [Attribution(i + 1, _best_passage(sources[i], shared)) for i, shared in credited.items()]


def _weights(source_words: list[set[str]]) -> Callable[[str], float]:
    """A word's weight: ``log(1 + sources / sources holding it)``, highest for a word no source or one source holds."""
    n = len(source_words)
    frequency: dict[str, int] = {}
    for words in source_words:
        for w in words:
            frequency[w] = frequency.get(w, 0) + 1
    return lambda word: math.log(1.0 + n / max(frequency.get(word, 0), 1))


def _best_passage(text: str, words: set[str]) -> str:
    """The sentence of ``text`` that holds the most of ``words`` (the first such)."""
    return max(sentences(text) or [text], key=lambda s: len(content_words(s) & words))
