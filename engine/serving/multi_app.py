"""The server over a :class:`~engine.serving.pool.ModelPool`: every model on disk by name, loaded when asked for.

The routes are the single-model server's (:mod:`engine.serving.openai_app`, :mod:`engine.serving.ollama_api`); each
generation request takes a lease on the model its body names, which loads it if needed, and gives it back when the
reply has been sent (for a stream, when the stream ends). ``/v1/models`` and Ollama's ``/api/tags`` list every
model discovery finds, ``/api/ps`` the loaded ones with their memory and when they will be unloaded.

Embedding models found by discovery are served by the embeddings routes (:mod:`engine.serving.embeddings`, over
:class:`PoolEmbeddings`): the pool loads them by name like the chat models, and ``wordllama-l2-256`` (built in) is
always there. They are listed with the chat models, with their type as Ollama's family, and ``/api/show`` gives
them the ``embedding`` capability. A chat request naming one, or an embeddings request naming a chat model, is a
400 that says so.

Ollama's ``keep_alive`` works as in Ollama: it sets how long the model stays after this request, and a request with
no messages (or no prompt) only loads the model, or unloads it when ``keep_alive`` is 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.docs.embedders import Embedder
from engine.serving.embeddings import (
    ALIASES,
    MODEL,
    BadInput,
    EmbeddingModelInfo,
    LocalEmbeddings,
    embedding_routes,
)
from engine.serving.guards import Guard, GuardRules
from engine.serving.ollama_api import OLLAMA_VERSION, _json
from engine.serving.openai_app import error_handlers
from engine.serving.pool import Entry, LoadedModel, ModelPool, parse_keep_alive
from engine.serving.protocol import APIError, ChatCompletionRequest, CompletionRequest, parse_body

T = TypeVar("T")


def _iso(ts: datetime) -> str:
    return ts.isoformat().replace("+00:00", "Z")


class _Leased:
    """A streamed answer that gives its model's lease back when it has been sent, or when sending it ended any
    other way (the client gone before the first byte, a cancelled task): Starlette runs the returned ASGI app, and
    its ``finally`` always runs, where a generator never started would not run its own."""

    def __init__(self, response: StreamingResponse, release: Callable[[], None]) -> None:
        self.response, self._release = response, release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await self.response(scope, receive, send)
        finally:
            self._release()


def _keep_alive(body: dict[str, Any]) -> object:
    """Ollama's ``keep_alive`` as the pool takes it (seconds or None; ``...``: the server's); a 400 when bad."""
    if "keep_alive" not in body or body["keep_alive"] is None:
        return ...
    try:
        return parse_keep_alive(body["keep_alive"])
    except ValueError as exc:
        raise APIError(400, str(exc), param="keep_alive") from exc


class PoolEmbeddings:
    """The embeddings routes' models on the multi-model server: the pool's embedding models, and WordLlama."""

    def __init__(self, pool: ModelPool) -> None:
        self.pool = pool
        self.builtin = LocalEmbeddings()

    def names(self) -> list[str]:
        return [*(e.name for e in self.pool.entries() if e.kind == "embedding"), MODEL]

    async def run(self, name: str | None, work: Callable[[str, Embedder], T],
                  keep_alive: object = None) -> tuple[str, T]:
        if not name or name in ALIASES:
            return await self.builtin.run(None, work)
        ttl = _keep_alive({"keep_alive": keep_alive})
        try:
            model = await self.pool.acquire(name, kind="embedding")
        except APIError as exc:
            if exc.status == 404:
                raise BadInput(404, f"no embedding model named {name!r:.200}; embedding models here: "
                               f"{', '.join(self.names())}", param="model") from exc
            raise
        try:
            result = await run_in_threadpool(work, model.name, model.llm)
        finally:
            self.pool.release(model, ttl)
        return model.name, result


def embedding_info(entry: Entry, embedder: Embedder | None = None) -> EmbeddingModelInfo:
    """An embedding entry as the lists show it (its parameters when it is loaded)."""
    return EmbeddingModelInfo(entry.name, entry.family, entry.size_bytes,
                              int(getattr(embedder, "num_parameters", 0) or 0))


class MultiModelRoutes:
    """The routes' logic over a pool."""

    def __init__(self, pool: ModelPool) -> None:
        self.pool = pool
        self._created = int(time.time())
        self._modified = _iso(datetime.now(UTC))

    # -- leases --------------------------------------------------------------------------------------------------
    async def _answer(self, name: str | None, keep_alive: object, call: Any) -> Response:
        """Run ``call(model)`` on a lease of ``name``'s model; a streamed answer holds the lease until it ends."""
        if name in ALIASES:
            raise APIError(400, f"'{name}' is an embedding model; use /v1/embeddings (or Ollama's /api/embed) for it.",
                           param="model", code="embedding_model")
        model = await self.pool.acquire(name)
        try:
            response = await call(model)
        except BaseException:
            self.pool.release(model, keep_alive)
            raise
        if not isinstance(response, StreamingResponse):
            self.pool.release(model, keep_alive)
            return response
        return _Leased(response, lambda: self.pool.release(model, keep_alive))  # type: ignore[return-value]

    # -- OpenAI --------------------------------------------------------------------------------------------------
    async def models(self, _: Request) -> Response:
        data = [{"id": e.name, "object": "model", "created": self._created, "owned_by": "hearth"}
                for e in self.pool.entries(rescan=True)]
        return JSONResponse({"object": "list", "data": data})

    async def chat(self, request: Request) -> Response:
        body = parse_body(await request.body(), ChatCompletionRequest)
        return await self._answer(body.model, ..., lambda m: m.chat[0].generate(body, request))

    async def completions(self, request: Request) -> Response:
        body = parse_body(await request.body(), CompletionRequest)
        return await self._answer(body.model, ..., lambda m: m.chat[0].generate(body, request))

    # -- Ollama --------------------------------------------------------------------------------------------------
    async def version(self, _: Request) -> Response:
        return JSONResponse({"version": OLLAMA_VERSION})

    async def tags(self, _: Request) -> Response:
        models = [{"name": e.name, "model": e.name, "modified_at": self._modified, "size": e.size_bytes,
                   "digest": "", "details": _details(e)} for e in self.pool.entries(rescan=True)]
        return JSONResponse({"models": models})

    async def ps(self, _: Request) -> Response:
        now_mono, now = time.monotonic(), datetime.now(UTC)
        out = []
        for m in self.pool.loaded():
            # a model in use stays its keep-alive after its requests end; None: for ever
            remaining = m.keep_alive_s if m.active or m.expires_at is None else max(m.expires_at - now_mono, 0.0)
            expires = now + (timedelta(days=36500) if remaining is None else timedelta(seconds=remaining))
            out.append({"name": m.name, "model": m.name, "size": m.memory_bytes, "digest": "",
                        "details": _details(m.entry, m.llm),
                        "expires_at": _iso(expires), "size_vram": 0, "active_requests": m.active})
        return JSONResponse({"models": out})

    async def show(self, request: Request) -> Response:
        body = await _json(request)
        name = body.get("model") or body.get("name")
        if name not in ALIASES:
            entry = self.pool.resolve(name)
            if entry.kind == "embedding":  # shown from its files, as Ollama does, without loading it
                return JSONResponse(embedding_info(entry).ollama_show(self._modified))
        return await self._answer(name, ..., lambda m: m.chat[1].show(request))

    async def ollama_chat(self, request: Request) -> Response:
        return await self._ollama(request, "messages", lambda m: m.chat[1].chat(request))

    async def ollama_generate(self, request: Request) -> Response:
        return await self._ollama(request, "prompt", lambda m: m.chat[1].generate(request))

    async def _ollama(self, request: Request, field: str, call: Any) -> Response:
        body = await _json(request)  # Starlette keeps the body: the model's route reads it again
        name, keep_alive = body.get("model"), _keep_alive(body)
        if not body.get(field) and keep_alive == 0:
            await self.pool.unload(name)
            reply: dict[str, Any] = {"model": self.pool.resolve(name).name, "created_at": _iso(datetime.now(UTC)),
                                     "done": True, "done_reason": "unload"}
            reply.update({"message": {"role": "assistant", "content": ""}} if field == "messages" else
                         {"response": ""})
            return JSONResponse(reply)
        return await self._answer(name, keep_alive, call)

    # -- service -------------------------------------------------------------------------------------------------
    async def health(self, _: Request) -> Response:
        dead = [m.name for m in self.pool.loaded() if m.server is not None and not m.server.engine.is_alive()]
        if dead:
            return APIError(503, f"The engine of {', '.join(dead)} has stopped; restart the server.",
                            "server_error", code="engine_stopped").response()
        return JSONResponse({"status": "ok", "loaded": [m.name for m in self.pool.loaded()]})

    async def metrics(self, _: Request) -> Response:
        return Response(render_metrics(self.pool.loaded()), media_type=CONTENT_TYPE_LATEST)


