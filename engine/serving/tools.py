"""Tool calling: OpenAI's ``tools`` into the prompt, the constraint for ``tool_choice``, and calls out of the reply.

- The prompt: the model's chat template renders the tools when it knows how (its source mentions ``tools``).
  Otherwise a system message lists them and asks for Hermes-style calls:
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
- ``tool_choice``: ``"none"`` leaves the tools out and parses nothing; ``"auto"`` lets the model choose and parses
  whatever calls it wrote; ``"required"`` and a named function constrain the reply by a JSON schema, so the
  arguments always validate: a named function's reply is its arguments object, ``required``'s is an array of
  ``{"name", "arguments"}`` objects (one item when ``parallel_tool_calls`` is false).
- The reply: :func:`parse_tool_calls` finds ``<tool_call>`` blocks, or a reply that is a JSON call (or a list of
  them) naming a known function, as Llama and Mistral models write them.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)

_INSTRUCTIONS = (
    "You can call functions. Their JSON signatures are:\n{tools}\n\n"
    "To call one, reply with only {open}{{\"name\": <function name>, \"arguments\": <arguments object>}}{close} "
    "(one block per call). Otherwise answer normally."
)


@dataclass(slots=True)
class ToolCall:
    name: str
    arguments: str  # a JSON text, as OpenAI sends it
    id: str = ""

    def __post_init__(self) -> None:
        self.id = self.id or f"call_{uuid.uuid4().hex[:24]}"

    def as_openai(self, index: int | None = None) -> dict[str, Any]:
        call: dict[str, Any] = {"id": self.id, "type": "function",
                                "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            call["index"] = index
        return call


def function_names(tools: list[dict[str, Any]]) -> list[str]:
    return [t["function"]["name"] for t in tools]


def template_knows_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders a ``tools`` argument."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = " ".join(str(t) for t in template.values())
    return isinstance(template, str) and "tools" in template


def with_tool_instructions(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with the tools described in the system message, for templates that ignore ``tools``."""
    signatures = "\n".join(json.dumps(t["function"], separators=(",", ":")) for t in tools)
    text = _INSTRUCTIONS.format(tools=signatures, open=TOOL_CALL_OPEN, close=TOOL_CALL_CLOSE)
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _parameters(tool: dict[str, Any]) -> dict[str, Any]:
    params = tool["function"].get("parameters")
    return params if isinstance(params, dict) and params else {"type": "object", "properties": {}}


def choice_schema(tools: list[dict[str, Any]], choice: str | dict[str, Any], parallel: bool) -> dict[str, Any] | None:
    """The JSON schema that ``required`` or a named ``tool_choice`` constrains the reply to; None otherwise."""
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        return _parameters(next(t for t in tools if t["function"]["name"] == name))
    if choice != "required":
        return None
    calls = [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                               "arguments": _parameters(t)},
              "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    schema: dict[str, Any] = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def constrained_calls(text: str, choice: str | dict[str, Any]) -> list[ToolCall]:
    """The calls in a reply constrained by :func:`choice_schema` (empty if it was cut short)."""
    try:
        value = json.loads(text)
    except ValueError:
        return []
    if isinstance(choice, dict):
        return [ToolCall(choice["function"]["name"], json.dumps(value))]
    return [ToolCall(c["name"], json.dumps(c["arguments"])) for c in value]


def _as_call(value: Any, names: set[str]) -> ToolCall | None:
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    args = value.get("arguments", value.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string already
        return ToolCall(value["name"], args)
    return ToolCall(value["name"], json.dumps(args))


def parse_tool_calls(text: str, names: list[str]) -> tuple[str, list[ToolCall]]:
    """The reply's plain content and the calls it makes (``auto``). A reply without calls is all content."""
    known = set(names)
    calls: list[ToolCall] = []
    if TOOL_CALL_OPEN in text:
        for block in _BLOCK.findall(text):
            try:
                call = _as_call(json.loads(block), known)
            except ValueError:
                call = None
            if call is not None:
                calls.append(call)
        content = _BLOCK.sub("", text).strip()
        return (content, calls) if calls else (text, [])
    stripped = text.strip()
    if stripped[:1] in ("{", "["):
        try:
            value = json.loads(stripped)
        except ValueError:
            return text, []
        items = value if isinstance(value, list) else [value]
        parsed = [_as_call(v, known) for v in items]
        if parsed and all(c is not None for c in parsed):
            return "", [c for c in parsed if c is not None]
    return text, []


def may_be_call(text: str) -> bool:
    """Whether a reply that starts like ``text`` may turn out to be a tool call (streaming holds it back)."""
    head = text.lstrip()
    return head[:1] in ("{", "[") or TOOL_CALL_OPEN.startswith(head[: len(TOOL_CALL_OPEN)]) or (
        TOOL_CALL_OPEN in text
    )


def history_message(message: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI history message as chat templates take it: assistant ``tool_calls`` with parsed arguments,
    and ``tool`` results with their call id; content always a string."""
    out: dict[str, Any] = {"role": message["role"], "content": message.get("content") or ""}
    if message.get("tool_calls"):
        calls = []
        for call in message["tool_calls"]:
            fn = call["function"]
            try:
                args: Any = json.loads(fn.get("arguments") or "{}")
            except ValueError:
                args = fn.get("arguments")
            calls.append({"id": call.get("id"), "type": "function",
                          "function": {"name": fn["name"], "arguments": args}})
        out["tool_calls"] = calls
    for key in ("tool_call_id", "name"):
        if message.get(key):
            out[key] = message[key]
    return out


def plain_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """History for a template without tool support: calls written out as ``<tool_call>`` blocks, results as
    user turns."""
    out = []
    for m in messages:
        if m["role"] == "tool":
            out.append({"role": "user", "content": f"Result of the function call {m.get('tool_call_id', '')}: "
                                                   f"{m['content']}"})
        elif m.get("tool_calls"):
            blocks = "".join(
                TOOL_CALL_OPEN + json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]})
                + TOOL_CALL_CLOSE for c in m["tool_calls"])
            out.append({"role": "assistant", "content": (m["content"] or "") + blocks})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out
