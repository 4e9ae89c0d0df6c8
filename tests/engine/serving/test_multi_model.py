"""``python -m engine.serve --models-dir DIR``: every model on disk by name, loaded when a request names it, kept
within a count limit and a keep-alive, and driven by the real ``ollama`` and ``openai`` clients.

One headless server runs for the module over three tiny random models (llama, qwen2, mistral) with at most two
loaded at once, so loading, eviction and the 503 of a request that cannot fit all happen for real; two tiny random
embedding models (a BERT encoder, a Qwen3-Embedding-style decoder) sit beside them, served on the embeddings routes
through the same pool, their vectors the document index's for the same folder.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import ollama
import openai
import pytest

from engine.serving.pool import parse_keep_alive
from engine.tools.local_server import free_port, stop, wait_until_healthy
from tests.engine.conftest import build_tiny_model
from tests.engine.embedding_models import build_tiny_embedder

MODELS = ("tiny-llama", "tiny-qwen2", "tiny-mistral")
#: The embedding models beside them: name -> (model type, pooling).
EMBEDDERS = {"tiny-bert-embed": ("bert", "mean"), "tiny-qwen3-embed": ("qwen3", "last")}
#: Runs the server, then prints which Qt modules its process imported.
_WRAPPER = ("import sys; from engine.serving.cli import main\ntry: sys.exit(main(sys.argv[1:]))\nfinally: "
            "print('qt-modules:', sorted(m for m in sys.modules if m.startswith(('PySide6', 'shiboken6'))), "
            "flush=True)")


class Headless:
    def __init__(self, base_url: str, process: subprocess.Popen[bytes], log_path: Path, data_dir: Path,
                 models_dir: Path) -> None:
        self.base_url, self.process, self.log_path, self.data_dir = base_url, process, log_path, data_dir
        self.models_dir = models_dir

    def ps(self) -> list[str]:
        return [m["name"] for m in httpx.get(f"{self.base_url}/api/ps", timeout=30).json()["models"]]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def _serve(root: Path, models: Path, max_loaded: int) -> Iterator[Headless]:
    """A headless server in a home of its own over ``models``, keeping at most ``max_loaded`` loaded."""
    home, data = root / "home", root / "data"
    home.mkdir()
    port = free_port()
    # a home of its own: the server lists the test's models (and the default one), not the machine's
    env = {**os.environ, "HOME": str(home), "HF_HOME": str(home / "hf"), "HEARTH_DATA_DIR": str(data),
           "XDG_DATA_HOME": str(home / ".local/share"), "OLLAMA_MODELS": str(home / "ollama")}
    env.pop("HEARTH_API_KEY", None)
    args = [sys.executable, "-c", _WRAPPER, "--models-dir", str(models), "--host", "127.0.0.1", "--port", str(port),
            "--dtype", "float32", "--kv-cache-mb", "8", "--max-loaded-models", str(max_loaded), "--keep-alive", "10m",
            "--log-level", "info"]
    log_path = root / "server.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(args, cwd=Path(__file__).resolve().parents[3], stdout=log_file,
                                   stderr=subprocess.STDOUT, env=env)
    server = Headless(f"http://127.0.0.1:{port}", process, log_path, data, models)
    try:
        wait_until_healthy(process, port, 120, server.log)
        yield server
    finally:
        stop(process)


@pytest.fixture(scope="module")
def headless(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Iterator[Headless]:
    root = tmp_path_factory.mktemp("headless")
    models = root / "models"
    for family, name in zip(("llama", "qwen2", "mistral"), MODELS, strict=True):
        build_tiny_model(family, models / name, default_model_dir)
    for name, (model_type, pooling) in EMBEDDERS.items():
        build_tiny_embedder(model_type, models / name, pooling=pooling)
    with _serve(root, models, max_loaded=2) as server:
        yield server


@pytest.fixture
def client(headless: Headless) -> Iterator[ollama.Client]:
    c = ollama.Client(host=headless.base_url, timeout=120)
    yield c
    c._client.close()


def _unload_all(client: ollama.Client, headless: Headless) -> None:
    for name in headless.ps():
        client.chat(model=name, messages=[], keep_alive=0)


def test_every_model_on_disk_is_listed_and_none_is_loaded_before_it_is_asked_for(headless: Headless,
                                                                                   client: ollama.Client) -> None:
    names = [m.model for m in client.list().models]
    assert set(MODELS) <= set(names), names
    listed = openai.OpenAI(base_url=f"{headless.base_url}/v1", api_key="none").models.list()
    assert set(MODELS) <= {m.id for m in listed.data}
    assert client.ps().models == []


def test_chat_with_an_unloaded_model_loads_it_and_keep_alive_0_unloads_it(headless: Headless,
                                                                          client: ollama.Client) -> None:
    _unload_all(client, headless)
    reply = client.chat(model="tiny-llama", messages=[{"role": "user", "content": "Hello"}],
                        options={"num_predict": 6, "temperature": 0})
    assert reply.done and reply.message.role == "assistant" and 1 <= (reply.eval_count or 0) <= 6
    loaded = client.ps().models
    assert [m.model for m in loaded] == ["tiny-llama"] and (loaded[0].size or 0) > 0
    client.chat(model="tiny-llama", messages=[], keep_alive=0)
    assert client.ps().models == []


def test_a_third_model_evicts_the_least_recently_used_idle_one(headless: Headless, client: ollama.Client) -> None:
    _unload_all(client, headless)
    sdk = openai.OpenAI(base_url=f"{headless.base_url}/v1", api_key="none")
    for name in ("tiny-llama", "tiny-qwen2", "tiny-mistral"):
        out = sdk.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                          temperature=0, extra_body={"ignore_eos": True})
        assert out.model == name and out.usage is not None and out.usage.completion_tokens == 4
    assert sorted(headless.ps()) == ["tiny-mistral", "tiny-qwen2"]  # llama was the least recently used


def test_a_short_keep_alive_unloads_the_model_after_its_request(headless: Headless, client: ollama.Client) -> None:
    _unload_all(client, headless)
    client.generate(model="tiny-qwen2", prompt="Hi", options={"num_predict": 2}, keep_alive="1s")
    assert headless.ps() == ["tiny-qwen2"]
    deadline = time.monotonic() + 30
    while headless.ps():
        assert time.monotonic() < deadline, "the model outlived its keep-alive"
        time.sleep(0.25)


def test_an_unknown_model_is_a_404_naming_the_models_there_are(headless: Headless) -> None:
    r = httpx.post(f"{headless.base_url}/v1/chat/completions", timeout=30,
                   json={"model": "no-such-model", "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 404
    assert "no-such-model" in r.json()["error"]["message"] and "tiny-llama" in r.json()["error"]["message"]


def _stream(base_url: str, model: str, max_tokens: int, out: dict[str, Any], sdk: openai.OpenAI | None = None) -> None:
    """Stream one chat reply; record when its first token came, how many came, and its text."""
    start = time.monotonic()
    sdk = sdk or openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", timeout=120)
    count, first, finish, text = 0, None, None, ""
    with sdk.chat.completions.create(model=model, messages=[{"role": "user", "content": "Count"}], stream=True,
                                     max_tokens=max_tokens, temperature=0, extra_body={"ignore_eos": True},
                                     stream_options={"include_usage": True}) as stream:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
                if first is None:
                    first = time.monotonic() - start
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
            if chunk.usage is not None:
                count = chunk.usage.completion_tokens
    out.update(first=first, count=count, finish=finish, text=text)


def test_two_clients_alternating_two_models_get_whole_replies(headless: Headless, client: ollama.Client) -> None:
    _unload_all(client, headless)
    results: list[dict[str, Any]] = []
    for round_ in range(2):
        threads = []
        for model in ("tiny-llama", "tiny-mistral") if round_ % 2 == 0 else ("tiny-mistral", "tiny-llama"):
            results.append({"model": model})
            threads.append(threading.Thread(target=_stream, args=(headless.base_url, model, 24, results[-1])))
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
    for r in results:
        assert r["finish"] == "length" and r["count"] == 24, r  # no reply cut off
        assert r["first"] is not None
    assert sorted(headless.ps()) == ["tiny-llama", "tiny-mistral"]


_LOADED = re.compile(r"\bloaded (\S+) in ([\d.]+) s")
_UNLOADED = re.compile(r"\bunloaded (\S+) in ([\d.]+) s")


def test_two_clients_taking_turns_on_two_models_with_one_loaded_wait_one_swap_at_most(
    headless: Headless, tmp_path: Path
) -> None:
    """Two models asked for in turn by two clients, with one model loaded at a time, so every turn swaps them.

    Each reply is whole (every token it was asked for, the same text after each load), and its first token comes
    after one swap, not two: the swap is the server's own account of unloading the other model and loading this one;
    the margin is the slowest first token of a loaded model measured here, counted twice, since the first reply of a
    fresh engine also waits for what the log does not time (its first step, the freed model's memory handed back),
    which on a busy machine came to about one such reply. The bound is half a swap above one swap.
    The turns do not overlap: with one model at a time, a request for the other one while a reply streams is
    refused with a 503 (the pool's test below), never served by cutting the running reply off.
    """
    tokens, models = 16, ("tiny-llama", "tiny-mistral")
    with _serve(tmp_path, headless.models_dir, max_loaded=1) as server:
        log = server.data_dir / "logs" / "server.log"
        clients = {m: openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", timeout=120) for m in models}
        # a third model first, so that the server's own first-request work is done and every turn is a swap
        _stream(server.base_url, "tiny-qwen2", 1, {}, clients[models[0]])
        swaps: list[dict[str, Any]] = []
        loaded: list[dict[str, Any]] = []
        for turn in range(4):
            model = models[turn % 2]
            seen = len(log.read_text().splitlines()) if log.exists() else 0
            swaps.append({"model": model})
            _stream(server.base_url, model, tokens, swaps[-1], clients[model])
            lines = log.read_text().splitlines()[seen:]
            unloads = [(m[1], float(m[2])) for line in lines if (m := _UNLOADED.search(line))]
            loads = [(m[1], float(m[2])) for line in lines if (m := _LOADED.search(line))]
            before = models[1 - turn % 2] if turn else "tiny-qwen2"
            assert [n for n, _ in loads] == [model] and [n for n, _ in unloads] == [before], lines
            # the log gives each figure to 0.01 s: the swap may have taken up to half of that more per figure
            swaps[-1]["swap"] = sum(s + 0.005 for _, s in unloads + loads)
            for _ in range(2):  # the same model again: no load; the slowest of these is the margin
                loaded.append({"model": model})
                _stream(server.base_url, model, tokens, loaded[-1], clients[model])
        for client in clients.values():
            client.close()
    for reply in swaps + loaded:
        assert reply["finish"] == "length" and reply["count"] == tokens and reply["first"] is not None, reply
    for model in models:
        assert len({r["text"] for r in swaps if r["model"] == model}) == 1, swaps  # no reply cut short
    margin = max(r["first"] for r in loaded)
    # one swap, not two: the bound sits halfway between a wait of one swap and one of two (a fresh-clone run saw a
    # first token 58 ms past one swap plus twice the margin, work the log does not time)
    for reply in swaps:
        assert reply["first"] <= 1.5 * reply["swap"] + 2 * margin, ([(r["first"], r["swap"]) for r in swaps], margin)


def test_a_stream_whose_client_leaves_gives_its_lease_back(headless: Headless, client: ollama.Client) -> None:
    _unload_all(client, headless)
    with httpx.Client(timeout=60) as c, c.stream(
        "POST", f"{headless.base_url}/v1/chat/completions",
        json={"model": "tiny-qwen2", "stream": True, "max_tokens": 400, "ignore_eos": True,
              "messages": [{"role": "user", "content": "Go on"}]},
    ) as response:
        next(response.iter_lines())  # the model is loaded and streaming; then the client hangs up
    deadline = time.monotonic() + 60
    while True:
        loaded = httpx.get(f"{headless.base_url}/api/ps", timeout=30).json()["models"]
        if loaded and loaded[0]["active_requests"] == 0:
            break
        assert time.monotonic() < deadline, f"the stream's lease was never given back: {loaded}"
        time.sleep(0.2)
    client.chat(model="tiny-qwen2", messages=[], keep_alive=0)  # idle, so it unloads at once
    assert headless.ps() == []


def test_a_model_that_cannot_fit_beside_busy_ones_gets_a_503_saying_what_is_loaded(
    headless: Headless, tmp_path: Path
) -> None:
    """The pool itself, over real engines on the module's models: two leases held, a third model refused."""
    import asyncio

    from engine import LLM
    from engine.serving.pool import Entry, ModelPool
    from engine.serving.protocol import APIError

    models = Path(headless.models_dir)
    entries = [Entry(name, str(models / name)) for name in MODELS]

    def load(entry: Entry) -> Any:
        return LLM(entry.path, dtype="float32", kv_cache_bytes=8 << 20)

    async def scenario() -> tuple[APIError, list[str]]:
        pool = ModelPool(lambda: entries, load, max_loaded=2)
        held = [await pool.acquire("tiny-llama"), await pool.acquire("tiny-qwen2")]
        try:
            with pytest.raises(APIError) as refused:
                await pool.acquire("tiny-mistral")
            for model in held:
                pool.release(model)
            third = await pool.acquire("tiny-mistral")  # idle now: the least recently used one makes room
            pool.release(third)
            return refused.value, [m.name for m in pool.loaded()]
        finally:
            await pool.close()

    error, loaded = asyncio.run(scenario())
    assert error.status == 503 and error.headers.get("Retry-After")
    assert "tiny-llama" in error.message and "tiny-qwen2" in error.message and "in use" in error.message
    assert sorted(loaded) == ["tiny-mistral", "tiny-qwen2"]


TEXTS = ["the keeper of the lighthouse", "rope and oil in the shed", "a ship in the storm"]


def _assert_index_vectors(got: object, folder: Path, texts: list[str]) -> None:
    """``got`` are the vectors the document index's embedder for ``folder`` gives ``texts`` (cosine > 0.9999)."""
    from engine.docs.embedders import load_embedder

    embedder = load_embedder(str(folder.resolve()))
    assert embedder is not None
    want = embedder.embed(texts).astype(np.float64)
    got_array = np.asarray(got, dtype=np.float64)
    assert got_array.shape == want.shape
    cosines = (got_array * want).sum(axis=1) / np.linalg.norm(got_array, axis=1) / np.linalg.norm(want, axis=1)
    assert cosines.min() > 0.9999, cosines


def test_embedding_models_are_listed_with_their_type_and_shown_as_embedders(headless: Headless,
                                                                             client: ollama.Client) -> None:
    tags = {m.model: m for m in client.list().models}
    details = {name: tags[name].details for name in ("tiny-bert-embed", "tiny-qwen3-embed", "tiny-llama")}
    assert details["tiny-bert-embed"] is not None and details["tiny-bert-embed"].family == "bert"
    assert details["tiny-qwen3-embed"] is not None and details["tiny-qwen3-embed"].families == ["qwen3"]
    assert details["tiny-llama"] is not None and details["tiny-llama"].family == "llama"
    assert (tags["tiny-qwen3-embed"].size or 0) > 0
    listed = openai.OpenAI(base_url=f"{headless.base_url}/v1", api_key="none").models.list()
    assert set(EMBEDDERS) <= {m.id for m in listed.data}
    shown = httpx.post(f"{headless.base_url}/api/show", json={"model": "tiny-bert-embed"}, timeout=30).json()
    assert shown["capabilities"] == ["embedding"] and "tiny-bert-embed" not in headless.ps()  # shown, not loaded


def test_an_embeddings_request_loads_the_model_through_the_pool(headless: Headless, client: ollama.Client) -> None:
    from langchain_openai import OpenAIEmbeddings
    from pydantic import SecretStr

    _unload_all(client, headless)
    folders = {name: headless.models_dir / name for name in EMBEDDERS}
    with openai.OpenAI(base_url=f"{headless.base_url}/v1", api_key="none", timeout=120) as sdk:
        batch = sdk.embeddings.create(model="tiny-bert-embed", input=TEXTS)
        one = sdk.embeddings.create(model="tiny-bert-embed", input=TEXTS[2])
    assert batch.model == "tiny-bert-embed" and batch.usage.prompt_tokens > 0
    _assert_index_vectors([d.embedding for d in batch.data], folders["tiny-bert-embed"], TEXTS)
    _assert_index_vectors([one.data[0].embedding], folders["tiny-bert-embed"], TEXTS[2:])
    loaded = {m.model: m for m in client.ps().models}
    assert list(loaded) == ["tiny-bert-embed"] and (loaded["tiny-bert-embed"].size or 0) > 0  # its memory counted
    langchain = OpenAIEmbeddings(model="tiny-qwen3-embed", base_url=f"{headless.base_url}/v1",
                                 api_key=SecretStr("none"), check_embedding_ctx_length=False)
    _assert_index_vectors(langchain.embed_documents(TEXTS), folders["tiny-qwen3-embed"], TEXTS)
    reply = client.embed(model="tiny-qwen3-embed", input=TEXTS)
    _assert_index_vectors(reply.embeddings, folders["tiny-qwen3-embed"], TEXTS)
    assert sorted(headless.ps()) == sorted(EMBEDDERS)
    client.embed(model="tiny-bert-embed", input="x", keep_alive=0)  # unloaded as soon as it is idle, as in Ollama
    deadline = time.monotonic() + 30
    while headless.ps() != ["tiny-qwen3-embed"]:
        assert time.monotonic() < deadline, headless.ps()
        time.sleep(0.1)


def test_a_request_for_the_wrong_kind_of_model_is_a_400_that_says_so(headless: Headless) -> None:
    chat = httpx.post(f"{headless.base_url}/v1/chat/completions", timeout=30,
                      json={"model": "tiny-bert-embed", "messages": [{"role": "user", "content": "Hi"}]})
    assert chat.status_code == 400
    assert "'tiny-bert-embed' is an embedding model; use /v1/embeddings" in chat.json()["error"]["message"]
    ollama_chat = httpx.post(f"{headless.base_url}/api/chat", timeout=30, json={
        "model": "tiny-qwen3-embed", "messages": [{"role": "user", "content": "Hi"}], "stream": False})
    assert ollama_chat.status_code == 400 and "is an embedding model" in ollama_chat.text
    wrong = httpx.post(f"{headless.base_url}/v1/embeddings", json={"model": "tiny-llama", "input": "x"}, timeout=30)
    message = wrong.json()["error"]["message"]
    assert wrong.status_code == 400 and "'tiny-llama' is a chat model, not an embedding model" in message
    assert "tiny-bert-embed" in message and "tiny-qwen3-embed" in message
    ollama_wrong = httpx.post(f"{headless.base_url}/api/embed", json={"model": "tiny-llama", "input": "x"}, timeout=30)
    assert ollama_wrong.status_code == 400 and "is a chat model" in ollama_wrong.json()["error"]
    unknown = httpx.post(f"{headless.base_url}/v1/embeddings", json={"model": "nomic-embed-text", "input": "x"},
                         timeout=30)
    message = unknown.json()["error"]["message"]
    assert unknown.status_code == 404 and "no embedding model named 'nomic-embed-text'" in message
    assert "tiny-bert-embed" in message and "wordllama-l2-256" in message and "tiny-llama" not in message


def test_the_server_logs_to_the_data_folder_and_imports_no_qt(headless: Headless, client: ollama.Client) -> None:
    client.generate(model="tiny-llama", prompt="Hi", options={"num_predict": 1})
    log = headless.data_dir / "logs" / "server.log"
    assert log.is_file() and "loaded tiny-llama" in log.read_text()
    headless.process.send_signal(signal.SIGINT)  # uvicorn stops, then the interrupt unwinds main()
    headless.process.wait(60)
    assert "qt-modules: []" in headless.log(), headless.log()[-2000:]


@pytest.mark.parametrize(("value", "seconds"), [(300, 300.0), ("5m", 300.0), ("1h30m", 5400.0), ("0", 0.0),
                                                ("-1", None), (-5, None), ("250ms", 0.25), ("45", 45.0)])
def test_keep_alive_takes_what_ollama_takes(value: object, seconds: float | None) -> None:
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", ["soon", "5 minutes", True, [1], "nan", ""])
def test_a_bad_keep_alive_is_refused_in_words(value: object) -> None:
    with pytest.raises(ValueError, match="keep_alive"):
        parse_keep_alive(value)
