"""The embeddings routes (/v1/embeddings, /api/embed, /api/embeddings) over real HTTP with the real WordLlama
weights, through the openai SDK, the ollama client and LangChain's OpenAIEmbeddings; bad input is a 400 in words.
The routes need no chat model, so the server here serves them alone (create_app adds the same routes)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from starlette.applications import Starlette

from engine.docs.embedders import load_embedder
from engine.serving.embeddings import MODEL, embedding_routes
from engine.serving.openai_app import uvicorn_server
from engine.serving.transport import bind_socket


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    server = uvicorn_server(Starlette(routes=embedding_routes()))
    sock = bind_socket("127.0.0.1", 0)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    for _ in range(100):
        try:
            httpx.post(f"{url}/api/embeddings", json={"prompt": "x"}, timeout=5)
            break
        except httpx.TransportError:
            threading.Event().wait(0.05)
    yield url
    server.should_exit = True
    thread.join(5)
    sock.close()


def _expected(texts: list[str]) -> np.ndarray:
    embedder = load_embedder("wordllama")
    assert embedder is not None
    return embedder.embed(texts)


def test_the_openai_sdk(base_url: str) -> None:
    from openai import OpenAI

    with OpenAI(base_url=f"{base_url}/v1", api_key="unused") as client:
        reply = client.embeddings.create(model=MODEL, input=["a car", "an automobile"])  # base64 by default
        one = client.embeddings.create(model=MODEL, input="a car", encoding_format="float")
    got = np.array([d.embedding for d in reply.data], dtype=np.float32)
    assert got.shape == (2, 256) and np.allclose(got, _expected(["a car", "an automobile"]), atol=1e-6)
    assert reply.model == MODEL and reply.usage.prompt_tokens > 0
    assert np.allclose(one.data[0].embedding, got[0], atol=1e-6)


def test_the_ollama_client(base_url: str) -> None:
    import ollama

    client = ollama.Client(host=base_url)
    reply = client.embed(model=MODEL, input=["interest rates", "a kitten"])
    assert np.allclose(np.array(reply.embeddings), _expected(["interest rates", "a kitten"]), atol=1e-6)
    legacy = client.embeddings(model=MODEL, prompt="interest rates")
    client._client.close()
    assert np.allclose(legacy.embedding, reply.embeddings[0], atol=1e-6)


def test_langchain_openai_embeddings(base_url: str) -> None:
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(
        model=MODEL,
        base_url=f"{base_url}/v1",
        api_key="unused",
        check_embedding_ctx_length=False,  # type: ignore[arg-type]
    )
    vectors = embeddings.embed_documents(["a car", "an automobile"])
    assert np.allclose(np.array(vectors), _expected(["a car", "an automobile"]), atol=1e-5)
    assert np.allclose(embeddings.embed_query("a car"), vectors[0], atol=1e-5)


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        ("/v1/embeddings", {"model": MODEL}, 400, "'input' must be a string or a non-empty list"),
        ("/v1/embeddings", {"model": MODEL, "input": []}, 400, "non-empty list"),
        ("/v1/embeddings", {"model": MODEL, "input": [[1, 2, 3]]}, 400, "token arrays are not accepted"),
        (
            "/v1/embeddings",
            {"model": MODEL, "input": "x", "encoding_format": "int8"},
            400,
            "'encoding_format'",
        ),
        ("/v1/embeddings", {"model": MODEL, "input": "x", "dimensions": 64}, 400, "'dimensions' must be 256"),
        ("/v1/embeddings", {"model": "gpt-4", "input": "x"}, 404, "no embedding model named 'gpt-4'"),
        ("/api/embed", {"model": MODEL, "input": 5}, 400, "'input' must be a string"),
        ("/api/embeddings", {"model": MODEL}, 400, "'prompt' must be a string"),
    ],
)
def test_bad_input_is_refused_in_words(
    base_url: str, path: str, body: dict[str, object], status: int, words: str
) -> None:
    reply = httpx.post(base_url + path, json=body, timeout=10)
    assert reply.status_code == status and words in reply.text
    bad = httpx.post(base_url + path, content=b"{not json", timeout=10)
    assert bad.status_code == 400 and "not valid JSON" in bad.text