def render_metrics(models: list[LoadedModel]) -> bytes:
    """The loaded models' metrics as one Prometheus text page: a family that several models report appears once,
    with a sample per model (the exposition format allows each family's header once)."""
    from prometheus_client import CollectorRegistry, generate_latest

    families: dict[str, Any] = {}
    for model in models:
        if model.server is None:  # an embedding model: no generation metrics
            continue
        for family in model.server.metrics.registry.collect():
            kept = families.get(family.name)
            if kept is None:
                families[family.name] = family
            else:
                kept.samples.extend(family.samples)

    class _Merged:
        def collect(self) -> Any:
            return iter(families.values())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged())
    return bytes(generate_latest(registry))


def _details(entry: Entry, loaded: Any = None) -> dict[str, Any]:
    """Ollama's ``details`` of an entry: its format and type (an embedding model's in full)."""
    if entry.kind == "embedding":
        return embedding_info(entry, loaded).ollama_details()
    family = entry.family
    return {"format": "gguf" if entry.path.endswith(".gguf") else "safetensors", "family": family,
            "families": [family] if family else []}


def create_multi_app(pool: ModelPool, rules: GuardRules | None = None) -> Starlette:
    """The ASGI app serving every model of ``pool`` under the OpenAI and Ollama APIs, behind a :class:`Guard`."""
    routes = MultiModelRoutes(pool)

    app = Starlette(
        routes=[
            Route("/health", routes.health),
            Route("/metrics", routes.metrics),
            Route("/v1/models", routes.models),
            Route("/v1/chat/completions", routes.chat, methods=["POST"]),
            Route("/v1/completions", routes.completions, methods=["POST"]),
            Route("/api/version", routes.version),
            Route("/api/tags", routes.tags),
            Route("/api/ps", routes.ps),
            Route("/api/show", routes.show, methods=["POST"]),
            Route("/api/chat", routes.ollama_chat, methods=["POST"]),
            Route("/api/generate", routes.ollama_generate, methods=["POST"]),
            *embedding_routes(PoolEmbeddings(pool)),
        ],
        exception_handlers=error_handlers(),
    )
    app.add_middleware(Guard, rules=rules or GuardRules())
    app.state.pool = pool
    return app
