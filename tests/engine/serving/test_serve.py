"""The OpenAI-compatible server, in a subprocess on a free loopback port, over the real default model."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from openai import AuthenticationError, BadRequestError, OpenAI
from prometheus_client.parser import text_string_to_metric_families

from tests.engine.server_process import API_KEY, KEYED, ServerProcess, scrape

MODEL = "SmolLM2-135M-Instruct"
HI = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def server(shared_server: Callable[..., ServerProcess]) -> ServerProcess:
    return shared_server(*KEYED)  # an API key, on /metrics too


@pytest.fixture
def client(server: ServerProcess) -> Iterator[OpenAI]:
    with OpenAI(base_url=server.v1, api_key=API_KEY, max_retries=0, timeout=60.0) as openai_client:
        yield openai_client


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, headers=server.headers(), timeout=60.0) as http_client:
        yield http_client


# --- the official client ---------------------------------------------------------------------------------------

def test_models(client: OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]


def test_chat_not_streamed_and_streamed(client: OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=8, temperature=0)
    text = reply.choices[0].message.content
    assert text and reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage is not None and reply.usage.prompt_tokens > 0
    assert 0 < reply.usage.completion_tokens <= 8
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens

    stream = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    # Not compared with ``text``: the second request reuses the first one's cached prefix, and bf16 prefill
    # over a cached prefix may break a near-tie differently.
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed and chunks[0].choices[0].delta.role == "assistant"
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] in ("stop", "length") and not any(finish[:-1])
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices and 0 < usage.completion_tokens <= 8


def test_completions_honour_stop_and_seed(client: OpenAI) -> None:
    prompt = "The three primary colors are"
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0)
    text = full.choices[0].text
    assert text and full.usage is not None and full.usage.completion_tokens == 10
    words = text.split()
    assert len(words) >= 3, text
    stop_word = words[2]
    stopped = client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0, stop=[stop_word])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == text[: text.index(stop_word)]

    seeded = [client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=1.0, seed=7)
              .choices[0].text for _ in range(2)]
    assert seeded[0] == seeded[1]


def test_completions_streamed(client: OpenAI) -> None:
    chunks = list(client.completions.create(model=MODEL, prompt="The three primary colors are", max_tokens=6,
                                            temperature=0, stream=True, stream_options={"include_usage": True}))
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] in ("stop", "length") and not any(finish[:-1])
    assert "".join(c.choices[0].text for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices and 0 < usage.completion_tokens <= 6


def test_sse_wire_format(http: httpx.Client) -> None:
    body = {"model": MODEL, "messages": HI, "max_tokens": 3, "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in events)
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2].removeprefix("data: "))
    assert last["object"] == "chat.completion.chunk" and last["usage"]["completion_tokens"] >= 1


# --- batching, disconnects, metrics ---------------------------------------------------------------------------

def test_eight_concurrent_streams_batch_together(client: OpenAI, http: httpx.Client) -> None:
    topics = ["cats", "rain", "bread", "trains", "the sea", "chess", "music", "winter"]

    def ask(topic: str) -> tuple[str, str | None]:
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Write one sentence about {topic}."}],
            max_tokens=12, temperature=0, stream=True)
        parts, finish = [], None
        for chunk in stream:
            if chunk.choices:
                parts.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
        return "".join(parts), finish

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(ask, topics))
    assert all(text and finish in ("stop", "length") for text, finish in results), results
    metrics = scrape(http)
    assert metrics["hearth:mean_batch_size"] > 1.0
    assert metrics["hearth:num_requests_running"] == 0


def test_metrics_parse_with_vllm_names(http: httpx.Client) -> None:
    families = {f.name: f.type for f in text_string_to_metric_families(http.get("/metrics").text)}
    expected = {
        "hearth:kv_cache_usage_perc": "gauge",
        "hearth:num_requests_running": "gauge",
        "hearth:num_requests_waiting": "gauge",
        "hearth:mean_batch_size": "gauge",
        "hearth:time_to_first_token_seconds": "histogram",
        "hearth:inter_token_latency_seconds": "histogram",
        "hearth:e2e_request_latency_seconds": "histogram",
        "hearth:prefix_cache_queries": "counter",
        "hearth:prefix_cache_hits": "counter",
        "hearth:num_preemptions": "counter",
    }
    assert {name: families.get(name) for name in expected} == expected


# --- security and bad input -------------------------------------------------------------------------------------

def test_api_key_is_required(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.base_url, timeout=10.0) as anonymous:
        missing = anonymous.get("/v1/models")
        wrong = anonymous.get("/v1/models", headers={"Authorization": "Bearer nope"})
        right = anonymous.get("/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
        assert anonymous.get("/health").status_code == 200
        assert anonymous.get("/metrics").status_code == 401  # --metrics-auth
    assert (missing.status_code, wrong.status_code, right.status_code) == (401, 401, 200)
    assert API_KEY not in " ".join(map(str, server.process.args))  # the key came through HEARTH_API_KEY
    assert missing.json()["error"]["type"] == "authentication_error"
    with OpenAI(base_url=server.v1, api_key="wrong", max_retries=0) as bad_client, \
            pytest.raises(AuthenticationError):
        bad_client.models.list()


LONG_PROMPT = "hello " * 9000

BAD_REQUESTS: list[tuple[str, str, Any, str]] = [
    # (id, path, body -- bytes are sent as-is, expected words in the message)
    ("malformed-json", "/v1/chat/completions", b'{"messages": [', "not valid JSON"),
    ("not-an-object", "/v1/chat/completions", [1, 2], "JSON object"),
    ("messages-wrong-type", "/v1/chat/completions", {"messages": "hi"}, "messages"),
    ("temperature-wrong-type", "/v1/chat/completions", {"messages": HI, "temperature": "hot"}, "temperature"),
    ("negative-max-tokens", "/v1/chat/completions", {"messages": HI, "max_tokens": -5}, "max_tokens"),
    ("n-above-8", "/v1/chat/completions", {"messages": HI, "n": 9}, "n"),
    ("top-logprobs-above-20", "/v1/chat/completions", {"messages": HI, "logprobs": True, "top_logprobs": 21},
     "top_logprobs"),
    ("audio-output", "/v1/chat/completions", {"messages": HI, "audio": {"voice": "alloy", "format": "wav"}},
     "audio"),
    ("bad-schema", "/v1/chat/completions", {"messages": HI, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}}, "json_schema"),
    ("tools", "/v1/chat/completions", {"messages": HI, "tools": [{"type": "function"}]}, "tools"),
    ("prompt-too-long", "/v1/completions", {"prompt": LONG_PROMPT, "max_tokens": 4}, "tokens"),
    ("completion-max-tokens-wrong-type", "/v1/completions", {"prompt": "Hi", "max_tokens": "ten"}, "max_tokens"),
]


@pytest.mark.parametrize(("path", "body", "words"), [c[1:] for c in BAD_REQUESTS], ids=[c[0] for c in BAD_REQUESTS])
def test_bad_requests_get_400_with_an_error_object(http: httpx.Client, path: str, body: Any, words: str) -> None:
    if isinstance(body, bytes):
        response = http.post(path, content=body, headers={"Content-Type": "application/json"})
    else:
        response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert words in error["message"], error


def test_hostile_requests_get_4xx_at_once_while_health_answers(http: httpx.Client) -> None:
    huge = b'{"messages": [{"role": "user", "content": "' + b"a" * (50 << 20) + b'"}]}'
    started = time.perf_counter()
    too_large = http.post("/v1/chat/completions", content=huge, headers={"Content-Type": "application/json"})
    elapsed_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    assert http.get("/health").status_code == 200
    health_ms = (time.perf_counter() - started) * 1000
    print(f"\n50 MB body: {too_large.status_code} after {elapsed_ms:.0f} ms; /health then {health_ms:.1f} ms")
    assert too_large.status_code == 413 and elapsed_ms < 5000
    json_type = {"Content-Type": "application/json"}
    cases = [
        (400, b'{"messages": [{"role": "user", "content": "\\ud800"}]}', json_type),
        (400, b'{"messages": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", json_type),
        (415, json.dumps({"messages": HI}).encode(), {"Content-Type": "text/plain"}),
        (403, json.dumps({"messages": HI}).encode(), {**json_type, "Origin": "http://evil.example"}),
        (403, json.dumps({"messages": HI}).encode(), {**json_type, "Host": "evil.example:8000"}),
    ]
    for status, body, headers in cases:
        response = http.post("/v1/chat/completions", content=body, headers=headers)
        assert response.status_code == status, (body[:60], response.text)
        assert response.json()["error"]["message"]


def test_openai_client_sees_a_too_long_prompt_as_bad_request(client: OpenAI) -> None:
    with pytest.raises(BadRequestError, match="context"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": LONG_PROMPT}],
                                       max_tokens=4)


def test_exposure_warning() -> None:
    from engine.serving.cli import exposure_warning

    assert exposure_warning("127.0.0.1", 8000, None) is None
    assert exposure_warning("localhost", 8000, None) is None
    assert exposure_warning("::1", 8000, None) is None
    assert exposure_warning("0.0.0.0", 8000, "key") is None
    warning = exposure_warning("0.0.0.0", 8000, None)
    assert warning is not None and "without an API key" in warning and "/v1/chat/completions" in warning
