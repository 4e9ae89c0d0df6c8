"""Which of a reply's sources its Sources list shows. No Qt.

A source is shown as cited only when the reply names its number ([n] with 1 <= n <= the number of sources given);
a number the model made up is never listed (the reply's text is left as written: a "[10]" may be code). A small
model often cites nothing at all: the list then shows the sources the prompt carried that matched the question
best, under a title that says the reply did not cite them.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.data.attachments import Source
from engine.docs.context import valid_citations

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


def shown_sources(reply: str, sources: list[Source]) -> ShownSources:
    """The Sources list of a reply given ``sources`` ([1] first)."""
    cited = valid_citations(reply, len(sources))
    if cited:
        return ShownSources([(n, sources[n - 1]) for n in cited], True, len(sources))
    ranked = sorted(range(len(sources)), key=lambda i: -sources[i].score)
    return ShownSources([(i + 1, sources[i]) for i in ranked[:UNCITED_SHOWN]], False, len(sources))


def snippet(source: Source) -> str:
    """A source's passage on one line, cut to :data:`SNIPPET_CHARS`."""
    flat = " ".join((source.snippet or source.text).split())
    return flat if len(flat) <= SNIPPET_CHARS else flat[: SNIPPET_CHARS - 1].rstrip() + "…"
