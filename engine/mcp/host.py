"""The MCP host: the configured servers, started lazily, watched, restarted, and their tools called, on the
PyPI ``mcp`` SDK.

The SDK is asyncio; callers are plain threads (the app's Qt pool, the tool loop). So the host runs one event
loop on a daemon thread of its own, and every public method is thread-safe and returns at once with a
``concurrent.futures.Future``. Nothing waits forever: starting has a timeout, each call has one (30 s unless
set), and a call's future resolves to a :class:`ToolResult`, an error result when the call failed. A call that
times out is cancelled at the server too (``notifications/cancelled``), so its work stops where the server allows;
a caller that passes ``on_progress`` gets the server's progress notifications for that call.

Each server runs as one task that owns its session (the SDK's context managers must be entered and left in one
task). Its state is ``stopped``, ``starting``, ``ready`` or ``failed`` (with the error and stderr's last lines).
A server whose process dies, or that stops answering pings, is restarted after a backoff that doubles up to
``max_backoff_s``; after ``max_restarts`` failed starts in a row it stays failed until :meth:`McpHost.restart`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, Self, TextIO, TypeVar

import httpx
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import get_default_environment, stdio_client
from mcp.client.streamable_http import streamable_http_client

from engine.mcp.config import McpConfig, ServerConfig

log = logging.getLogger(__name__)
T = TypeVar("T")
State = Literal["stopped", "starting", "ready", "failed"]
#: a result's text past this is cut (a tool that returns megabytes would fill any context)
MAX_RESULT_CHARS = 100_000
STDERR_LINES = 20
#: how much longer than the start timeout a caller waits, so the attempt's own verdict (with stderr) comes first
START_GRACE_S = 3.0
#: a call's progress as the server reports it: progress so far, the total when known, a message ("" when none)
OnProgress = Callable[[float, float | None, str], None]


@dataclass(frozen=True)
class ToolInfo:
    server: str
    name: str
    description: str
    input_schema: dict[str, Any]

    def as_openai(self, name: str | None = None) -> dict[str, Any]:
        """The tool as an OpenAI function definition (under ``name`` when the loop renames it)."""
        return {"type": "function", "function": {"name": name or self.name, "description": self.description,
                                                 "parameters": self.input_schema or {"type": "object"}}}


@dataclass(frozen=True)
class ServerStatus:
    name: str
    state: State
    enabled: bool
    tools: tuple[ToolInfo, ...] = ()
    error: str = ""
    stderr_tail: tuple[str, ...] = ()
    restarts: int = 0


@dataclass(frozen=True)
class ToolResult:
    """What a call gave back, as the text the model reads; ``is_error`` when the tool or the call failed."""

    text: str
    is_error: bool = False
    structured: Any = None


@dataclass
class _Server:
    config: ServerConfig
    state: State = "stopped"
    tools: tuple[ToolInfo, ...] = ()
    error: str = ""
    stderr_tail: tuple[str, ...] = ()
    restarts: int = 0
    failures: int = 0  # failed starts in a row
    session: ClientSession | None = None
    task: asyncio.Task[None] | None = None
    settled: asyncio.Event = field(default_factory=asyncio.Event)  # set when the current start attempt ends
    dead: asyncio.Event = field(default_factory=asyncio.Event)
    stop: asyncio.Event = field(default_factory=asyncio.Event)


class McpHost:
    """The servers of ``config``; see the module docstring. Close it when done (or use it as a context manager)."""

    def __init__(self, config: McpConfig, *, call_timeout_s: float = 30.0, start_timeout_s: float = 30.0,
                 ping_interval_s: float = 10.0, backoff_s: float = 1.0, max_backoff_s: float = 60.0,
                 max_restarts: int = 5) -> None:
        self.config = config
        self.call_timeout_s = call_timeout_s
        self.start_timeout_s = start_timeout_s
        self.ping_interval_s = ping_interval_s
        self.backoff_s, self.max_backoff_s, self.max_restarts = backoff_s, max_backoff_s, max_restarts
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-host", daemon=True)
        self._thread.start()
        self._servers: dict[str, _Server] = self._run(self._make_servers()).result(10)
        self._closed = False

    async def _make_servers(self) -> dict[str, _Server]:  # the events belong to the host's loop
        return {name: _Server(cfg) for name, cfg in self.config.servers.items()}

    # --- the synchronous, thread-safe side ----------------------------------------------------------------------
    def _run(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def status(self, name: str | None = None) -> list[ServerStatus]:
        """A snapshot of each server's state (or of ``name``'s); starts nothing."""
        servers = [self._server(name)] if name is not None else list(self._servers.values())
        return [ServerStatus(s.config.name, s.state, s.config.enabled, s.tools, s.error, s.stderr_tail, s.restarts)
                for s in servers]

    def start(self, name: str) -> concurrent.futures.Future[ServerStatus]:
        """Start ``name`` if it is not running; the future gives its status once ready or failed."""
        return self._run(self._ensure(self._server(name)))

    def list_tools(self, name: str) -> concurrent.futures.Future[tuple[ToolInfo, ...]]:
        """``name``'s tools, starting it first if need be (empty when it failed: see :meth:`status`)."""
        async def tools() -> tuple[ToolInfo, ...]:
            return (await self._ensure(self._server(name))).tools
        return self._run(tools())

    def call_tool(self, server: str, tool: str, arguments: dict[str, Any], timeout_s: float | None = None,
                  on_progress: OnProgress | None = None) -> concurrent.futures.Future[ToolResult]:
        """Call ``tool`` of ``server``; the future always resolves, within the timeout, to a :class:`ToolResult`.
        ``on_progress`` runs on the host's thread for each progress notification of the call: keep it short."""
        return self._run(self._call(self._server(server), tool, arguments, timeout_s or self.call_timeout_s,
                                    on_progress))

    def restart(self, name: str) -> concurrent.futures.Future[ServerStatus]:
        """Stop ``name`` and start it again, whatever its state (the failure count starts over)."""
        async def again() -> ServerStatus:
            server = self._server(name)
            await self._stop(server)
            server.failures = 0
            return await self._ensure(server)
        return self._run(again())

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop every server and the host's loop."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
            self._run(self._stop_all()).result(timeout_s)
        with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
            self._run(self._loop.shutdown_asyncgens()).result(timeout_s)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _server(self, name: str) -> _Server:
        try:
            return self._servers[name]
        except KeyError:
            raise KeyError(f"no MCP server named {name!r} is configured") from None

    # --- the loop's side ---------------------------------------------------------------------------------------
    def _snapshot(self, server: _Server) -> ServerStatus:
        return self.status(server.config.name)[0]

    async def _ensure(self, server: _Server) -> ServerStatus:
        if not server.config.enabled:
            server.error = "the server is disabled in mcp.json"
            return self._snapshot(server)
        if server.task is None or server.task.done():
            server.stop.clear()
            server.task = asyncio.create_task(self._supervise(server), name=f"mcp:{server.config.name}")
        if server.state != "ready" or server.dead.is_set():  # starting, or waiting to restart: the next attempt
            # decides
            waiter = asyncio.create_task(server.settled.wait())
            await asyncio.wait([waiter, server.task], timeout=self.start_timeout_s + START_GRACE_S,
                               return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        if server.state != "ready" and not server.error:
            server.error = server.error or f"the server did not start within {self.start_timeout_s:g} s"
        return self._snapshot(server)

    async def _supervise(self, server: _Server) -> None:
        """Run the server; when it dies, start it again after a backoff, until stopped or out of restarts."""
        while not server.stop.is_set():
            await self._serve_once(server)
            if server.stop.is_set():
                break
            if server.state == "ready":  # it had started: a crash, not a failed start
                server.failures = 0
            server.failures += 1
            server.state = "failed"
            if server.failures > self.max_restarts:
                server.error += f" (gave up after {self.max_restarts} restarts)"
                break
            delay = min(self.backoff_s * 2 ** (server.failures - 1), self.max_backoff_s)
            log.info("MCP server %s failed (%s); restarting in %.1f s", server.config.name, server.error, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.stop.wait(), delay)
            server.restarts += 1
        self._settle(server)  # nobody waits for a server that will not come

    @staticmethod
    def _settle(server: _Server) -> None:
        """Wake whoever waits for the current start attempt; later waiters wait for the next one."""
        server.settled.set()
        server.settled = asyncio.Event()

    async def _serve_once(self, server: _Server) -> None:
        server.state, server.error, server.session = "starting", "", None
        server.dead.clear()
        errlog = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115 -- closed below
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport(server.config, errlog, stack))
                session = await stack.enter_async_context(ClientSession(read, write))
                try:
                    await asyncio.wait_for(session.initialize(), self.start_timeout_s)
                    listed = await asyncio.wait_for(session.list_tools(), self.start_timeout_s)
                except TimeoutError:  # failed now: nobody waits for the hung process to be ended
                    server.error = (f"the server did not answer the MCP handshake within "
                                    f"{self.start_timeout_s:g} s")
                    server.state, server.stderr_tail = "failed", _tail(errlog)
                    self._settle(server)
                    raise
                server.tools = tuple(ToolInfo(server.config.name, t.name, t.description or "", dict(t.inputSchema))
                                     for t in listed.tools)
                server.session, server.state = session, "ready"
                server.stderr_tail = ()
                self._settle(server)
                await self._watch(server, session)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 -- the SDK wraps a dead process's errors in groups
            server.error = server.error or _describe(exc)
        finally:
            server.session = None
            server.stderr_tail = _tail(errlog)
            errlog.close()
        if not server.stop.is_set() and not server.error:
            server.error = "the server's connection closed"
        if server.state == "starting":
            server.state = "failed"
            self._settle(server)

    async def _watch(self, server: _Server, session: ClientSession) -> None:
        """Until stopped: ping now and then; a failed ping or a call that lost the connection ends the session."""
        while True:
            stop = asyncio.create_task(server.stop.wait())
            dead = asyncio.create_task(server.dead.wait())
            await asyncio.wait([stop, dead], timeout=self.ping_interval_s,
                                         return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            dead.cancel()
            if server.stop.is_set():
                return
            if server.dead.is_set():
                server.error = server.error or "the server stopped answering"
                return
            try:
                await asyncio.wait_for(session.send_ping(), min(self.ping_interval_s, 10.0))
            except Exception as exc:  # noqa: BLE001 -- any failed ping ends the session
                server.error = f"the server did not answer a ping ({_describe(exc)})"
                return

    @contextlib.asynccontextmanager
    async def _transport(self, config: ServerConfig, errlog: TextIO, stack: contextlib.AsyncExitStack) -> Any:
        if config.transport == "http":
            client = await stack.enter_async_context(httpx.AsyncClient(
                headers=config.headers, timeout=httpx.Timeout(self.call_timeout_s, read=300.0)))
            async with streamable_http_client(config.url, http_client=client) as (read, write, _):
                yield read, write
        else:
            env = {**get_default_environment(), **config.env} if config.env else None
            params = StdioServerParameters(command=config.command, args=list(config.args), env=env,
                                           cwd=config.cwd or None, encoding_error_handler="replace")
            async with stdio_client(params, errlog=errlog) as (read, write):
                yield read, write

    async def _stop(self, server: _Server) -> None:
        server.stop.set()
        if server.task is not None and not server.task.done():
            try:
                await asyncio.wait_for(asyncio.shield(server.task), 5.0)
            except Exception:  # noqa: BLE001 -- a server that will not stop is cancelled
                server.task.cancel()
                with contextlib.suppress(BaseException):
                    await server.task
        server.state, server.session, server.task = "stopped", None, None

    async def _stop_all(self) -> None:
        await asyncio.gather(*(self._stop(s) for s in self._servers.values()), return_exceptions=True)

    async def _call(self, server: _Server, tool: str, arguments: dict[str, Any], timeout_s: float,
                    on_progress: OnProgress | None = None) -> ToolResult:
        name = server.config.name
        status = await self._ensure(server)
        if server.session is None or status.state != "ready" or server.dead.is_set():
            why = status.error or status.state
            tail = f"\nIts last stderr lines:\n{chr(10).join(status.stderr_tail)}" if status.stderr_tail else ""
            return ToolResult(f"The MCP server {name!r} is not running ({why}); {tool!r} was not called.{tail}",
                              is_error=True)
        if tool not in {t.name for t in server.tools}:
            return ToolResult(f"The MCP server {name!r} has no tool named {tool!r}.", is_error=True)
        session = server.session
        progress = _progress_callback(on_progress, name, tool)
        sent: list[int] = []

        async def send() -> types.CallToolResult:
            # the id the SDK gives this request: it takes the session's next id before its first await
            sent.append(getattr(session, "_request_id", -1))
            return await session.call_tool(tool, arguments, read_timeout_seconds=timedelta(seconds=timeout_s),
                                           progress_callback=progress)

        abandoned = ToolResult(f"The tool {tool!r} of {name!r} did not answer within {timeout_s:g} s; "
                               "the call was abandoned.", is_error=True)
        try:
            result = await asyncio.wait_for(send(), timeout_s)
        except TimeoutError:
            await _cancel(session, sent, timeout_s)
            return abandoned
        except Exception as exc:  # noqa: BLE001 -- every failure goes back to the model as a result
            text = _describe(exc)
            if "timed out" in text.lower():
                await _cancel(session, sent, timeout_s)
                return abandoned
            if server.session is session and _lost(exc):
                server.error = f"the connection was lost during a call to {tool!r} ({text})"
                server.dead.set()
            return ToolResult(f"The call to {tool!r} of {name!r} failed: {text}", is_error=True)
        return _result(result)


def _progress_callback(on_progress: OnProgress | None, server: str, tool: str) -> Any:
    """``on_progress`` as the SDK's async progress callback (None when there is none: no token is then sent)."""
    if on_progress is None:
        return None

    async def progress(done: float, total: float | None, message: str | None) -> None:
        try:
            on_progress(done, total, message or "")
        except Exception:  # a caller's display error must not end the call
            log.exception("the progress callback of %s/%s failed", server, tool)
    return progress


async def _cancel(session: ClientSession, sent: list[int], timeout_s: float) -> None:
    """Tell the server that the request in ``sent`` (when it went out) was abandoned, so it may stop working."""
    if not sent or sent[0] < 0:
        return
    note = types.CancelledNotification(params=types.CancelledNotificationParams(
        requestId=sent[0], reason=f"no answer within {timeout_s:g} s"))
    with contextlib.suppress(Exception):  # a server that is gone cannot be told
        await asyncio.wait_for(session.send_notification(types.ClientNotification(note)), 5.0)


def _result(result: types.CallToolResult) -> ToolResult:
    parts: list[str] = []
    for item in result.content:
        if isinstance(item, types.TextContent):
            parts.append(item.text)
        elif isinstance(item, types.ImageContent | types.AudioContent):
            parts.append(f"[{item.type}: {item.mimeType}, {len(item.data) * 3 // 4} bytes]")
        elif isinstance(item, types.EmbeddedResource):
            res = item.resource
            parts.append(res.text if isinstance(res, types.TextResourceContents) else f"[resource {res.uri}]")
        elif isinstance(item, types.ResourceLink):
            parts.append(f"[resource {item.uri}]")
    if not parts and result.structuredContent is not None:
        parts.append(json.dumps(result.structuredContent))
    text = "\n".join(parts)
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + f"\n[... cut: the result had {len(text)} characters]"
    return ToolResult(text, bool(result.isError), result.structuredContent)


def _describe(exc: BaseException) -> str:
    """An exception in words, looking inside exception groups for the first real cause."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        text = f"the command was not found ({exc.filename or text})"
    return text


def _lost(exc: BaseException) -> bool:
    """Whether a call failed because the session is gone (the process died, the connection dropped)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = _describe(exc).lower()
    return ("closed" in text or "connection" in text or isinstance(exc, OSError | EOFError)
            or type(exc).__name__ in ("ClosedResourceError", "BrokenResourceError", "EndOfStream"))


def _tail(errlog: TextIO) -> tuple[str, ...]:
    try:
        errlog.flush()
        size = os.fstat(errlog.fileno()).st_size
        errlog.seek(max(0, size - 16_384))
        lines = errlog.read().splitlines()
    except (OSError, ValueError):
        return ()
    return tuple(line for line in lines[-STDERR_LINES:])
