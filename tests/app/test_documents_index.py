"""The sources a prompt carries (app.docs, no Qt): whole documents when they fit, retrieved chunks when not; which
sources a reply's list shows."""

from __future__ import annotations

from pathlib import Path

from app.data.attachments import Source
from app.docs.citations import shown_sources
from app.docs.index import TOP_K, DocumentIndex, estimate_tokens, with_sources
from tests.engine.docs.files import write_pdf

PAGES = ["Apples grow in the orchard.", "The lighthouse keeper is Ottoline Brask.", "Tides rise four metres."]


def test_documents_that_fit_go_in_whole_one_source_per_page(tmp_path: Path) -> None:
    index = DocumentIndex(tmp_path / "documents")
    pdf = write_pdf(tmp_path / "a.pdf", PAGES)
    outcome = index.index(7, [str(pdf)])
    assert outcome.indexed == [str(pdf.resolve())] and not outcome.skipped
    prepared = index.prepare(7, "Who keeps the lighthouse?", budget_tokens=2000)
    assert prepared is not None and prepared.is_whole
    assert [s.page for s in prepared.sources] == [1, 2, 3]
    assert "[2] a.pdf, page 2\nThe lighthouse keeper is Ottoline Brask." in prepared.block
    assert max(prepared.sources, key=lambda s: s.score).page == 2  # scored against the question all the same


def test_documents_too_long_for_the_budget_are_retrieved(tmp_path: Path) -> None:
    index = DocumentIndex(tmp_path / "documents")
    filler = "\n\n".join(f"Paragraph {i} is about the weather and the sea and nothing else." for i in range(400))
    long = tmp_path / "long.txt"
    long.write_text(filler + "\n\nThe secret harbour code is PELICAN-42.\n\n" + filler)
    index.index(1, [str(long)])
    assert index.prepare(1, "x", budget_tokens=10**6).is_whole  # type: ignore[union-attr]
    prepared = index.prepare(1, "What is the secret harbour code?", budget_tokens=1500)
    assert prepared is not None and not prepared.is_whole
    assert 1 <= len(prepared.sources) <= TOP_K and estimate_tokens(prepared.block) <= 1500
    assert "PELICAN-42" in prepared.sources[0].text
    assert index.prepare(1, "anything", budget_tokens=10) is None  # no room at all: no sources
    index.remove(1, str(long))
    assert index.prepare(1, "What is the secret harbour code?", budget_tokens=1500) is None


def test_sources_go_before_the_question_in_the_last_turn_only() -> None:
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
               {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Who?"}]
    out = with_sources(history, "SOURCES")
    assert out[:3] == history[:3] and out[3] == {"role": "user", "content": "SOURCES\n\nQuestion: Who?"}
    assert history[3]["content"] == "Who?"


def test_only_real_citations_are_listed() -> None:
    sources = [Source("/d/a.pdf", p, 0, 5, f"page {p}", score) for p, score in ((1, 0.1), (2, 0.3), (3, 0.2))]
    shown = shown_sources("It is so [3][2], and [7] too, and [2] again.", sources)
    assert shown.is_cited and [n for n, _ in shown.entries] == [3, 2]
    uncited = shown_sources("No citation at all [0].", sources)
    assert not uncited.is_cited and [n for n, _ in uncited.entries] == [2, 3, 1]  # best match first


def test_sources_a_reply_draws_on_are_listed_with_the_sentence_it_matched() -> None:
    pages = ["Apples grow in the orchard. Pears do not.", "The lighthouse keeper is Ottoline Brask. She is kind.",
             "Tides rise four metres."]
    sources = [Source("/d/a.pdf", p, 0, len(t), t, s) for p, t, s in zip((1, 2, 3), pages, (0.3, 0.2, 0.1), strict=True)]
    question = "Who keeps the lighthouse?"
    drawn = shown_sources("Ottoline Brask keeps it.", sources, question)
    assert drawn.is_cited and drawn.title == "Sources" and [n for n, _ in drawn.entries] == [2]
    assert drawn.entries[0][1].snippet == "The lighthouse keeper is Ottoline Brask."
    # the model's own valid [n] first, then what the reply draws on; an invented [9] still never shows
    both = shown_sources("Ottoline Brask [1][9]. Tides rise four metres.", sources, question)
    assert [n for n, _ in both.entries] == [1, 2, 3] and both.entries[0][1].snippet == ""
    # the reply only echoes the question: nothing is drawn on, the best matches are listed as searched
    echo = shown_sources("I cannot tell who keeps the lighthouse.", sources, question)
    assert not echo.is_cited and [n for n, _ in echo.entries] == [1, 2, 3]
