"""The embeddings routes (/v1/embeddings, /api/embed, /api/embeddings) over real HTTP, through the openai SDK, the
ollama client and LangChain's OpenAIEmbeddings; bad input is a 400 in words.

First with the real WordLlama weights, served alone (the routes need no chat model; create_app adds the same
routes); then ``python -m engine.serve`` with a tiny chat model and two tiny random embedding models given with
``--embedding-model`` (a BERT encoder with CLS pooling, a Qwen3-Embedding-style decoder with last-token pooling),
whose vectors must be the document index's for the same folder."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from starlette.applications import Starlette

from engine.docs.embedders import load_embedder
from engine.serving.embeddings import MODEL, embedding_routes
from engine.serving.openai_app import uvicorn_server
from engine.serving.transport import bind_socket
from tests.engine.embedding_models import build_tiny_embedder, write_gguf
from tests.engine.server_process import ServerProcess, run_server


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
    from pydantic import SecretStr

    embeddings = OpenAIEmbeddings(
        model=MODEL,
        base_url=f"{base_url}/v1",
        api_key=SecretStr("unused"),
        check_embedding_ctx_length=False,
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


# -- embedding models run by the engine, beside a chat model -------------------------------------------------------
TEXTS = ["the lighthouse keeper", "a storm at sea, the boat in the harbour", "the museum hall"]


@pytest.fixture(scope="module")
def embedder_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("embedders")
    nomic, model = build_tiny_embedder("nomic_bert", root / "nomic-folder", pooling="mean")
    return {
        "tiny-bert": build_tiny_embedder("bert", root / "tiny-bert", pooling="cls")[0],
        "tiny-qwen3-embedding": build_tiny_embedder("qwen3", root / "tiny-qwen3-embedding", pooling="last")[0],
        # a llama.cpp nomic-bert GGUF file, Q8_0, served by its file name
        "tiny-nomic": write_gguf(nomic, model, root / "tiny-nomic.gguf", quantized=True),
    }


@pytest.fixture(scope="module")
def served(
    repo_root: Path, tiny_model_dirs: dict[str, Path], embedder_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """``python -m engine.serve`` on the tiny llama (the later ``--model`` wins over run_server's) with both
    embedding models."""
    flags = ["--model", str(tiny_model_dirs["llama"]), "--dtype", "float32"]
    for folder in embedder_dirs.values():
        flags += ["--embedding-model", str(folder)]
    log = tmp_path_factory.mktemp("served") / "server.log"
    with run_server(repo_root, log, None, *flags) as server:
        yield server


def _index_vectors(folder: Path, texts: list[str]) -> np.ndarray:
    """What the document index's embedder for ``folder`` gives for ``texts``."""
    embedder = load_embedder(str(folder.resolve()))
    assert embedder is not None
    return embedder.embed(texts)


def _assert_same(got: object, folder: Path, texts: list[str]) -> None:
    got_array = np.asarray(got, dtype=np.float64)
    want = _index_vectors(folder, texts).astype(np.float64)
    assert got_array.shape == want.shape
    cosines = (got_array * want).sum(axis=1) / np.linalg.norm(got_array, axis=1) / np.linalg.norm(want, axis=1)
    assert cosines.min() > 0.9999, cosines


@pytest.mark.parametrize("name", ["tiny-bert", "tiny-qwen3-embedding", "tiny-nomic"])
def test_the_openai_sdk_gets_the_index_vectors_of_an_embedding_model(
    served: ServerProcess, embedder_dirs: dict[str, Path], name: str
) -> None:
    from openai import OpenAI

    with OpenAI(base_url=served.v1, api_key="unused", max_retries=0, timeout=60) as client:
        batch = client.embeddings.create(model=name, input=TEXTS)  # base64, the SDK's default
        one = client.embeddings.create(model=name, input=TEXTS[1], encoding_format="float")
    assert batch.model == name and one.model == name and batch.usage.prompt_tokens > 0
    _assert_same([d.embedding for d in batch.data], embedder_dirs[name], TEXTS)
    _assert_same([one.data[0].embedding], embedder_dirs[name], TEXTS[1:2])


def test_langchain_and_the_ollama_client_get_the_same_vectors(
    served: ServerProcess, embedder_dirs: dict[str, Path]
) -> None:
    import ollama
    from langchain_openai import OpenAIEmbeddings
    from pydantic import SecretStr

    embeddings = OpenAIEmbeddings(
        model="tiny-bert", base_url=served.v1, api_key=SecretStr("unused"), check_embedding_ctx_length=False
    )
    _assert_same(embeddings.embed_documents(TEXTS), embedder_dirs["tiny-bert"], TEXTS)
    client = ollama.Client(host=served.base_url, timeout=60)
    reply = client.embed(model="tiny-qwen3-embedding", input=TEXTS)
    legacy = client.embeddings(model="tiny-qwen3-embedding:latest", prompt=TEXTS[0])
    wordllama = client.embed(model=MODEL, input=TEXTS[0])  # the built-in one is still served
    client._client.close()
    assert reply.model == "tiny-qwen3-embedding"
    _assert_same(reply.embeddings, embedder_dirs["tiny-qwen3-embedding"], TEXTS)
    _assert_same([legacy.embedding], embedder_dirs["tiny-qwen3-embedding"], TEXTS[:1])
    assert np.allclose(wordllama.embeddings, _expected(TEXTS[:1]), atol=1e-6)


def test_the_model_lists_name_the_embedding_models(served: ServerProcess, embedder_dirs: dict[str, Path]) -> None:
    ids = [m["id"] for m in httpx.get(f"{served.v1}/models", timeout=30).json()["data"]]
    assert ids[1:] == ["tiny-bert", "tiny-qwen3-embedding", "tiny-nomic"] and len(ids) == 4
    tags = {m["name"]: m for m in httpx.get(f"{served.base_url}/api/tags", timeout=30).json()["models"]}
    assert tags["tiny-bert"]["details"]["family"] == "bert" and tags["tiny-bert"]["size"] > 0
    assert tags["tiny-qwen3-embedding"]["details"]["families"] == ["qwen3"]
    assert tags["tiny-nomic"]["size"] == embedder_dirs["tiny-nomic"].stat().st_size
    shown = httpx.post(f"{served.base_url}/api/show", json={"model": "tiny-bert"}, timeout=30).json()
    assert shown["capabilities"] == ["embedding"]


def test_a_request_for_the_wrong_kind_of_model_is_refused_in_words(served: ServerProcess) -> None:
    chat = httpx.post(f"{served.v1}/chat/completions", timeout=30,
                      json={"model": "tiny-bert", "messages": [{"role": "user", "content": "Hi"}]})
    assert chat.status_code == 400 and "'tiny-bert' is an embedding model; use /v1/embeddings" in chat.text
    ollama_chat = httpx.post(f"{served.base_url}/api/chat", timeout=30, json={
        "model": "tiny-bert", "messages": [{"role": "user", "content": "Hi"}], "stream": False})
    assert ollama_chat.status_code == 400 and "use /api/embed" in ollama_chat.text
    chat_name = httpx.get(f"{served.v1}/models", timeout=30).json()["data"][0]["id"]
    wrong = httpx.post(f"{served.v1}/embeddings", json={"model": chat_name, "input": "x"}, timeout=30)
    assert wrong.status_code == 400, wrong.text
    error = wrong.json()["error"]
    assert "is a chat model, not an embedding model" in error["message"] and "tiny-bert" in error["message"]
    unknown = httpx.post(f"{served.v1}/embeddings", json={"model": "bge-small", "input": "x"}, timeout=30)
    message = unknown.json()["error"]["message"]
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
    assert "no embedding model named 'bge-small'" in message
    assert all(n in message for n in ("tiny-bert", "tiny-qwen3-embedding", MODEL)), message
    dims = httpx.post(f"{served.v1}/embeddings", json={"model": "tiny-bert", "input": "x", "dimensions": 8}, timeout=30)
    assert dims.status_code == 400 and "'dimensions' must be 32" in dims.text


def test_a_folder_that_is_no_embedding_model_stops_the_server_in_words(
    repo_root: Path, tiny_model_dirs: dict[str, Path]
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "engine.serve", "--port", "0", "--embedding-model", str(tiny_model_dirs["llama"])],
        cwd=repo_root, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "error: --embedding-model: llama is a llama; embedding models run as" in done.stderr, done.stderr
