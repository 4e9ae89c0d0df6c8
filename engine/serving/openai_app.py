"""An OpenAI-compatible HTTP server over the engine: ``python -m engine.serve --model default --port 8000``.

Endpoints: ``GET /v1/models``, ``POST /v1/chat/completions`` and ``POST /v1/completions`` (both streamed as
server-sent events when ``stream`` is true; logprobs, ``n``, structured output and tools as OpenAI has them),
Ollama's ``/api/*`` (:mod:`engine.serving.ollama_api`), the embeddings routes (:mod:`engine.serving.embeddings`,
with the embedding models served beside the chat model), ``GET /health`` (503 once the engine's loop has died) and
``GET /metrics`` (Prometheus text, vLLM-style names under ``hearth:``). Starlette + uvicorn over
:class:`~engine.serving.async_engine.AsyncLLMEngine`; requests batch with every other user of the same engine (the
app's chats when the app serves its loaded model).

The wire format lives in :mod:`engine.serving.protocol`, who may call and with what in
:mod:`engine.serving.guards`, sockets and connection limits in :mod:`engine.serving.transport`, and the command
line in :mod:`engine.serving.cli`. Every error is an OpenAI-style error object.

Long because chat and completions share one streamed and one non-streamed path here, with ``n``, logprobs and
tool calls; splitting them would scatter one request's way through the server over several modules.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.api import CapacityError, SamplingParams, StepOutput, TokenLogprob
from engine.serving import tools as tools_mod
from engine.serving.async_engine import AsyncLLMEngine, AsyncRequest
from engine.serving.choices import Choice, Plan
from engine.serving.embeddings import LocalEmbeddings, embedding_routes
from engine.serving.guards import Guard, GuardRules, is_loopback
from engine.serving.limits import check_sampling_limits
from engine.serving.metrics import METRICS_CONTENT_TYPE, ServerMetrics
from engine.serving.ollama_api import ollama_routes
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
#: The deadline of a request that sets no ``timeout_s``: it then ends with finish_reason "timeout", keeping its text.
DEFAULT_REQUEST_TIMEOUT_S = 600.0


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
                 priority: int = 0, request_timeout_s: float | None = DEFAULT_REQUEST_TIMEOUT_S,
                 sampling_defaults: Mapping[str, float] | None = None) -> None:
        self.engine = engine
        #: the model's own sampling settings, for the fields a request leaves out
        self.sampling_defaults = dict(sampling_defaults or {})
        self.model_name = model_name
        self.priority = priority
        self.request_timeout_s = request_timeout_s
        self._names = {model_name, *aliases}
        #: the names of the embedding models served beside (a chat request naming one gets a 400 saying so)
        self.embedding_names: frozenset[str] = frozenset()
        self._created = int(time.time())
        self.metrics = ServerMetrics(engine.metrics, model_name)
        self._token_texts: dict[int, str] = {}

    # -- helpers ---------------------------------------------------------------------------------------------------
    def _check_model(self, model: str | None) -> None:
        if model is not None and model not in self._names and model in self.embedding_names:
            raise APIError(400, f"'{model}' is an embedding model; use /v1/embeddings for it (this server chats "
                           f"with '{self.model_name}').", param="model", code="embedding_model")
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

    async def _submit(self, prompt: Any, params: SamplingParams, plan: Plan) -> list[AsyncRequest]:
        max_len = self.engine.engine.max_model_len
        param = "messages" if plan.chat else "prompt"
        self._check_length(prompt, max_len, param)
        try:
            return await self.engine.add_requests(prompt, params, self.priority, plan.template_tools)
        except CapacityError as exc:
            raise APIError(429, str(exc), type_="rate_limit_error", code="queue_full",
                           headers={"Retry-After": str(RETRY_AFTER_S)}) from exc
        except ValueError as exc:
            text = str(exc)
            code = "context_length_exceeded" if "context" in text else None
            if "json_schema" in text or "grammar" in text or "structured output" in text:
                param = "response_format"
            raise APIError(400, text, param=param, code=code) from exc

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

    async def _merged(self, requests: list[AsyncRequest]) -> AsyncIterator[tuple[int, StepOutput]]:
        """The outputs of ``n`` parallel requests as they come, each with its choice index."""
        queue: asyncio.Queue[tuple[int, StepOutput | None]] = asyncio.Queue()

        async def pump(index: int, request: AsyncRequest) -> None:
            try:
                async for out in self._observe(request):
                    queue.put_nowait((index, out))
            finally:
                queue.put_nowait((index, None))

        tasks = [asyncio.create_task(pump(i, r)) for i, r in enumerate(requests)]
        try:
            live = len(tasks)
            while live:
                index, out = await queue.get()
                if out is None:
                    live -= 1
                else:
                    yield index, out
        finally:
            for task in tasks:
                task.cancel()
            for request in requests:
                request.cancel()

    async def _collect(self, requests: list[AsyncRequest], http: Request) -> list[Choice]:
        """Run non-streamed requests to the end; a client that hangs up cancels them."""

        async def watch() -> None:
            while not await http.is_disconnected():
                await asyncio.sleep(_DISCONNECT_POLL_S)
            for request in requests:
                request.cancel()

        watcher = asyncio.create_task(watch())
        choices = [Choice() for _ in requests]
        try:
            async for index, out in self._merged(requests):
                choices[index].add(out)
        finally:
            watcher.cancel()
        for choice in choices:
            assert choice.final is not None and choice.final.finished
            if choice.final.finish_reason == "error":
                raise APIError(500, choice.final.error or "generation failed", type_="server_error")
            if choice.final.finish_reason == "timeout" and choice.final.error:
                raise APIError(503, choice.final.error, type_="server_error", code="timeout")
        return choices

    # -- logprobs --------------------------------------------------------------------------------------------------
    def _token(self, token_id: int) -> str:
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self.engine.engine.tokenizer.decode([token_id])
        return text

    def _chat_logprobs(self, logprobs: list[TokenLogprob]) -> dict[str, Any]:
        def entry(token_id: int, value: float) -> dict[str, Any]:
            text = self._token(token_id)
            return {"token": text, "logprob": value, "bytes": list(text.encode())}

        return {"content": [{**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
                            for lp in logprobs], "refusal": None}

    def _text_logprobs(self, logprobs: list[TokenLogprob], offset: int) -> dict[str, Any]:
        tokens = [self._token(lp.token_id) for lp in logprobs]
        offsets = []
        for text in tokens:
            offsets.append(offset)
            offset += len(text)
        return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in logprobs],
                "top_logprobs": [{self._token(t): v for t, v in lp.top} for lp in logprobs],
                "text_offset": offsets}

    def _logprobs(self, plan: Plan, logprobs: list[TokenLogprob] | None, offset: int = 0) -> Any:
        if not plan.logprobs or logprobs is None:
            return None
        return self._chat_logprobs(logprobs) if plan.chat else self._text_logprobs(logprobs, offset)

    # -- routes ----------------------------------------------------------------------------------------------------
    def list_models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": self._created,
                                            "owned_by": "hearth"}]}

    def _plan_chat(self, body: ChatCompletionRequest) -> tuple[Any, Plan, dict[str, Any]]:
        """The prompt, the plan and the extra sampling fields of a chat request (tools and response format)."""
        messages = body.engine_messages()
        tools, choice = body.tool_list(), body.choice()
        plan = Plan(chat=True, logprobs=bool(body.logprobs), choice=choice)
        extra: dict[str, Any] = {"logprobs": bool(body.logprobs), "top_logprobs": body.top_logprobs or 0}
        if choice == "none" or not tools:
            return [{"role": m["role"], "content": m["content"]} for m in tools_mod.plain_history(messages)], \
                plan, {**extra, **body.format_params()}
        plan.names = tools_mod.function_names(tools)
        if tools_mod.template_knows_tools(self.engine.engine.tokenizer):
            prompt: Any = [tools_mod.history_message(m) for m in messages]
            plan.template_tools = tools
        else:
            prompt = tools_mod.with_tool_instructions(tools_mod.plain_history(messages), tools)
        schema = tools_mod.choice_schema(tools, choice, body.parallel_tool_calls is not False)
        extra.update({"json_schema": schema} if schema is not None else body.format_params())
        return prompt, plan, extra

    async def generate(self, body: GenerationRequest, http: Request) -> Response:
        """Answer a chat or a completion request, streamed or whole."""
        self._check_model(body.model)
        if isinstance(body, ChatCompletionRequest):
            prompt, plan, extra = self._plan_chat(body)
            max_tokens = body.max_completion_tokens or body.max_tokens
        else:
            assert isinstance(body, CompletionRequest)
            prompt, max_tokens = body.engine_prompt(), body.max_tokens or 16
            plan = Plan(chat=False, logprobs=body.logprobs is not None)
            extra = {"logprobs": body.logprobs is not None, "top_logprobs": body.logprobs or 0}
            if body.echo:
                if body.logprobs is not None:
                    raise APIError(400, "echo with logprobs is not supported (no prompt logprobs).",
                                   param="echo", code="unsupported_parameter")
                plan.echo = prompt if isinstance(prompt, str) else self.engine.engine.tokenizer.decode(prompt)
        try:
            timeout_s = body.timeout_s or self.request_timeout_s
            params = body.sampling_params(max_tokens, self.engine.engine.max_model_len, self.sampling_defaults,
                                          timeout_s=timeout_s, **extra)
        except ValueError as exc:
            raise APIError(400, str(exc), param=str(exc).split(" ", 1)[0]) from exc
        check_sampling_limits(params)
        requests = await self._submit(prompt, params, plan)
        rid, created = f"{'chatcmpl' if plan.chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time())
        prompt_tokens = requests[0].num_prompt_tokens
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(self._chunks(requests, plan, rid, created, include_usage),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        choices = await self._collect(requests, http)
        out = [self._choice_body(plan, i, c) for i, c in enumerate(choices)]
        generated = sum(_num_generated(c.final) for c in choices if c.final is not None)
        return JSONResponse({
            "id": rid, "object": "chat.completion" if plan.chat else "text_completion", "created": created,
            "model": self.model_name, "choices": out, "usage": _usage(prompt_tokens, generated),
        })

    def _choice_body(self, plan: Plan, index: int, choice: Choice) -> dict[str, Any]:
        assert choice.final is not None
        text, finish = "".join(choice.parts), choice.final.finish_reason
        logprobs = self._logprobs(plan, choice.logprobs, len(plan.echo))
        if not plan.chat:
            return {"index": index, "text": plan.echo + text, "finish_reason": finish, "logprobs": logprobs}
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        content, calls = plan.calls(text)
        if calls:
            message.update(content=content or None, tool_calls=[c.as_openai() for c in calls])
            finish = "tool_calls"
        return {"index": index, "message": message, "finish_reason": finish, "logprobs": logprobs}

    async def _chunks(self, requests: list[AsyncRequest], plan: Plan, rid: str, created: int,
                      include_usage: bool) -> AsyncIterator[str]:
        """Server-sent events: text deltas, then a chunk with the finish reason and usage, then ``[DONE]``.

        With tools, text that may turn out to be a call is held back; at the end its calls go out as one
        ``tool_calls`` delta, or the held text as content."""
        chat = plan.chat
        head = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
                "model": self.model_name}

        def chunk(index: int, text: str, finish: str | None = None, logprobs: Any = None,
                  delta: dict[str, Any] | None = None, **extra: Any) -> str:
            if chat:
                choice: dict[str, Any] = {"index": index, "delta": delta or ({"content": text} if text else {})}
            else:
                choice = {"index": index, "text": text}
            choice.update(finish_reason=finish, logprobs=logprobs)
            return _sse({**head, "choices": [choice], **extra})

        n = len(requests)
        states = [Choice() for _ in requests]
        if chat:
            for i in range(n):
                yield _sse({**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                 "finish_reason": None, "logprobs": None}]})
        elif plan.echo:
            for i in range(n):
                yield chunk(i, plan.echo)
        offsets = [len(plan.echo)] * n
        generated = 0
        async for i, out in self._merged(requests):
            state = states[i]
            state.add(out)
            logprobs = self._logprobs(plan, out.logprobs, offsets[i])
            offsets[i] += len(out.delta_text)
            text = state.release(plan, out.finished)
            if text or logprobs is not None:
                yield chunk(i, text, logprobs=logprobs)
            if not out.finished:
                continue
            if out.finish_reason == "error":
                yield _sse(APIError(500, out.error or "generation failed", "server_error").body())
                break
            if out.finish_reason == "timeout" and out.error:
                yield _sse(APIError(503, out.error, "server_error", code="timeout").body())
                break
            finish = out.finish_reason
            calls = plan.calls("".join(state.parts))[1] if state.held else []
            if calls:
                yield chunk(i, "", delta={"tool_calls": [c.as_openai(k) for k, c in enumerate(calls)]})
                finish = "tool_calls"
            elif state.held:
                yield chunk(i, "".join(state.parts)[state.sent:])
            generated += _num_generated(out)
            usage = _usage(requests[0].num_prompt_tokens, _num_generated(out) if n == 1 else generated)
            yield chunk(i, "", finish, **({"usage": usage} if n == 1 else {}))
        else:
            if include_usage:
                yield _sse({**head, "choices": [], "usage": _usage(requests[0].num_prompt_tokens, generated)})
        yield _sse("[DONE]")


def error_handlers() -> dict[Any, Any]:
    """Starlette's exception handlers for both servers: every error answers as an OpenAI-style error object."""

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

    return {APIError: api_error, HTTPException: http_error, ClientDisconnect: client_gone, Exception: server_error}


