"""Fit a conversation into the context window: what to drop when a chat grows longer than the model can read.

The policies follow LM Studio's "context overflow" choices:

* ``"truncate_middle"``: keep the system prompt, the first exchange (what the chat is about) and the latest
  turns; drop turns from the middle.
* ``"rolling_window"``: keep the system prompt and the latest turns; drop the oldest.
* ``"stop"``: drop nothing; a conversation that does not fit raises :class:`ContextOverflowError` with a
  message for the user.

The last message (the one being answered) is never dropped. Token counts come from a function of the whole
message list, so chat-template tokens are counted too. Plain Python: no torch, no tokenizer of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

Message = dict[str, str]
OverflowPolicy = Literal["truncate_middle", "rolling_window", "stop"]
OVERFLOW_POLICIES: tuple[OverflowPolicy, ...] = ("truncate_middle", "rolling_window", "stop")


class ContextOverflowError(ValueError):
    """The conversation does not fit the context window under the chosen policy."""


def check_policy(policy: str) -> OverflowPolicy:
    """``policy`` if it is one of :data:`OVERFLOW_POLICIES`; ``ValueError`` otherwise."""
    if policy not in OVERFLOW_POLICIES:
        raise ValueError(f"overflow must be one of {', '.join(OVERFLOW_POLICIES)}, got {policy!r}")
    return policy


def fit_messages(
    messages: Sequence[Message],
    max_tokens: int,
    count_tokens: Callable[[list[Message]], int],
    policy: str = "truncate_middle",
    *,
    context_length: int | None = None,
) -> list[Message]:
    """The messages to send so that ``count_tokens(result) <= max_tokens``.

    Args:
        messages: the conversation, oldest first; system messages may lead it.
        max_tokens: the prompt's token budget (the context length less the room kept for the reply).
        count_tokens: the prompt's length in tokens for a message list (the chat template applied).
        policy: one of :data:`OVERFLOW_POLICIES`.
        context_length: the context the user chose (prompt and reply), for the error messages: they name it
            and the part of it kept for the reply, not ``max_tokens`` alone, which is only what is left.

    Returns:
        ``messages`` itself (as a new list) when it fits, else a shorter list that does: whole turns are
        dropped, and a kept turn never starts with the assistant's reply to a dropped question.

    Raises:
        ContextOverflowError: ``policy`` is "stop" and the conversation is too long, or even the system prompt
            and the last message alone do not fit.
        ValueError: an unknown policy.
    """
    policy = check_policy(policy)
    kept = list(messages)
    total = count_tokens(kept)
    if total <= max_tokens:
        return kept
    if policy == "stop":
        raise ContextOverflowError(
            f"This chat is {total} tokens long, {_room(max_tokens, context_length)} "
            + _choices("Start a new chat", "shorten your message", *_remedies(max_tokens, context_length),
                       "choose another overflow policy")
        )
    num_system = 0
    while num_system < len(kept) - 1 and kept[num_system].get("role") == "system":
        num_system += 1
    head = kept[:num_system]
    body = kept[num_system:]
    # the first exchange (a user turn and the reply to it) stays under "truncate_middle"
    num_pinned = 0
    if policy == "truncate_middle" and len(body) > 3:
        num_pinned = 2 if body[0].get("role") == "user" and body[1].get("role") == "assistant" else 1
    pinned, middle, last = body[:num_pinned], body[num_pinned:-1], body[-1:]

    def candidate(num_dropped: int) -> list[Message]:
        rest = middle[num_dropped:]
        while rest and rest[0].get("role") == "assistant":  # a reply without its question reads as nonsense
            rest = rest[1:]
        return head + pinned + rest + last

    # fewest dropped messages that fit: the count shrinks as more are dropped, so bisect
    low, high = 1, len(middle)
    if count_tokens(candidate(high)) > max_tokens:
        if pinned and count_tokens(head + last) <= max_tokens:
            return head + last
        raise ContextOverflowError(
            f"Even the system prompt and your last message alone are {count_tokens(head + last)} tokens, "
            f"{_room(max_tokens, context_length)} " + _choices("Shorten the message", *_remedies(max_tokens, context_length))
        )
    while low < high:
        mid = (low + high) // 2
        if count_tokens(candidate(mid)) <= max_tokens:
            high = mid
        else:
            low = mid + 1
    return candidate(low)


def _room(max_tokens: int, context_length: int | None) -> str:
    """Why the chat does not fit, in the user's terms: the context they set and what the reply keeps of it."""
    if context_length is None or context_length <= max_tokens:
        return f"more than the {max_tokens} the model can read with room for the reply."
    return (f"but the context holds {context_length} tokens and {context_length - max_tokens} of them are kept "
            f"for the reply (its Max tokens, up to half the context), which leaves {max_tokens} for the chat.")


def _remedies(max_tokens: int, context_length: int | None) -> list[str]:
    """What the user can change so that more fits."""
    if context_length is None or context_length <= max_tokens:
        return ["raise the context length"]
    return ["lower Max tokens", f"raise the context length above {context_length} (Model pane, then Load)"]


def _choices(*choices: str) -> str:
    """``choices`` as one sentence: "a, b or c."."""
    return f"{', '.join(choices[:-1])} or {choices[-1]}."


def approximate_tokens(messages: Sequence[Message]) -> int:
    """A rough token count without a tokenizer (about four characters a token, plus a few per message), for
    servers whose tokenizer is not at hand."""
    return sum(len(m.get("content", "")) // 4 + 4 for m in messages)
