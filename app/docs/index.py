"""A conversation's attached files in the document index, and the numbered sources a prompt carries.

No Qt. Each conversation has a collection of its own in the ``engine.docs`` index (``documents/`` in the data
folder), named :func:`collection_name`. Every call opens its own connection, so indexing on a worker thread and
retrieval on the GUI thread never share one (SQLite's WAL lets the reader go on while the writer writes).

How a reply gets its sources (:meth:`DocumentIndex.prepare`), as LM Studio does it: when the whole text of the
chat's documents fits the context budget it goes into the prompt whole, one numbered source per page; otherwise the
best chunks for the question are retrieved by hybrid search (BM25 and vectors fused by RRF) and numbered instead.
A chat may also use document collections (watched folders, :mod:`app.docs.collections`): its documents are then
its own files and those collections together, whole when they all fit, else each searched and the rankings fused.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.data.attachments import Source
from engine.docs import store
from engine.docs.context import build_context, collection_pages
from engine.docs.indexer import index_collection
from engine.docs.search import Hit, reciprocal_rank_fusion, search

#: Chunks retrieved for a question when the documents do not fit whole (GPT4All gives 3, AnythingLLM 4 to 6).
TOP_K = 4
#: Characters per token, estimated on the low side (English runs about four) so an estimate errs towards "too long".
CHARS_PER_TOKEN = 3
#: Tokens kept free beyond the reply's room: the chat template's own tokens and the question's framing.
MARGIN_TOKENS = 128
#: The context assumed when the model's is not known (a remote server).
DEFAULT_CONTEXT = 4096
#: The room kept for a reply whose chat sets no token limit.
DEFAULT_REPLY_TOKENS = 512

Progress = Callable[[int, int, str], None]


def collection_name(conversation_id: int) -> str:
    """The index collection holding a conversation's attachments."""
    return f"chat-{conversation_id}"


def estimate_tokens(text: str) -> int:
    """A token count for budgeting, without the model's tokenizer."""
    return len(text) // CHARS_PER_TOKEN + 1


