"""Checks a JSON schema typed into the app before a chat uses it, and says in plain words what is wrong.

No Qt. The check compiles the schema with llguidance, the library the engine constrains replies with
(``engine/model/grammar.py``), so a schema accepted here is one the engine can follow; it needs no model.
"""

from __future__ import annotations

import json
from typing import Any

#: The engine's JSON grammar options (compact whitespace); the same here so the check matches what it compiles.
_JSON_OPTIONS: Any = {"whitespace_flexible": False}


def parse_schema(text: str) -> dict[str, Any] | None:
    """The schema in ``text``, or None when ``text`` is blank (replies may then be any JSON object).

    Raises:
        ValueError: ``text`` is not JSON, not a JSON object, or a schema replies cannot be made to follow;
            the message says which, in plain words.
    """
    if not text.strip():
        return None
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"This is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}).") from None
    if not isinstance(schema, dict):
        raise ValueError("A schema must be a JSON object, starting with {.")  # noqa: TRY004 - bad input text
    from llguidance import LLMatcher

    try:
        grammar = LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=_JSON_OPTIONS)
        problem = LLMatcher.validate_grammar(grammar)
    except (ValueError, TypeError) as exc:
        problem = str(exc)
    if problem:
        raise ValueError(f"Replies cannot follow this schema: {problem.strip()}")
    return schema
