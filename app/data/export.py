"""Export a conversation to Markdown or JSON, and import it back from JSON.

The JSON is OpenAI's chat format (``{"messages": [{"role", "content"}, ...]}``, the shown branch)
plus a ``"hearth"`` section with what that format lacks: title, sampling parameters, per-message
metrics and the whole branch tree, so that :func:`from_json` restores every branch. A file with
only ``"messages"`` imports as a single-branch conversation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from app.data.records import DEFAULT_TITLE, ROLES, Conversation, Message
from app.data.storage import Storage

FORMAT_VERSION = 1

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
    for message in storage.active_path(conversation_id):
        lines += [f"## {message.role.capitalize()}", "", message.content, ""]
        if meta := _metadata_line(message):
            lines += [f"*{meta}*", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _message_meta(message: Message) -> dict[str, Any]:
    return {name: getattr(message, name) for name in (*_STR_META, *_INT_META, *_FLOAT_META)}


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
    tree = [
        {
            "id": m.id,
            "parent_id": m.parent_id,
            "role": m.role,
            "content": m.content,
            "created_at": m.created_at,
            "is_complete": m.is_complete,
            "metadata": _message_meta(m),
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


@dataclass(slots=True)
class _Node:
    """One validated message of an import, before it is written."""

    key: object  # its id in the file; parents refer to it
    parent_key: object
    role: str
    content: str
    created_at: float | None
    is_complete: bool
    metadata: dict[str, Any]


def _expect(value: object, kind: type | tuple[type, ...], where: str, optional: bool = False) -> Any:
    """Return ``value`` if it has type ``kind`` (bools are not numbers), else raise ValueError."""
    if optional and value is None:
        return None
    is_bool_as_number = isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))
    if not isinstance(value, kind) or is_bool_as_number:
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise ValueError(f"{where} must be {names}{' or null' if optional else ''}, got {value!r:.60}")
    return value


def _role(value: object, where: str) -> str:
    role = _expect(value, str, where)
    if role not in ROLES:
        raise ValueError(f"{where} must be one of {', '.join(ROLES)}, got {role!r}")
    return str(role)


def _metadata(value: object, where: str) -> dict[str, Any]:
    raw = _expect(value if value is not None else {}, dict, where)
    unknown = set(raw) - {*_STR_META, *_INT_META, *_FLOAT_META}
    if unknown:
        raise ValueError(f"{where} has unknown keys: {', '.join(sorted(map(str, unknown)))}")
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


def _nodes_from_openai(messages: list[Any]) -> tuple[str | None, list[_Node]]:
    """Read a plain OpenAI message list: leading system messages become the system prompt."""
    system_parts: list[str] = []
    nodes: list[_Node] = []
    for index, item in enumerate(messages):
        where = f"messages[{index}]"
        entry = _expect(item, dict, where)
        role = _role(entry.get("role"), f"{where}.role")
        content = _expect(entry.get("content"), str, f"{where}.content")
        if role == "system" and not nodes:
            system_parts.append(content)
            continue
        parent = nodes[-1].key if nodes else None
        nodes.append(_Node(index, parent, role, content, None, True, _metadata(None, where)))
    return ("\n\n".join(system_parts) or None), nodes


def _nodes_from_tree(tree: object) -> list[_Node]:
    """Read the ``hearth.tree`` list and order it so that every parent precedes its children."""
    nodes: dict[object, _Node] = {}
    for index, item in enumerate(_expect(tree, list, "hearth.tree")):
        where = f"hearth.tree[{index}]"
        entry = _expect(item, dict, where)
        key = _expect(entry.get("id"), (int, str), f"{where}.id")
        if key in nodes:
            raise ValueError(f"{where}.id {key!r} appears twice")
        created = _expect(entry.get("created_at"), (int, float), f"{where}.created_at", optional=True)
        nodes[key] = _Node(
            key=key,
            parent_key=_expect(entry.get("parent_id"), (int, str), f"{where}.parent_id", optional=True),
            role=_role(entry.get("role"), f"{where}.role"),
            content=_expect(entry.get("content"), str, f"{where}.content"),
            created_at=None if created is None else float(created),
            is_complete=_expect(entry.get("is_complete", True), bool, f"{where}.is_complete"),
            metadata=_metadata(entry.get("metadata"), f"{where}.metadata"),
        )
    ordered: list[_Node] = []
    placed: set[object] = set()
    pending = list(nodes.values())
    while pending:  # each pass keeps file order, so an exported (parent-first) tree takes one pass
        waiting = []
        for node in pending:
            if node.parent_key is None or node.parent_key in placed:
                ordered.append(node)
                placed.add(node.key)
            else:
                waiting.append(node)
        if len(waiting) == len(pending):
            node = waiting[0]
            problem = "a cycle" if node.parent_key in nodes else f"unknown parent_id {node.parent_key!r}"
            raise ValueError(f"hearth.tree: message {node.key!r} has {problem}")
        pending = waiting
    return ordered


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
    hearth = _expect(root.get("hearth"), dict, "hearth", optional=True)
    if hearth is None:
        system_prompt, nodes = _nodes_from_openai(messages)
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
        active_key = _expect(hearth.get("active_leaf_id"), (int, str), "hearth.active_leaf_id", optional=True)
        if active_key is not None and active_key not in {n.key for n in nodes}:
            raise ValueError(f"hearth.active_leaf_id {active_key!r} is not in hearth.tree")
    with storage.batch():
        conversation = storage.create_conversation(title, system_prompt, created_at=created_at)
        if any(value is not None for value in sampling.values()):
            storage.set_sampling(
                conversation.id, sampling["temperature"], sampling["top_p"], sampling["max_tokens"]
            )
            storage.set_model(conversation.id, sampling["model"])
        if reply_format is not None or schema is not None:
            storage.set_reply_format(conversation.id, reply_format, None if schema is None else json.dumps(schema))
        new_ids: dict[object, int] = {}
        for node in nodes:
            message = storage.add_message(
                conversation.id,
                node.role,
                node.content,
                None if node.parent_key is None else new_ids[node.parent_key],
                is_complete=node.is_complete,
                created_at=node.created_at,
                **node.metadata,
            )
            new_ids[node.key] = message.id
        leaf = None if active_key is None else new_ids[active_key]
        return storage.set_active_leaf(conversation.id, leaf)
