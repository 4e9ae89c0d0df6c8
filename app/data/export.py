"""Export a conversation to Markdown or JSON, and import it back from JSON.

The JSON is OpenAI's chat format (``{"messages": [{"role", "content"}, ...]}``, the shown branch)
plus a ``"hearth"`` section with what that format lacks: title, sampling parameters, per-message
metrics and the whole branch tree, with each reply's tool steps (``"tool_steps"``, in
:mod:`app.data.tool_steps`' form) and, for a reply whose chat was cut to fit the context, what was left out
(``"left_out": {"num_dropped_messages", "context_length"}``, :mod:`app.data.reply_context`), so that
:func:`from_json` restores every branch. A file with only ``"messages"`` imports as a single-branch conversation.
The Markdown says a cut reply's line as the chat shows it.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections import defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.data.records import DEFAULT_TITLE, ROLES, Conversation, Message, MessageNode
from app.data.reply_context import LeftOut, conversation_left_out, left_out_words, set_left_out
from app.data.storage import Storage
from app.data.tool_steps import ToolStepRecord, ToolStepStore, steps_from_json, steps_to_json

FORMAT_VERSION = 1
#: The largest file :func:`read_import_file` reads: far above any conversation typed and answered by hand,
#: and small enough that parsing it keeps memory and time in bounds.
MAX_IMPORT_BYTES = 64 * 2**20
#: The most messages (all branches) an import may hold.
MAX_IMPORT_MESSAGES = 50_000
#: The largest whole number a file may give (SQLite's INTEGER is 64-bit).
_MAX_INT = 2**63 - 1

_STR_META = ("model", "quantization", "finish_reason")
_INT_META = ("num_prompt_tokens", "num_generated_tokens")
_FLOAT_META = ("ttft_s", "tok_s")
_SAMPLING = (("temperature", float), ("top_p", float), ("max_tokens", int), ("model", str))


def _timestamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")


def _metadata_line(message: Message) -> str:
    """Return e.g. ``model qwen · 42.1 tok/s · TTFT 0.31 s · 120 tokens``, or ``""`` for none."""
    parts = []
    if message.model:
        quantization = f" ({message.quantization})" if message.quantization else ""
        parts.append(f"model {message.model}{quantization}")
    if message.tok_s is not None:
        parts.append(f"{message.tok_s:.1f} tok/s")
    if message.ttft_s is not None:
        parts.append(f"TTFT {message.ttft_s:.2f} s")
    if message.num_generated_tokens is not None:
        parts.append(f"{message.num_generated_tokens} tokens")
    if not message.is_complete:
        parts.append("incomplete")
    return " · ".join(parts)


def to_markdown(storage: Storage, conversation_id: int) -> str:
    """Render the conversation's shown branch as Markdown.

    Raises:
        ValueError: No conversation has this id.
    """
    conversation = storage.get_conversation(conversation_id)
    started = _timestamp(conversation.created_at)
    lines = [f"# {conversation.title}", "", f"*Exported from Hearth; started {started}*", ""]
    if conversation.system_prompt:
        lines += ["## System prompt", "", conversation.system_prompt, ""]
    steps = ToolStepStore(storage).conversation_steps(conversation_id)
    left_out = conversation_left_out(storage, conversation_id)
    for message in storage.active_path(conversation_id):
        lines += [f"## {message.role.capitalize()}", ""]
        if message.id in left_out:
            lines += [f"*{left_out_words(left_out[message.id])}*", ""]
        for step in steps.get(message.id or 0, []):
            server = f" (server {step.server})" if step.server else ""
            lines += [f"- *Tool {step.tool}{server}: {step.outcome}*"]
        if message.id in steps:
            lines += [""]
        lines += [message.content, ""]
        if meta := _metadata_line(message):
            lines += [f"*{meta}*", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _message_meta(message: Message) -> dict[str, Any]:
    return {name: getattr(message, name) for name in (*_STR_META, *_INT_META, *_FLOAT_META)}


def _left_out_json(left_out: LeftOut) -> dict[str, int]:
    return {"num_dropped_messages": left_out.num_dropped, "context_length": left_out.context_length}


def to_json(storage: Storage, conversation_id: int) -> dict[str, Any]:
    """Export a conversation as a JSON-ready dict: OpenAI ``messages`` plus a ``hearth`` section.

    Raises:
        ValueError: No conversation has this id.
    """
    conversation = storage.get_conversation(conversation_id)
    messages = []
    if conversation.system_prompt:
        messages.append({"role": "system", "content": conversation.system_prompt})
    messages += [{"role": m.role, "content": m.content} for m in storage.active_path(conversation_id)]
    steps = ToolStepStore(storage).conversation_steps(conversation_id)
    left_out = conversation_left_out(storage, conversation_id)
    tree = [
        {
            "id": m.id,
            "parent_id": m.parent_id,
            "role": m.role,
            "content": m.content,
            "created_at": m.created_at,
            "is_complete": m.is_complete,
            "metadata": _message_meta(m),
            **({"tool_steps": steps_to_json(steps[m.id])} if m.id in steps else {}),
            **({"left_out": _left_out_json(left_out[m.id])} if m.id in left_out else {}),
        }
        for m in storage.messages(conversation_id)
    ]
    return {
        "messages": messages,
        "hearth": {
            "format_version": FORMAT_VERSION,
            "title": conversation.title,
            "system_prompt": conversation.system_prompt,
            "created_at": conversation.created_at,
            "sampling": {name: getattr(conversation, name) for name, _ in _SAMPLING},
            "reply_format": {
                "response_format": conversation.response_format,
                "json_schema": None if conversation.json_schema is None else json.loads(conversation.json_schema),
            },
            "active_leaf_id": conversation.active_leaf_id,
            "tree": tree,
        },
    }


# --- import ---------------------------------------------------------------------------------------


class ImportRefused(ValueError):
    """The file is not imported as a whole (too large, too many messages, nested too deeply); the message is a
    sentence for the user."""


def _refuse_constant(name: str) -> None:
    raise ValueError(f"the file holds {name}, which is not a number JSON allows")


def read_import_file(path: Path) -> object:
    """Read and parse a conversation file, within :data:`MAX_IMPORT_BYTES`.

    Only a regular file is read (a FIFO or a device named like a JSON file is refused without blocking).

    Raises:
        ImportRefused: the file is too large, or nested too deeply to parse.
        OSError: it cannot be opened or read, or is not a regular file.
        UnicodeDecodeError: it is not UTF-8 text.
        ValueError: it is not JSON (``json.JSONDecodeError``), or holds NaN or Infinity.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_BINARY", 0))
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{Path(path).name} is not a regular file")
        if info.st_size > MAX_IMPORT_BYTES:
            raise ImportRefused(_too_large(info.st_size))
        raw = file.read(MAX_IMPORT_BYTES + 1)
    if len(raw) > MAX_IMPORT_BYTES:  # grew while being read
        raise ImportRefused(_too_large(len(raw)))
    text = raw.decode("utf-8")
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise ImportRefused("The file nests lists or objects too deeply to be a conversation.") from None


