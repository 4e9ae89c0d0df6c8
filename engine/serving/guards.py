"""Who may call the server and what a request may look like, checked before any route runs.

:class:`Guard` is one pure ASGI middleware (no ``BaseHTTPMiddleware``, which would get in the way of streaming
and disconnects). In order, it refuses:

- a ``Host`` that is not a loopback name while the server listens on loopback (DNS rebinding), 403;
- a cross-site ``Origin`` not in the allow list (a web page the user happens to visit), 403; allowed origins
  get CORS headers, and their preflight ``OPTIONS`` is answered here, without a key;
- a missing or wrong API key on ``/v1/*`` and Ollama's ``/api/*`` (and on ``/metrics`` with ``metrics_auth``), 401;
- a POST whose Content-Type is not ``application/json`` (a browser's "simple" cross-site request), 415;
- a body larger than ``max_body_bytes``, 413 as soon as ``Content-Length`` says so (then the connection closes,
  so the rest is never read), or as soon as the bytes received pass the limit; and a body that does not arrive
  within ``body_timeout_s``, 408;
- a generation request (``/v1/chat/completions``, ``/v1/completions``, ``/api/chat``, ``/api/generate``) from a
  client address that already has ``max_requests_per_client`` of them in flight, 429 with ``Retry-After``, so
  one client cannot take every place in the batch. A request counts until its reply (streamed or not) ends.

Every refusal is an OpenAI-style error object.
"""

from __future__ import annotations

import asyncio
import ipaddress
import secrets
from dataclasses import dataclass

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.serving.protocol import APIError

#: Default body limit: a long conversation is a few hundred KB; 50 MB of JSON is an attack.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
#: Default limit of generation requests in flight from one client address (as many as a default batch holds).
DEFAULT_MAX_REQUESTS_PER_CLIENT = 16
#: Seconds a client over its limit is asked to wait (``Retry-After``).
CLIENT_RETRY_AFTER_S = 1
_GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/api/chat", "/api/generate"})
_CORS_METHODS = "GET, POST, OPTIONS"
_CORS_HEADERS = "Authorization, Content-Type"


