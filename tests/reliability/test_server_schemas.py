"""The real server (the default model, in a subprocess) against schemas and Ollama bodies that once got 500s.

Before: a schema whose required property refers back to itself spent seconds building the grammar's first mask on
the engine thread and ended in a 500; a regex of nested repeats ended in a 500 with the grammar library's internals
in the message; a non-string Ollama ``model`` was a 500 (``AttributeError``). Now each is a 400 in words, answered
before anything is compiled or submitted, within a second.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.engine.server_process import OPEN, ServerProcess

HI = [{"role": "user", "content": "Say hi."}]
#: Words of the grammar library's own messages, which a client should never have to read.
INTERNALS = ("lexer", "fuel", "earley", "llguidance", "panic", "rust", "traceback", "nonterminal", "grammar too")
#: A 400 must come back at once (the bound is loose: the machine running the suite may be busy).
QUICK_S = 1.0


@pytest.fixture(scope="module")
def server(shared_server: Callable[..., ServerProcess]) -> ServerProcess:
    return shared_server(*OPEN)


def _timed_post(server: ServerProcess, path: str, body: dict[str, Any]) -> tuple[httpx.Response, float]:
    started = time.perf_counter()
    response = httpx.post(f"{server.base_url}{path}", json=body, headers=server.headers(), timeout=60)
    return response, time.perf_counter() - started


def _assert_quick_400(response: httpx.Response, elapsed_s: float, *words: str) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    message = error if isinstance(error, str) else error["message"]
    assert not any(w in message.lower() for w in INTERNALS), message
    for word in words:
        assert word in message, message
    assert elapsed_s < QUICK_S, f"the 400 took {elapsed_s:.2f} s"
    return message


SELF_REQUIRED = {"$ref": "#/$defs/node", "$defs": {"node": {
    "type": "object", "properties": {"child": {"$ref": "#/$defs/node"}}, "required": ["child"]}}}
ROOT_REQUIRED = {"type": "object", "properties": {"again": {"$ref": "#"}}, "required": ["again"]}
ARRAY_REQUIRED = {"$defs": {"list": {"type": "array", "items": {"$ref": "#/$defs/list"}, "minItems": 1}},
                  "type": "object", "properties": {"l": {"$ref": "#/$defs/list"}}, "required": ["l"]}
NESTED_COUNTED = {"type": "object", "properties": {"s": {"type": "string", "pattern": "(a{1,1000}){1,1000}"}},
                  "required": ["s"]}
NESTED_PLUS = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^((a+)+)+$"}}, "required": ["s"]}
BAD_SCHEMAS = {
    "self-required-ref": (SELF_REQUIRED, "refers to itself"),
    "root-required-ref": (ROOT_REQUIRED, "refers to itself"),
    "array-of-itself": (ARRAY_REQUIRED, "refers to itself"),
    "nested-counted-repeat": (NESTED_COUNTED, "pattern"),
    "nested-unbounded-repeat": (NESTED_PLUS, "pattern"),
}


@pytest.mark.parametrize("case", list(BAD_SCHEMAS), ids=list(BAD_SCHEMAS))
def test_an_impossible_or_explosive_schema_gets_a_quick_400(server: ServerProcess, case: str) -> None:
    schema, words = BAD_SCHEMAS[case]
    body = {"model": "default", "messages": HI, "max_tokens": 8,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    response, elapsed = _timed_post(server, "/v1/chat/completions", body)
    _assert_quick_400(response, elapsed, words)
    assert response.json()["error"]["param"] == "response_format"
    ollama, elapsed = _timed_post(server, "/api/chat", {"model": "default", "messages": HI, "stream": False,
                                                        "format": schema, "options": {"num_predict": 8}})
    _assert_quick_400(ollama, elapsed, words)


def test_a_recursive_schema_that_can_end_is_still_served(server: ServerProcess) -> None:
    tree = {"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 4},
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 1}},
        "required": ["name"]}}}
    body = {"model": "default", "messages": HI, "max_tokens": 8, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "tree", "schema": tree}}}
    response, _ = _timed_post(server, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text


OLLAMA_BODIES = {
    "model-number": ("/api/chat", {"model": 123, "messages": HI}, "model"),
    "model-list": ("/api/generate", {"model": ["default"], "prompt": "hi"}, "model"),
    "show-model-object": ("/api/show", {"model": {"name": "default"}}, "model"),
    "messages-content-list": ("/api/chat", {"model": "default", "messages": [{"role": "user", "content": [1]}]},
                              "content"),
    "role-number": ("/api/chat", {"model": "default", "messages": [{"role": 5, "content": "hi"}]}, "role"),
    "stream-string": ("/api/chat", {"model": "default", "messages": HI, "stream": "no"}, "stream"),
    "options-list": ("/api/generate", {"model": "default", "prompt": "hi", "options": [1]}, "options"),
    "temperature-string": ("/api/generate", {"model": "default", "prompt": "hi",
                                             "options": {"temperature": "hot"}}, "temperature"),
    "num-predict-string": ("/api/generate", {"model": "default", "prompt": "hi",
                                             "options": {"num_predict": "many"}}, "num_predict"),
    "stop-number": ("/api/generate", {"model": "default", "prompt": "hi", "options": {"stop": 7}}, "stop"),
    "system-number": ("/api/generate", {"model": "default", "prompt": "hi", "system": 1}, "system"),
    "tools-object": ("/api/chat", {"model": "default", "messages": HI, "tools": {"a": 1}}, "tools"),
}


@pytest.mark.parametrize("case", list(OLLAMA_BODIES), ids=list(OLLAMA_BODIES))
def test_an_ollama_body_of_the_wrong_types_gets_a_quick_400(server: ServerProcess, case: str) -> None:
    path, body, word = OLLAMA_BODIES[case]
    response, elapsed = _timed_post(server, path, body)
    _assert_quick_400(response, elapsed, word)
    assert httpx.get(f"{server.base_url}/health", timeout=5).status_code == 200