def _too_large(size: int) -> str:
    return (f"The file is too large to import: {size / 2**20:.1f} MiB, and Hearth imports files of up to "
            f"{MAX_IMPORT_BYTES // 2**20} MiB.")


def _expect(value: object, kind: type | tuple[type, ...], where: str, optional: bool = False) -> Any:
    """Return ``value`` if it has type ``kind`` (bools are not numbers), else raise ValueError.

    Numbers must be finite and fit SQLite's 64-bit integers; text must be encodable (no lone surrogates).
    """
    if optional and value is None:
        return None
    is_bool_as_number = isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))
    if not isinstance(value, kind) or is_bool_as_number:
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise ValueError(f"{where} must be {names}{' or null' if optional else ''}, got {_short(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where} must be a finite number, got {value}")
    if isinstance(value, int) and not isinstance(value, bool) and not -_MAX_INT <= value <= _MAX_INT:
        raise ValueError(f"{where} is too large a number")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{where} holds a character that is not valid text (a lone surrogate)") from None
    return value


def _short(value: object) -> str:
    """``value`` for an error message, cut short without first writing out all of it (a huge string or list)."""
    if isinstance(value, str):
        return repr(value[:60])
    if isinstance(value, (dict, list)):
        return f"a JSON {'object' if isinstance(value, dict) else 'list'}"
    return f"{value!r:.60}" if isinstance(value, (int, float, bool)) and abs(float(value)) < 1e300 else "a number"


def _role(value: object, where: str) -> str:
    role = _expect(value, str, where)
    if role not in ROLES:
        raise ValueError(f"{where} must be one of {', '.join(ROLES)}, got {_short(role)}")
    return str(role)


def _metadata(value: object, where: str) -> dict[str, Any]:
    raw = _expect(value if value is not None else {}, dict, where)
    unknown = set(raw) - {*_STR_META, *_INT_META, *_FLOAT_META}
    if unknown:
        names = sorted(str(name)[:40] for name in unknown)
        raise ValueError(f"{where} has unknown keys: {', '.join(names[:5])}{', …' if len(names) > 5 else ''}")
    meta: dict[str, Any] = {}
    for name in _STR_META:
        meta[name] = _expect(raw.get(name), str, f"{where}.{name}", optional=True)
    for name in _INT_META:
        meta[name] = _expect(raw.get(name), int, f"{where}.{name}", optional=True)
    for name in _FLOAT_META:
        number = _expect(raw.get(name), (int, float), f"{where}.{name}", optional=True)
        meta[name] = None if number is None else float(number)
    for name in (*_INT_META, *_FLOAT_META):
        if meta[name] is not None and meta[name] < 0:
            raise ValueError(f"{where}.{name} must be >= 0, got {meta[name]}")
    return meta


