"""A chat template rendered as transformers 5 renders it (``apply_chat_template(tokenize=False)``), without it.

The same sandbox (jinja2's immutable sandbox, ``trim_blocks``/``lstrip_blocks``, loop controls, a JSON ``tojson``,
``raise_exception``, ``strftime_now``, namespaces that refuse underscore names), the same inputs (messages without
their None-valued keys, rebuilt from plain JSON types, reasoning under its older names too, the special tokens as
variables) and the same handling of ``continue_final_message``. ``{% generation %}`` blocks render as their body
(Hearth asks for no assistant-token masks).

A template comes with the model file, so it is untrusted code: the sandbox stops it reaching Python's internals,
and :class:`_BoundedEnvironment` stops it spending unbounded time or memory. Every loop step and call counts
against a step budget and a wall-clock budget; every string or list a template builds (``*``, ``+``, ``~``, ``%``,
filters, methods, ``{{ }}`` output) is measured before it is built where its size can be foreseen, and counted
against a total. A template past any bound fails the render with :class:`ChatTemplateLimitError`.

Every chat render in the engine comes here, whichever tokenizer the model has: :func:`apply_chat_template` stands
in for the tokenizer's own method, transformers' included (a Qwen2 or SentencePiece tokenizer loads through
transformers, whose render has no bounds).

Long because the bounds must sit inside the one environment that renders: the sandbox, its budgets and the
measured operations are one mechanism, and a template escapes any part of it split off.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import json
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "

#: Longest string or list (in characters or items) one template step may build; also the longest rendered text.
#: Far above any context window's worth of text (a million tokens is a few million characters).
MAX_TEXT = 8 * 2**20
#: Characters and items all the steps of one render may build together.
MAX_BUILT = 128 * 2**20
#: Loop steps and calls one render may take.
MAX_STEPS = 2_000_000
#: Longest ``range()`` a template may make (jinja's sandbox's own bound).
MAX_RANGE = 100_000
#: Seconds one render may take.
MAX_SECONDS = 4.0


class ChatTemplateLimitError(ValueError):
    """The model's chat template went past a bound on time or memory (a broken or hostile template)."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"the model's chat template exceeded a limit ({what}), so it is broken or hostile and was stopped. "
            "Use a different model file, or override the chat template with one of your own"
        )


@dataclasses.dataclass
class _Budget:
    deadline: float
    steps: int = 0
    built: int = 0


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("chat_render_budget", default=None)


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
    compiled = _compiled(template)
    variables = {"messages": chat, "tools": _plain(tools), "documents": _plain(documents),
                 "add_generation_prompt": add_generation_prompt, **_plain(dict(values))}  # fmt: skip
    text = _bounded_render(compiled, variables)
    if continue_final_message:
        if final.strip() not in text or _CONTINUE_TAG.strip() not in text:
            raise ValueError("continue_final_message is set but the final message does not appear in the chat "
                             "after applying the chat template")  # fmt: skip
        at = text.rindex(_CONTINUE_TAG.strip())
        text = text[:at] if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:at].rstrip()
    return text


