"""A small stdio MCP server for the host's tests: ``add``, ``slow`` (for timeouts), ``crash`` (exits the process),
``big`` (a large result), ``city_time`` (one enum argument) and ``started`` (how many times this server's process started, from a counter file). ``--http PORT`` serves Streamable HTTP."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Literal

import anyio
from mcp.server.fastmcp import FastMCP

server = FastMCP("hearth-test")
COUNTER = os.environ.get("HEARTH_TEST_COUNTER")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await anyio.sleep(seconds)
    return "done"


@server.tool()
def crash() -> str:
    """End the server's process at once."""
    print("crashing on purpose", file=sys.stderr, flush=True)
    os._exit(3)


@server.tool()
def big(chars: int) -> str:
    """A long text."""
    return "x" * chars


@server.tool()
def city_time(city: Literal["Tokyo", "Paris"]) -> str:
    """The time in a city (fixed, for tests)."""
    return f"It is 09:30 in {city}."


@server.tool()
def started() -> int:
    """How many times this server has started."""
    return int(Path(COUNTER).read_text()) if COUNTER else 0


if __name__ == "__main__":
    if COUNTER:
        path = Path(COUNTER)
        path.write_text(str(int(path.read_text() or "0") + 1) if path.exists() else "1")
    print("test server starting", file=sys.stderr, flush=True)
    if len(sys.argv) > 2 and sys.argv[1] == "--http":  # Streamable HTTP on 127.0.0.1:PORT/mcp
        server.settings.port = int(sys.argv[2])
        server.run("streamable-http")
    else:
        server.run("stdio")
