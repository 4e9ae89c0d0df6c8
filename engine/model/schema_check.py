"""Checks of a JSON schema before it is compiled into a grammar, so that schemas no document can satisfy, or
whose regexes would cost the grammar library unbounded work, are refused in words instead of failing later.

- :func:`check_schema` walks the schema once (its size and depth bounded), resolving local ``$ref``\\ s:
  a schema that must contain itself (a required property, a non-empty array's items or an ``allOf`` that leads
  back to the same schema, with no way out through ``anyOf``/``oneOf``) has no finite document; it is refused
  rather than left to the grammar, which spends seconds on its first mask and then can never finish.
- :func:`check_pattern` bounds a regex's cost: counted repeats nested inside each other multiply
  (``(a{1,1000}){1,1000}`` spells a million states), and a repeat of something that itself repeats without
  bound (``(a+)+``) is the classic exponential shape; both are refused with the pattern named.

Every refusal is a ``ValueError`` whose message names the part of the schema at fault.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from re import _constants as _sre_constants  # type: ignore[attr-defined]  # the regex parser (sre_parse)
from re import _parser as _sre_parser  # type: ignore[attr-defined]
from typing import Any

#: The most subschemas a schema may have (a large tool list is a few thousand).
MAX_SCHEMA_NODES = 20_000
#: The deepest nesting of subschemas (real schemas rarely pass 20).
MAX_SCHEMA_DEPTH = 64
#: The longest ``pattern``, in characters.
MAX_PATTERN_CHARS = 1_000
#: The most copies of a regex's parts that its counted repeats may spell out (``[a-z]{1,64}`` is 64).
MAX_PATTERN_EXPANSION = 10_000

_REPEATS = (_sre_constants.MAX_REPEAT, _sre_constants.MIN_REPEAT,
            *(getattr(_sre_constants, n) for n in ("POSSESSIVE_REPEAT",) if hasattr(_sre_constants, n)))
_MAXREPEAT = _sre_constants.MAXREPEAT
_COMBINERS = ("allOf", "anyOf", "oneOf")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMA_ONE = ("items", "additionalProperties", "additionalItems", "contains", "not", "if", "then", "else",
                  "propertyNames", "unevaluatedProperties", "unevaluatedItems")


def check_schema(schema: Any) -> None:
    """Refuse a schema that no finite document satisfies, that is too large or deep, or whose patterns are
    too costly; ``ValueError`` in words."""
    if not isinstance(schema, dict):
        return  # a boolean schema, or one the grammar library refuses itself
    for nodes, (path, node) in enumerate(_walk(schema, "#", 0), start=1):
        if nodes > MAX_SCHEMA_NODES:
            raise ValueError(f"json_schema has more than {MAX_SCHEMA_NODES} subschemas; send a smaller schema")
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            check_pattern(pattern, f"{path}/pattern")
        for key in node.get("patternProperties") or {}:
            if isinstance(key, str):
                check_pattern(key, f"{path}/patternProperties")
        ref = node.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            raise ValueError(f"json_schema refers to '{ref}' at {path}; only references inside the schema "
                             "('#/$defs/...') are supported")
        if isinstance(ref, str) and _resolve(schema, ref) is None:
            raise ValueError(f"json_schema refers to '{ref}' at {path}, which the schema does not define")
    looping = _endless_ref(schema)
    if looping is not None:
        raise ValueError(f"json_schema refers to itself through '{looping}' in a way every document must "
                         "follow (a required property, a non-empty array or allOf), so no finite JSON document "
                         "matches it; make the recursion optional")


def _walk(node: Any, path: str, depth: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every subschema object under ``node``, with its JSON pointer; ``ValueError`` past the depth limit."""
    if not isinstance(node, dict):
        return
    if depth > MAX_SCHEMA_DEPTH:
        raise ValueError(f"json_schema nests subschemas deeper than {MAX_SCHEMA_DEPTH} levels (at {path})")
    yield path, node
    for key in _SUBSCHEMA_MAPS:
        children = node.get(key)
        if isinstance(children, dict):
            for name, child in children.items():
                yield from _walk(child, f"{path}/{key}/{name}", depth + 1)
    for key in (*_SUBSCHEMA_ONE, "prefixItems", *_COMBINERS):
        child = node.get(key)
        if isinstance(child, list):
            for i, item in enumerate(child):
                yield from _walk(item, f"{path}/{key}/{i}", depth + 1)
        else:
            yield from _walk(child, f"{path}/{key}", depth + 1)


