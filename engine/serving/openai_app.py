"""An OpenAI-compatible HTTP server over the engine: ``python -m engine.serve --model default --port 8000``.

Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions`` and ``POST /v1/completions`` (both streamed as
server-sent events when ``stream`` is true), ``GET /health`` and ``GET /metrics`` (Prometheus text, vLLM-style
names under ``hearth:``). Starlette + uvicorn over :class:`~engine.serving.async_engine.AsyncLLMEngine`; requests batch
with every other user of the same engine (the app's chats when the app serves its loaded model).

Bad input gets a 400 with an OpenAI-style error object naming the problem; parameters the engine cannot honour
(``n > 1``, ``logprobs``, ``tools``, ...) are refused, never ignored. ``--api-key`` guards ``/v1/*`` with
``Authorization: Bearer``; ``/health`` and ``/metrics`` stay open, as in vLLM.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import logging
import secrets
import socket
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, Literal, TypeVar

import uvicorn
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from engine.api import CapacityError, ModelLoadError, SamplingParams, StepOutput
from engine.serving.async_engine import AsyncLLMEngine, AsyncRequest

log = logging.getLogger("engine.serving.openai_app")

METRIC_PREFIX = "hearth:"
_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                    40.0, 80.0)
_DISCONNECT_POLL_S = 0.25


# --- request bodies ---------------------------------------------------------------------------------------------
# Strict types, unknown fields forbidden: a parameter we do not support is a 400 naming it, never ignored.

class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


_BodyT = TypeVar("_BodyT", bound=_Body)


class StreamOptions(_Body):
    include_usage: bool = False


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class _Sampling(_Body):
    """Fields shared by both generation endpoints."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0)
    n: int | None = 1
    user: str | None = None
    # vLLM's extensions the engine supports.
    top_k: int | None = Field(default=None, ge=0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    # Accepted only at their "off" values.
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    @field_validator("n")
    @classmethod
    def _only_one_choice(cls, n: int | None) -> int | None:
        if n not in (None, 1):
            raise ValueError("only n=1 is supported")
        return n

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value: float | None) -> float | None:
        if value:
            raise ValueError("presence and frequency penalties are not supported; use repetition_penalty")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise ValueError("logit_bias is not supported")
        return value

    def sampling_params(self, max_tokens: int | None, default_max_tokens: int) -> SamplingParams:
        """The engine's parameters; ``ValueError`` names a bad field."""
        return SamplingParams(
            max_tokens=max_tokens or default_max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            repetition_penalty=self.repetition_penalty or 1.0,
            stop=[self.stop] if isinstance(self.stop, str) else list(self.stop or []),
            seed=self.seed,
        )


def _refuse(what: str, allowed: tuple[Any, ...] = (None, False)) -> Callable[[Any], Any]:
    """A validator that accepts only a field's "off" values and names the feature otherwise."""

    def check(value: Any) -> Any:
        if value is True or value not in allowed:
            raise ValueError(f"{what} is not supported")
        return value

    return check


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: Any = None
    top_logprobs: Any = None
    response_format: Any = None

    _check_logprobs = field_validator("logprobs", "top_logprobs")(_refuse("logprobs"))
    _check_format = field_validator("response_format")(_refuse("a response_format other than text", (None, {"type": "text"})))


class CompletionRequest(_Sampling):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)] | Annotated[list[int], Field(min_length=1)]
    echo: Any = None
    best_of: Any = None
    logprobs: Any = None
    suffix: Any = None

    _check_echo = field_validator("echo")(_refuse("echo"))
    _check_best_of = field_validator("best_of")(_refuse("best_of > 1", (None, 1)))
    _check_logprobs = field_validator("logprobs")(_refuse("logprobs"))
    _check_suffix = field_validator("suffix")(_refuse("suffix"))


# --- errors -----------------------------------------------------------------------------------------------------

class APIError(Exception):
    """An error answered as ``{"error": {...}}`` in OpenAI's shape."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def _validation_error(exc: ValidationError) -> APIError:
    """Turn pydantic's first complaint into one sentence naming the parameter."""
    errors = exc.errors()
    if not errors:
        return APIError(400, "The request is invalid.")
    err = errors[0]
    loc = [str(p) for p in err.get("loc", ())]
    # Drop pydantic's union branch names ("str", "list[TextPart]") from the path.
    loc = [p for p in loc if not any(c in p for c in "[]") and p not in ("str", "int", "function-after")]
    param = ".".join(loc) or None
    kind, msg = err.get("type", ""), str(err.get("msg", "invalid value"))
    if kind == "extra_forbidden":
        return APIError(400, f"Unsupported parameter '{param}': Hearth's server does not support it.",
                        param=param, code="unsupported_parameter")
    if kind == "missing":
        return APIError(400, f"Missing required parameter '{param}'.", param=param, code="missing_parameter")
    if msg.startswith("Value error, "):
        msg = msg.removeprefix("Value error, ")
    if param is None:
        return APIError(400, f"The request body is invalid: {msg}.")
    return APIError(400, f"Invalid value for '{param}': {msg}.", param=param, code="invalid_value")


# --- metrics ----------------------------------------------------------------------------------------------------

class ServerMetrics:
    """The Prometheus registry behind ``/metrics``.

    Histograms and request counters cover the requests this server answered; gauges and the prefix-cache and
    preemption counters are read from the engine at scrape time, so they include everyone who shares it.
    """

    def __init__(self, engine_metrics: Callable[[], dict[str, float]], model_name: str) -> None:
        disable_created_metrics()  # no *_created series: they only add noise for a single-process server
        self.registry = CollectorRegistry()
        self._model = model_name
        labels = ["model_name"]
        p = METRIC_PREFIX

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(p + name, doc, labels, buckets=_LATENCY_BUCKETS, registry=self.registry)

        self.ttft = histogram("time_to_first_token_seconds", "Time to first token, per request.")
        self.itl = histogram("inter_token_latency_seconds", "Time between successive tokens of a request.")
        self.e2e = histogram("e2e_request_latency_seconds", "Whole-request latency, arrival to last token.")
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens processed.", labels, registry=self.registry)
        self.generation_tokens = Counter(p + "generation_tokens", "Tokens generated.", labels,
                                         registry=self.registry)
        self.request_success = Counter(p + "request_success", "Finished requests by finish reason.",
                                       [*labels, "finished_reason"], registry=self.registry)
        self.registry.register(_EngineCollector(engine_metrics, model_name))

    def observe_token(self, itl_s: float | None) -> None:
        if itl_s is not None:
            self.itl.labels(self._model).observe(itl_s)

    def observe_finish(self, out: StepOutput | None, num_prompt_tokens: int) -> None:
        reason = "abort" if out is None else (out.finish_reason or "stop")
        self.request_success.labels(self._model, reason).inc()
        self.prompt_tokens.labels(self._model).inc(num_prompt_tokens)
        m = (out.metrics if out is not None else None) or {}
        self.generation_tokens.labels(self._model).inc(m.get("num_generated_tokens") or 0)
        if m.get("ttft_s") is not None:
            self.ttft.labels(self._model).observe(m["ttft_s"])
        if m.get("e2e_s") is not None:
            self.e2e.labels(self._model).observe(m["e2e_s"])

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector:
    """Engine state, read at scrape time."""

    _GAUGES = (
        ("num_requests_running", "num_running", "Requests in the running batch."),
        ("num_requests_waiting", "num_waiting", "Requests waiting to be scheduled."),
        ("kv_cache_usage_perc", "kv_cache_usage", "Fraction of KV-cache blocks in use (1 = full)."),
        ("kv_blocks_used", "kv_blocks_used", "KV-cache blocks held by requests."),
        ("kv_blocks_total", "kv_blocks_total", "KV-cache blocks in the pool."),
        ("mean_batch_size", "mean_batch_size", "Mean sequences per engine step over recent steps."),
        ("batch_efficiency", "batch_efficiency", "Mean batch size over max_batch_size."),
        ("generation_throughput_tok_s", "throughput_tok_s", "Tokens generated per second, recent window."),
    )
    _COUNTERS = (
        ("prefix_cache_queries", "prefix_cache_queries", "Prompt tokens looked up in the prefix cache."),
        ("prefix_cache_hits", "prefix_cache_hits", "Prompt tokens found in the prefix cache."),
        ("num_preemptions", "num_preemptions", "Requests preempted to free KV-cache blocks."),
    )

    def __init__(self, engine_metrics: Callable[[], dict[str, float]], model_name: str) -> None:
        self._engine_metrics = engine_metrics
        self._model = model_name

    def collect(self) -> Any:
        snap = self._engine_metrics()
        for name, key, doc in self._GAUGES:
            family = GaugeMetricFamily(METRIC_PREFIX + name, doc, labels=["model_name"])
            family.add_metric([self._model], float(snap.get(key, 0.0)))
            yield family
        for name, key, doc in self._COUNTERS:
            family = CounterMetricFamily(METRIC_PREFIX + name, doc, labels=["model_name"])
            family.add_metric([self._model], float(snap.get(key, 0.0)))
            yield family


# --- the app ----------------------------------------------------------------------------------------------------

def _usage(num_prompt: int, num_generated: int) -> dict[str, int]:
    return {"prompt_tokens": num_prompt, "completion_tokens": num_generated,
            "total_tokens": num_prompt + num_generated}


def _sse(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


class OpenAIServer:
    """The routes' logic over one :class:`AsyncLLMEngine`.

    Args:
        engine: the asyncio front of the engine.
        model_name: the id ``/v1/models`` lists; requests may also name one of ``aliases``.
        api_key: if set, ``/v1/*`` requires ``Authorization: Bearer <api_key>``.
        priority: scheduling priority of this server's requests (0 = same as the app's chats).
    """

    def __init__(self, engine: AsyncLLMEngine, model_name: str, api_key: str | None = None,
                 aliases: tuple[str, ...] = ("default",), priority: int = 0) -> None:
        self.engine = engine
        self.model_name = model_name
        self.api_key = api_key or None
        self.priority = priority
        self._names = {model_name, *aliases}
        self._created = int(time.time())
        self.metrics = ServerMetrics(engine.metrics, model_name)

    # -- helpers ---------------------------------------------------------------------------------------------------
    def check_auth(self, request: Request) -> None:
        if self.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), self.api_key.encode()):
            reason = "missing" if not header else "wrong"
            raise APIError(401, f"The API key is {reason}: send 'Authorization: Bearer <key>'.",
                           type_="authentication_error", code="invalid_api_key")

    def _check_model(self, model: str | None) -> None:
        if model is not None and model not in self._names:
            raise APIError(404, f"The model '{model}' does not exist; this server serves '{self.model_name}'.",
                           param="model", code="model_not_found")

    def _submit(self, prompt: Any, body: _Sampling, max_tokens: int | None) -> AsyncRequest:
        max_len = self.engine.engine.max_model_len
        try:
            params = body.sampling_params(max_tokens, default_max_tokens=max_len)
        except ValueError as exc:
            raise APIError(400, str(exc), param=str(exc).split(" ", 1)[0]) from exc
        try:
            return self.engine.submit(prompt, params, priority=self.priority)
        except CapacityError as exc:
            raise APIError(429, str(exc), type_="rate_limit_error", code="queue_full") from exc
        except ValueError as exc:
            code = "context_length_exceeded" if "context" in str(exc) else None
            raise APIError(400, str(exc), param="messages" if isinstance(body, ChatCompletionRequest)
                           else "prompt", code=code) from exc

    async def _observe(self, request: AsyncRequest) -> AsyncIterator[StepOutput]:
        """The request's outputs, recording its latencies; an abandoned request is cancelled and counted."""
        final: StepOutput | None = None
        last_token: float | None = None
        try:
            async for out in request:
                if out.new_token_ids:
                    now = time.monotonic()
                    if last_token is not None:
                        self.metrics.observe_token(now - last_token)
                    last_token = now
                if out.finished:
                    final = out
                yield out
        finally:
            request.cancel()
            self.metrics.observe_finish(final, request.num_prompt_tokens)

    async def _collect(self, request: AsyncRequest, http: Request) -> tuple[str, StepOutput]:
        """Run a non-streamed request to the end; a client that hangs up cancels it."""

        async def watch() -> None:
            while not await http.is_disconnected():
                await asyncio.sleep(_DISCONNECT_POLL_S)
            request.cancel()

        watcher = asyncio.create_task(watch())
        parts: list[str] = []
        final: StepOutput | None = None
        try:
            async for out in self._observe(request):
                parts.append(out.delta_text)
                final = out
        finally:
            watcher.cancel()
        assert final is not None and final.finished
        if final.finish_reason == "error":
            raise APIError(500, final.error or "generation failed", type_="server_error")
        return "".join(parts), final

    # -- routes ----------------------------------------------------------------------------------------------------
    def list_models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": self._created,
                                            "owned_by": "hearth"}]}

    async def chat(self, body: ChatCompletionRequest, http: Request) -> Response:
        self._check_model(body.model)
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                    for m in body.messages]
        request = self._submit(messages, body, body.max_completion_tokens or body.max_tokens)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return self._stream(self._chat_chunks(request, rid, created, include_usage))
        text, final = await self._collect(request, http)
        return JSONResponse({
            "id": rid, "object": "chat.completion", "created": created, "model": self.model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": final.finish_reason, "logprobs": None}],
            "usage": _usage(request.num_prompt_tokens, int((final.metrics or {}).get("num_generated_tokens", 0))),
        })

    async def completions(self, body: CompletionRequest, http: Request) -> Response:
        self._check_model(body.model)
        prompt: Any = body.prompt
        if isinstance(prompt, list) and isinstance(prompt[0], str):
            prompt = prompt[0]  # a batch of one
        request = self._submit(prompt, body, body.max_tokens or 16)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return self._stream(self._completion_chunks(request, rid, created, include_usage))
        text, final = await self._collect(request, http)
        return JSONResponse({
            "id": rid, "object": "text_completion", "created": created, "model": self.model_name,
            "choices": [{"index": 0, "text": text, "finish_reason": final.finish_reason, "logprobs": None}],
            "usage": _usage(request.num_prompt_tokens, int((final.metrics or {}).get("num_generated_tokens", 0))),
        })

    @staticmethod
    def _stream(chunks: AsyncIterator[str]) -> StreamingResponse:
        return StreamingResponse(chunks, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def _chat_chunks(self, request: AsyncRequest, rid: str, created: int,
                           include_usage: bool) -> AsyncIterator[str]:
        head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": self.model_name}

        def chunk(delta: dict[str, str], finish: str | None = None, **extra: Any) -> str:
            return _sse({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                                              "logprobs": None}], **extra})

        yield chunk({"role": "assistant", "content": ""})
        async for out in self._observe(request):
            if out.delta_text:
                yield chunk({"content": out.delta_text})
            if out.finished:
                if out.finish_reason == "error":
                    yield _sse(APIError(500, out.error or "generation failed", "server_error").body())
                    break
                usage = _usage(request.num_prompt_tokens, int((out.metrics or {}).get("num_generated_tokens", 0)))
                yield chunk({}, out.finish_reason, usage=usage)
                if include_usage:
                    yield _sse({**head, "choices": [], "usage": usage})
        yield _sse("[DONE]")

    async def _completion_chunks(self, request: AsyncRequest, rid: str, created: int,
                                 include_usage: bool) -> AsyncIterator[str]:
        head = {"id": rid, "object": "text_completion", "created": created, "model": self.model_name}

        def chunk(text: str, finish: str | None = None, **extra: Any) -> str:
            return _sse({**head, "choices": [{"index": 0, "text": text, "finish_reason": finish,
                                              "logprobs": None}], **extra})

        async for out in self._observe(request):
            if out.finished:
                if out.finish_reason == "error":
                    yield _sse(APIError(500, out.error or "generation failed", "server_error").body())
                    break
                usage = _usage(request.num_prompt_tokens, int((out.metrics or {}).get("num_generated_tokens", 0)))
                yield chunk(out.delta_text, out.finish_reason, usage=usage)
                if include_usage:
                    yield _sse({**head, "choices": [], "usage": usage})
            elif out.delta_text:
                yield chunk(out.delta_text)
        yield _sse("[DONE]")


