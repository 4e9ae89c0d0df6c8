"""Sockets and connections: the listening socket, uvicorn's settings, and deadlines for request headers and for
clients that stop reading.

- The listening socket is created as ``IPPROTO_TCP``: asyncio sets ``TCP_NODELAY`` only on sockets that say so,
  and accepted sockets inherit the listener's protocol. Without it, Nagle's algorithm and delayed ACKs add
  ~40 ms to every non-streamed reply on a keep-alive connection.
- uvicorn closes idle keep-alive connections (``timeout_keep_alive``) and caps connections
  (``limit_concurrency``, 503 beyond it), but has no deadline for a request's headers: a client that connects and
  sends nothing, or half a header, holds its connection for ever. :class:`_H11Protocol` closes it after
  ``header_timeout_s``. The header size is capped by h11 (``h11_max_incomplete_event_size``).
- A client that stops reading a reply (a stream it never reads) would hold its request, and its place in the
  batch, until the request's own deadline: the engine keeps generating into a queue nobody drains. Each accepted
  socket's send buffer, and asyncio's buffer above it, are capped (``send_buffer_bytes``; the kernel would
  otherwise grow its buffer to megabytes), so such a client fills them within some tens of kilobytes; once the
  server's writes have been blocked for ``write_timeout_s`` the connection is dropped, which cancels the
  request and frees its slot.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

_HEADER_TIMEOUT_S = 10.0
_WRITE_TIMEOUT_S = 15.0
_SEND_BUFFER_BYTES = 16 * 1024
_log = logging.getLogger("hearth.server")


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """Per-connection limits.

    Attributes:
        header_timeout_s: longest wait for a request's headers, from connecting or from the previous reply.
        keep_alive_s: an idle keep-alive connection closes after this long.
        max_connections: open connections beyond this get 503 (idle keep-alive ones count).
        max_header_bytes: the largest request line plus headers.
        write_timeout_s: a connection whose client takes none of the reply for this long is dropped (its
            request is cancelled).
        send_buffer_bytes: each connection's kernel send buffer (``SO_SNDBUF``, which Linux doubles) and
            asyncio's write buffer limit: they bound how much of a reply a client that does not read can leave
            waiting before ``write_timeout_s`` starts to run. Token streams and JSON replies need little.
    """

    header_timeout_s: float = _HEADER_TIMEOUT_S
    keep_alive_s: int = 5
    max_connections: int = 256
    max_header_bytes: int = 16 * 1024
    write_timeout_s: float = _WRITE_TIMEOUT_S
    send_buffer_bytes: int = _SEND_BUFFER_BYTES

    def __post_init__(self) -> None:
        if (self.header_timeout_s <= 0 or self.keep_alive_s < 1 or self.max_connections < 1
                or not self.write_timeout_s > 0 or self.send_buffer_bytes < 4096):
            raise ValueError(f"connection limits must be positive (a send buffer of 4096 bytes or more): {self}")


class _Config(uvicorn.Config):
    """uvicorn's settings plus the header deadline, which ``_H11Protocol`` reads."""

    def __init__(self, app: Any, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(app, http=_H11Protocol, timeout_keep_alive=limits.keep_alive_s,
                         limit_concurrency=limits.max_connections,
                         h11_max_incomplete_event_size=limits.max_header_bytes, **kwargs)
        self.header_timeout_s = limits.header_timeout_s
        self.write_timeout_s = limits.write_timeout_s
        self.send_buffer_bytes = limits.send_buffer_bytes


class _H11Protocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request headers do not arrive in time, or whose
    client stops taking the reply.

    The header deadline runs from the connection's start and again from each finished reply (which also bounds
    how long a refused request's unread body is drained); it stops once a request's headers are in. The write
    deadline runs while asyncio has paused writing (the socket's buffers are full) and stops when it resumes.
    """

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self._header_timeout_s = getattr(config, "header_timeout_s", _HEADER_TIMEOUT_S)
        self._write_timeout_s = getattr(config, "write_timeout_s", _WRITE_TIMEOUT_S)
        self._send_buffer_bytes = getattr(config, "send_buffer_bytes", _SEND_BUFFER_BYTES)
        self._header_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_buffer_bytes)
            except OSError:  # not a TCP socket (a test's pipe); the write deadline still holds
                pass
        transport.set_write_buffer_limits(high=self._send_buffer_bytes)
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        self._disarm_write_timer()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self._write_timeout_s, self._on_write_timeout)

    def resume_writing(self) -> None:
        self._disarm_write_timer()
        super().resume_writing()

    def _disarm_write_timer(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _on_write_timeout(self) -> None:
        self._write_timer = None
        _log.warning("Dropped the connection of %s: it took none of the reply for %g s (a client that does not "
                     "read); its request is cancelled.", self.client, self._write_timeout_s)
        self.transport.abort()

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and not self.cycle.response_complete:
            self._disarm_header_timer()  # a request is in: the app's own timeouts take over

    def on_response_complete(self) -> None:
        self._arm_header_timer()  # before super(), which may start a pipelined request and disarm it
        super().on_response_complete()

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        self._header_timer = self.loop.call_later(self._header_timeout_s, self._on_header_timeout)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def server_config(app: Any, limits: ConnectionLimits | None = None, log_level: str = "warning") -> uvicorn.Config:
    """uvicorn's settings for ``app`` under ``limits``."""
    return _Config(app, limits or ConnectionLimits(), log_level=log_level, timeout_graceful_shutdown=2,
                   lifespan="off", ws="none")


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind and listen now, so a port in use is an ``OSError`` here rather than inside uvicorn."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock
