"""The OpenAI API's wire format: request bodies, and errors as OpenAI-style error objects.

Bodies are strict pydantic models with unknown fields forbidden, so a parameter the engine cannot honour is a 400
naming it, never ignored. ``parse_body`` turns raw bytes into one of them; every way that can fail (bad JSON, lone
surrogates, nesting deeper than any real request, a wrong type) is an :class:`APIError`, never a 500.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, TypeVar

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.responses import JSONResponse

from engine.api import SamplingParams

#: The largest seed: the engine's generators take an unsigned 64-bit value.
MAX_SEED = 2**64 - 1


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


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class GenerationRequest(_Body):
    """Fields shared by both generation endpoints."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    n: int | None = 1
    user: str | None = None
    # vLLM's extensions the engine supports.
    top_k: int | None = Field(default=None, ge=0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    ignore_eos: bool = False
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
            ignore_eos=self.ignore_eos,
        )


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
    logprobs: Any = None
    top_logprobs: Any = None
    response_format: Any = None

    _check_logprobs = field_validator("logprobs", "top_logprobs")(_refuse("logprobs"))
    _check_format = field_validator("response_format")(_refuse("a response_format other than text", (None, {"type": "text"})))

    def engine_messages(self) -> list[dict[str, str]]:
        """The conversation as the engine's chat template takes it ("developer" is OpenAI's newer "system")."""
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                for m in self.messages]


class CompletionRequest(GenerationRequest):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)] | Annotated[list[int], Field(min_length=1)]
    echo: Any = None
    best_of: Any = None
    logprobs: Any = None
    suffix: Any = None

    _check_echo = field_validator("echo")(_refuse("echo"))
    _check_best_of = field_validator("best_of")(_refuse("best_of > 1", (None, 1)))
    _check_logprobs = field_validator("logprobs")(_refuse("logprobs"))
    _check_suffix = field_validator("suffix")(_refuse("suffix"))

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
