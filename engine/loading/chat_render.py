"""A chat template rendered as transformers 5 renders it (``apply_chat_template(tokenize=False)``), without it.

The same sandbox (jinja2's immutable sandbox, ``trim_blocks``/``lstrip_blocks``, loop controls, a JSON ``tojson``,
``raise_exception``, ``strftime_now``, namespaces that refuse underscore names), the same inputs (messages without
their None-valued keys, rebuilt from plain JSON types, reasoning under its older names too, the special tokens as
variables) and the same handling of ``continue_final_message``. ``{% generation %}`` blocks render as their body
(Hearth asks for no assistant-token masks).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def render_chat(
    template: str,
    conversation: Sequence[Mapping[str, Any]],
    tools: list[dict[str, Any]] | None,
    documents: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
    continue_final_message: bool | str,
    values: Mapping[str, Any],
) -> str:
    """The text of one conversation; ``values`` are the template's other variables (special tokens, options)."""
    chat = _alias_reasoning(_plain([{k: v for k, v in m.items() if v is not None} for m in conversation]))
    final = ""
    if continue_final_message:
        field = continue_final_message if isinstance(continue_final_message, str) else "content"
        final = _tag_final(chat, field, template)
    text = str(_compiled(template).render(
        messages=chat, tools=_plain(tools), documents=_plain(documents),
        add_generation_prompt=add_generation_prompt, **_plain(dict(values)),
    ))  # fmt: skip
    if continue_final_message:
        if final.strip() not in text or _CONTINUE_TAG.strip() not in text:
            raise ValueError("continue_final_message is set but the final message does not appear in the chat "
                             "after applying the chat template")  # fmt: skip
        at = text.rindex(_CONTINUE_TAG.strip())
        text = text[:at] if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:at].rstrip()
    return text


def _tag_final(chat: list[dict[str, Any]], field: str, template: str) -> str:
    """Mark the end of the message to continue (transformers' continue_final_message); return its text."""
    final = chat[-1].get(field)
    if final is None:
        raise ValueError(f'continue_final_message is set but the final message has no "{field}" to continue!')
    fields = [f for f in _REASONING_FIELDS if chat[-1].get(f) == final] if field in _REASONING_FIELDS else [field]
    if not any(f in template for f in fields):
        raise ValueError(f'continue_final_message is set to "{field}" but this is not an accepted field in the template')
    if isinstance(final, (list, tuple)):
        for block in reversed(final):
            if "text" in block:
                final, block["text"] = block["text"], block["text"] + _CONTINUE_TAG
                return str(final)
        raise ValueError("continue_final_message is set but we could not find any text to continue in the final message!")
    for f in fields:
        chat[-1][f] = chat[-1][f] + _CONTINUE_TAG
    return str(final)


def _alias_reasoning(chat: list[Any]) -> list[Any]:
    """``reasoning_content`` filled from its older names, and ``thinking`` for templates that read that."""
    out = []
    for message in chat:
        if isinstance(message, dict):
            reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
            if reasoning is not None:
                message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def _plain(value: Any) -> Any:
    """What a template sees, rebuilt from plain JSON types (the sandbox does not know other objects' methods)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


@functools.lru_cache(maxsize=16)
def _compiled(template: str) -> Any:
    """The template compiled in transformers' sandbox: immutable sandbox, trim/lstrip blocks, loop controls, a
    JSON ``tojson``, ``raise_exception``, ``strftime_now``, and ``{% generation %}`` blocks rendered as their body."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        tags = {"generation"}  # noqa: RUF012 -- jinja reads the class attribute

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return str(caller())

    class Namespace(jinja2.utils.Namespace):
        """Namespaces refuse underscore names (no reaching into Python internals)."""

        def __init__(*args: Any, **kwargs: Any) -> None:  # jinja's signature trick: `self` may be a key
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"chat templates cannot set {name!r} on a namespace")

    class Dict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:  # fmt: skip
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])  # fmt: skip
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, dict=Dict(), namespace=Namespace)
    return env.from_string(template)


__all__ = ["render_chat"]
