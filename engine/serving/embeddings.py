"""Embeddings over HTTP: OpenAI's ``POST /v1/embeddings`` and Ollama's ``POST /api/embed`` and ``/api/embeddings``.

The routes take their embedder by the request's ``model`` from an :class:`EmbeddingSource`:

* the single-model server's :class:`LocalEmbeddings`: the embedding model folders given with
  ``--embedding-model`` (loaded at start, beside the chat model), and WordLlama's static embeddings (the document
  index's offline embedder, 256 dimensions) under ``wordllama-l2-256``, loaded on first use;
* the multi-model server's pool (:class:`engine.serving.multi_app.PoolEmbeddings`): every embedding model discovery
  finds, loaded when a request names it and unloaded like the chat models.

A request that names no model gets the first ``--embedding-model``, else WordLlama. The vectors are the document
index's (``engine.docs.embedders``: the model's document prompt first, L2-normalised), so a client that embeds
through the server searches the same space as the index. ``input`` is a string or a list of strings (Ollama's legacy
``/api/embeddings`` takes one ``prompt``); OpenAI's ``encoding_format`` may be ``float`` or ``base64``
(little-endian float32, what the ``openai`` SDK asks for by default); ``dimensions`` may only repeat the model's
own. Bad input is a 400 that says what is wrong; an unknown model is a 404 naming the embedding models there are,
and a chat model a 400 that says so. OpenAI's route answers errors in OpenAI's shape, Ollama's as
``{"error": "..."}``.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import pydantic_core
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engine.docs.embedders import Embedder, load_embedder
from engine.serving.protocol import APIError

MODEL = "wordllama-l2-256"
ALIASES = frozenset({MODEL, "wordllama", f"{MODEL}:latest", "wordllama:latest"})
MAX_INPUTS = 2048
MAX_CHARS = 1_000_000
T = TypeVar("T")


class BadInput(APIError):
    """A request the embeddings routes refuse: ``status`` and the reason in words."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        kind = "not_found_error" if status == 404 else "server_error" if status >= 500 else "invalid_request_error"
        super().__init__(status, message, kind, param=param, code="model_not_found" if status == 404 else None)


@dataclass(frozen=True, slots=True)
class EmbeddingModelInfo:
    """An embedding model as the model lists show it: its name, type (``bert``, ``qwen3``...), files' size and
    parameters."""

    name: str
    family: str
    size_bytes: int = 0
    num_parameters: int = 0

    def ollama_details(self) -> dict[str, Any]:
        """Ollama's ``details`` of the model (its fields, no others)."""
        size = _parameter_size(self.num_parameters)
        return {"parent_model": "", "format": "safetensors", "family": self.family,
                "families": [self.family] if self.family else [], "parameter_size": size,
                "quantization_level": "F32"}

    def ollama_show(self, modified_at: str) -> dict[str, Any]:
        """Ollama's ``/api/show`` answer: no template, and ``embedding`` as its one capability, as Ollama has it."""
        return {"modelfile": "", "parameters": "", "template": "", "details": self.ollama_details(),
                "model_info": {}, "capabilities": ["embedding"], "modified_at": modified_at}


def _parameter_size(count: int) -> str:
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if count >= scale:
            return f"{count / scale:.1f}{suffix}"
    return str(count) if count else ""


class EmbeddingSource(Protocol):
    """Where the routes get an embedder: ``run`` resolves the request's model name, runs ``work(name, embedder)``
    on a worker thread and returns the model's served name with the result. ``keep_alive`` is Ollama's field as
    the request sent it (a pool uses it; others ignore it)."""

    async def run(self, name: str | None, work: Callable[[str, Embedder], T],
                  keep_alive: object = None) -> tuple[str, T]: ...


def served_name(folder: Path) -> str:
    """The name a model folder is served under: its folder name, or ``owner/name`` for a Hugging Face cache
    snapshot (whose folder is a commit hash); a GGUF file's name without ``.gguf``."""
    folder = Path(folder)
    if folder.suffix.lower() == ".gguf" and folder.is_file():
        return folder.stem
    repo = folder.parent.parent.name if folder.parent.name == "snapshots" else ""
    if repo.startswith("models--"):
        return repo.removeprefix("models--").replace("--", "/")
    return folder.name


