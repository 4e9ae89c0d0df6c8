"""Hostile and careless clients against the HTTP server: huge and malformed bodies, slow and idle connections.

The server runs in-process over a fake engine on a loopback port (``serve_fake``), so each test takes about a
second. Timings are printed (``pytest -s``) and asserted loosely: the machine running the suite may be busy.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Self

import httpx
import pytest

from engine.serving.guards import GuardRules
from engine.serving.transport import ConnectionLimits
from tests.reliability.conftest import FakeEngine, Serve

CHAT = "/v1/chat/completions"
JSON = {"Content-Type": "application/json"}
HI = [{"role": "user", "content": "Say hello."}]


class HealthPoller:
    """Times ``GET /health`` every 10 ms on its own thread while a test does something nasty."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.latencies_ms: list[float] = []
        self.statuses: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=10.0) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                self.statuses.append(client.get("/health").status_code)
                self.latencies_ms.append((time.perf_counter() - started) * 1000)
                time.sleep(0.01)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)

    def check(self, what: str) -> None:
        print(f"{what}: /health max {max(self.latencies_ms):.1f} ms, median "
              f"{statistics.median(self.latencies_ms):.1f} ms over {len(self.latencies_ms)} calls")
        assert self.statuses and set(self.statuses) == {200}
        assert max(self.latencies_ms) < 1000


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict[str, str]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and error["type"]
    if code is not None:
        assert error["code"] == code, error
    return error


# --- big bodies -------------------------------------------------------------------------------------------------

def test_a_50_mb_body_gets_413_at_once_while_health_answers(serve_fake: Serve) -> None:
    body = b'{"messages": [{"role": "user", "content": "' + b"a" * (50 << 20) + b'"}]}'
    with serve_fake() as base, HealthPoller(base) as poller:
        time.sleep(0.05)
        started = time.perf_counter()
        with httpx.Client(base_url=base, timeout=30.0) as client:
            response = client.post(CHAT, content=body, headers=JSON)
        elapsed_ms = (time.perf_counter() - started) * 1000
        time.sleep(0.05)
    print(f"\n50 MB body: 413 after {elapsed_ms:.0f} ms")
    assert_error(response, 413, "request_too_large")
    assert elapsed_ms < 5000
    poller.check("during the 50 MB upload")


def test_a_chunked_body_over_the_limit_gets_413(serve_fake: Serve, fake_engine: FakeEngine) -> None:
    def pieces() -> Iterator[bytes]:
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(4):
            yield b"a" * (1 << 20)
        yield b'"}]}'

    with serve_fake(GuardRules(max_body_bytes=1 << 20)) as base, httpx.Client(base_url=base, timeout=30.0) as client:
        response = client.post(CHAT, content=pieces(), headers=JSON)
    assert "content-length" not in response.request.headers
    assert_error(response, 413, "request_too_large")
    assert fake_engine.num_tokenized == 0


def test_a_prompt_far_over_the_context_is_refused_before_tokenizing(serve_fake: Serve,
                                                                     fake_engine: FakeEngine) -> None:
    with serve_fake() as base, httpx.Client(base_url=base, timeout=30.0) as client:
        chat = client.post(CHAT, json={"messages": [{"role": "user", "content": "a" * 200_000}]})
        completion = client.post("/v1/completions", json={"prompt": "a" * 200_000})
    assert "200000 characters" in assert_error(chat, 400, "context_length_exceeded")["message"]
    assert_error(completion, 400, "context_length_exceeded")
    assert fake_engine.num_tokenized == 0


def test_tokenizing_runs_off_the_event_loop(serve_fake: Serve, fake_engine: FakeEngine) -> None:
    fake_engine.tokenize_delay_s = 1.0
    results: list[int] = []
    with serve_fake() as base, httpx.Client(base_url=base, timeout=30.0) as client:
        client.get("/health")  # the server is up
        chatting = threading.Thread(target=lambda: results.append(client.post(CHAT, json={"messages": HI})
                                                                  .status_code))
        chatting.start()
        time.sleep(0.3)  # the chat is being tokenized now
        started = time.perf_counter()
        with httpx.Client(base_url=base, timeout=30.0) as other:
            health = other.get("/health")
        health_ms = (time.perf_counter() - started) * 1000
        chatting.join(10)
    print(f"\n/health while a prompt is tokenized for 1 s: {health_ms:.1f} ms")
    assert health.status_code == 200 and results == [200]
    assert health_ms < 500


# --- malformed bodies -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("body", [
    b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
    b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "a\\udfff"}]}]}',
    b'{"messages": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
    b"[" * 10_000 + b"]" * 10_000,
    b'{"messages": [{"role": "user", "content": "hi"}], "repetition_penalty": 1e400}',
], ids=["lone-surrogate", "lone-surrogate-in-part", "nested-10000", "nested-top-level", "infinity"])
def test_hostile_json_gets_400_with_an_error_object(serve_fake: Serve, body: bytes) -> None:
    with serve_fake() as base, httpx.Client(base_url=base, timeout=30.0) as client:
        response = client.post(CHAT, content=body, headers=JSON)
    assert assert_error(response, 400)["type"] == "invalid_request_error"


