"""Which of a reply's sources its Sources list shows. No Qt.

A source is shown as cited when the reply names its number ([n] with 1 <= n <= the number of sources given), or
when the reply draws on it by its wording (:func:`engine.docs.context.attribute`: a small model, the default among
them, seldom writes [n] itself); a number the model made up is never listed (the reply's text is left as written: a
"[10]" may be code). The sources the reply names come first, then those it draws on; each one it draws on shows the
sentence the reply matched as its snippet. A reply that neither names nor draws on any source (it answered from
elsewhere, or said it could not tell) gets the sources the prompt carried that matched the question best, under a
title that says the reply did not cite them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from app.data.attachments import Source
from engine.docs.context import attribute, valid_citations

#: How many uncited sources are listed, best match first, when a reply cites none.
UNCITED_SHOWN = 3
#: Characters of a source's passage shown in the list.
SNIPPET_CHARS = 160


@dataclass(frozen=True)
class ShownSources:
    """The list under a reply: (number in the prompt, source) pairs, and whether the reply cited them."""

    entries: list[tuple[int, Source]]
    is_cited: bool
    num_given: int

    @property
    def title(self) -> str:
        if self.is_cited:
            return "Sources"
        return "Sources searched (the reply cites none of them)"


def shown_sources(reply: str, sources: list[Source], question: str = "") -> ShownSources:
    """The Sources list of a reply to ``question`` given ``sources`` ([1] first)."""
    drawn = {a.number: a.passage for a in attribute(reply, [s.text for s in sources], question)}
    cited = list(dict.fromkeys([*valid_citations(reply, len(sources)), *drawn]))
    if cited:
        entries = [(n, replace(sources[n - 1], snippet=drawn[n]) if n in drawn else sources[n - 1]) for n in cited]
        return ShownSources(entries, True, len(sources))
    ranked = sorted(range(len(sources)), key=lambda i: -sources[i].score)
    return ShownSources([(i + 1, sources[i]) for i in ranked[:UNCITED_SHOWN]], False, len(sources))


def snippet(source: Source) -> str:
    """A source's passage on one line, cut to :data:`SNIPPET_CHARS`."""
    flat = " ".join((source.snippet or source.text).split())
    return flat if len(flat) <= SNIPPET_CHARS else flat[: SNIPPET_CHARS - 1].rstrip() + "…"