def _nodes_from_openai(messages: list[Any]) -> tuple[str | None, list[MessageNode]]:
    """Read a plain OpenAI message list: leading system messages become the system prompt."""
    system_parts: list[str] = []
    nodes: list[MessageNode] = []
    for index, item in enumerate(messages):
        where = f"messages[{index}]"
        entry = _expect(item, dict, where)
        role = _role(entry.get("role"), f"{where}.role")
        content = _expect(entry.get("content"), str, f"{where}.content")
        if role == "system" and not nodes:
            system_parts.append(content)
            continue
        parent = nodes[-1].key if nodes else None
        nodes.append(MessageNode(index, parent, role, content, None, True, _metadata(None, where)))
    return ("\n\n".join(system_parts) or None), nodes


def _tool_steps(tree: object) -> dict[object, list[ToolStepRecord]]:
    """The tool steps of ``hearth.tree``'s messages, by message id (the tree itself is checked by
    :func:`_nodes_from_tree`)."""
    steps = {}
    for index, entry in enumerate(tree if isinstance(tree, list) else []):
        if isinstance(entry, dict) and entry.get("tool_steps") is not None:
            steps[entry.get("id")] = steps_from_json(entry["tool_steps"], f"hearth.tree[{index}].tool_steps")
    return steps


def _left_out(tree: object) -> dict[object, LeftOut]:
    """What was left out of the context of ``hearth.tree``'s cut replies, by message id (the tree itself is
    checked by :func:`_nodes_from_tree`)."""
    found = {}
    for index, entry in enumerate(tree if isinstance(tree, list) else []):
        if not isinstance(entry, dict) or entry.get("left_out") is None:
            continue
        where = f"hearth.tree[{index}].left_out"
        value = _expect(entry["left_out"], dict, where)
        num = _expect(value.get("num_dropped_messages"), int, f"{where}.num_dropped_messages")
        context = _expect(value.get("context_length", 0), int, f"{where}.context_length")
        if num < 1:
            raise ValueError(f"{where}.num_dropped_messages must be at least 1, got {_short(num)}")
        if context < 0:
            raise ValueError(f"{where}.context_length must not be negative, got {_short(context)}")
        found[entry.get("id")] = LeftOut(num, context)
    return found


def _nodes_from_tree(tree: object) -> list[MessageNode]:
    """Read the ``hearth.tree`` list and order it so that every parent precedes its children.

    Siblings keep their order in the file, and roots come first in file order, whatever order the file lists
    parents and children in; the ordering visits each message once.
    """
    nodes: dict[object, MessageNode] = {}
    items = _expect(tree, list, "hearth.tree")
    if len(items) > MAX_IMPORT_MESSAGES:
        raise ImportRefused(_too_many(len(items)))
    for index, item in enumerate(items):
        where = f"hearth.tree[{index}]"
        entry = _expect(item, dict, where)
        key = _expect(entry.get("id"), (int, str), f"{where}.id")
        if key in nodes:
            raise ValueError(f"{where}.id {_short(key)} appears twice")
        created = _expect(entry.get("created_at"), (int, float), f"{where}.created_at", optional=True)
        nodes[key] = MessageNode(
            key=key,
            parent_key=_expect(entry.get("parent_id"), (int, str), f"{where}.parent_id", optional=True),
            role=_role(entry.get("role"), f"{where}.role"),
            content=_expect(entry.get("content"), str, f"{where}.content"),
            created_at=None if created is None else float(created),
            is_complete=_expect(entry.get("is_complete", True), bool, f"{where}.is_complete"),
            metadata=_metadata(entry.get("metadata"), f"{where}.metadata"),
        )
    children: dict[object, list[MessageNode]] = defaultdict(list)
    for node in nodes.values():
        if node.parent_key is not None and node.parent_key not in nodes:
            raise ValueError(f"hearth.tree: message {_short(node.key)} has unknown parent_id {_short(node.parent_key)}")
        children[node.parent_key].append(node)
    ordered: list[MessageNode] = []
    stack = list(reversed(children[None]))
    while stack:  # depth first, without recursion: a chain of thousands of messages is one long branch
        node = stack.pop()
        ordered.append(node)
        stack.extend(reversed(children.get(node.key, ())))
    if len(ordered) < len(nodes):  # what no root reaches hangs in a cycle
        placed = {id(node) for node in ordered}
        stuck = next(node for node in nodes.values() if id(node) not in placed)
        raise ValueError(f"hearth.tree: message {_short(stuck.key)} has a cycle")
    return ordered


