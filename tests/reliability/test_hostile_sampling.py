"""Sampling values that once killed the engine thread, each sent once to the real server.

Before: ``seed`` 2**64 overflowed the generator, ``temperature`` 1e-40 and ``repetition_penalty`` 1e-300 put NaN
into ``torch.multinomial``; the engine thread died, ``/health`` still said 200 and every later request hung.
Now out-of-range values are refused with a 400 naming the field, a tiny temperature is greedy, and the server
answers the next request.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.engine.server_process import ServerProcess, run_server

HI = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def server(repo_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("hostile") / "server.log"
    with run_server(repo_root, log) as server:
        yield server


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
