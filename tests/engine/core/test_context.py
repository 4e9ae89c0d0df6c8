"""``engine.core.context.fit_messages``: what each overflow policy keeps when a chat outgrows the context."""

from __future__ import annotations

import pytest

from engine.core.context import ContextOverflowError, approximate_tokens, fit_messages


def words(messages: list[dict[str, str]]) -> int:
    """A token count for tests: one per word, two per message for the template."""
    return sum(len(m["content"].split()) + 2 for m in messages)


def chat(num_turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "be brief"}]
    for i in range(num_turns):
        messages += [{"role": "user", "content": f"question {i} " + "w " * 8},
                     {"role": "assistant", "content": f"answer {i} " + "w " * 8}]
    return messages + [{"role": "user", "content": "last question"}]


def test_a_chat_that_fits_is_kept_whole() -> None:
    messages = chat(2)
    assert fit_messages(messages, 1000, words, "stop") == messages


def test_truncate_middle_keeps_the_system_prompt_the_first_exchange_and_the_latest_turns() -> None:
    messages = chat(10)
    kept = fit_messages(messages, 80, words, "truncate_middle")
    assert words(kept) <= 80
    assert kept[0] == messages[0] and kept[1:3] == messages[1:3] and kept[-1] == messages[-1]
    assert kept[3]["role"] == "user"  # never a reply without its question
    assert len(kept) < len(messages) and kept[-2] == messages[-2]


def test_rolling_window_drops_the_oldest_turns() -> None:
    messages = chat(10)
    kept = fit_messages(messages, 80, words, "rolling_window")
    assert words(kept) <= 80 and kept[0] == messages[0] and kept[-1] == messages[-1]
    assert kept[1]["role"] == "user" and kept[1] != messages[1]
    assert kept[1:] == messages[len(messages) - len(kept) + 1:]  # a contiguous tail
    # as few dropped as possible: one more turn would not fit
    longer = [messages[0], *messages[len(messages) - len(kept) - 1:]]
    assert words(longer) > 80


def test_stop_says_why() -> None:
    with pytest.raises(ContextOverflowError, match="tokens long"):
        fit_messages(chat(10), 80, words, "stop")


def test_a_last_message_too_long_alone_raises_under_every_policy() -> None:
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "w " * 100}]
    for policy in ("truncate_middle", "rolling_window"):
        with pytest.raises(ContextOverflowError, match="last message"):
            fit_messages(messages, 50, words, policy)


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="overflow must be one of"):
        fit_messages(chat(1), 10, words, "drop_everything")


def test_approximate_tokens_grows_with_the_text() -> None:
    assert approximate_tokens([{"role": "user", "content": "x" * 400}]) == 104
