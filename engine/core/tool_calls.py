"""Tool calls in a model's reply, for every family's format, whole or while the reply streams.

The formats, as the models write them (special tokens may be kept in the text or skipped by the detokenizer,
so each marker is optional):

- Hermes / Qwen: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per call, text around;
- Llama 3.x: ``<|python_tag|>{"name": ..., "parameters": {...}}`` (several joined by ``;``), or the bare JSON
  object that Llama 3.2's JSON tool calling writes;
- Mistral: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``, or the newer
  ``[TOOL_CALLS]name[ARGS]{...}``;
- a reply that is only a JSON call or a list of them (what ``tool_choice="required"`` constrains to).

:class:`ToolCallStream` takes the reply delta by delta: text that cannot be part of a call is released at once,
each call comes out as soon as its JSON closes. :func:`parse_reply` is the same over a whole reply. Malformed or
unknown calls are kept as :attr:`ToolCallParse.problems`, in words a model can act on; nothing here raises on
what a model wrote. :func:`tool_family` picks the family from the chat template and the tokenizer's tokens.

The prompt side lives here too (the server's ``engine/serving/tools.py`` and the MCP loop share it): tools into
the prompt through the chat template, or as a system message asking for Hermes calls when the template ignores
``tools``; :func:`choice_schema`, the JSON schema ``tool_choice="required"`` or a named function constrains a
reply to; and history messages as templates take them.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
MISTRAL_CALLS = "[TOOL_CALLS]"
MISTRAL_ARGS = "[ARGS]"
_MARKERS = (TOOL_CALL_OPEN, PYTHON_TAG, MISTRAL_CALLS)
#: End-of-turn texts a detokenizer that keeps special tokens may leave after a call.
_END_TEXTS = ("<|eom_id|>", "<|eot_id|>", "</s>", "<|im_end|>")
_NAME_ARGS = re.compile(r"\s*([A-Za-z0-9_.\-]+)\[ARGS\]")

Family = Literal["hermes", "llama", "mistral"]


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


@dataclass(slots=True)
class ToolCallParse:
    """A reply split into its plain text, its well-formed calls to known tools, and what was wrong with the rest."""

    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def extend(self, other: ToolCallParse) -> None:
        self.content += other.content
        self.calls += other.calls
        self.problems += other.problems


def tool_family(tokenizer: Any) -> Family:
    """The call format a model writes, from its chat template and its tokens; Hermes when nothing says otherwise
    (the format the server's own tool instructions ask for)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = " ".join(str(t) for t in template.values())
    text = template if isinstance(template, str) else ""
    get_vocab = getattr(tokenizer, "get_vocab", None)
    vocab: Any = get_vocab() if callable(get_vocab) else {}
    if MISTRAL_CALLS in text or (MISTRAL_CALLS in vocab and TOOL_CALL_OPEN not in text):
        return "mistral"
    if TOOL_CALL_OPEN in text:
        return "hermes"
    if PYTHON_TAG in text or "<|eom_id|>" in text or (PYTHON_TAG in vocab and "ipython" in text):
        return "llama"
    return "hermes"


def _call_of(value: Any, names: set[str], where: str) -> tuple[ToolCall | None, str | None]:
    """A decoded call object as a :class:`ToolCall`, or the problem with it."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None, f"{where}: a call must be a JSON object with a \"name\" and its \"arguments\""
    name = value["name"]
    if name not in names:
        known = ", ".join(sorted(names)) or "none"
        return None, f"{where}: there is no tool named {name!r} (the tools are: {known})"
    args = value.get("arguments", value.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON text already
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError as exc:
            return None, f"{where}: the arguments of {name!r} are not valid JSON ({exc})"
    if not isinstance(args, dict):
        return None, f"{where}: the arguments of {name!r} must be a JSON object, not {type(args).__name__}"
    return ToolCall(name, json.dumps(args)), None


def _looks_like_call(value: Any) -> bool:
    items = value if isinstance(value, list) else [value]
    return bool(items) and all(isinstance(v, dict) and "name" in v and
                               ("arguments" in v or "parameters" in v) for v in items)


class ToolCallStream:
    """A reply's calls as it streams: :meth:`feed` each delta, then :meth:`finish`.

    Each returns a :class:`ToolCallParse` of what is settled by then: text that cannot start a call, the calls
    whose JSON has closed, and the problems found. Text that may still turn into a call is held back until it
    is settled either way. ``names`` are the tools the model may call.
    """

    def __init__(self, names: list[str] | set[str]) -> None:
        self.names = set(names)
        self._buf = ""
        self._mode: Literal["text", "hermes", "json", "list", "bare"] = "text"
        self._started = False  # anything but whitespace released or consumed
        self._count = 0
        self._mistral = False

    @property
    def in_call(self) -> bool:
        """Whether a call is forming: its text is held back."""
        return self._mode != "text"

    def feed(self, delta: str) -> ToolCallParse:
        self._buf += delta
        out = ToolCallParse()
        while self._step(out, final=False):
            pass
        return out

    def finish(self) -> ToolCallParse:
        out = ToolCallParse()
        while self._step(out, final=True):
            pass
        rest, self._buf = self._buf, ""
        if self._mode in ("hermes", "json", "list") and rest.strip():
            self._count += 1
            out.problems.append(f"call {self._count}: the call was cut off before its JSON was complete: "
                                f"{rest.strip()[:200]!r}")
        else:
            self._emit(out, rest)
        self._mode = "text"
        return out

    # --- the state machine: each step consumes some of the buffer, or returns False to wait for more ----------
    def _step(self, out: ToolCallParse, final: bool) -> bool:
        if self._mode == "text":
            return self._text(out, final)
        if self._mode == "hermes":
            return self._hermes(out, final)
        if self._mode == "bare":
            return self._bare(out, final)
        return self._json(out)

    def _text(self, out: ToolCallParse, final: bool) -> bool:
        buf = self._buf
        if not buf:
            return False
        if not self._started:
            head = buf.lstrip()
            if not head:
                return False
            if head[0] in "{[" and not head.startswith(MISTRAL_CALLS[: len(head)]):
                self._buf, self._mode, self._started = head, "bare", True
                return True
        hits = [(buf.find(m), m) for m in _MARKERS if m in buf]
        if hits:
            at, marker = min(hits)
            self._emit(out, buf[:at])
            self._buf = buf[at + len(marker):]
            self._started = True
            self._mode = "hermes" if marker == TOOL_CALL_OPEN else "json"
            self._mistral = marker == MISTRAL_CALLS
            return True
        keep = 0 if final else _partial_marker(buf)
        self._emit(out, buf[: len(buf) - keep])
        self._buf = buf[len(buf) - keep:]
        return False

    def _emit(self, out: ToolCallParse, text: str) -> None:
        text = _strip_end_texts(text)
        if text:
            out.content += text
            self._started = self._started or bool(text.strip())

    def _hermes(self, out: ToolCallParse, final: bool) -> bool:
        end = self._buf.find(TOOL_CALL_CLOSE)
        if end < 0 and not final:
            return False
        block = self._buf if end < 0 else self._buf[:end]
        self._buf = "" if end < 0 else self._buf[end + len(TOOL_CALL_CLOSE):]
        self._mode = "text"
        self._decoded(block.strip(), out)
        return True

    def _decoded(self, text: str, out: ToolCallParse) -> None:
        self._count += 1
        where = f"call {self._count}"
        try:
            value = json.loads(text)
        except ValueError as exc:
            out.problems.append(f"{where}: not valid JSON ({exc}): {text[:200]!r}")
            return
        for item in value if isinstance(value, list) else [value]:
            call, problem = _call_of(item, self.names, where)
            if call is not None:
                out.calls.append(call)
            if problem is not None:
                out.problems.append(problem)

    def _json(self, out: ToolCallParse) -> bool:
        """After ``<|python_tag|>`` or ``[TOOL_CALLS]``: JSON calls (objects, or items of a list) one by one."""
        buf = self._buf.lstrip(" \t\r\n;," if self._mode == "json" else " \t\r\n,")
        self._buf = buf
        if not buf:
            return False
        if self._mode == "json" and MISTRAL_CALLS.startswith(buf[: len(MISTRAL_CALLS)]) and buf[:1] == "[":
            if len(buf) < len(MISTRAL_CALLS):
                return False  # may be the next call's marker
            self._buf, self._mistral = buf[len(MISTRAL_CALLS):], True
            return True
        if self._mode == "list" and buf[0] == "]":
            self._buf, self._mode = buf[1:], "json"
            return True
        if self._mode == "json" and buf[0] == "[":
            self._buf, self._mode = buf[1:], "list"
            return True
        if self._mode == "json" and self._mistral:
            named = _NAME_ARGS.match(buf)
            if named:
                return self._named_args(named, out)
            if MISTRAL_ARGS not in buf and re.fullmatch(r"\s*[A-Za-z0-9_.\-]*(\[[ARGS]{0,4})?", buf):
                return False  # may still become name[ARGS]
        if buf[0] != "{":
            if self._mode == "list":
                self._count += 1
                out.problems.append(f"call {self._count}: expected a JSON call object, found {buf[:80]!r}")
                self._buf, self._mode = "", "text"
                return False
            self._mode = "text"  # text after the calls
            return True
        try:
            value, end = json.JSONDecoder().raw_decode(buf)
        except ValueError:
            return False  # not closed yet
        self._buf = buf[end:]
        self._count += 1
        call, problem = _call_of(value, self.names, f"call {self._count}")
        if call is not None:
            out.calls.append(call)
        if problem is not None:
            out.problems.append(problem)
        return True

    def _named_args(self, named: re.Match[str], out: ToolCallParse) -> bool:
        rest = self._buf[named.end():].lstrip()
        try:
            args, end = json.JSONDecoder().raw_decode(rest)
        except ValueError:
            return False
        self._buf = rest[end:]
        self._count += 1
        call, problem = _call_of({"name": named.group(1), "arguments": args}, self.names, f"call {self._count}")
        if call is not None:
            out.calls.append(call)
        if problem is not None:
            out.problems.append(problem)
        return True

    def _bare(self, out: ToolCallParse, final: bool) -> bool:
        """A reply that starts with JSON: calls if it is a call object or a list of them, text otherwise."""
        try:
            value, end = json.JSONDecoder().raw_decode(self._buf)
        except ValueError:
            if final:
                self._mode = "text"
                return True
            return False
        if _looks_like_call(value):
            self._buf = self._buf[end:]
            self._mode = "json"  # more calls may follow (Llama joins them with ";")
            self._decoded(json.dumps(value), out)
        else:
            self._mode = "text"
            self._emit(out, self._buf[:end])
            self._buf = self._buf[end:]
        return True


def _partial_marker(text: str) -> int:
    """How many characters at the end of ``text`` may be the start of a marker (held back while streaming)."""
    best = 0
    for marker in _MARKERS + _END_TEXTS:
        for n in range(min(len(marker) - 1, len(text)), 0, -1):
            if text.endswith(marker[:n]):
                best = max(best, n)
                break
    return best


def _strip_end_texts(text: str) -> str:
    for end in _END_TEXTS:
        text = text.replace(end, "")
    return text


def parse_reply(text: str, names: list[str] | set[str]) -> ToolCallParse:
    """A whole reply's text, calls and problems (see :class:`ToolCallStream`)."""
    stream = ToolCallStream(names)
    out = stream.feed(text)
    out.extend(stream.finish())
    return out


def parse_tool_calls(text: str, names: list[str]) -> tuple[str, list[ToolCall]]:
    """The reply's plain content and the calls it makes (``auto``). A reply without well-formed calls to known
    tools is all content."""
    parsed = parse_reply(text, names)
    if not parsed.calls:
        return text, []
    return parsed.content.strip(), parsed.calls


def may_be_call(text: str) -> bool:
    """Whether a reply that starts like ``text`` may turn out to be a tool call (streaming holds it back)."""
    head = text.lstrip()
    return head[:1] in ("{", "[") or any(m.startswith(head[: len(m)]) or m in text for m in _MARKERS)


# --- the prompt side: tools into the prompt, the constraint for tool_choice ------------------------------
_INSTRUCTIONS = (
    "You can call functions. Their JSON signatures are:\n{tools}\n\n"
    "To call one, reply with only {open}{{\"name\": <function name>, \"arguments\": <arguments object>}}{close} "
    "(one block per call). Otherwise answer normally."
)



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
