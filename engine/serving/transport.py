"""Sockets and connections: the listening socket, uvicorn's settings, and a deadline for request headers.

- The listening socket is created as ``IPPROTO_TCP``: asyncio sets ``TCP_NODELAY`` only on sockets that say so,
  and accepted sockets inherit the listener's protocol. Without it, Nagle's algorithm and delayed ACKs add
  ~40 ms to every non-streamed reply on a keep-alive connection.
- uvicorn closes idle keep-alive connections (``timeout_keep_alive``) and caps connections
  (``limit_concurrency``, 503 beyond it), but has no deadline for a request's headers: a client that connects and
  sends nothing, or half a header, holds its connection for ever. :class:`_H11Protocol` closes it after
  ``header_timeout_s``. The header size is capped by h11 (``h11_max_incomplete_event_size``).
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

_HEADER_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """Per-connection limits.

    Attributes:
        header_timeout_s: longest wait for a request's headers, from connecting or from the previous reply.
        keep_alive_s: an idle keep-alive connection closes after this long.
        max_connections: open connections beyond this get 503 (idle keep-alive ones count).
        max_header_bytes: the largest request line plus headers.
    """

    header_timeout_s: float = _HEADER_TIMEOUT_S
    keep_alive_s: int = 5
    max_connections: int = 256
    max_header_bytes: int = 16 * 1024

    def __post_init__(self) -> None:
        if self.header_timeout_s <= 0 or self.keep_alive_s < 1 or self.max_connections < 1:
            raise ValueError(f"connection limits must be positive: {self}")


class _Config(uvicorn.Config):
    """uvicorn's settings plus the header deadline, which ``_H11Protocol`` reads."""

    def __init__(self, app: Any, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(app, http=_H11Protocol, timeout_keep_alive=limits.keep_alive_s,
                         limit_concurrency=limits.max_connections,
                         h11_max_incomplete_event_size=limits.max_header_bytes, **kwargs)
        self.header_timeout_s = limits.header_timeout_s


class _H11Protocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request headers do not arrive in time.

    The deadline runs from the connection's start and again from each finished reply (which also bounds how
    long a refused request's unread body is drained); it stops once a request's headers are in.
    """

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self._header_timeout_s = getattr(config, "header_timeout_s", _HEADER_TIMEOUT_S)
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

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