def folder_size(folder: Path) -> int:
    """The bytes of the files in ``folder`` and its subfolders (of the file, for a GGUF file)."""
    if Path(folder).is_file():
        return Path(folder).stat().st_size
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


class LocalEmbeddings:
    """The single-model server's embedding models: model folders loaded now, and WordLlama on first use.

    Args:
        folders: embedding model folders or GGUF files (``--embedding-model``), each served under
            :func:`served_name`, with ``NAME:latest`` and the path as given as other names.

    Raises:
        ValueError: a folder that holds no embedding model Hearth runs, or two with the same name (in words).
        FileNotFoundError: a folder that does not exist.
    """

    def __init__(self, folders: Sequence[Path] = ()) -> None:
        self._models: dict[str, Embedder] = {}
        self._infos: list[EmbeddingModelInfo] = []
        self._names: dict[str, str] = {alias: MODEL for alias in ALIASES}
        #: the names of the chat model served beside (a request for one gets a 400 that says what it is)
        self.chat_names: frozenset[str] = frozenset()
        for folder in folders:
            path = Path(folder).expanduser()
            if not path.exists():
                raise FileNotFoundError(f"no embedding model at {folder}")
            embedder = load_embedder(str(path.resolve()))
            assert embedder is not None
            name = served_name(path.resolve())
            if name in self._names:
                raise ValueError(f"two embedding models are named {name!r}; give each folder a name of its own")
            self._models[name] = embedder
            spec = getattr(embedder, "spec", None)
            self._infos.append(EmbeddingModelInfo(name, str(getattr(spec, "model_type", "")), folder_size(path),
                                                  int(getattr(embedder, "num_parameters", 0))))
            for alias in (name, f"{name}:latest", str(folder)):
                self._names.setdefault(alias, name)

    @property
    def models(self) -> list[EmbeddingModelInfo]:
        """The model folders served (WordLlama, built in, is not listed)."""
        return list(self._infos)

    @property
    def names(self) -> frozenset[str]:
        """Every name a request may give, aliases included."""
        return frozenset(self._names)

    def resolve(self, name: str | None) -> str:
        """The served name ``name`` means (None or empty: the first model folder, else WordLlama).

        Raises:
            BadInput: 400 for the chat model's name, 404 for a name no embedding model has (both list them).
        """
        if name is None or name == "":
            return self._infos[0].name if self._infos else MODEL
        if not isinstance(name, str):
            raise BadInput(400, "'model' must be a string", param="model")
        served = self._names.get(name)
        if served is not None:
            return served
        known = ", ".join([*(i.name for i in self._infos), MODEL])
        if name in self.chat_names or name.removesuffix(":latest") in self.chat_names:
            raise BadInput(400, f"'{name:.200}' is a chat model, not an embedding model; this server embeds with: "
                           f"{known}", param="model")
        raise BadInput(404, f"no embedding model named {name!r:.200}: this server embeds with: {known}",
                       param="model")

    async def run(self, name: str | None, work: Callable[[str, Embedder], T],
                  keep_alive: object = None) -> tuple[str, T]:
        served = self.resolve(name)
        model = self._models.get(served)

        def call() -> T:
            return work(served, model if model is not None else wordllama())

        return served, await run_in_threadpool(call)


def wordllama() -> Embedder:
    """WordLlama's embedder (kept once loaded); a 503 in words when its files are not installed."""
    try:
        embedder = load_embedder("wordllama")
    except (OSError, ValueError, ImportError) as exc:
        raise BadInput(503, f"the embedding model cannot load: {exc}") from exc
    assert embedder is not None
    return embedder


def vectors_and_tokens(embedder: Embedder, texts: list[str]) -> tuple[np.ndarray, int]:
    """The texts' vectors (float32, as the document index has them) and the tokens they were made from."""
    ids: Callable[[list[str]], list[list[int]]] | None = getattr(embedder, "token_ids", None)
    if ids is not None:
        tokens = sum(len(x) for x in ids(texts))
    else:
        tokenizer = getattr(embedder, "tokenizer", None)
        tokens = (
            sum(len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False))
            if tokenizer is not None
            else sum(len(t.split()) for t in texts)
        )
    return embedder.embed(texts).astype(np.float32), tokens