def _resolve(schema: dict[str, Any], ref: str) -> Any:
    """The subschema a local ``$ref`` (a JSON pointer after ``#``) names, or None."""
    node: Any = schema
    pointer = ref[1:]
    if not pointer:
        return node
    if not pointer.startswith("/"):
        return None  # an anchor name; the grammar library decides
    for part in pointer[1:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _endless_ref(schema: dict[str, Any]) -> str | None:
    """The first ``$ref`` (in the order the schema is read) that no finite document can instantiate, when the
    whole schema depends on it; None when every document can end.

    "Can end" is the least fixpoint over the references: a reference can end once its target can end assuming
    only the references already known to end, so a reference that can end only through itself never does.
    """
    refs: dict[str, bool] = {}
    for _, node in _walk(schema, "#", 0):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            refs.setdefault(ref, False)
    changed = True
    while changed:
        changed = False
        for ref, ends in refs.items():
            if not ends and _can_end(_resolve(schema, ref), refs, 0):
                refs[ref] = changed = True
    if _can_end(schema, refs, 0):
        return None
    return next((ref for ref, ends in refs.items() if not ends), "#")


def _can_end(node: Any, refs: dict[str, bool], depth: int) -> bool:
    """Whether some finite document matches ``node``, given which references can end."""
    if not isinstance(node, dict) or depth > MAX_SCHEMA_DEPTH:
        return True
    ref = node.get("$ref")
    if isinstance(ref, str) and not refs.get(ref, True):
        return False
    for key in ("anyOf", "oneOf"):
        branches = node.get(key)
        if isinstance(branches, list) and branches and not any(_can_end(b, refs, depth + 1) for b in branches):
            return False
    combined = node.get("allOf")
    if isinstance(combined, list) and not all(_can_end(b, refs, depth + 1) for b in combined):
        return False
    types = node.get("type")
    may_be_other = types is not None and types not in ("object", "array") and not (
        isinstance(types, list) and set(types) <= {"object", "array"})
    if may_be_other:
        return True  # a string or a number ends at once
    properties = node.get("properties")
    required = node.get("required")
    if isinstance(properties, dict) and isinstance(required, list):
        for name in required:
            if isinstance(name, str) and not _can_end(properties.get(name), refs, depth + 1):
                return False
    min_items = node.get("minItems")
    if isinstance(min_items, int) and min_items > 0:
        prefix = node.get("prefixItems")
        prefix = prefix if isinstance(prefix, list) else []
        if not all(_can_end(item, refs, depth + 1) for item in prefix[:min_items]):
            return False
        if min_items > len(prefix) and not _can_end(node.get("items"), refs, depth + 1):
            return False
    return True


def check_pattern(pattern: str, where: str = "pattern") -> None:
    """Refuse a regex too long, or whose nested repeats make its automaton explode. One Python's parser does not
    read is left to the grammar library, whose limits still bound it."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"json_schema's {where} is {len(pattern)} characters long; the limit is "
                         f"{MAX_PATTERN_CHARS}")
    try:
        parsed = _sre_parser.parse(pattern)
    except (re.error, RecursionError, OverflowError):
        return  # JSON Schema's regexes are ECMAScript's (``\\p{L}``...): the grammar library judges them
    size, _ = _cost(parsed, pattern, where)
    if size > MAX_PATTERN_EXPANSION:
        raise ValueError(f"json_schema's {where} '{_shown(pattern)}' nests counted repeats that spell out "
                         f"{size} copies (the limit is {MAX_PATTERN_EXPANSION}); use a simpler pattern")


def _shown(pattern: str) -> str:
    return pattern if len(pattern) <= 60 else pattern[:57] + "..."


def _cost(items: Any, pattern: str, where: str) -> tuple[int, bool]:
    """The expanded size of parsed regex ``items`` and whether it matches text of unbounded length."""
    size, unbounded = 0, False
    for op, arg in items:
        if op in _REPEATS:
            low, high, sub = arg
            sub_size, sub_unbounded = _cost(sub, pattern, where)
            if high == _MAXREPEAT and sub_unbounded:
                raise ValueError(f"json_schema's {where} '{_shown(pattern)}' repeats without bound a part that "
                                 "itself repeats without bound (like '(a+)+'); write the repeat once")
            size += sub_size * max(1, low if high == _MAXREPEAT else high)
            unbounded = unbounded or sub_unbounded or high == _MAXREPEAT
        elif op == _sre_constants.SUBPATTERN:
            sub_size, sub_unbounded = _cost(arg[-1], pattern, where)
            size, unbounded = size + sub_size, unbounded or sub_unbounded
        elif op == _sre_constants.BRANCH:
            costs = [_cost(branch, pattern, where) for branch in arg[1]]
            size += sum(c for c, _ in costs)
            unbounded = unbounded or any(u for _, u in costs)
        elif op in (_sre_constants.ASSERT, _sre_constants.ASSERT_NOT):
            size += _cost(arg[1], pattern, where)[0]
        else:
            size += 1
        if size > MAX_PATTERN_EXPANSION:
            return size, unbounded
    return size, unbounded