def create_app(engine: AsyncLLMEngine, model_name: str, rules: GuardRules | None = None,
               aliases: tuple[str, ...] = ("default",), priority: int = 0,
               request_timeout_s: float | None = DEFAULT_REQUEST_TIMEOUT_S,
               sampling_defaults: Mapping[str, float] | None = None,
               embeddings: LocalEmbeddings | None = None) -> Starlette:
    """The ASGI app serving ``engine`` under the OpenAI API, behind a :class:`Guard` with ``rules``.

    ``request_timeout_s`` is the deadline of a request that names none (``timeout_s``); None: no deadline.
    ``embeddings`` are the embedding models served beside (default: WordLlama alone).
    """
    server = OpenAIServer(engine, model_name, aliases, priority, request_timeout_s, sampling_defaults)
    embeddings = embeddings if embeddings is not None else LocalEmbeddings()
    embeddings.chat_names = frozenset(server._names)
    server.embedding_names = embeddings.names

    async def health(_: Request) -> Response:
        if not engine.is_alive():
            return APIError(503, "The engine has stopped and answers no more requests; restart the server.",
                            "server_error", code="engine_stopped").response()
        return JSONResponse({"status": "ok"})

    async def metrics(_: Request) -> Response:
        return Response(server.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    async def models(_: Request) -> Response:
        listing = server.list_models()
        listing["data"] += [{"id": m.name, "object": "model", "created": server._created, "owned_by": "hearth"}
                            for m in embeddings.models]
        return JSONResponse(listing)

    async def chat(request: Request) -> Response:
        return await server.generate(parse_body(await request.body(), ChatCompletionRequest), request)

    async def completions(request: Request) -> Response:
        return await server.generate(parse_body(await request.body(), CompletionRequest), request)

    app = Starlette(
        routes=[
            Route("/health", health),
            Route("/metrics", metrics),
            Route("/v1/models", models),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            *ollama_routes(server, embeddings),
            *embedding_routes(embeddings),
        ],
        exception_handlers=error_handlers(),
    )
    app.add_middleware(Guard, rules=rules or GuardRules())
    app.state.server = server
    return app


class ServerThread:
    """Runs the server on a background thread over an engine someone else steps (the app's bridge).

    ``start()`` binds at once (``OSError`` when the port is taken) and returns; ``stop()`` waits for uvicorn.
    ``rules``, when given, replaces the default ones (``api_key``, and the ``Host`` check when ``host`` is
    loopback). ``priority`` is the scheduling priority of the server's requests: the app passes a value above its
    own chats' 0, so the adaptive concurrency controller keeps the user's chat ahead of API clients.
    """

    def __init__(self, engine: Any, model_name: str, host: str = "127.0.0.1", port: int = 8000,
                 api_key: str | None = None, *, rules: GuardRules | None = None,
                 limits: ConnectionLimits | None = None, priority: int = 0,
                 request_timeout_s: float | None = DEFAULT_REQUEST_TIMEOUT_S,
                 sampling_defaults: Mapping[str, float] | None = None) -> None:
        self.host, self.port = host, port
        rules = rules or GuardRules(api_key=api_key or None, check_host=is_loopback(host))
        app = create_app(AsyncLLMEngine(engine), model_name, rules, priority=priority,
                         request_timeout_s=request_timeout_s, sampling_defaults=sampling_defaults)
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
