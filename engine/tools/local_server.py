"""A benchmarked or tested server in a subprocess on a loopback port: pick the port, wait for it, stop it.

``python -m engine.bench --paths`` (our server), ``engine/tools/llama_server.py`` (llama.cpp's) and the server
tests start their process each their own way (arguments, environment, where its output goes), then share these.
"""

from __future__ import annotations

import http.client
import socket
import subprocess
import time
from collections.abc import Callable


class ServerExited(RuntimeError):
    """The server process ended before it answered ``/health``."""


def free_port() -> int:
    """A loopback port free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until_healthy(
    process: subprocess.Popen[bytes], port: int, timeout_s: float, output: Callable[[], str] = lambda: ""
) -> None:
    """Poll ``GET /health`` on ``port`` until it answers 200.

    Raises:
        ServerExited: the process ended first; the message ends with ``output()`` (e.g. its log).
        TimeoutError: it did not answer within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise ServerExited(f"the server exited with status {process.returncode} while starting{_tail(output)}")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            conn.close()
        if time.monotonic() > deadline:
            raise TimeoutError(f"the server did not become ready within {timeout_s:.0f} s{_tail(output)}")
        time.sleep(0.2)


def stop(process: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    """Terminate ``process``, and kill it if it has not ended after ``timeout_s``."""
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _tail(output: Callable[[], str]) -> str:
    text = output()
    return f":\n{text[-2000:]}" if text else ""