def _too_many(count: int) -> str:
    return (f"The file holds {count:,} messages, and Hearth imports conversations of up to "
            f"{MAX_IMPORT_MESSAGES:,} messages.")


def from_json(storage: Storage, data: object) -> Conversation:
    """Import a conversation exported by :func:`to_json` (or a plain OpenAI ``messages`` dict).

    Everything is validated before anything is written, and the writes form one transaction.

    Args:
        storage: Where to create the conversation.
        data: The parsed JSON.

    Returns:
        The new conversation, showing the branch that was shown when exported.

    Raises:
        ValueError: The data is malformed; the message names the offending field.
    """
    root = _expect(data, Mapping, "the imported JSON")
    messages = _expect(root.get("messages"), list, "messages")
    if len(messages) > MAX_IMPORT_MESSAGES:
        raise ImportRefused(_too_many(len(messages)))
    hearth = _expect(root.get("hearth"), dict, "hearth", optional=True)
    if hearth is None:
        system_prompt, nodes = _nodes_from_openai(messages)
        steps: dict[object, list[ToolStepRecord]] = {}
        left_out: dict[object, LeftOut] = {}
        title, created_at, sampling, active_key = DEFAULT_TITLE, None, {}, (nodes[-1].key if nodes else None)
        reply_format, schema = None, None
    else:
        version = _expect(hearth.get("format_version"), int, "hearth.format_version")
        if version > FORMAT_VERSION:
            raise ValueError(f"hearth.format_version {version} is newer than this Hearth ({FORMAT_VERSION})")
        title = _expect(hearth.get("title", DEFAULT_TITLE), str, "hearth.title")
        if not title.strip():
            raise ValueError("hearth.title must not be blank")
        system_prompt = _expect(hearth.get("system_prompt"), str, "hearth.system_prompt", optional=True)
        created_at = _expect(hearth.get("created_at"), (int, float), "hearth.created_at", optional=True)
        raw_sampling = _expect(hearth.get("sampling", {}), dict, "hearth.sampling")
        sampling = {
            name: _expect(raw_sampling.get(name), (int, float) if kind is float else kind,
                          f"hearth.sampling.{name}", optional=True)
            for name, kind in _SAMPLING
        }  # fmt: skip
        raw_format = _expect(hearth.get("reply_format", {}), dict, "hearth.reply_format")
        reply_format = _expect(raw_format.get("response_format"), str, "hearth.reply_format.response_format",
                               optional=True)
        schema = _expect(raw_format.get("json_schema"), dict, "hearth.reply_format.json_schema", optional=True)
        nodes = _nodes_from_tree(hearth.get("tree", []))
        steps = _tool_steps(hearth.get("tree", []))
        left_out = _left_out(hearth.get("tree", []))
        active_key = _expect(hearth.get("active_leaf_id"), (int, str), "hearth.active_leaf_id", optional=True)
        if active_key is not None and active_key not in {n.key for n in nodes}:
            raise ValueError(f"hearth.active_leaf_id {_short(active_key)} is not in hearth.tree")
    with storage.batch():
        conversation = storage.create_conversation(title, system_prompt, created_at=created_at)
        if any(value is not None for value in sampling.values()):
            storage.set_sampling(
                conversation.id, sampling["temperature"], sampling["top_p"], sampling["max_tokens"]
            )
            storage.set_model(conversation.id, sampling["model"])
        if reply_format is not None or schema is not None:
            storage.set_reply_format(conversation.id, reply_format, None if schema is None else json.dumps(schema))
        conversation = storage.add_message_tree(conversation.id, nodes, active_key)
        if steps or left_out:  # the tree's messages were given ids in the order of nodes
            store = ToolStepStore(storage)
            for node, message in zip(nodes, storage.messages(conversation.id), strict=True):
                if node.key in steps:
                    store.add_all(message.id or 0, steps[node.key])
                if node.key in left_out:
                    set_left_out(storage, message.id or 0, left_out[node.key])
        return conversation


def import_file(storage: Storage, path: Path) -> Conversation:
    """Import the conversation file at ``path`` (:func:`read_import_file`, then :func:`from_json`).

    Raises:
        ImportRefused, OSError, ValueError: as :func:`read_import_file` and :func:`from_json`.
        sqlite3.Error: the database could not take it (locked by another program, or the disk is full);
            nothing is written then.
    """
    data = read_import_file(path)
    try:
        return from_json(storage, data)
    except RecursionError:  # a JSON schema nested nearly as deep as the parser allows, written back out
        raise ImportRefused("The file nests lists or objects too deeply to be a conversation.") from None