async def _body(request: Request) -> dict[str, Any]:
    try:
        body = pydantic_core.from_json(await request.body() or b"{}", allow_inf_nan=False)
    except ValueError as exc:
        raise BadInput(400, f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadInput(400, "the request body must be a JSON object")
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise BadInput(400, "'model' must be a string", param="model")
    return body


def _texts(value: Any, field: str) -> list[str]:
    """``value`` as a list of strings: a string or a non-empty list of strings."""
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts:
        raise BadInput(400, f"'{field}' must be a string or a non-empty list of strings", param=field)
    if not all(isinstance(t, str) for t in texts):
        raise BadInput(400, f"'{field}' must hold strings only (token arrays are not accepted)", param=field)
    if len(texts) > MAX_INPUTS:
        raise BadInput(400, f"'{field}' holds {len(texts)} texts; at most {MAX_INPUTS} per request", param=field)
    if sum(len(t) for t in texts) > MAX_CHARS:
        raise BadInput(400, f"'{field}' is longer than {MAX_CHARS} characters in all", param=field)
    return texts


def _encode(vector: np.ndarray, encoding: str) -> Any:
    return (
        base64.b64encode(vector.astype("<f4").tobytes()).decode() if encoding == "base64" else vector.tolist()
    )


def _ollama_error(exc: APIError) -> Response:
    return JSONResponse({"error": exc.message}, status_code=exc.status, headers=exc.headers or None)


class EmbeddingRoutes:
    """The three routes over one :class:`EmbeddingSource`."""

    def __init__(self, source: EmbeddingSource) -> None:
        self.source = source

    async def openai_embeddings(self, request: Request) -> Response:
        try:
            body = await _body(request)
            texts = _texts(body.get("input"), "input")
            encoding = body.get("encoding_format", "float")
            if encoding not in ("float", "base64"):
                raise BadInput(400, "'encoding_format' must be 'float' or 'base64'", param="encoding_format")
            dimensions = body.get("dimensions")

            def work(name: str, embedder: Embedder) -> tuple[np.ndarray, int]:
                if dimensions not in (None, embedder.dim):
                    raise BadInput(400, f"'dimensions' must be {embedder.dim} for {name!r} (its vectors cannot be "
                                   "shortened)", param="dimensions")
                return vectors_and_tokens(embedder, texts)

            model, (vectors, tokens) = await self.source.run(body.get("model"), work)
        except APIError as exc:
            return exc.response()
        data = [{"object": "embedding", "index": i, "embedding": _encode(v, encoding)} for i, v in enumerate(vectors)]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return JSONResponse({"object": "list", "data": data, "model": model, "usage": usage})

    async def ollama_embed(self, request: Request) -> Response:
        try:
            body = await _body(request)
            texts = _texts(body.get("input"), "input")
            model, (vectors, tokens) = await self.source.run(
                body.get("model"), lambda _, e: vectors_and_tokens(e, texts), body.get("keep_alive"))
        except APIError as exc:
            return _ollama_error(exc)
        return JSONResponse({"model": model, "embeddings": vectors.tolist(), "prompt_eval_count": tokens})

    async def ollama_embeddings(self, request: Request) -> Response:
        """Ollama's legacy route: one ``prompt``, one ``embedding``."""
        try:
            body = await _body(request)
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise BadInput(400, "'prompt' must be a string", param="prompt")
            _, (vectors, _) = await self.source.run(
                body.get("model"), lambda _, e: vectors_and_tokens(e, [prompt]), body.get("keep_alive"))
        except APIError as exc:
            return _ollama_error(exc)
        return JSONResponse({"embedding": vectors[0].tolist()})


def embedding_routes(source: EmbeddingSource | None = None) -> list[Route]:
    """The routes over ``source`` (default: WordLlama alone)."""
    routes = EmbeddingRoutes(source if source is not None else LocalEmbeddings())
    return [
        Route("/v1/embeddings", routes.openai_embeddings, methods=["POST"]),
        Route("/api/embed", routes.ollama_embed, methods=["POST"]),
        Route("/api/embeddings", routes.ollama_embeddings, methods=["POST"]),
    ]
