"""Which sources a reply draws on, from its wording (engine.docs.context.attribute), on canned replies: the sources it
restates are credited and give the matching sentence as the snippet; echoing the question, answering from elsewhere
or saying nothing credits none."""

from __future__ import annotations

from engine.docs.context import attribute, content_words, sentences

PAGES = [
    "Harbour guide, page one. The harbour opens at dawn and closes at dusk every day of the year.",
    "The lighthouse keeper of Port Wendle is named Ottoline Brask. She has kept the light since 1987.",
    "Tides. The spring tide rises four metres above the low water mark in March.",
]


def _numbers(reply: str, question: str = "", sources: list[str] = PAGES) -> list[int]:
    return [a.number for a in attribute(reply, sources, question)]


def test_a_reply_restating_one_page_is_credited_to_that_page_alone() -> None:
    question = "Who is the lighthouse keeper of Port Wendle?"
    [only] = attribute("The keeper of Port Wendle is Ottoline Brask.", PAGES, question)
    assert only.number == 2 and only.passage == "The lighthouse keeper of Port Wendle is named Ottoline Brask."
    assert _numbers("The spring tide rises 4 metres above the low water mark in March.",
                    "How high does the spring tide rise?") == [3]
    assert _numbers("It opened at dawn.", "When does the harbour open?") == [1]  # "opened"/"opens" meet


def test_a_reply_drawing_on_two_pages_credits_both_in_the_order_it_uses_them() -> None:
    reply = "The spring tide rises four metres. Also, the harbour closes at dusk."
    assert _numbers(reply, "Tell me about the port.") == [3, 1]
    # one sentence that says two things credits each source it shares several words with
    assert _numbers("The harbour opens at dawn, and the spring tide rises four metres.", "The port?") == [1, 3]


def test_echoing_the_question_or_answering_from_elsewhere_credits_nothing() -> None:
    question = "Who is the lighthouse keeper of Port Wendle?"
    assert _numbers("I don't know who the lighthouse keeper of Port Wendle is.", question) == []
    assert _numbers("The capital of France is Paris.", "What is the capital of France?") == []
    assert _numbers("The answer to this question is: [1]", "Since when?") == []  # a bare marker is no wording
    assert _numbers("", question) == [] and _numbers("Anything at all.", question, sources=[]) == []


def test_a_single_distinctive_word_is_enough_when_it_is_all_the_reply_adds() -> None:
    """Half of what the sentence adds to the question is in the source: the year alone credits page 2."""
    assert _numbers("The keeper has kept the light since 1987.", "Since when has the keeper kept the light?") == [2]
    # a passing word among many that no source holds is not enough
    assert _numbers("Paris has many museums, cafes and a harbour.", "What about Paris?") == []


def test_citation_markers_and_stopwords_are_not_content() -> None:
    assert content_words("The answer is in [2] and [13].") == set()
    assert content_words("Rises, rise; opened OPENS 1987 a 7") == {"ris", "open", "1987", "7"}
    assert sentences("One. Two!\nThree? four: five") == ["One.", "Two!", "Three?", "four:", "five"]
