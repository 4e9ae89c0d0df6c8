"""The server's request deadline: a default for every request, a per-request ``timeout_s``, impossible values refused.

What a deadline does inside the engine (partial text kept, blocks freed, an error for a request that never started)
is tested through the real server in ``test_real_server.py``.
"""

from __future__ import annotations

import httpx
import pytest

from engine.serving.openai_app import DEFAULT_REQUEST_TIMEOUT_S
from tests.reliability.conftest import FakeEngine, Serve

HI = [{"role": "user", "content": "hi"}]


def _chat(base_url: str, **fields: object) -> httpx.Response:
    return httpx.post(f"{base_url}/v1/chat/completions", json={"model": "fake-model", "messages": HI, **fields},
                      timeout=10)


def test_every_request_gets_the_server_default_unless_it_sets_its_own(serve_fake: Serve,
                                                                        fake_engine: FakeEngine) -> None:
    with serve_fake() as base_url:
        assert _chat(base_url).status_code == 200
        assert fake_engine.last_params is not None and fake_engine.last_params.timeout_s == DEFAULT_REQUEST_TIMEOUT_S
        assert _chat(base_url, timeout_s=2.5).status_code == 200
        assert fake_engine.last_params.timeout_s == 2.5
        ollama = httpx.post(f"{base_url}/api/chat", json={"model": "fake-model", "messages": HI, "stream": False},
                            timeout=10)
        assert ollama.status_code == 200, ollama.text
        assert fake_engine.last_params.timeout_s == DEFAULT_REQUEST_TIMEOUT_S


def test_a_server_without_a_default_sets_no_deadline(serve_fake: Serve, fake_engine: FakeEngine) -> None:
    with serve_fake(request_timeout_s=None) as base_url:
        assert _chat(base_url).status_code == 200
        assert fake_engine.last_params is not None and fake_engine.last_params.timeout_s is None


@pytest.mark.parametrize("value", [0, -1, "soon"])
def test_an_impossible_timeout_is_a_400_naming_it(serve_fake: Serve, value: object) -> None:
    with serve_fake() as base_url:
        response = _chat(base_url, timeout_s=value)
    assert response.status_code == 400, response.text
    assert "timeout_s" in response.json()["error"]["message"]


def test_the_command_line_refuses_a_negative_default() -> None:
    from engine.serving.cli import main

    assert main(["--request-timeout", "-5"]) == 2


def test_the_command_line_refuses_an_impossible_thread_count(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from engine.serving.cli import main

    assert main(["--threads", "0"]) == 2
    assert "--threads must be a positive whole number, got 0" in capsys.readouterr().err
    monkeypatch.setenv("HEARTH_THREADS", "many")
    assert main([]) == 2
    assert "HEARTH_THREADS='many'" in capsys.readouterr().err