class _AuthMiddleware:
    """Pure ASGI (no ``BaseHTTPMiddleware``, which would get in the way of streaming and disconnects)."""

    def __init__(self, app: ASGIApp, server: OpenAIServer) -> None:
        self.app, self.server = app, server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            try:
                self.server.check_auth(Request(scope))
            except APIError as exc:
                await exc.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _parse(request: Request, model: type[_BodyT]) -> _BodyT:
    """The JSON body as ``model``, whatever the Content-Type says (curl's ``-d`` sends a form type)."""
    raw = await request.body()
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"The request body is not valid JSON: {exc}.", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise APIError(400, f"The request body must be a JSON object, not {type(data).__name__}.",
                       code="invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc) from exc


def create_app(engine: AsyncLLMEngine, model_name: str, api_key: str | None = None,
               aliases: tuple[str, ...] = ("default",)) -> Starlette:
    """The ASGI app serving ``engine`` under the OpenAI API."""
    server = OpenAIServer(engine, model_name, api_key, aliases)

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def metrics(_: Request) -> Response:
        return Response(server.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def models(_: Request) -> Response:
        return JSONResponse(server.list_models())

    async def chat(request: Request) -> Response:
        return await server.chat(await _parse(request, ChatCompletionRequest), request)

    async def completions(request: Request) -> Response:
        return await server.completions(await _parse(request, CompletionRequest), request)

    async def api_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, APIError)
        return exc.response()

    app = Starlette(
        routes=[
            Route("/health", health),
            Route("/metrics", metrics),
            Route("/v1/models", models),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
        ],
        exception_handlers={APIError: api_error},
    )
    app.add_middleware(_AuthMiddleware, server=server)
    app.state.server = server
    return app


# --- running it -------------------------------------------------------------------------------------------------

def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this computer."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str, port: int, api_key: str | None) -> str | None:
    """The warning for a bind that other computers can reach without a key, or None."""
    if is_loopback(host) or api_key:
        return None
    return (f"WARNING: serving on {host}:{port} without an API key. Anyone who can reach this address can "
            "run prompts on your model (/v1/chat/completions, /v1/completions), list it (/v1/models) and read "
            "/metrics. Pass --api-key KEY, or bind to 127.0.0.1.")


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind the listening socket now, so a port in use is an ``OSError`` here rather than inside uvicorn."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class ServerThread:
    """Runs the server on a background thread over an engine someone else steps (the app's bridge).

    ``start()`` binds at once (``OSError`` when the port is taken) and returns; ``stop()`` waits for uvicorn.
    """

    def __init__(self, engine: Any, model_name: str, host: str = "127.0.0.1", port: int = 8000,
                 api_key: str | None = None) -> None:
        self.host, self.port = host, port
        app = create_app(AsyncLLMEngine(engine), model_name, api_key)
        self._server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                     timeout_graceful_shutdown=2, lifespan="off"))
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> None:
        self._sock = bind_socket(self.host, self.port)
        self.port = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="hearth-server", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine.serve",
                                     description="Serve a model over an OpenAI-compatible HTTP API.")
    parser.add_argument("--model", default="default", help="'default', a Hugging Face folder, or a .gguf file")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this computer)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/*")
    parser.add_argument("--served-model-name", default=None, help="model id to report (default: the model's)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16 (default: auto)")
    parser.add_argument("--quantization", default="auto", help="auto or none (default: auto)")
    parser.add_argument("--max-batch-size", type=int, default=16, help="most sequences per step (default: 16)")
    parser.add_argument("--max-wait-ms", type=float, default=5.0, help="batching window when idle (default: 5)")
    parser.add_argument("--kv-cache-mb", type=int, default=0, help="KV-cache budget in MiB (default: automatic)")
    parser.add_argument("--max-model-len", type=int, default=None, help="longest prompt plus reply")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def main(argv: list[str] | None = None) -> int:
    """Load the model and serve until interrupted. Returns 2 when the model cannot be loaded or bound."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)-7s %(name)s %(message)s")
    warning = exposure_warning(args.host, args.port, args.api_key)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    from engine.core.llm import LLM

    options: dict[str, Any] = {"max_batch_size": args.max_batch_size, "max_wait_ms": args.max_wait_ms,
                               "max_model_len": args.max_model_len}
    if args.kv_cache_mb:
        options["kv_cache_bytes"] = args.kv_cache_mb * 1024 * 1024
    try:
        llm = LLM(args.model, device=args.device, dtype=args.dtype, quantization=args.quantization,
                  start_loop=True, **options)
    except (ModelLoadError, ValueError, TypeError) as exc:
        sock.close()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    name = args.served_model_name or llm.model_name
    app = create_app(AsyncLLMEngine(llm), name, args.api_key, aliases=("default", str(args.model)))
    print(f"Hearth is serving {name} on {llm.device} at http://{args.host}:{args.port}/v1"
          + (" (API key required)" if args.api_key else ""), flush=True)
    try:
        uvicorn.Server(uvicorn.Config(app, log_level=args.log_level, timeout_graceful_shutdown=2,
                                      lifespan="off")).run(sockets=[sock])
    finally:
        llm.close()
        sock.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