@dataclass(frozen=True, slots=True)
class GuardRules:
    """What :class:`Guard` enforces.

    Attributes:
        api_key: if set, ``/v1/*`` requires ``Authorization: Bearer <api_key>``.
        metrics_auth: ``/metrics`` requires the key too (``/health`` never does).
        check_host: accept only loopback ``Host`` values; on when the server listens on loopback.
        allowed_origins: web origins (``https://app.example``, or ``*``) allowed to call from a browser.
        max_body_bytes: the largest request body.
        body_timeout_s: longest wait for the rest of a request body.
        max_requests_per_client: generation requests one client address may have in flight (0: no limit).
    """

    api_key: str | None = None
    metrics_auth: bool = False
    check_host: bool = True
    allowed_origins: tuple[str, ...] = ()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    body_timeout_s: float = 30.0
    max_requests_per_client: int = DEFAULT_MAX_REQUESTS_PER_CLIENT

    def __post_init__(self) -> None:
        if self.metrics_auth and not self.api_key:
            raise ValueError("metrics_auth needs an API key")
        if self.max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be positive, got {self.max_body_bytes}")
        if self.max_requests_per_client < 0:
            raise ValueError(f"max_requests_per_client must be 0 (no limit) or more, got "
                             f"{self.max_requests_per_client}")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address or a host name) means only this computer."""
    name = host.strip("[]").lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """The name in a ``Host`` header, without its port (``[::1]:8000`` -> ``::1``)."""
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


def _normalise_origin(origin: str) -> str:
    return origin.strip().lower().rstrip("/")


class Guard:
    """The checks above, in front of ``app``."""

    def __init__(self, app: ASGIApp, rules: GuardRules) -> None:
        self.app, self.rules = app, rules
        self._origins = frozenset(_normalise_origin(o) for o in rules.allowed_origins)
        self._in_flight: dict[str, int] = {}  # client address -> generation requests not yet answered

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is not None and self._origin_allowed(origin):
            send = self._with_cors(send, origin)
        try:
            self._check_host(headers)
            self._check_origin(origin)
            if origin is not None and scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
                await self._preflight()(scope, receive, send)
                return
            self._check_auth(scope["path"], headers)
            if scope["method"] in ("POST", "PUT", "PATCH"):
                self._check_body_headers(headers)
        except APIError as exc:
            await exc.response()(scope, receive, send)
            return
        client = self._counted_client(scope)
        if client is None:
            await self.app(scope, self._limited(receive), send)
            return
        if self._in_flight.get(client, 0) >= self.rules.max_requests_per_client:
            await self._too_many(client)(scope, receive, send)
            return
        self._in_flight[client] = self._in_flight.get(client, 0) + 1
        try:
            await self.app(scope, self._limited(receive), send)
        finally:
            left = self._in_flight[client] - 1
            if left:
                self._in_flight[client] = left
            else:
                del self._in_flight[client]

    # -- per-client limit ----------------------------------------------------------------------------------
    def _counted_client(self, scope: Scope) -> str | None:
        """The client address a generation request counts against, or None when it is not counted."""
        if not self.rules.max_requests_per_client or scope["method"] != "POST":
            return None
        if scope["path"] not in _GENERATION_PATHS:
            return None
        client = scope.get("client")
        return str(client[0]) if client else ""

    def _too_many(self, client: str) -> Response:
        limit = self.rules.max_requests_per_client
        return APIError(429, f"This client ({client or 'unknown address'}) already has {limit} requests in "
                        f"flight, the most one client may have; retry when one has finished (the server's "
                        f"--max-requests-per-client sets the limit).", type_="rate_limit_error",
                        code="too_many_requests", headers={"Retry-After": str(CLIENT_RETRY_AFTER_S)}).response()

    # -- checks ------------------------------------------------------------------------------------------------
    def _check_host(self, headers: Headers) -> None:
        host = headers.get("host")
        if self.rules.check_host and host is not None and not is_loopback(_host_name(host)):
            raise APIError(403, f"The Host '{host}' is not this computer; this server answers only to "
                           "localhost, 127.0.0.1 and ::1 (start it with --host to listen elsewhere).",
                           type_="permission_error", code="host_not_allowed")

    def _origin_allowed(self, origin: str) -> bool:
        return "*" in self._origins or _normalise_origin(origin) in self._origins

    def _check_origin(self, origin: str | None) -> None:
        if origin is not None and not self._origin_allowed(origin):
            raise APIError(403, f"Requests from the web page '{origin}' are refused; start the server with "
                           f"--allow-origin {origin} to allow it.", type_="permission_error",
                           code="origin_not_allowed")

    def _check_auth(self, path: str, headers: Headers) -> None:
        key = self.rules.api_key
        guarded = path.startswith(("/v1", "/api/")) or (self.rules.metrics_auth and path.startswith("/metrics"))
        if key is None or not guarded:
            return
        header = headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), key.encode()):
            reason = "missing" if not header else "wrong"
            raise APIError(401, f"The API key is {reason}: send 'Authorization: Bearer <key>'.",
                           type_="authentication_error", code="invalid_api_key")

    def _check_body_headers(self, headers: Headers) -> None:
        media_type = headers.get("content-type", "").partition(";")[0].strip().lower()
        if media_type != "application/json":
            shown = media_type or "none"
            raise APIError(415, f"The request body must be sent as 'Content-Type: application/json', not {shown}.",
                           code="unsupported_media_type")
        length = headers.get("content-length")
        if length is None:
            return
        if not length.isdigit():
            raise APIError(400, f"Invalid Content-Length '{length}'.", code="invalid_content_length")
        if int(length) > self.rules.max_body_bytes:
            error = self._too_large()
            error.headers["Connection"] = "close"
            raise error

    def _too_large(self) -> APIError:
        return APIError(413, f"The request body is larger than {self.rules.max_body_bytes} bytes; send less, or "
                        "start the server with a larger --max-body-bytes.", code="request_too_large")

    # -- wrappers ----------------------------------------------------------------------------------------------
    def _limited(self, receive: Receive) -> Receive:
        """``receive`` that counts body bytes and times out while the body is incomplete."""
        received = 0
        complete = False

        async def limited_receive() -> Message:
            nonlocal received, complete
            if complete:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.rules.body_timeout_s)
            except TimeoutError:
                raise APIError(408, f"The request body did not arrive within {self.rules.body_timeout_s:g} s.",
                               code="request_timeout") from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                complete = not message.get("more_body", False)
                if received > self.rules.max_body_bytes:
                    raise self._too_large()
            else:
                complete = True
            return message

        return limited_receive

    @staticmethod
    def _preflight() -> Response:
        return Response(status_code=204, headers={"Access-Control-Allow-Methods": _CORS_METHODS,
                                                  "Access-Control-Allow-Headers": _CORS_HEADERS,
                                                  "Access-Control-Max-Age": "600"})

    @staticmethod
    def _with_cors(send: Send, origin: str) -> Send:
        async def cors_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["Access-Control-Allow-Origin"] = origin
                headers.add_vary_header("Origin")
            await send(message)

        return cors_send
