"""Retrieved chunks into a chat: the numbered sources block of the prompt, and the citations a reply may keep.

Sources are numbered [1]..[n] in the order retrieval ranked them, each with its file name and page, so the model
can cite them and the reply's Sources list can show them. A model may cite a number that was never given (an
invented source): `valid_citations` keeps only the numbers that exist, and `strip_invalid_citations` removes the
others from the reply text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

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


def valid_citations(reply: str, n_sources: int) -> list[int]:
    """The source numbers a reply cites that exist (1..n_sources), each once, in order of first citation."""
    cited = (int(m.group(1)) for m in CITATION.finditer(reply))
    return list(dict.fromkeys(n for n in cited if 1 <= n <= n_sources))


def strip_invalid_citations(reply: str, n_sources: int) -> str:
    """The reply with every ``[n]`` that names no source removed."""
    return CITATION.sub(lambda m: m.group(0) if 1 <= int(m.group(1)) <= n_sources else "", reply)
