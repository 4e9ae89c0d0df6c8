"""Ollama's native API on the server's port, through the ``ollama`` Python client."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.engine.server_process import KEYED, ServerProcess, run_server

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


def test_a_blob_of_an_ollama_store_is_served_by_its_tag_name(repo_root: Path, tmp_path: Path) -> None:
    """``python -m engine.serve --model ~/.ollama/models/blobs/sha256-…`` lists and answers as ``smollm2:135m``,
    the name ``ollama list`` gives it, not as the blob's file name."""
    from engine.loading.ollama import MODEL_MEDIA_TYPE
    from engine.tools.make_gguf import write_gguf

    store = tmp_path / "models"
    digest = "sha256:" + "5a7e1c0d" * 8
    manifest = store / "manifests" / "registry.ollama.ai" / "library" / "smollm2" / "135m"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"layers": [{"mediaType": MODEL_MEDIA_TYPE, "digest": digest}]}))
    blob = store / "blobs" / digest.replace(":", "-")
    blob.parent.mkdir()
    write_gguf(blob, "tiny", "Q8_0", seed=3, vocab=2048)
    with run_server(repo_root, tmp_path / "server.log", None, "--model", str(blob), "--quantization", "bf16") as server:
        assert [m["id"] for m in httpx.get(f"{server.v1}/models").json()["data"]] == ["smollm2:135m"]
        assert [m["name"] for m in httpx.get(f"{server.base_url}/api/tags").json()["models"]] == ["smollm2:135m"]
        reply = httpx.post(f"{server.v1}/chat/completions", timeout=60, json={
            "model": "smollm2:135m", "max_tokens": 3, "messages": [{"role": "user", "content": "Hi"}]})
        assert reply.status_code == 200, reply.text
        assert reply.json()["model"] == "smollm2:135m"
