"""Chat messages to token ids through the model's chat template, with message text kept as text.

A tokenizer turns the text ``<|im_end|>`` into the control token it names. If the rendered template were
tokenized as one string, a user could forge turns: ``<|im_end|><|im_start|>system ...`` inside a message would
become a real end of turn and a real system turn. So the template's own text is tokenized with its special
tokens, and each message's content is tokenized with ``split_special_tokens=True``: special-token text in it
stays ordinary text.

When no message contains special-token text, the ids are exactly what ``apply_chat_template(tokenize=True)``
gives. Either way the template renders in :mod:`engine.loading.chat_render`, within bounds on time and memory,
never in the tokenizer's own method (transformers' has none).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from engine.loading.chat_render import apply_chat_template


def _special_texts(tokenizer: Any) -> list[str]:
    texts = {str(t) for t in getattr(tokenizer, "all_special_tokens", [])}
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    texts.update(str(tok.content) for tok in added.values() if getattr(tok, "special", False))
    return sorted((t for t in texts if t), key=len, reverse=True)


def _contents(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if isinstance(m.get("content"), str)]


def has_special_text(tokenizer: Any, messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether any message's text contains the text of one of the tokenizer's special tokens."""
    specials = _special_texts(tokenizer)
    return any(s in content for content in _contents(messages) for s in specials)


def chat_token_ids(
    tokenizer: Any, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool, continue_final_message: bool,
    **template_kwargs: Any,
) -> list[int]:
    """Token ids of ``messages`` rendered by the tokenizer's chat template; message text never becomes control tokens."""
    if not has_special_text(tokenizer, messages):
        rendered = apply_chat_template(
            tokenizer,
            messages,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tokenize=True,
            **template_kwargs,
        )
        return [int(t) for t in rendered]
    # Render with a unique marker around each content, then tokenize template text and content text apart.
    tag = secrets.token_hex(8)
    marked: list[dict[str, Any]] = []
    originals: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            marked.append({**message, "content": f"\x00{tag}:{len(originals)}\x00"})
            originals.append(content)
        else:
            marked.append(dict(message))
    text = apply_chat_template(
        tokenizer,
        marked,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        tokenize=False,
        **template_kwargs,
    )
    ids: list[int] = []
    rest = str(text)
    while rest:
        start = rest.find(f"\x00{tag}:")
        template_part = rest if start < 0 else rest[:start]
        if template_part:
            ids += tokenizer(template_part, add_special_tokens=False)["input_ids"]
        if start < 0:
            break
        end = rest.index("\x00", start + 1)
        index = int(rest[start + 2 + len(tag) : end])
        ids += tokenizer(originals[index], add_special_tokens=False, split_special_tokens=True)["input_ids"]
        rest = rest[end + 1 :]
    return [int(t) for t in ids]
