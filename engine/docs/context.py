"""Retrieved chunks into a chat: the numbered sources block of the prompt, and the citations a reply may keep.

Sources are numbered [1]..[n] in the order retrieval ranked them, each with its file name and page, so the model
can cite them and the reply's Sources list can show them. A model may cite a number that was never given (an
invented source): `valid_citations` keeps only the numbers that exist, and `strip_invalid_citations` removes the
others from the reply text.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence
from pathlib import Path

from engine.docs import store
from engine.docs.search import Hit

CITATION = re.compile(r"\[(\d{1,4})\]")

INSTRUCTIONS = (
    "Answer from the sources below when they are relevant. Cite each source you use by its number in square "
    "brackets, like [1]. Do not cite a number that is not listed. If the sources do not answer the question, say so."
)


def source_label(hit: Hit) -> str:
    """``name.pdf, page 3`` (the page only where the file has pages)."""
    name = Path(hit.file).name
    return f"{name}, page {hit.page}" if hit.page is not None else name


def build_context(hits: Sequence[Hit], instructions: str = INSTRUCTIONS) -> str:
    """The prompt block for a chat: the instructions, then each hit as ``[n] file, page: text``. Empty without hits."""
    if not hits:
        return ""
    blocks = [f"[{n}] {source_label(hit)}\n{hit.text.strip()}" for n, hit in enumerate(hits, start=1)]
    return instructions + "\n\nSources:\n\n" + "\n\n".join(blocks)


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
