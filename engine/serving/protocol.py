"""The OpenAI API's wire format: request bodies, and errors as OpenAI-style error objects.

Bodies are strict pydantic models with unknown fields forbidden. Every field of OpenAI's current chat-completions and
completions requests is declared: those that change the output are honoured, bookkeeping ones (``store``,
``metadata``, ``user``, ``service_tier``...) are accepted and ignored, and a field is a 400 naming it only when
it asks for something Hearth cannot do (audio output, web search, ``suffix``), never at its neutral value. ``parse_body`` turns raw bytes into one of them; every way that can fail (bad JSON, lone
surrogates, nesting deeper than any real request, a wrong type) is an :class:`APIError`, never a 500.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, TypeVar

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.responses import JSONResponse

from engine.api import MAX_N, MAX_TOP_LOGPROBS, SamplingParams

#: The largest seed: the engine's generators take an unsigned 64-bit value.
MAX_SEED = 2**64 - 1
#: Caps on what one request may ask of the shared engine at every step (``engine/serving/limits.py`` says why).
MAX_LOGIT_BIAS_ENTRIES = 1024
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1000


# --- errors -----------------------------------------------------------------------------------------------------

class APIError(Exception):
    """An error answered as ``{"error": {...}}`` in OpenAI's shape."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = dict(headers or {})
        if status == 401:
            self.headers.setdefault("WWW-Authenticate", "Bearer")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers or None)


def validation_error(exc: ValidationError) -> APIError:
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


# --- request bodies ---------------------------------------------------------------------------------------------

class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


BodyT = TypeVar("BodyT", bound=_Body)


class StreamOptions(_Body):
    include_usage: bool = False
    include_obfuscation: bool | None = None  # padding against length side channels; nothing to pad locally


class TextPart(_Body):
    type: Literal["text"]
    text: str


class RefusalPart(_Body):
    type: Literal["refusal"]
    refusal: str


class FunctionCall(_Body):
    name: str
    arguments: str


class ToolCallBody(_Body):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDef(_Body):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(_Body):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class ChatMessage(_Body):
    """A history message of any role. Images, audio and files in content are refused (text-only models)."""

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[TextPart | RefusalPart] | None = None
    name: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCallBody] | None = None
    tool_call_id: str | None = None
    function_call: FunctionCall | None = None  # the deprecated single call
    audio: dict[str, Any] | None = None  # a reference to an earlier audio reply; there are none here

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text if isinstance(p, TextPart) else p.refusal for p in self.content)


class JSONSchemaFormat(_Body):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class GenerationRequest(_Body):
    """Fields shared by both generation endpoints. Bookkeeping fields are accepted and ignored."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    n: int | None = Field(default=None, ge=1, le=MAX_N)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM's extensions the engine supports.
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    ignore_eos: bool = False
    # llama-server's: how many of the latest tokens the penalties read (-1: all of them, 0: penalties off).
    repeat_last_n: int | None = Field(default=None, ge=-1)
    # Hearth's extension: seconds until the request ends with finish_reason "timeout" (default: the server's).
    timeout_s: float | None = Field(default=None, gt=0.0, allow_inf_nan=False)

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is not None and len(value) > MAX_LOGIT_BIAS_ENTRIES:  # before looping over them
            raise ValueError(f"it has {len(value)} entries; at most {MAX_LOGIT_BIAS_ENTRIES} are accepted")
        for key, bias in (value or {}).items():
            if not key.isdigit():
                raise ValueError(f"keys must be token ids, got {key!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"biases must lie in [-100, 100], got {bias!r}")
        return value

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"it has {len(stops)} strings; at most {MAX_STOP_STRINGS} are accepted")
        longest = max((len(s) for s in stops), default=0)
        if longest > MAX_STOP_CHARS:
            raise ValueError(f"a stop string is {longest} characters long; at most {MAX_STOP_CHARS} are accepted")
        return value

    def sampling_params(self, max_tokens: int | None, default_max_tokens: int,
                        model_defaults: Mapping[str, float] | None = None, **extra: Any) -> SamplingParams:
        """The engine's parameters; ``ValueError`` names a bad field.

        A sampling field the request leaves out takes the model's own default (``model_defaults``: its
        ``generation_config.json`` or Hearth's preset for it), as LM Studio and Ollama do, else the API's.
        """
        own = with_model_defaults({"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                                   "min_p": self.min_p, "repetition_penalty": self.repetition_penalty,
                                   "repeat_last_n": self.repeat_last_n},
                                  model_defaults)
        return SamplingParams(
            max_tokens=max_tokens or default_max_tokens,
            temperature=1.0 if own["temperature"] is None else own["temperature"],
            top_p=1.0 if own["top_p"] is None else own["top_p"],
            top_k=own["top_k"] or 0,
            min_p=own["min_p"] or 0.0,
            repetition_penalty=own["repetition_penalty"] or 1.0,
            repeat_last_n=own["repeat_last_n"],
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            logit_bias={int(k): v for k, v in (self.logit_bias or {}).items()},
            stop=[self.stop] if isinstance(self.stop, str) else list(self.stop or []),
            seed=self.seed,
            ignore_eos=self.ignore_eos,
            n=self.n or 1,
            **extra,
        )


def with_model_defaults(fields: Mapping[str, Any], model_defaults: Mapping[str, float] | None) -> dict[str, Any]:
    """``fields`` with each one that is None (left out of the request) set from ``model_defaults`` where it has
    one."""
    defaults = model_defaults or {}
    return {k: defaults.get(k) if v is None else v for k, v in fields.items()}


def _refuse(what: str, allowed: tuple[Any, ...] = (None, False)) -> Callable[[Any], Any]:
    """A validator that accepts only a field's "off" values and names the feature otherwise."""

    def check(value: Any) -> Any:
        if value is True or value not in allowed:
            raise ValueError(f"{what} is not supported")
        return value

    return check


