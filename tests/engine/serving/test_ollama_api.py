"""Ollama's native API on the server's port, through the ``ollama`` Python client."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.engine.server_process import KEYED, ServerProcess

ollama = pytest.importorskip("ollama")


@pytest.fixture(scope="module")
def server(shared_server: Callable[..., ServerProcess]) -> ServerProcess:
    return shared_server(*KEYED)  # the API key guards /api/* as well as /v1


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[object]:
    ollama_client = ollama.Client(host=server.base_url, headers=server.headers(), timeout=120)
    yield ollama_client
    ollama_client._client.close()  # the client keeps an httpx connection pool open otherwise


def test_list_show_and_version(client: object, server: ServerProcess) -> None:
    models = client.list().models  # type: ignore[attr-defined]
    assert [m.model for m in models] == ["SmolLM2-135M-Instruct"]
    assert "completion" in client.show("default").capabilities  # type: ignore[attr-defined]
    assert httpx.get(f"{server.base_url}/api/version", headers=server.headers()).json()["version"]
    assert httpx.get(f"{server.base_url}/api/tags").status_code == 401  # the API key guards /api/* too


def test_chat_streams_and_generate_answers(client: object) -> None:
    parts = list(client.chat(model="default", messages=[{"role": "user", "content": "Say hi."}],  # type: ignore[attr-defined]
                             stream=True, options={"num_predict": 6, "temperature": 0}))
    assert parts[-1].done and parts[-1].done_reason in ("stop", "length")
    assert "".join(p.message.content for p in parts) and not any(p.done for p in parts[:-1])
    reply = client.generate(model="default", prompt="Why is the sky blue?", options={"num_predict": 5})  # type: ignore[attr-defined]
    assert reply.done and reply.response and 0 < reply.eval_count <= 5


def test_format_schema(client: object) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    reply = client.chat(model="default", messages=[{"role": "user", "content": "A number as JSON."}],  # type: ignore[attr-defined]
                        format=schema, options={"num_predict": 20})
    assert 0 <= json.loads(reply.message.content)["n"] <= 9
