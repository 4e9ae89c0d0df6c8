"""A stdio MCP server of the tests' own that misbehaves, for the host's tests (tool_server.py stays the well-behaved
one the app's tests count the tools of): ``hang`` blocks its only thread, so it answers nothing, pings included;
``wait`` sleeps and writes "cancelled" to a file when the client cancels it; ``count`` reports progress; ``big``
returns a long text. ``--hang-at-start`` never answers the handshake."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import anyio
from mcp.server.fastmcp import Context, FastMCP

server = FastMCP("hearth-unruly")


@server.tool()
def hang(seconds: float) -> str:
    """Block the server's only thread until the time is up (a sync tool runs on the server's event loop)."""
    time.sleep(seconds)
    return "awake"


@server.tool()
async def wait(seconds: float, marker: str) -> str:
    """Sleep, then answer; when the client cancels the call first, write "cancelled" to ``marker``."""
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        Path(marker).write_text("cancelled")
        raise
    return "done"


@server.tool()
async def count(steps: int, ctx: Context) -> str:
    """Report progress ``steps`` times, then answer."""
    for i in range(1, steps + 1):
        await ctx.report_progress(i, steps, f"step {i}")
    return f"counted to {steps}"


@server.tool()
def big(chars: int) -> str:
    """A long text."""
    return "x" * chars


if __name__ == "__main__":
    if "--hang-at-start" in sys.argv:
        time.sleep(3600)
    server.run("stdio")
