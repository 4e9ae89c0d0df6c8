"""The real server (the default model, in a subprocess) against hostile and careless clients.

Sampling values that once killed the engine thread are each sent once. Before: ``seed`` 2**64 overflowed the generator, ``temperature`` 1e-40 and ``repetition_penalty`` 1e-300 put NaN
into ``torch.multinomial``; the engine thread died, ``/health`` still said 200 and every later request hung.
Now out-of-range values are refused with a 400 naming the field, a tiny temperature is greedy, and the server
answers the next request. A client that hangs up mid-stream gets its request cancelled and its KV blocks freed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.engine.server_process import OPEN, ServerProcess, scrape

HI = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def server(shared_server: Callable[..., ServerProcess]) -> ServerProcess:
    return shared_server(*OPEN)


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, headers=server.headers(), timeout=60.0) as http_client:
        yield http_client


def _chat(server: ServerProcess, **fields: object) -> httpx.Response:
    body = {"model": "default", "messages": HI, "max_tokens": 4, **fields}
    return httpx.post(f"{server.v1}/chat/completions", json=body, headers=server.headers(), timeout=60)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"seed": 18446744073709551616, "temperature": 1.0}, "seed"),
        ({"repetition_penalty": 1e-300, "temperature": 1.0}, "repetition_penalty"),
        ({"temperature": float("inf")}, "temperature"),
    ],
    ids=["seed-2**64", "penalty-1e-300", "temperature-inf"],
)
def test_impossible_sampling_values_get_a_400_and_the_server_lives(
    server: ServerProcess, fields: dict[str, object], named: str
) -> None:
    response = _chat(server, **fields) if fields.get("temperature") != float("inf") else httpx.post(
        f"{server.v1}/chat/completions",
        content=b'{"model": "default", "messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}',
        headers={**server.headers(), "Content-Type": "application/json"},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    assert "error" in response.json()
    if named != "temperature":
        assert named in response.json()["error"]["message"]
    after = _chat(server, temperature=0.0)
    assert after.status_code == 200, after.text
    assert httpx.get(f"{server.base_url}/health", timeout=5).status_code == 200


def test_a_vanishing_temperature_is_greedy(server: ServerProcess) -> None:
    tiny = _chat(server, temperature=1e-40, seed=2**64 - 1)
    greedy = _chat(server, temperature=0.0)
    assert tiny.status_code == 200, tiny.text
    assert tiny.json()["choices"][0]["message"]["content"] == greedy.json()["choices"][0]["message"]["content"]
    assert httpx.get(f"{server.base_url}/health", timeout=5).status_code == 200


def test_disconnect_mid_stream_cancels_and_frees_blocks(server: ServerProcess, http: httpx.Client) -> None:
    aborted_before = scrape(http).get("hearth:request_success_total{abort}", 0.0)
    body = {"model": "default", "max_tokens": 400, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": "Tell me a very long story about a dragon and a knight."}]}
    with httpx.Client(base_url=server.base_url, headers=server.headers(), timeout=60.0) as streaming, \
            streaming.stream("POST", "/v1/chat/completions", json=body) as response:
        lines = (line for line in response.iter_lines() if line)
        received = [next(lines) for _ in range(4)]
        assert all(line.startswith("data: {") for line in received)
        busy = scrape(http)
        assert busy["hearth:num_requests_running"] == 1 and busy["hearth:kv_blocks_used"] > 0
    # leaving the block closed the connection mid-stream
    deadline = time.monotonic() + 15
    while True:
        metrics = scrape(http)
        if metrics["hearth:kv_blocks_used"] == 0 and metrics["hearth:num_requests_running"] == 0:
            break
        assert time.monotonic() < deadline, f"blocks not freed after the disconnect: {metrics}"
        time.sleep(0.1)
    assert metrics["hearth:request_success_total{abort}"] == aborted_before + 1


def test_a_request_past_its_deadline_keeps_its_text(server: ServerProcess) -> None:
    response = _chat(server, max_tokens=4000, ignore_eos=True, temperature=0.0, timeout_s=1.0)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "timeout"
    assert choice["message"]["content"]  # what was written before the deadline


def test_a_request_whose_deadline_passes_before_it_starts_gets_a_clear_error(server: ServerProcess) -> None:
    response = _chat(server, timeout_s=1e-9)
    assert response.status_code == 503, response.text
    assert "without starting" in response.json()["error"]["message"]
    assert _chat(server).status_code == 200
