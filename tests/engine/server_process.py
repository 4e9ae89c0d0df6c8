"""Run ``python -m engine.serve`` in a subprocess on a free loopback port, for the server and remote tests.

Starting one loads the default model, so the suite shares them: :class:`ServerPool` (the ``shared_server`` fixture in
``tests/conftest.py``) starts one per set of flags and keeps it for the session. A test module asks for the flags it
needs (``KEYED`` or ``OPEN``); requests are all a module may leave behind, so the modules' tests read the server's
counters as differences or wait for its gauges to settle.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from engine.tools.local_server import ServerExited, free_port, stop, wait_until_healthy

#: Model load plus warm-up; generous, because a busy shared machine slows it several-fold.
START_TIMEOUT_S = 300.0

#: The API key of the shared keyed server (``KEYED``).
API_KEY = "sk-hearth-test"
#: The shared servers' arguments to ``shared_server`` / :meth:`ServerPool.get`: the API key, then extra flags.
#: ``KEYED`` guards ``/v1``, ``/api`` and ``/metrics`` with ``API_KEY``; ``OPEN`` has no key, as by default.
KEYED: tuple[str, ...] = (API_KEY, "--metrics-auth")
OPEN: tuple[str, ...] = ()


@dataclass(slots=True)
class ServerProcess:
    base_url: str  # http://127.0.0.1:PORT
    api_key: str | None
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def v1(self) -> str:
        return f"{self.base_url}/v1"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def run_server(repo_root: Path, log_path: Path, api_key: str | None = None, *extra: str) -> Iterator[ServerProcess]:
    """Start the server, wait until ``/health`` answers, yield it, then stop it."""
    port = free_port()
    args = [sys.executable, "-m", "engine.serve", "--model", "default", "--host", "127.0.0.1", "--port",
            str(port), "--max-batch-size", "8", "--kv-cache-mb", "64", "--log-level", "warning", *extra]
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    env.pop("HEARTH_API_KEY", None)
    if api_key:
        env["HEARTH_API_KEY"] = api_key  # not on argv, where ps shows it
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(args, cwd=repo_root, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    server = ServerProcess(f"http://127.0.0.1:{port}", api_key, process, log_path)
    try:
        try:
            wait_until_healthy(process, port, START_TIMEOUT_S, server.log)
        except (ServerExited, TimeoutError) as exc:
            raise RuntimeError(str(exc)) from exc
        yield server
    finally:
        stop(process)


class ServerPool:
    """Servers started on first use, one per (api_key, flags), all stopped by :meth:`close`.

    A server that failed to start is not retried: every later request for it raises the same error at once.
    """

    def __init__(self, repo_root: Path, log_dir: Path) -> None:
        self._repo_root, self._log_dir = repo_root, log_dir
        self._servers: dict[tuple[str | None, tuple[str, ...]], ServerProcess | RuntimeError] = {}
        self._stack = contextlib.ExitStack()

    def get(self, api_key: str | None = None, *extra: str) -> ServerProcess:
        """The running server with these flags, started now if it is the first request for them."""
        key = (api_key, extra)
        if key not in self._servers:
            log_path = self._log_dir / f"server-{len(self._servers)}.log"
            try:
                self._servers[key] = self._stack.enter_context(run_server(self._repo_root, log_path, api_key, *extra))
            except RuntimeError as exc:
                self._servers[key] = exc
        server = self._servers[key]
        if isinstance(server, RuntimeError):
            raise server
        return server

    def close(self) -> None:
        self._stack.close()
        self._servers.clear()


def scrape(http: httpx.Client) -> dict[str, float]:
    """``/metrics`` parsed by prometheus_client: sample name (plus finished_reason label) -> value."""
    response = http.get("/metrics")
    assert response.status_code == 200
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            reason = sample.labels.get("finished_reason")
            values[f"{sample.name}{{{reason}}}" if reason else sample.name] = sample.value
    return values