def apply_chat_template(
    tokenizer: Any,
    conversation: Sequence[Mapping[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    documents: list[dict[str, Any]] | None = None,
    chat_template: str | None = None,
    add_generation_prompt: bool = False,
    continue_final_message: bool | str = False,
    tokenize: bool = True,
    **kwargs: Any,
) -> str | list[int]:
    """``tokenizer.apply_chat_template(..., return_dict=False)`` for any tokenizer, transformers' or Hearth's, with
    the render bounded: the template ``tokenizer.get_chat_template`` picks (a name among several, ``tool_use`` when
    tools are given, the default), the tokenizer's ``special_tokens_map`` under ``kwargs`` as variables, and the text
    tokenized as transformers 5 tokenizes it, with ``add_special_tokens=False``. One conversation, tools as JSON
    schemas; text (``tokenize=False``) or ids."""
    template = tokenizer.get_chat_template(chat_template, tools)
    if not conversation:
        raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt are not compatible")
    if tools is not None and not all(isinstance(t, dict) for t in tools):
        raise ValueError("tools must be JSON schemas (dicts)")
    if documents is not None and not all(isinstance(d, dict) for d in documents):
        raise TypeError("Documents should be a list of dicts with 'title' and 'text' keys!")
    values = {**tokenizer.special_tokens_map, **kwargs}
    text = render_chat(template, conversation, tools, documents, add_generation_prompt, continue_final_message, values)
    if not tokenize:
        return text
    return [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]


def _bounded_render(compiled: Any, variables: dict[str, Any]) -> str:
    """The template's text, stopped with :class:`ChatTemplateLimitError` past a bound."""
    token = _BUDGET.set(_Budget(deadline=time.monotonic() + MAX_SECONDS))
    try:
        parts: list[str] = []
        length = 0
        for part in compiled.generate(**variables):
            _step()
            length += len(part)
            if length > MAX_TEXT:
                raise ChatTemplateLimitError(f"its text passed {MAX_TEXT} characters")
            parts.append(part)
        return "".join(parts)
    except RecursionError:
        raise ChatTemplateLimitError("it nested calls too deeply") from None
    except MemoryError:
        raise ChatTemplateLimitError("it ran out of memory") from None
    finally:
        _BUDGET.reset(token)


def _budget() -> _Budget:
    budget = _BUDGET.get()
    if budget is None:  # rendered outside render_chat: a budget of its own
        budget = _Budget(deadline=time.monotonic() + MAX_SECONDS)
        _BUDGET.set(budget)
    return budget


def _step() -> None:
    """One loop step or call: within the step and time budgets."""
    budget = _budget()
    budget.steps += 1
    if budget.steps > MAX_STEPS:
        raise ChatTemplateLimitError(f"it took more than {MAX_STEPS} loop steps and calls")
    if time.monotonic() > budget.deadline:
        raise ChatTemplateLimitError(f"it ran longer than {MAX_SECONDS:g} seconds")


def _build(size: int) -> None:
    """A string or list of ``size`` about to be built: within the size and total budgets."""
    if size > MAX_TEXT:
        raise ChatTemplateLimitError(f"it built a string or list of more than {MAX_TEXT} characters or items")
    budget = _budget()
    budget.built += size
    if budget.built > MAX_BUILT:
        raise ChatTemplateLimitError(f"it built more than {MAX_BUILT} characters and items in all")


def _size(value: Any, limit: int = MAX_TEXT) -> int:
    """About how long ``value``'s text is (strings and containers, walked), stopping once past ``limit``."""
    total, stack = 0, [value]
    while stack and total <= limit:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += 2 + 2 * len(item)
            if total <= limit:
                stack.extend(item)
        elif isinstance(item, Mapping):
            total += 2 + 4 * len(item)
            if total <= limit:
                stack.extend(item.keys())
                stack.extend(item.values())
        else:
            total += 8
    return total


_WIDTH = re.compile(r"[%:{.][^\d{}%\s]{0,3}(\d{4,})")  # a width or precision in a %- or {}-format


def _foreseen(args: Sequence[Any], kwargs: Mapping[str, Any], format_text: str | None = None) -> int:
    """About how large a result built from these arguments can be: their sizes, plus the largest number among
    them (a width, a count) times the first string's lines and tabs, plus any width in ``format_text``."""
    values = [*args, *kwargs.values()]
    numbers = [abs(v) for v in values if isinstance(v, int) and not isinstance(v, bool)]
    if format_text is not None:
        numbers += [int(w) for w in _WIDTH.findall(format_text[:MAX_TEXT])]
    first = next((v for v in values if isinstance(v, str)), "")
    spread = 1 + first.count("\n") + first.count("\t") if numbers else 0
    total = sum(min(_size(v), MAX_TEXT + 1) for v in values if isinstance(v, (str, list, tuple, dict)))
    return total + max(numbers, default=0) * spread


def _replaced_size(text: Any, old: Any, new: Any, count: Any = -1) -> int:
    if not (isinstance(text, str) and isinstance(old, str) and isinstance(new, str)):
        return 0
    hits = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return len(text) + hits * len(new)


def _guarded(func: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``func`` (a filter or a method) with its result's size foreseen and then counted."""

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        _step()
        plain = [a for a in args if not hasattr(a, "environment")]  # not a context or environment passed in
        if name == "replace":
            _build(_replaced_size(*plain[:4]) if 3 <= len(plain) <= 4 else _foreseen(plain, kwargs))
        else:
            _build(_foreseen(plain, kwargs, plain[0] if name == "format" and plain and isinstance(plain[0], str)
                             else None))  # fmt: skip
        result = func(*args, **kwargs)
        if isinstance(result, (str, list, tuple, dict)):
            _build(_size(result))
        return result

    return guarded


def _loop_items(items: Any) -> Iterator[Any]:
    """What a ``{% for %}`` walks, one counted step at a time."""
    for item in items:
        _step()
        yield item


def _concat(*parts: Any) -> str:
    """``a ~ b``: sized before it is built."""
    texts = [str(p) for p in parts]
    _build(sum(len(t) for t in texts))
    return "".join(texts)


def _shown(value: Any) -> Any:
    """A ``{{ value }}``: its text's size counted before it is made."""
    _step()
    _build(_size(value))
    return value


def _bounded_range(*args: Any) -> range:
    """``range()`` of at most :data:`MAX_RANGE` items."""
    _step()
    if not all(isinstance(a, int) for a in args):
        raise TypeError("range() takes integers")
    items = range(*args)
    if len(items) > MAX_RANGE:
        raise ChatTemplateLimitError(f"it asked for a range of more than {MAX_RANGE} items")
    return items


def _binop_size(operator: str, left: Any, right: Any) -> int:
    """About how large ``left operator right`` is, before it is computed."""
    sequences = (str, list, tuple)
    if operator == "*":
        if isinstance(left, int) and isinstance(right, sequences):
            left, right = right, left
        if isinstance(left, sequences) and isinstance(right, int):
            return len(left) * max(right, 0)
        if isinstance(left, int) and isinstance(right, int):
            return (left.bit_length() + right.bit_length()) // 3
    if operator == "+" and isinstance(left, sequences) and isinstance(right, sequences):
        return len(left) + len(right)
    if operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
        return min(left.bit_length() * right, MAX_TEXT * 16) // 3
    if operator == "%" and isinstance(left, str):
        return _foreseen([left, *(right if isinstance(right, tuple) else [right])], {}, left)
    return 0


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

    env = _environment_class()(trim_blocks=True, lstrip_blocks=True,
                               extensions=[Generation, jinja2.ext.loopcontrols])  # fmt: skip
    env.filters["tojson"] = tojson
    env.filters = {name: _guarded(f, name) for name, f in env.filters.items()}
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, dict=Dict(), namespace=Namespace,
                       range=_bounded_range)  # fmt: skip
    return env.from_string(template)


@functools.cache
def _environment_class() -> type:
    """Transformers' immutable sandbox with every loop, call, operator and output bounded (the module docstring)."""
    from jinja2 import nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.visitor import NodeTransformer

    def call(name: str, *args: Any) -> Any:
        node = nodes.Call(nodes.ImportedName(f"{__name__}.{name}"), list(args), [], None, None)
        return node.set_lineno(args[0].lineno if args and args[0].lineno else 1)

    class Bounds(NodeTransformer):
        """Loops walk counted steps, ``~`` is sized first, and each ``{{ }}`` is counted."""

        def visit_For(self, node: Any) -> Any:
            node = self.generic_visit(node)
            node.iter = call("_loop_items", node.iter)
            return node

        def visit_Concat(self, node: Any) -> Any:
            node = self.generic_visit(node)
            return call("_concat", *node.nodes)

        def visit_Output(self, node: Any) -> Any:
            node = self.generic_visit(node)
            node.nodes = [n if isinstance(n, nodes.TemplateData) else call("_shown", n) for n in node.nodes]
            return node

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "+", "**", "%"})

        def _parse(self, source: str, name: str | None, filename: str | None) -> Any:
            return Bounds().visit(super()._parse(source, name, filename))

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _step()
            _build(_binop_size(operator, left, right))
            return super().call_binop(context, operator, left, right)

        def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
            _step()
            owner = getattr(obj, "__self__", None)
            if isinstance(owner, (str, list, tuple, dict)):
                method = getattr(obj, "__name__", "")
                if method == "replace":
                    _build(_replaced_size(owner, *args[:3]))
                elif method == "join" and args:
                    _build(_size(args[0]) + len(owner) * _size(args[0], 2 * MAX_TEXT))
                else:
                    _build(_foreseen([owner, *args], kwargs))
            result = super().call(context, obj, *args, **kwargs)
            if isinstance(result, (str, list, tuple, dict)):
                _build(_size(result))
            return result

        def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
            wrapper = super().wrap_str_format(value)
            if wrapper is None:
                return None
            text = value.__self__

            @functools.wraps(wrapper)
            def sized(*args: Any, **kwargs: Any) -> str:
                _step()
                _build(_foreseen([text, *args], kwargs, text))
                return wrapper(*args, **kwargs)

            return sized

    return BoundedEnvironment


__all__ = ["MAX_TEXT", "ChatTemplateLimitError", "apply_chat_template", "render_chat"]
