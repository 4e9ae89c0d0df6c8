"""Embeddings over HTTP: OpenAI's ``POST /v1/embeddings`` and Ollama's ``POST /api/embed`` and ``/api/embeddings``.

They serve the document index's offline embedder, WordLlama's static embeddings (256 dimensions, from the
``wordllama`` wheel's own files), under the model name ``wordllama-l2-256``: the engine runs no transformer
embedding model yet. ``input`` is a string or a list of strings (Ollama's legacy ``/api/embeddings`` takes one
``prompt``); OpenAI's ``encoding_format`` may be ``float`` or ``base64`` (little-endian float32, what the ``openai``
SDK asks for by default). Bad input is a 400 that says what is wrong; another model's name is a 404.

The embedder is loaded on the first request and kept. ``engine.serving`` may import ``engine.docs.embedders``
alone (pyproject.toml's layers contract names this one exception).
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pydantic_core
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engine.docs.embedders import load_embedder

MODEL = "wordllama-l2-256"
ALIASES = frozenset({MODEL, "wordllama", f"{MODEL}:latest", "wordllama:latest"})
MAX_INPUTS = 2048
MAX_CHARS = 1_000_000


class BadInput(Exception):
    """A request the embeddings routes refuse: ``status`` and the reason in words."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def _body(request: Request) -> dict[str, Any]:
    try:
        body = pydantic_core.from_json(await request.body() or b"{}", allow_inf_nan=False)
    except ValueError as exc:
        raise BadInput(400, f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadInput(400, "the request body must be a JSON object")
    return body


def _texts(value: Any, field: str) -> list[str]:
    """``value`` as a list of strings: a string or a non-empty list of strings."""
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts:
        raise BadInput(400, f"'{field}' must be a string or a non-empty list of strings")
    if not all(isinstance(t, str) for t in texts):
        raise BadInput(400, f"'{field}' must hold strings only (token arrays are not accepted)")
    if len(texts) > MAX_INPUTS:
        raise BadInput(400, f"'{field}' holds {len(texts)} texts; at most {MAX_INPUTS} per request")
    if sum(len(t) for t in texts) > MAX_CHARS:
        raise BadInput(400, f"'{field}' is longer than {MAX_CHARS} characters in all")
    return texts


def _check_model(model: Any) -> str:
    if model is None:
        return MODEL
    if not isinstance(model, str):
        raise BadInput(400, "'model' must be a string")
    if model not in ALIASES:
        raise BadInput(404, f"no embedding model named {model!r}: this server embeds with {MODEL!r}")
    return MODEL


async def _embed(texts: list[str]) -> tuple[np.ndarray, int]:
    """The texts' vectors and their token count, off the event loop."""

    def run() -> tuple[np.ndarray, int]:
        embedder = load_embedder("wordllama")
        assert embedder is not None
        tokenizer = getattr(embedder, "tokenizer", None)
        tokens = (
            sum(len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False))
            if tokenizer is not None
            else sum(len(t.split()) for t in texts)
        )
        return embedder.embed(texts).astype(np.float32), tokens

    try:
        return await run_in_threadpool(run)
    except (OSError, ValueError, ImportError) as exc:
        raise BadInput(503, f"the embedding model cannot load: {exc}") from exc


def _encode(vector: np.ndarray, encoding: str) -> Any:
    return (
        base64.b64encode(vector.astype("<f4").tobytes()).decode() if encoding == "base64" else vector.tolist()
    )


async def openai_embeddings(request: Request) -> Response:
    try:
        body = await _body(request)
        model = _check_model(body.get("model"))
        texts = _texts(body.get("input"), "input")
        encoding = body.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise BadInput(400, "'encoding_format' must be 'float' or 'base64'")
        if body.get("dimensions") not in (None, 256):
            raise BadInput(400, f"'dimensions' must be 256 for {MODEL!r} (its vectors cannot be shortened)")
        vectors, tokens = await _embed(texts)
    except BadInput as exc:
        kind = "not_found_error" if exc.status == 404 else "invalid_request_error"
        return JSONResponse({"error": {"message": str(exc), "type": kind}}, status_code=exc.status)
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": _encode(v, encoding),
        }
        for i, v in enumerate(vectors)
    ]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return JSONResponse({"object": "list", "data": data, "model": model, "usage": usage})


async def ollama_embed(request: Request) -> Response:
    try:
        body = await _body(request)
        model = _check_model(body.get("model"))
        vectors, tokens = await _embed(_texts(body.get("input"), "input"))
    except BadInput as exc:
        return JSONResponse({"error": str(exc)}, status_code=exc.status)
    return JSONResponse({"model": model, "embeddings": vectors.tolist(), "prompt_eval_count": tokens})


async def ollama_embeddings(request: Request) -> Response:
    """Ollama's legacy route: one ``prompt``, one ``embedding``."""
    try:
        body = await _body(request)
        _check_model(body.get("model"))
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise BadInput(400, "'prompt' must be a string")
        vectors, _ = await _embed([prompt])
    except BadInput as exc:
        return JSONResponse({"error": str(exc)}, status_code=exc.status)
    return JSONResponse({"embedding": vectors[0].tolist()})


def embedding_routes() -> list[Route]:
    return [
        Route("/v1/embeddings", openai_embeddings, methods=["POST"]),
        Route("/api/embed", ollama_embed, methods=["POST"]),
        Route("/api/embeddings", ollama_embeddings, methods=["POST"]),
    ]