def test_unknown_routes_and_methods_get_error_objects(serve_fake: Serve) -> None:
    with serve_fake() as base, httpx.Client(base_url=base, timeout=30.0) as client:
        assert_error(client.get("/v2/nothing"), 404)
        assert_error(client.get(CHAT), 405)


def test_vllm_ignore_eos_is_accepted(serve_fake: Serve, fake_engine: FakeEngine) -> None:
    with serve_fake() as base, httpx.Client(base_url=base, timeout=30.0) as client:
        response = client.post(CHAT, json={"messages": HI, "ignore_eos": True, "max_tokens": 4})
    assert response.status_code == 200, response.text
    assert fake_engine.last_params is not None and fake_engine.last_params.ignore_eos


def test_a_seed_beyond_64_bits_is_a_400(serve_fake: Serve) -> None:
    with serve_fake() as base, httpx.Client(base_url=base, timeout=30.0) as client:
        response = client.post(CHAT, json={"messages": HI, "seed": 2**64, "temperature": 1.0})
    assert assert_error(response, 400)["param"] == "seed"


# --- engine state -----------------------------------------------------------------------------------------------

def test_a_full_queue_gets_429_with_retry_after(serve_fake: Serve, fake_engine: FakeEngine) -> None:
    fake_engine.queue_full = True
    with serve_fake() as base, httpx.Client(base_url=base, timeout=30.0) as client:
        response = client.post(CHAT, json={"messages": HI})
    assert_error(response, 429, "queue_full")
    assert int(response.headers["retry-after"]) >= 1


def test_health_is_503_once_the_engine_loop_is_dead(serve_fake: Serve, fake_engine: FakeEngine) -> None:
    loop = threading.Event()
    fake_engine._loop_thread = threading.Thread(target=loop.wait, daemon=True)
    fake_engine._loop_thread.start()
    with serve_fake() as base, httpx.Client(base_url=base, timeout=30.0) as client:
        assert client.get("/health").status_code == 200
        loop.set()
        fake_engine._loop_thread.join(5)
        assert_error(client.get("/health"), 503, "engine_stopped")


# --- connections ------------------------------------------------------------------------------------------------

def test_keep_alive_replies_are_not_held_back_by_nagle(serve_fake: Serve) -> None:
    with serve_fake() as base, httpx.Client(base_url=base, timeout=10.0) as client:
        client.get("/v1/models")
        times_ms = []
        for _ in range(20):
            started = time.perf_counter()
            assert client.get("/v1/models").status_code == 200
            times_ms.append((time.perf_counter() - started) * 1000)
    median = statistics.median(times_ms)
    print(f"\n20 keep-alive requests: median {median:.2f} ms, max {max(times_ms):.2f} ms")
    assert median < 20  # Nagle plus delayed ACKs would make it ~40 ms


def _port(base_url: str) -> int:
    return int(base_url.rsplit(":", 1)[1])


def _closed_within(sock: socket.socket, timeout_s: float) -> bool:
    """Whether the server closes ``sock`` within ``timeout_s`` (anything it sends first is skipped)."""
    sock.settimeout(timeout_s)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if not sock.recv(4096):
                return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return False


def test_idle_and_half_sent_connections_are_closed(serve_fake: Serve) -> None:
    limits = ConnectionLimits(header_timeout_s=0.5)
    with serve_fake(limits=limits) as base, HealthPoller(base) as poller:
        socks = [socket.create_connection(("127.0.0.1", _port(base))) for _ in range(20)]
        try:
            for i, sock in enumerate(socks):
                if i % 2:  # a slowloris: a request line and half a header, then nothing
                    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            started = time.monotonic()
            closed = [_closed_within(sock, 5.0) for sock in socks]
            elapsed = time.monotonic() - started
        finally:
            for sock in socks:
                sock.close()
    print(f"\n20 idle or half-sent connections closed after {elapsed:.2f} s")
    assert all(closed)
    assert elapsed < 4
    poller.check("with 20 stalled connections")


def test_a_stalled_body_gets_408(serve_fake: Serve) -> None:
    with serve_fake(GuardRules(body_timeout_s=0.5)) as base, \
            socket.create_connection(("127.0.0.1", _port(base))) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"messages\"")
        sock.settimeout(5.0)
        reply = b""
        while b"request_timeout" not in reply and (data := sock.recv(4096)):
            reply += data
    assert reply.startswith(b"HTTP/1.1 408"), reply
    assert b'"request_timeout"' in reply


def test_connections_beyond_the_cap_get_503(serve_fake: Serve) -> None:
    limits = ConnectionLimits(max_connections=4, header_timeout_s=10.0)
    with serve_fake(limits=limits) as base, httpx.Client(base_url=base, timeout=10.0) as client:
        assert client.get("/health").status_code == 200
        client.close()
        socks = [socket.create_connection(("127.0.0.1", _port(base))) for _ in range(4)]
        try:
            time.sleep(0.3)  # the server accepts them
            with httpx.Client(base_url=base, timeout=10.0) as late:
                refused = late.get("/health").status_code
        finally:
            for sock in socks:
                sock.close()
        time.sleep(0.3)
        with httpx.Client(base_url=base, timeout=10.0) as later:
            after = later.get("/health").status_code
    assert (refused, after) == (503, 200)