class ChatCompletionRequest(GenerationRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: ResponseFormat | None = None
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: list[FunctionDef] | None = None  # the deprecated form of tools
    function_call: Literal["none", "auto"] | NamedFunction | None = None
    # Accepted and ignored: bookkeeping, and hints that do not change what a local model can do.
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    prediction: dict[str, Any] | None = None  # a latency hint; the output is the same without it
    reasoning_effort: str | None = None
    verbosity: str | None = None
    # Refused when they ask for something: audio output, web search.
    modalities: list[Literal["text", "audio"]] | None = None
    audio: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None

    _check_audio = field_validator("audio")(_refuse("audio output"))
    _check_search = field_validator("web_search_options")(_refuse("web search"))

    @field_validator("modalities")
    @classmethod
    def _text_only(cls, value: list[str] | None) -> list[str] | None:
        if value and "audio" in value:
            raise ValueError("audio output is not supported; ask for ['text']")
        return value

    def tool_list(self) -> list[dict[str, Any]]:
        """The tools offered, as plain dicts (the deprecated ``functions`` become tools)."""
        if self.tools:
            return [t.model_dump(exclude_none=True) for t in self.tools]
        return [{"type": "function", "function": f.model_dump(exclude_none=True)} for f in self.functions or []]

    def choice(self) -> str | dict[str, Any]:
        """``tool_choice`` as "none", "auto", "required" or ``{"type": "function", "function": {"name"}}``."""
        tools = self.tool_list()
        choice: Any = self.tool_choice if self.tool_choice is not None else self.function_call
        if isinstance(choice, NamedFunction):
            choice = {"type": "function", "function": {"name": choice.name}}
        elif isinstance(choice, NamedToolChoice):
            choice = choice.model_dump()
        if not tools:
            if choice not in (None, "none", "auto"):
                raise APIError(400, "tool_choice asks for a tool call but no tools are given.",
                               param="tool_choice", code="invalid_value")
            return "none"
        if isinstance(choice, dict) and choice["function"]["name"] not in [t["function"]["name"] for t in tools]:
            raise APIError(400, f"tool_choice names the function '{choice['function']['name']}', which is not "
                           "among the tools.", param="tool_choice", code="invalid_value")
        return choice or "auto"

    def format_params(self) -> dict[str, Any]:
        """``response_format`` as SamplingParams fields."""
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            return {}
        if fmt.type == "json_object":
            return {"response_format": "json"}
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise APIError(400, "response_format of type json_schema needs json_schema.schema.",
                           param="response_format", code="invalid_value")
        return {"json_schema": fmt.json_schema.schema_}

    def engine_messages(self) -> list[dict[str, Any]]:
        """The conversation as the engine's chat template takes it ("developer" is OpenAI's newer "system")."""
        out = []
        for m in self.messages:
            role = {"developer": "system", "function": "tool"}.get(m.role, m.role)
            message: dict[str, Any] = {"role": role, "content": m.text()}
            calls = [c.model_dump() for c in m.tool_calls or []]
            if m.function_call is not None:
                calls.append({"id": "call_0", "type": "function", "function": m.function_call.model_dump()})
            if calls:
                message["tool_calls"] = calls
            if m.tool_call_id or (m.role == "function" and m.name):
                message["tool_call_id"] = m.tool_call_id or m.name
            out.append(message)
        return out


class CompletionRequest(GenerationRequest):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)] | Annotated[list[int], Field(min_length=1)]
    echo: bool | None = None
    best_of: int | None = None
    logprobs: int | None = Field(default=None, ge=0, le=5)
    suffix: str | None = None

    _check_best_of = field_validator("best_of")(_refuse("best_of > 1", (None, 1)))
    _check_suffix = field_validator("suffix")(_refuse("suffix (text insertion)", (None, "")))

    def engine_prompt(self) -> str | list[int]:
        """The prompt as text or token ids (a batch of one string is that string)."""
        prompt = self.prompt
        if isinstance(prompt, list) and isinstance(prompt[0], str):
            return prompt[0]
        return prompt


def parse_body(raw: bytes, model: type[BodyT]) -> BodyT:
    """The JSON body as ``model``.

    pydantic's Rust parser refuses what Python's ``json`` lets through to crash later: lone surrogates
    (``"\\ud800"``), ``NaN``, and nesting deeper than a few hundred levels (``json`` raises RecursionError).
    """
    try:
        data = pydantic_core.from_json(raw, allow_inf_nan=False)
    except ValueError as exc:
        raise APIError(400, f"The request body is not valid JSON: {exc}.", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise APIError(400, f"The request body must be a JSON object, not {type(data).__name__}.",
                       code="invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from exc
