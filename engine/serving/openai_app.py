"""An OpenAI-compatible HTTP server over the engine: ``python -m engine.serve --model default --port 8000``.

Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions`` and ``POST /v1/completions`` (both streamed as
server-sent events when ``stream`` is true), ``GET /health`` (503 once the engine's loop has died) and
``GET /metrics`` (Prometheus text, vLLM-style names under ``hearth:``). Starlette + uvicorn over
:class:`~engine.serving.async_engine.AsyncLLMEngine`; requests batch with every other user of the same engine (the
app's chats when the app serves its loaded model).

The wire format lives in :mod:`engine.serving.protocol`, who may call and with what in
:mod:`engine.serving.guards`, sockets and connection limits in :mod:`engine.serving.transport`, and the command
line in :mod:`engine.serving.cli`. Every error is an OpenAI-style error object.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.api import CapacityError, StepOutput
from engine.serving.async_engine import AsyncLLMEngine, AsyncRequest
from engine.serving.guards import Guard, GuardRules, is_loopback
from engine.serving.metrics import METRICS_CONTENT_TYPE, ServerMetrics
from engine.serving.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    GenerationRequest,
    parse_body,
)
from engine.serving.transport import ConnectionLimits, bind_socket, server_config

_DISCONNECT_POLL_S = 0.25
#: A prompt longer than this many characters per context token is refused before it is tokenized (no
#: tokenizer packs more than a few characters into a token outside runs of spaces or punctuation).
MAX_CHARS_PER_TOKEN = 32
#: Seconds a client should wait after a 429 before trying again.
RETRY_AFTER_S = 1


def _usage(num_prompt: int, num_generated: int) -> dict[str, int]:
    return {"prompt_tokens": num_prompt, "completion_tokens": num_generated,
            "total_tokens": num_prompt + num_generated}


def _sse(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


def _num_generated(out: StepOutput) -> int:
    return int((out.metrics or {}).get("num_generated_tokens", 0))


class OpenAIServer:
    """The routes' logic over one :class:`AsyncLLMEngine`.

    Args:
        engine: the asyncio front of the engine.
        model_name: the id ``/v1/models`` lists; requests may also name one of ``aliases``.
        priority: scheduling priority of this server's requests (0 = same as the app's chats).
    """

    def __init__(self, engine: AsyncLLMEngine, model_name: str, aliases: tuple[str, ...] = ("default",),
                 priority: int = 0) -> None:
        self.engine = engine
        self.model_name = model_name
        self.priority = priority
        self._names = {model_name, *aliases}
        self._created = int(time.time())
        self.metrics = ServerMetrics(engine.metrics, model_name)

    # -- helpers ---------------------------------------------------------------------------------------------------
    def _check_model(self, model: str | None) -> None:
        if model is not None and model not in self._names:
            raise APIError(404, f"The model '{model}' does not exist; this server serves '{self.model_name}'.",
                           param="model", code="model_not_found")

    @staticmethod
    def _check_length(prompt: Any, max_len: int, param: str) -> None:
        """Refuse a prompt far too long for the context by its characters, before tokenizing it."""
        if isinstance(prompt, str):
            chars = len(prompt)
        elif isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            chars = sum(len(m["content"]) for m in prompt)
        else:
            return
        if chars > max_len * MAX_CHARS_PER_TOKEN:
            raise APIError(400, f"The prompt has {chars} characters, far more than the context of {max_len} "
                           "tokens holds; shorten the prompt.", param=param, code="context_length_exceeded")

    async def _submit(self, prompt: Any, body: GenerationRequest, max_tokens: int | None) -> AsyncRequest:
        max_len = self.engine.engine.max_model_len
        param = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
        try:
            params = body.sampling_params(max_tokens, default_max_tokens=max_len)
        except ValueError as exc:
            raise APIError(400, str(exc), param=str(exc).split(" ", 1)[0]) from exc
        self._check_length(prompt, max_len, param)
        try:
            return await self.engine.add_request(prompt, params, priority=self.priority)
        except CapacityError as exc:
            raise APIError(429, str(exc), type_="rate_limit_error", code="queue_full",
                           headers={"Retry-After": str(RETRY_AFTER_S)}) from exc
        except ValueError as exc:
            code = "context_length_exceeded" if "context" in str(exc) else None
            raise APIError(400, str(exc), param=param, code=code) from exc

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

    async def generate(self, body: GenerationRequest, http: Request) -> Response:
        """Answer a chat or a completion request, streamed or whole."""
        self._check_model(body.model)
        chat = isinstance(body, ChatCompletionRequest)
        if isinstance(body, ChatCompletionRequest):
            prompt: Any = body.engine_messages()
            max_tokens = body.max_completion_tokens or body.max_tokens
        else:
            assert isinstance(body, CompletionRequest)
            prompt, max_tokens = body.engine_prompt(), body.max_tokens or 16
        request = await self._submit(prompt, body, max_tokens)
        rid, created = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time())
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(self._chunks(request, chat, rid, created, include_usage),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        text, final = await self._collect(request, http)
        if chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text}
        choice.update(finish_reason=final.finish_reason, logprobs=None)
        return JSONResponse({
            "id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
            "model": self.model_name, "choices": [choice],
            "usage": _usage(request.num_prompt_tokens, _num_generated(final)),
        })

    async def _chunks(self, request: AsyncRequest, chat: bool, rid: str, created: int,
                      include_usage: bool) -> AsyncIterator[str]:
        """Server-sent events: text deltas, then a chunk with the finish reason and usage, then ``[DONE]``."""
        head = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
                "model": self.model_name}

        def chunk(text: str, finish: str | None = None, **extra: Any) -> str:
            if chat:
                choice: dict[str, Any] = {"index": 0, "delta": {"content": text} if text else {}}
            else:
                choice = {"index": 0, "text": text}
            choice.update(finish_reason=finish, logprobs=None)
            return _sse({**head, "choices": [choice], **extra})

        if chat:
            yield _sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                             "finish_reason": None, "logprobs": None}]})
        async for out in self._observe(request):
            if out.delta_text:
                yield chunk(out.delta_text)
            if not out.finished:
                continue
            if out.finish_reason == "error":
                yield _sse(APIError(500, out.error or "generation failed", "server_error").body())
                break
            usage = _usage(request.num_prompt_tokens, _num_generated(out))
            yield chunk("", out.finish_reason, usage=usage)
            if include_usage:
                yield _sse({**head, "choices": [], "usage": usage})
        yield _sse("[DONE]")


def create_app(engine: AsyncLLMEngine, model_name: str, rules: GuardRules | None = None,
               aliases: tuple[str, ...] = ("default",)) -> Starlette:
    """The ASGI app serving ``engine`` under the OpenAI API, behind a :class:`Guard` with ``rules``."""
    server = OpenAIServer(engine, model_name, aliases)

    async def health(_: Request) -> Response:
        if not engine.is_alive():
            return APIError(503, "The engine has stopped and answers no more requests; restart the server.",
                            "server_error", code="engine_stopped").response()
        return JSONResponse({"status": "ok"})

    async def metrics(_: Request) -> Response:
        return Response(server.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    async def models(_: Request) -> Response:
        return JSONResponse(server.list_models())

    async def chat(request: Request) -> Response:
        return await server.generate(parse_body(await request.body(), ChatCompletionRequest), request)

    async def completions(request: Request) -> Response:
        return await server.generate(parse_body(await request.body(), CompletionRequest), request)

    async def api_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, APIError)
        return exc.response()

    async def http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return APIError(exc.status_code, exc.detail, headers=exc.headers).response()

    async def client_gone(_: Request, exc: Exception) -> Response:
        return Response(status_code=400)  # the client hung up while sending; nobody reads this

    async def server_error(_: Request, exc: Exception) -> Response:
        # uvicorn logs the traceback after this answer is sent
        return APIError(500, "The server failed on this request; its log has the details.",
                        "server_error").response()

    app = Starlette(
        routes=[
            Route("/health", health),
            Route("/metrics", metrics),
            Route("/v1/models", models),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
        ],
        exception_handlers={APIError: api_error, HTTPException: http_error, ClientDisconnect: client_gone,
                            Exception: server_error},
    )
    app.add_middleware(Guard, rules=rules or GuardRules())
    app.state.server = server
    return app


class ServerThread:
    """Runs the server on a background thread over an engine someone else steps (the app's bridge).

    ``start()`` binds at once (``OSError`` when the port is taken) and returns; ``stop()`` waits for uvicorn.
    ``rules``, when given, replaces the default ones (``api_key``, and the ``Host`` check when ``host`` is
    loopback).
    """

    def __init__(self, engine: Any, model_name: str, host: str = "127.0.0.1", port: int = 8000,
                 api_key: str | None = None, *, rules: GuardRules | None = None,
                 limits: ConnectionLimits | None = None) -> None:
        self.host, self.port = host, port
        rules = rules or GuardRules(api_key=api_key or None, check_host=is_loopback(host))
        app = create_app(AsyncLLMEngine(engine), model_name, rules)
        self._server = uvicorn_server(app, limits)
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


def uvicorn_server(app: Starlette, limits: ConnectionLimits | None = None,
                   log_level: str = "warning") -> uvicorn.Server:
    """A ``uvicorn.Server`` for ``app`` with the connection limits and header deadline."""
    return uvicorn.Server(server_config(app, limits, log_level))
