"""A request that leaves a sampling field out gets the model's own setting (its generation_config.json or Hearth's
preset for it), as LM Studio and Ollama do; a field the request sets wins, even at the API's neutral value."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from engine.serving.async_engine import AsyncLLMEngine
from engine.serving.guards import GuardRules
from engine.serving.openai_app import create_app
from engine.serving.protocol import ChatCompletionRequest
from tests.engine.conftest import TinyLLM

MODEL_DEFAULTS = {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.05, "repeat_last_n": 32}


def test_left_out_fields_take_the_model_defaults_and_set_ones_win() -> None:
    body = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "top_p": 1.0,
                                                 "top_k": 0})
    params = body.sampling_params(None, 64, MODEL_DEFAULTS)
    assert params.temperature == 0.6 and params.repetition_penalty == 1.05  # left out: the model's
    assert params.repeat_last_n == 32
    assert params.top_p == 1.0 and params.top_k == 0  # set by the request, even to the neutral value
    plain = body.sampling_params(None, 64)
    assert plain.temperature == 1.0 and plain.repetition_penalty == 1.0  # no model defaults: the API's
    assert plain.repeat_last_n is None  # the whole history, as Hugging Face's generate


@pytest.fixture
def served(tiny_llm: TinyLLM, tiny_model_dirs: dict[str, Path]) -> Any:
    """The server over a tiny model whose generation_config.json sets sampling, with the engine's submissions
    recorded on their way in."""
    folder = tiny_model_dirs["llama"]
    config_path = folder / "generation_config.json"
    original = config_path.read_text() if config_path.exists() else None
    config_path.write_text(json.dumps({**json.loads(original or "{}"), "do_sample": True, **MODEL_DEFAULTS}))
    try:
        llm = tiny_llm(folder, start_loop=True)
    finally:
        if original is None:
            config_path.unlink()
        else:
            config_path.write_text(original)
    assert llm.sampling_defaults == MODEL_DEFAULTS
    engine = AsyncLLMEngine(llm)
    seen: list[Any] = []
    add = engine.add_requests

    async def recording(prompt: Any, params: Any, *args: Any) -> Any:
        seen.append(params)
        return await add(prompt, params, *args)

    engine.add_requests = recording  # type: ignore[method-assign]
    app = create_app(engine, "tiny", GuardRules(check_host=False), sampling_defaults=llm.sampling_defaults)
    with TestClient(app) as client:
        yield client, seen


def test_the_openai_and_ollama_routes_fill_left_out_fields_from_the_model(served: Any) -> None:
    client, seen = served
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert (seen[-1].temperature, seen[-1].top_p, seen[-1].top_k) == (0.6, 0.9, 20)
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                                                  "temperature": 0})
    assert r.status_code == 200 and seen[-1].temperature == 0.0 and seen[-1].top_p == 0.9
    r = client.post("/api/chat", json={"model": "tiny", "stream": False, "options": {"num_predict": 2, "top_k": 5},
                                       "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 200, r.text
    assert (seen[-1].temperature, seen[-1].top_k, seen[-1].repetition_penalty) == (0.6, 5, 1.05)


def test_the_penalty_window_comes_from_the_request_else_the_model(served: Any) -> None:
    """llama-server's ``repeat_last_n`` on /v1 and Ollama's option of that name on /api: -1 is the whole history, 0
    turns the penalties off, below -1 is a 400 naming the field."""
    client, seen = served
    user = [{"role": "user", "content": "Hi"}]
    for window in (16, 0, -1):
        r = client.post("/v1/chat/completions", json={"messages": user, "max_tokens": 2, "repeat_last_n": window})
        assert r.status_code == 200, r.text
        assert seen[-1].repeat_last_n == window and seen[-1].repetition_penalty == 1.05
        r = client.post("/api/chat", json={"model": "tiny", "stream": False, "messages": user,
                                           "options": {"num_predict": 2, "repeat_last_n": window}})
        assert r.status_code == 200, r.text
        assert seen[-1].repeat_last_n == window
    r = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 200 and seen[-1].repeat_last_n == 32  # left out: the model's
    r = client.post("/api/generate", json={"model": "tiny", "stream": False, "prompt": "Hi",
                                           "options": {"num_predict": 2}})
    assert r.status_code == 200 and seen[-1].repeat_last_n == 32
    count = len(seen)
    r = client.post("/v1/chat/completions", json={"messages": user, "max_tokens": 2, "repeat_last_n": -2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "repeat_last_n", r.text
    r = client.post("/api/chat", json={"model": "tiny", "stream": False, "messages": user,
                                       "options": {"num_predict": 2, "repeat_last_n": -2}})
    assert r.status_code == 400 and "repeat_last_n must be a number of tokens" in r.text, r.text
    r = client.post("/api/chat", json={"model": "tiny", "stream": False, "messages": user,
                                       "options": {"repeat_last_n": "64"}})
    assert r.status_code == 400 and "repeat_last_n" in r.text, r.text
    assert len(seen) == count  # nothing refused reached the engine