def sources_budget(history: Sequence[dict[str, str]], params: Mapping[str, Any], context_length: int) -> int:
    """The tokens a prompt's sources may take: the context less the reply's room (at most half of it), the chat's
    turns and a margin. A send (``DocumentsController.prepare``) and the context meter both budget by it."""
    context = context_length or DEFAULT_CONTEXT
    reply_room = int(params.get("max_tokens") or DEFAULT_REPLY_TOKENS)
    used = sum(estimate_tokens(m.get("content", "")) for m in history)
    return context - min(reply_room, context // 2) - used - MARGIN_TOKENS


@dataclass
class IndexOutcome:
    """What indexing attached files did: the files read, (path, reason) for each one that could not be, and the
    embedder the collection's search uses (``wordllama``, ``bm25`` or a model's path) with why that one."""

    indexed: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    embedder_reason: str = ""
    embedder: str = ""


@dataclass(frozen=True)
class Prepared:
    """The sources block for one prompt: ``sources`` in the block's order ([1] first), and whether the documents
    went in whole (else retrieved)."""

    block: str
    sources: list[Source]
    is_whole: bool


class DocumentIndex:
    """The document index in ``home`` (created when first used)."""

    def __init__(self, home: Path) -> None:
        self.home = Path(home)

    def _connect(self) -> sqlite3.Connection:
        return store.connect(self.home)

    def index(self, conversation_id: int, paths: list[str], progress: Progress | None = None) -> IndexOutcome:
        """Add ``paths`` to the conversation's collection and index what changed (any thread; it takes a while).

        Raises:
            FileNotFoundError: a path does not exist.
        """
        conn = self._connect()
        try:
            report = index_collection(conn, collection_name(conversation_id), [Path(p) for p in paths],
                                      progress=progress)
        finally:
            conn.close()
        return IndexOutcome(list(report.indexed), list(report.skipped), report.embedder_reason, report.embedder)

    def remove(self, conversation_id: int, path: str) -> None:
        """Stop using ``path`` in the conversation: its chunks leave the collection."""
        conn = self._connect()
        try:
            store.remove_root(conn, collection_name(conversation_id), path)
        finally:
            conn.close()

    def prepare(self, conversation_id: int, question: str, budget_tokens: int,
                collections: Sequence[str] = ()) -> Prepared | None:
        """The numbered sources for ``question`` from the conversation's own files and its ``collections``: the
        documents whole when they all fit ``budget_tokens``, else the :data:`TOP_K` best chunks of them all
        (fewer when even those do not fit). None when none of them holds any text."""
        names = list(dict.fromkeys([collection_name(conversation_id), *collections]))
        conn = self._connect()
        try:
            names = [n for n in names if store.collection_row(conn, n) is not None]
            size = sum(_text_size(conn, n) for n in names)
            if not size:
                return None
            # A large watched folder is not rebuilt page by page for each prompt when it cannot fit anyway.
            pages = _unique([p for n in names for p in collection_pages(conn, n)]) \
                if size // CHARS_PER_TOKEN <= 2 * budget_tokens else []
            hits = _fused([search(conn, n, question, top_k=max(TOP_K, 50)) for n in names]) \
                if question.strip() else []
        finally:
            conn.close()
        whole = build_context(pages)
        if pages and estimate_tokens(whole) <= budget_tokens:
            best: dict[tuple[str, int | None], Hit] = {}
            for hit in hits:  # best first: each page keeps its best chunk's score and text as its snippet
                best.setdefault((hit.file, hit.page), hit)
            sources = [_source(page, best.get((page.file, page.page))) for page in pages]
            return Prepared(whole, sources, is_whole=True)
        chosen = hits[:TOP_K]
        while chosen and estimate_tokens(build_context(chosen)) > budget_tokens:
            chosen = chosen[:-1]
        if not chosen:
            return None
        return Prepared(build_context(chosen), [_source(hit, hit) for hit in chosen], is_whole=False)


def _text_size(conn: sqlite3.Connection, name: str) -> int:
    """The characters of a collection's pages (their chunks' spans, overlaps counted once per page)."""
    row = conn.execute(
        'SELECT SUM(span) FROM (SELECT MAX(c."end") - MIN(c.start) AS span FROM chunks c'
        " JOIN collections k ON k.id = c.collection_id WHERE k.name = ? GROUP BY c.file_id, c.page)",
        (name,),
    ).fetchone()
    return int(row[0] or 0)


def _unique(hits: list[Hit]) -> list[Hit]:
    """Each passage once: a file both attached and in a chosen collection is not given twice."""
    seen: set[tuple[str, int | None, int, int]] = set()
    out = []
    for hit in hits:
        key = (hit.file, hit.page, hit.start, hit.end)
        if key not in seen:
            seen.add(key)
            out.append(hit)
    return out


def _fused(rankings: list[list[Hit]]) -> list[Hit]:
    """Several collections' hits (each best first) as one ranking, by reciprocal rank fusion: BM25-only and
    hybrid scores live on unrelated scales, ranks do not. Each hit keeps its own score for the Sources list."""
    if len(rankings) == 1:
        return _unique(rankings[0])
    flat = [hit for ranking in rankings for hit in ranking]
    ids, start = [], 0
    for ranking in rankings:
        ids.append([(start + i, hit.score) for i, hit in enumerate(ranking)])
        start += len(ranking)
    return _unique([flat[i] for i, _ in reciprocal_rank_fusion(ids)])


def _source(hit: Hit, best: Hit | None) -> Source:
    snippet = best.text if best is not None and best is not hit else ""
    return Source(hit.file, hit.page, hit.start, hit.end, hit.text, best.score if best is not None else 0.0,
                  snippet)


def with_sources(history: list[dict[str, str]], block: str) -> list[dict[str, str]]:
    """``history`` with the sources block put before the text of its last (user) turn.

    The block goes into the user turn rather than a system message: a small model (the default is a 135M one)
    follows what sits right beside the question far better than a system prompt many tokens away, some chat
    templates have no system role at all, and the earlier turns stay a byte-identical prefix, so their cached KV
    blocks are reused. Only the prompt changes; the stored message keeps what the user typed.
    """
    if not history or history[-1].get("role") != "user" or not block:
        return list(history)
    last = dict(history[-1])
    last["content"] = f"{block}\n\nQuestion: {last['content']}"
    return [*history[:-1], last]
