"""A chat that outgrows the context, on a real engine: the error names the context the user set, and the handle
says how many messages were left out."""

from __future__ import annotations

from typing import Any

import pytest

from engine.api import SamplingParams
from engine.core.context import ContextOverflowError, fit_messages
from tests.engine.conftest import TinyLLM


def long_chat(num_turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "Be brief."}]
    for i in range(num_turns):
        messages += [{"role": "user", "content": f"Question {i}: " + "tell me about bread " * 6},
                     {"role": "assistant", "content": f"Answer {i}: " + "bread is baked dough " * 6}]
    return messages + [{"role": "user", "content": "And what about cake?"}]


def words(messages: list[dict[str, str]]) -> int:
    return sum(len(m["content"].split()) + 2 for m in messages)


def test_the_overflow_error_names_the_context_and_the_room_kept_for_the_reply() -> None:
    with pytest.raises(ContextOverflowError) as caught:
        fit_messages(long_chat(10), 256, words, "stop", context_length=512)
    text = str(caught.value)
    assert "the context holds 512 tokens and 256 of them are kept for the reply" in text
    assert "lower Max tokens" in text and "raise the context length above 512" in text
    assert "Start a new chat" in text


def test_a_too_long_last_message_names_the_context_too() -> None:
    messages = [{"role": "user", "content": "w " * 400}]
    with pytest.raises(ContextOverflowError, match="your last message alone") as caught:
        fit_messages(messages, 256, words, "truncate_middle", context_length=512)
    assert "context holds 512 tokens" in str(caught.value)


def test_the_engine_names_the_users_context_not_what_is_left_after_the_reply(tiny_llm: TinyLLM) -> None:
    """A 512-token context with Max tokens 512 keeps 256 for the reply; the error used to say "256" alone, which
    read as if the setting had not reached the engine."""
    llm: Any = tiny_llm(max_model_len=512)
    with pytest.raises(ValueError, match="the context holds 512 tokens") as caught:
        llm.engine.submit(long_chat(20), SamplingParams(max_tokens=512), overflow="stop")
    assert "256 of them are kept for the reply" in str(caught.value)


def test_the_handle_counts_the_messages_left_out(tiny_llm: TinyLLM) -> None:
    llm: Any = tiny_llm(max_model_len=512)
    chat = long_chat(20)
    handle = llm.engine.submit(chat, SamplingParams(max_tokens=16), overflow="truncate_middle")
    kept = llm.engine.fit_context(chat, SamplingParams(max_tokens=16), "truncate_middle")
    assert handle.num_dropped_messages == len(chat) - len(kept) > 0
    whole = llm.engine.submit(chat[-3:], SamplingParams(max_tokens=16), overflow="truncate_middle")
    assert whole.num_dropped_messages == 0
    for h in (handle, whole):
        h.cancel()
