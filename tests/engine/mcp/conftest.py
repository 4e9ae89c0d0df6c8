"""The MCP tests' own stdio server (tool_server.py, on the SDK's FastMCP), started by a real host."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.mcp.config import McpConfig, parse_config
from engine.mcp.host import McpHost

SERVER = Path(__file__).with_name("tool_server.py")


def server_config(counter: Path | None = None, **extra: object) -> McpConfig:
    entry: dict[str, object] = {"command": sys.executable, "args": [str(SERVER)]}
    if counter is not None:
        entry["env"] = {"HEARTH_TEST_COUNTER": str(counter)}
    return parse_config({"mcpServers": {"t": entry, **extra}})


@pytest.fixture(scope="module")
def host() -> Iterator[McpHost]:
    """One host over the test server for a module (each start costs a Python process importing the SDK)."""
    with McpHost(server_config(), call_timeout_s=20, start_timeout_s=60) as h:
        yield h
