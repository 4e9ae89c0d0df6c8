"""Ollama's native API on the OpenAI server's port, so tools written for Ollama work unchanged.

``GET /api/version``, ``GET /api/tags``, ``POST /api/show``, ``POST /api/chat`` and ``POST /api/generate``
(streamed as NDJSON unless ``"stream": false``), plus ``GET /api/ps``. Ollama's ``options`` map onto
``SamplingParams`` (``num_predict``, ``temperature``, ``top_k``, ``top_p``, ``min_p``, ``repeat_penalty``,
``repeat_last_n``, ``presence_penalty``, ``frequency_penalty``, ``seed``, ``stop``); ``format`` is ``"json"`` or a JSON schema;
``tools`` in a chat are rendered and parsed as on the OpenAI side. Options that only tune Ollama's own runtime
(``num_ctx``, ``num_gpu``, ``num_thread``...) are accepted and ignored. Errors are ``{"error": "..."}``.
The embedding models served beside the chat model are listed by ``/api/tags`` and ``/api/ps`` and shown by
``/api/show`` (capability ``embedding``); their routes are :mod:`engine.serving.embeddings`'.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pydantic_core
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.api import CapacityError, SamplingParams, StepOutput
from engine.serving import tools as tools_mod
from engine.serving.limits import check_sampling_limits
from engine.serving.protocol import APIError

#: The Ollama API version reported; clients check it only for display.
OLLAMA_VERSION = "0.6.3"
_SAMPLING_OPTIONS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
                     "repeat_penalty": "repetition_penalty", "repeat_last_n": "repeat_last_n",
                     "presence_penalty": "presence_penalty",
                     "frequency_penalty": "frequency_penalty", "seed": "seed", "stop": "stop"}
_NUMBER = (int, float)
#: The types of the body fields Hearth reads or accepts; a field of another type is a 400 naming it.
_BODY_TYPES: dict[str, tuple[type, ...]] = {
    "model": (str,), "name": (str,), "prompt": (str,), "system": (str,), "template": (str,), "suffix": (str,),
    "stream": (bool,), "raw": (bool,), "think": (bool, str), "keep_alive": (str, int, float),
    "format": (str, dict), "options": (dict,), "messages": (list,), "tools": (list,), "images": (list,),
    "context": (list,), "verbose": (bool,),
}
_MESSAGE_TYPES: dict[str, tuple[type, ...]] = {
    "role": (str,), "content": (str,), "images": (list,), "tool_calls": (list,), "thinking": (str,),
    "tool_name": (str,),
}
#: Options by type; the integers also take no booleans. Unknown options are ignored, as Ollama does.
_INT_OPTIONS = ("top_k", "seed", "num_predict", "num_ctx", "repeat_last_n", "num_keep", "num_batch", "num_gpu",
                "num_thread", "mirostat", "main_gpu")
_FLOAT_OPTIONS = ("temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty",
                  "typical_p", "tfs_z", "mirostat_tau", "mirostat_eta")
_BOOL_OPTIONS = ("penalize_newline", "numa", "use_mmap", "use_mlock", "low_vram", "f16_kv", "vocab_only")


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


_TYPE_NAMES = {str: "a string", bool: "true or false", int: "an integer", float: "a number", dict: "an object",
               list: "a list", type(None): "null"}


def _type_name(value: Any) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _check_field(where: str, value: Any, allowed: tuple[type, ...]) -> None:
    """400 unless ``value`` is one of ``allowed`` (or null); a boolean is never taken for a number."""
    if value is None:
        return
    ok = isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed)
    if not ok:
        wanted = " or ".join(_TYPE_NAMES[t] for t in allowed)
        raise APIError(400, f"{where} must be {wanted}, not {_type_name(value)}", param=where)


def check_body_types(body: dict[str, Any]) -> None:
    """Refuse an Ollama body whose fields, messages or options have the wrong JSON types, in words."""
    for key, allowed in _BODY_TYPES.items():
        _check_field(key, body.get(key), allowed)
    for i, message in enumerate(body.get("messages") or []):
        if not isinstance(message, dict):
            raise APIError(400, f"messages[{i}] must be an object with role and content, not "
                           f"{_type_name(message)}", param="messages")
        for key, allowed in _MESSAGE_TYPES.items():
            _check_field(f"messages[{i}].{key}", message.get(key), allowed)
    for i, tool in enumerate(body.get("tools") or []):
        _check_field(f"tools[{i}]", tool, (dict,))
    options = body.get("options") or {}
    for key in _INT_OPTIONS:
        _check_field(f"options.{key}", options.get(key), (int,))
    for key in _FLOAT_OPTIONS:
        _check_field(f"options.{key}", options.get(key), _NUMBER)
    for key in _BOOL_OPTIONS:
        _check_field(f"options.{key}", options.get(key), (bool,))
    stop = options.get("stop")
    if stop is not None and not (isinstance(stop, str) or (isinstance(stop, list)
                                                           and all(isinstance(s, str) for s in stop))):
        raise APIError(400, f"options.stop must be a string or a list of strings, not {_type_name(stop)}",
                       param="options.stop")


class OllamaAPI:
    """The routes over an :class:`~engine.serving.openai_app.OpenAIServer` (its engine, name and metrics)."""

    def __init__(self, server: Any, embeddings: Any = None) -> None:
        self.server = server
        #: the embedding models served beside (``engine.serving.embeddings.LocalEmbeddings``), or None
        self.embeddings = embeddings
        self._modified = _now()

    def _embedding_models(self) -> list[Any]:
        return list(self.embeddings.models) if self.embeddings is not None else []

    def _embedding_model(self, name: Any) -> Any:
        """The embedding model ``name`` means (by any of its names), or None."""
        if (self.embeddings is None or not isinstance(name, str) or name in self.server._names
                or name not in self.embeddings.names):
            return None
        served = self.embeddings.resolve(name)
        return next((m for m in self._embedding_models() if m.name == served), None)

    @property
    def _engine(self) -> Any:
        return self.server.engine.engine

    def _details(self) -> dict[str, Any]:
        cfg = getattr(self._engine.runner, "config", None)
        family = str(getattr(cfg, "model_type", "") or "")
        return {"parent_model": "", "format": "safetensors", "family": family, "families": [family],
                "parameter_size": "", "quantization_level": ""}

    def _check_model(self, name: Any) -> None:
        if (name is not None and name not in self.server._names and self.embeddings is not None
                and name in self.embeddings.names):
            raise APIError(400, f"'{name}' is an embedding model; use /api/embed for it (this server chats with "
                           f"'{self.server.model_name}')")
        if name is not None and name not in self.server._names and name.split(":")[0] not in self.server._names:
            raise APIError(404, f"model '{name}' not found; this server serves '{self.server.model_name}'")

    # -- routes ------------------------------------------------------------------------------------------------
    async def version(self, _: Request) -> Response:
        return JSONResponse({"version": OLLAMA_VERSION})

    async def tags(self, _: Request) -> Response:
        name = self.server.model_name
        embedders = [{"name": m.name, "model": m.name, "modified_at": self._modified, "size": m.size_bytes,
                      "digest": "", "details": m.ollama_details()} for m in self._embedding_models()]
        return JSONResponse({"models": [{"name": name, "model": name, "modified_at": self._modified, "size": 0,
                                         "digest": "", "details": self._details()}, *embedders]})

    async def ps(self, _: Request) -> Response:
        models = [(self.server.model_name, 0, self._details())]
        models += [(m.name, m.size_bytes, m.ollama_details()) for m in self._embedding_models()]
        return JSONResponse({"models": [{"name": name, "model": name, "size": size, "digest": "",
                                         "details": details, "expires_at": "2999-01-01T00:00:00Z",
                                         "size_vram": 0} for name, size, details in models]})

    async def show(self, request: Request) -> Response:
        body = await _json(request)
        embedder = self._embedding_model(body.get("model") or body.get("name"))
        if embedder is not None:
            return JSONResponse(embedder.ollama_show(self._modified))
        self._check_model(body.get("model") or body.get("name"))
        template = getattr(self._engine.tokenizer, "chat_template", "") or ""
        caps = ["completion"] + (["tools"] if tools_mod.template_knows_tools(self._engine.tokenizer) else [])
        return JSONResponse({"modelfile": "", "parameters": "", "template": str(template),
                             "details": self._details(), "model_info": {}, "capabilities": caps,
                             "modified_at": self._modified})

    async def chat(self, request: Request) -> Response:
        body = await _json(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise APIError(400, "messages must be a list of {role, content} objects")
        history = [{"role": m["role"], "content": str(m.get("content") or ""),
                    **({"tool_calls": _openai_calls(m["tool_calls"])} if m.get("tool_calls") else {})}
                   for m in messages]
        tools = body.get("tools") or []
        names = tools_mod.function_names(tools) if tools else []
        template_tools = None
        if tools and tools_mod.template_knows_tools(self._engine.tokenizer):
            prompt: Any = [tools_mod.history_message(m) for m in history]
            template_tools = tools
        elif tools:
            prompt = tools_mod.with_tool_instructions(tools_mod.plain_history(history), tools)
        else:
            prompt = tools_mod.plain_history(history)
        if not prompt:  # Ollama answers an empty chat (a model preload) with an empty reply
            return JSONResponse({"model": self.server.model_name, "created_at": _now(),
                                 "message": {"role": "assistant", "content": ""}, "done": True,
                                 "done_reason": "load"})
        return await self._run(body, prompt, template_tools, names, chat=True)

    async def generate(self, request: Request) -> Response:
        body = await _json(request)
        prompt = body.get("prompt") or ""
        if not isinstance(prompt, str):
            raise APIError(400, "prompt must be a string")
        if not prompt:
            return JSONResponse({"model": self.server.model_name, "created_at": _now(), "response": "",
                                 "done": True, "done_reason": "load"})
        if body.get("raw"):
            engine_prompt: Any = prompt
        else:
            engine_prompt = [*([{"role": "system", "content": body["system"]}] if body.get("system") else []),
                             {"role": "user", "content": prompt}]
        return await self._run(body, engine_prompt, None, [], chat=False)

    # -- generation --------------------------------------------------------------------------------------------
    def _params(self, body: dict[str, Any]) -> SamplingParams:
        self._check_model(body.get("model"))
        options = body.get("options") or {}
        if not isinstance(options, dict):
            raise APIError(400, "options must be an object")
        fields: dict[str, Any] = {ours: options[theirs] for theirs, ours in _SAMPLING_OPTIONS.items()
                                  if options.get(theirs) is not None}
        for key, value in getattr(self.server, "sampling_defaults", {}).items():
            fields.setdefault(key, value)  # what the request leaves out, the model's own settings fill in
        num_predict = options.get("num_predict")
        max_len = self._engine.max_model_len
        fields["max_tokens"] = num_predict if isinstance(num_predict, int) and num_predict > 0 else max_len
        fmt = body.get("format")
        if fmt == "json":
            fields["response_format"] = "json"
        elif isinstance(fmt, dict):
            fields["json_schema"] = fmt
        elif fmt not in (None, ""):
            raise APIError(400, "format must be 'json' or a JSON schema")
        fields["timeout_s"] = self.server.request_timeout_s
        try:
            params = SamplingParams(**fields)
        except (ValueError, TypeError) as exc:
            raise APIError(400, str(exc)) from exc
        check_sampling_limits(params)
        return params

    async def _run(self, body: dict[str, Any], prompt: Any, template_tools: list[dict[str, Any]] | None,
                   names: list[str], chat: bool) -> Response:
        params = self._params(body)
        try:
            request = (await self.server.engine.add_requests(prompt, params, self.server.priority,
                                                             template_tools))[0]
        except CapacityError as exc:
            raise APIError(429, str(exc)) from exc
        except ValueError as exc:
            raise APIError(400, str(exc)) from exc
        start = time.monotonic()
        stream = body.get("stream", True) is not False
        outputs = self._ndjson(request, chat, names, start)
        if stream:
            return StreamingResponse(outputs, media_type="application/x-ndjson")
        parts, last = [], None
        async for line in outputs:
            last = json.loads(line)
            if last.get("error"):
                return _error(500, last["error"])
            parts.append(last["message"]["content"] if chat else last["response"])
        assert last is not None
        if chat:
            last["message"]["content"] = "".join(parts)
        else:
            last["response"] = "".join(parts)
        return JSONResponse(last)

    async def _ndjson(self, request: Any, chat: bool, names: list[str], start: float) -> AsyncIterator[str]:
        head = {"model": self.server.model_name}
        text: list[str] = []
        final: StepOutput | None = None
        async for out in self.server._observe(request):
            if out.finished:
                final = out
                if out.finish_reason == "error":
                    yield json.dumps({"error": out.error or "generation failed"}) + "\n"
                    return
            text.append(out.delta_text)
            if out.delta_text and not names:
                piece = {"message": {"role": "assistant", "content": out.delta_text}} if chat else {
                    "response": out.delta_text}
                yield json.dumps({**head, "created_at": _now(), **piece, "done": False}) + "\n"
        assert final is not None
        content, calls = tools_mod.parse_tool_calls("".join(text), names) if names else ("", [])
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [{"function": {"name": c.name, "arguments": json.loads(c.arguments)}}
                                     for c in calls]
        elapsed = int((time.monotonic() - start) * 1e9)
        metrics = final.metrics or {}
        tail = {"done": True, "done_reason": "stop" if final.finish_reason == "stop" else "length",
                "total_duration": elapsed, "load_duration": 0,
                "prompt_eval_count": request.num_prompt_tokens,
                "prompt_eval_duration": int((metrics.get("ttft_s") or 0) * 1e9),
                "eval_count": int(metrics.get("num_generated_tokens") or 0), "eval_duration": elapsed}
        piece = {"message": message} if chat else {"response": "", "context": []}
        yield json.dumps({**head, "created_at": _now(), **piece, **tail}) + "\n"


def _openai_calls(calls: Any) -> list[dict[str, Any]]:
    """Ollama's history calls (arguments as objects) in OpenAI's shape (arguments as JSON text)."""
    out = []
    for i, call in enumerate(calls if isinstance(calls, list) else []):
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        args = fn.get("arguments", {})
        out.append({"id": f"call_{i}", "type": "function",
                    "function": {"name": str(fn.get("name", "")),
                                 "arguments": args if isinstance(args, str) else json.dumps(args)}})
    return out


async def _json(request: Request) -> dict[str, Any]:
    """The body as a JSON object of the right field types (pydantic's parser: deep nesting is a 400, not the
    RecursionError of Python's ``json``)."""
    try:
        body = pydantic_core.from_json(await request.body() or b"{}", allow_inf_nan=False)
    except ValueError as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    check_body_types(body)
    return body


def ollama_routes(server: Any, embeddings: Any = None) -> list[Route]:
    """The ``/api/*`` routes over ``server``, listing ``embeddings``' models too."""
    api = OllamaAPI(server, embeddings)
    return [
        Route("/api/version", api.version),
        Route("/api/tags", api.tags),
        Route("/api/ps", api.ps),
        Route("/api/show", api.show, methods=["POST"]),
        Route("/api/chat", api.chat, methods=["POST"]),
        Route("/api/generate", api.generate, methods=["POST"]),
    ]
