"""llama.cpp's ``llama-server`` as a benchmark opponent: start it on a GGUF, stream the bench prompts through it.

The server gets the same prompts as our engine, as token ids (so both tokenize nothing differently), through its
``/completion`` API with ``n_predict``, ``ignore_eos`` and ``temperature`` 0, streamed so every token has a
timestamp. ``-np N`` gives it N parallel slots; ``-c`` is sized so each slot holds prompt and reply.

Each server runs in one weight layout: llama.cpp's default (Q4_0, Q4_K and IQ4_NL repacked for the CPU's SIMD) or
``--no-repack``; the bench measures both and compares with the better (``engine/tools/bench_servers.py``). On some
AMX CPUs the repacked layout crashes at the first decode; that raises ``ServerDied``, and the rows say so.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from engine.tools.local_server import ServerExited, free_port, stop, wait_until_healthy
from engine.tools.timings import Timings, time_concurrent_streams

_READY_TIMEOUT_S = 120.0
_REQUEST_TIMEOUT_S = 600.0


class ServerDied(RuntimeError):
    """The server process exited while serving."""


@dataclass(slots=True)
class LlamaServer:
    """A running ``llama-server`` process on a local port."""

    process: subprocess.Popen[bytes]
    port: int
    no_repack: bool

    def alive(self) -> bool:
        return self.process.poll() is None


@contextmanager
def running_server(
    binary: Path, gguf: Path, parallel: int, threads: int, ctx_per_slot: int, no_repack: bool
) -> Iterator[LlamaServer]:
    """Start ``binary`` on ``gguf`` with ``parallel`` slots; stop it on exit."""
    port = free_port()
    cmd = [
        str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
        "-np", str(parallel), "-t", str(threads), "-c", str(ctx_per_slot * parallel), "--log-disable",
    ]  # fmt: skip
    if no_repack:
        cmd.append("--no-repack")
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = LlamaServer(process, port, no_repack)
    try:
        try:
            wait_until_healthy(process, port, _READY_TIMEOUT_S)
        except ServerExited as exc:
            raise ServerDied(f"llama-server: {exc}") from exc
        yield server
    finally:
        stop(process, 10)


@contextmanager
def _completion(server: LlamaServer, body: dict[str, object]) -> Iterator[http.client.HTTPResponse]:
    """One POST to ``/completion``: yields the response once it answers 200; a dead server raises ServerDied."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=_REQUEST_TIMEOUT_S)
    try:
        conn.request("POST", "/completion", body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise ServerDied(f"llama-server answered {resp.status}: {resp.read()[:200]!r}")
        yield resp
    except (OSError, http.client.HTTPException) as exc:
        if not server.alive():
            raise ServerDied(f"llama-server exited with status {server.process.returncode}") from exc
        raise
    finally:
        conn.close()


def _stream_completion(server: LlamaServer, prompt: list[int], max_tokens: int, times: list[float]) -> None:
    """One streamed ``/completion``; appends a timestamp per generated token to ``times``."""
    body = {"prompt": prompt, "n_predict": max_tokens, "ignore_eos": True, "temperature": 0.0, "stream": True,
            "cache_prompt": True}
    with _completion(server, body) as resp:
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data: "):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("stop"):
                predicted = int(chunk.get("timings", {}).get("predicted_n", len(times)))
                times.extend([time.perf_counter()] * max(predicted - len(times), 0))  # tokens sent together
                break
            times.append(time.perf_counter())


def prefill_seconds(server: LlamaServer, prompt: list[int]) -> float:
    """Wall time of one request that reads ``prompt`` (no prompt cache) and answers one token."""
    start = time.perf_counter()
    with _completion(server, {"prompt": prompt, "n_predict": 1, "temperature": 0.0, "cache_prompt": False}) as resp:
        resp.read()
    return time.perf_counter() - start


def bench_server(server: LlamaServer, prompts: list[list[int]], max_tokens: int) -> Timings:
    """Send every prompt at once (one thread per request) and time each token."""
    return time_concurrent_streams(prompts, lambda prompt, times: _stream_completion(server, prompt, max_tokens, times))


@contextmanager
def serving(
    binary: Path, gguf: Path, prompts: list[list[int]], concurrency: int, max_tokens: int, threads: int,
    no_repack: bool,
) -> Iterator[Callable[[], Timings]]:
    """A warmed server with ``concurrency`` slots in one weight layout until the block ends: yields ``run``, which
    times ``concurrency`` streams of ``max_tokens`` tokens.

    Raises:
        ServerDied: it died starting or at its warm-up request (the repacked layout's crash on some AMX CPUs comes
            there).
    """
    longest = max(len(p) for p in prompts[:concurrency])
    ctx_per_slot = -(-(longest + max_tokens + 64) // 256) * 256
    batch = [prompts[i % len(prompts)] for i in range(concurrency)]
    with running_server(binary, gguf, concurrency, threads, ctx_per_slot, no_repack) as server:
        bench_server(server, batch, 4)
        yield lambda: bench_server(server, batch, max_tokens)
