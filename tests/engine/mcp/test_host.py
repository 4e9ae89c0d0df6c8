"""The MCP host against a real stdio server: lazy start, tools, calls, timeouts, crashes and restarts, failures."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.mcp.config import McpConfig, parse_config
from engine.mcp.host import MAX_RESULT_CHARS, McpHost
from tests.engine.mcp.conftest import SERVER, server_config


def test_servers_start_lazily_and_list_their_tools(host: McpHost) -> None:
    assert host.status("t")[0].state == "stopped"  # nothing started by making the host
    tools = {t.name: t for t in host.list_tools("t").result(60)}
    assert {"add", "slow", "crash", "big", "city_time", "started"} <= set(tools)
    assert tools["add"].input_schema["properties"]["a"]["type"] == "integer"
    assert tools["add"].description == "Add two integers."
    assert host.status("t")[0].state == "ready"


def test_a_call_and_its_result(host: McpHost) -> None:
    result = host.call_tool("t", "add", {"a": 2, "b": 3}).result(60)
    assert (result.text, result.is_error) == ("5", False)
    wrong = host.call_tool("t", "add", {"a": "two"}).result(60)
    assert wrong.is_error and "validation error" in wrong.text.lower()
    missing = host.call_tool("t", "nope", {}).result(60)
    assert missing.is_error and "no tool named 'nope'" in missing.text
    big = host.call_tool("t", "big", {"chars": MAX_RESULT_CHARS + 50}).result(60)
    assert len(big.text) < MAX_RESULT_CHARS + 100 and "cut" in big.text


def test_a_call_that_takes_too_long_times_out_and_the_server_goes_on(host: McpHost) -> None:
    result = host.call_tool("t", "slow", {"seconds": 5}, timeout_s=0.5).result(10)
    assert result.is_error and "did not answer within 0.5 s" in result.text
    assert host.call_tool("t", "add", {"a": 1, "b": 1}).result(30).text == "2"


def test_a_crashed_server_is_restarted_with_backoff(tmp_path: Path) -> None:
    counter = tmp_path / "starts"
    with McpHost(server_config(counter), start_timeout_s=60, backoff_s=0.2, ping_interval_s=0.5) as host:
        assert host.call_tool("t", "started", {}).result(60).text == "1"
        crashed = host.call_tool("t", "crash", {}).result(30)
        assert crashed.is_error
        # the next call waits for the restart rather than failing
        assert host.call_tool("t", "started", {}).result(60).text == "2"
        status = host.status("t")[0]
        assert status.state == "ready" and status.restarts >= 1


def test_a_server_that_cannot_start_fails_with_its_stderr_and_does_not_block() -> None:
    config = parse_config({"mcpServers": {
        "boom": {"command": sys.executable,
                 "args": ["-c", "import sys; print('no token set', file=sys.stderr); sys.exit(2)"]},
        "missing": {"command": "/nonexistent/mcp-server"},
        "off": {"command": sys.executable, "disabled": True},
    }})
    with McpHost(config, max_restarts=0, start_timeout_s=20) as host:
        boom = host.start("boom").result(30)
        assert boom.state == "failed" and "no token set" in "\n".join(boom.stderr_tail)
        missing = host.start("missing").result(30)
        assert missing.state == "failed" and missing.error
        result = host.call_tool("missing", "x", {}).result(30)
        assert result.is_error and "not running" in result.text
        assert host.start("off").result(5).state == "stopped"


def test_the_command_line_lists_and_calls(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from engine.mcp.__main__ import main

    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"t": {"command": sys.executable, "args": [str(SERVER)]},
                                                 "bad": {"args": []}}}))
    assert main(["call", "t", "add", "--args", '{"a": 20, "b": 22}', "--config", str(config)]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == "42" and "bad: left out: the entry needs 'command'" in out.err
    assert main(["call", "t", "add", "--args", "[1]", "--config", str(config)]) == 2


def test_a_streamable_http_server(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(SERVER), "--http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.1)
        config = parse_config({"mcpServers": {"web": {"url": f"http://127.0.0.1:{port}/mcp",
                                                      "headers": {"Authorization": "Bearer x"}}}})
        with McpHost(config, start_timeout_s=30) as host:
            assert host.call_tool("web", "add", {"a": 40, "b": 2}).result(60).text == "42"
            assert host.status("web")[0].state == "ready"
    finally:
        proc.terminate()
        proc.wait(10)


UNRULY = Path(__file__).with_name("unruly_server.py")


def unruly_config(*args: str) -> McpConfig:
    return parse_config({"mcpServers": {"u": {"command": sys.executable, "args": [str(UNRULY), *args]}}})


@pytest.fixture(scope="module")
def unruly() -> Iterator[McpHost]:
    with McpHost(unruly_config(), call_timeout_s=20, start_timeout_s=60) as h:
        yield h


def test_a_5_mb_result_comes_back_cut_and_the_server_goes_on(unruly: McpHost) -> None:
    result = unruly.call_tool("u", "big", {"chars": 5_000_000}).result(60)
    assert not result.is_error and result.text.startswith("x" * 1000)
    assert len(result.text) < MAX_RESULT_CHARS + 100 and "the result had 5000000 characters" in result.text
    assert unruly.call_tool("u", "count", {"steps": 1}).result(30).text == "counted to 1"


def test_the_servers_progress_reaches_the_caller(unruly: McpHost) -> None:
    seen: list[tuple[float, float | None, str]] = []
    result = unruly.call_tool("u", "count", {"steps": 3}, on_progress=lambda *p: seen.append(p)).result(30)
    assert result.text == "counted to 3"
    assert seen == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]

    def broken(*progress: object) -> None:
        raise RuntimeError("a display that fails")
    # a progress callback that raises does not fail the call
    assert unruly.call_tool("u", "count", {"steps": 2}, on_progress=broken).result(30).text == "counted to 2"


def test_a_call_that_times_out_is_cancelled_at_the_server(unruly: McpHost, tmp_path: Path) -> None:
    marker = tmp_path / "cancelled"
    result = unruly.call_tool("u", "wait", {"seconds": 60, "marker": str(marker)}, timeout_s=0.5).result(30)
    assert result.is_error and "did not answer within 0.5 s" in result.text
    deadline = time.monotonic() + 20
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.read_text() == "cancelled"  # the server was told, and stopped the work
    assert unruly.call_tool("u", "count", {"steps": 1}).result(30).text == "counted to 1"


def test_a_server_that_hangs_mid_session_is_restarted() -> None:
    with McpHost(unruly_config(), start_timeout_s=60, backoff_s=0.2, ping_interval_s=0.5) as host:
        assert host.call_tool("u", "count", {"steps": 1}).result(60).text == "counted to 1"
        hung = host.call_tool("u", "hang", {"seconds": 120}, timeout_s=1).result(30)
        assert hung.is_error and "did not answer within 1 s" in hung.text
        deadline = time.monotonic() + 60  # the next ping goes unanswered: the process is ended and started again
        while host.status("u")[0].restarts < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert host.status("u")[0].restarts >= 1
        assert host.call_tool("u", "count", {"steps": 1}).result(60).text == "counted to 1"
        assert host.status("u")[0].state == "ready"


def test_a_server_that_hangs_at_start_fails_in_time_and_blocks_nothing() -> None:
    with McpHost(unruly_config("--hang-at-start"), start_timeout_s=2, max_restarts=0) as host:
        began = time.monotonic()
        status = host.start("u").result(30)
        assert status.state == "failed" and "handshake within 2 s" in status.error, status
        result = host.call_tool("u", "count", {"steps": 1}).result(30)
        assert result.is_error and "not running" in result.text
        assert time.monotonic() - began < 15
