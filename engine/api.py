"""The engine's contracts: the types the app, the server and test fakes share. No torch, no Qt, no engine imports.

Everything a caller hands the engine or gets back is defined here once: sampling parameters, the engine
configuration, errors, step and request outputs, hardware facts, the quantization recommendation, model facts and
the names of quantization levels. ``engine/__init__.py`` re-exports the public ones.

Long because it is every contract in one place: the app, the server and the fakes import one module, and no type
is defined twice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any, Literal

FinishReason = Literal["stop", "length", "abort", "error", "timeout"]
FitVerdict = Literal["yes", "tight", "no"]
LoadStage = Literal["convert", "validate", "read weights", "quantize", "warm up", "ready"]


# ---------------------------------------------------------------------------------------------------------------
# Errors


class ModelLoadError(Exception):
    """A model could not be loaded. The message says what is wrong and what to do about it."""


class CapacityError(Exception):
    """The engine's request queue is full; retry later or raise ``max_waiting``."""


# ---------------------------------------------------------------------------------------------------------------
# Quantization levels

#: What ``LLM(quantization=...)`` accepts. ``fp32`` keeps the weights in fp32 (``none`` is an accepted alias);
#: ``bf16``/``fp16`` store them in 16 bits; ``int8``/``int4`` quantize the decoder's linear layers; ``file`` (GGUF
#: files on a CPU) keeps every weight in the file's own blocks (Q4_K, Q6_K, Q8_0...), mapped from the file, and
#: multiplies them in those blocks (``engine/model/gguf_linear.py``).
QUANTIZATION_LEVELS = ("auto", "fp32", "bf16", "fp16", "int8", "int4", "file")
#: The levels that change the weights themselves, not only their dtype.
WEIGHT_LEVELS = ("int8", "int4", "file")
#: Weight dtype of each concrete level (int8/int4 keep the embedding and norms in bf16; ``file`` computes in fp32
#: around its block kernels, and holds only norms and biases as tensors).
LEVEL_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "int8": "bfloat16", "int4": "bfloat16",
                "file": "float32"}
#: Bytes per parameter of each level (int4 adds a bf16 scale and zero per group of 32).
BYTES_PER_PARAM = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "int8": 1.0 + 2 / 4096, "int4": 0.5 + 4 / 32}
#: Each level in plain words, as the app's Precision choices and the server's ``--help`` show it.
LEVEL_LABELS = {"auto": "the best that fits", "fp32": "full size, exact", "bf16": "half size",
                "fp16": "half size, for GPUs", "int8": "quarter size", "int4": "eighth size, some quality loss",
                "file": "as in the GGUF file, read in place"}
_LEVEL_ALIASES = {
    "none": "fp32",
    "float32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "q8": "int8",
    "q4": "int4",
    "gguf": "file",
}


def check_level(level: str) -> str:
    """Normalise a quantization name; unknown ones raise ``ValueError`` naming the field."""
    name = level.strip().lower()
    name = _LEVEL_ALIASES.get(name, name)
    if name not in QUANTIZATION_LEVELS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATION_LEVELS)}; got {level!r}")
    return name


#: Canonical dtype names (as torch spells them) for every spelling the engine accepts.
DTYPE_NAMES = {
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
}


def dtype_name(name: str) -> str:
    """The canonical torch name of a dtype spelling ("bf16" -> "bfloat16"); ``ValueError`` for others."""
    key = name.strip().lower().removeprefix("torch.")
    if key not in DTYPE_NAMES:
        raise ValueError(f"dtype must be one of float32, bfloat16 or float16; got {name!r}")
    return DTYPE_NAMES[key]


# ---------------------------------------------------------------------------------------------------------------
# Requests

#: The KV block that is never handed out and stays zero: padded attention reads point at it.
NULL_BLOCK = 0


#: Temperatures below this sample as greedy decoding (dividing logits by less overflows or ties everything).
GREEDY_TEMPERATURE = 1e-5
MAX_TEMPERATURE = 100.0
#: Repetition penalties outside this range only produce overflow or NaN, never a useful distribution.
MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = 0.01, 100.0
MAX_SEED = 2**64 - 1  # seeds are unsigned 64-bit values
#: OpenAI's bounds: presence/frequency penalties in [-2, 2], logit biases in [-100, 100], at most 20 top logprobs.
MAX_PENALTY = 2.0
MAX_LOGIT_BIAS = 100.0
MAX_TOP_LOGPROBS = 20
#: Most parallel sequences (``n``) one request may ask for.
MAX_N = 8
#: What ``SamplingParams.response_format`` accepts: free text, or any JSON document (``json_schema`` narrows it).
ResponseFormat = Literal["text", "json"]


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(slots=True)
class SamplingParams:
    """How one request picks its tokens. Invalid values raise ``ValueError`` naming the field.

    ``temperature`` below ``GREEDY_TEMPERATURE`` (0 included) is greedy decoding. ``top_k == 0`` and
    ``top_p == 1`` switch those filters off. ``seed`` is an unsigned 64-bit value.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False
    #: Seconds from submission after which the request ends with ``finish_reason="timeout"`` (None: never).
    timeout_s: float | None = None
    #: OpenAI's penalties over the tokens generated so far: ``logit -= frequency * count + presence * (count > 0)``.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    #: Token id -> value added to its logit before sampling (-100 bans it in practice, 100 all but forces it).
    logit_bias: dict[int, float] = field(default_factory=dict)
    #: Drop tokens whose probability is below ``min_p`` times the top token's (0 = off).
    min_p: float = 0.0
    #: Parallel sequences over the same prompt (``LLMEngine.submit_n``); they share the prompt's KV blocks.
    n: int = 1
    #: Report each sampled token's log-probability, plus the ``top_logprobs`` most likely alternatives.
    logprobs: bool = False
    top_logprobs: int = 0
    #: "json" constrains the reply to a JSON document (an object unless ``json_schema`` says otherwise).
    response_format: ResponseFormat = "text"
    #: A JSON schema the reply must validate against (implies ``response_format="json"``).
    json_schema: dict[str, Any] | None = None
    #: A Lark grammar (llguidance's dialect) the reply must match; exclusive with ``json_schema``.
    grammar: str | None = None
    #: How many of the latest tokens (prompt then reply) the repetition, presence and frequency penalties read:
    #: None or -1 = all of them (Hugging Face's ``generate``), 0 = none (the penalties are off), n > 0 = the last n
    #: (llama.cpp's and Ollama's ``repeat_last_n``, 64 there). Presence and frequency still count reply tokens only.
    repeat_last_n: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        # written as "not (in range)" so that NaN fails too
        if not _is_number(self.temperature) or not 0.0 <= self.temperature <= MAX_TEMPERATURE:
            raise ValueError(f"temperature must be between 0 and {MAX_TEMPERATURE:g}, got {self.temperature!r}")
        if not _is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"top_k must be a non-negative integer, got {self.top_k!r}")
        if not _is_number(self.repetition_penalty) or not (
            MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY
        ):
            raise ValueError(
                f"repetition_penalty must be between {MIN_REPETITION_PENALTY:g} and {MAX_REPETITION_PENALTY:g}, "
                f"got {self.repetition_penalty!r}"
            )
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        if self.seed is not None and (
            not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed <= MAX_SEED
        ):
            raise ValueError(f"seed must be an integer between 0 and 2**64 - 1, got {self.seed!r}")
        if self.timeout_s is not None and (not _is_number(self.timeout_s) or not 0 < self.timeout_s < math.inf):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {self.timeout_s!r}")
        self._check_sampling_controls()
        self._check_structure()

    def _check_sampling_controls(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -MAX_PENALTY <= value <= MAX_PENALTY:
                raise ValueError(f"{name} must be between -2 and 2, got {value!r}")
        if not isinstance(self.logit_bias, dict) or not all(
            isinstance(k, int) and not isinstance(k, bool) and k >= 0
            and _is_number(v) and -MAX_LOGIT_BIAS <= v <= MAX_LOGIT_BIAS
            for k, v in self.logit_bias.items()
        ):
            raise ValueError(f"logit_bias must map token ids to values in [-100, 100], got {self.logit_bias!r}")
        if not _is_number(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be between 0 and 1, got {self.min_p!r}")
        if self.repeat_last_n is not None and (
            not isinstance(self.repeat_last_n, int) or isinstance(self.repeat_last_n, bool) or self.repeat_last_n < -1
        ):
            raise ValueError("repeat_last_n must be a number of tokens: -1 (or None) for all of them, 0 to turn the "
                             f"penalties off, or a positive count; got {self.repeat_last_n!r}")
        if not isinstance(self.n, int) or isinstance(self.n, bool) or not 1 <= self.n <= MAX_N:
            raise ValueError(f"n must be an integer between 1 and {MAX_N}, got {self.n!r}")
        if type(self.logprobs) is not bool:
            raise ValueError(f"logprobs must be true or false, got {self.logprobs!r}")
        if (not isinstance(self.top_logprobs, int) or isinstance(self.top_logprobs, bool)
                or not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS):
            raise ValueError(f"top_logprobs must be an integer between 0 and {MAX_TOP_LOGPROBS}, "
                             f"got {self.top_logprobs!r}")

    def _check_structure(self) -> None:
        if self.response_format not in ("text", "json"):
            raise ValueError(f"response_format must be 'text' or 'json', got {self.response_format!r}")
        if self.json_schema is not None:
            if not isinstance(self.json_schema, dict):
                raise ValueError(f"json_schema must be a JSON schema object, got {self.json_schema!r}")
            self.response_format = "json"
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar.strip()):
            raise ValueError(f"grammar must be a non-empty Lark grammar, got {self.grammar!r}")
        if self.grammar is not None and self.response_format == "json":
            raise ValueError("grammar cannot be combined with response_format='json' or json_schema")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def is_constrained(self) -> bool:
        """The reply must follow a grammar (JSON, a JSON schema, or ``grammar``)."""
        return self.response_format == "json" or self.grammar is not None

    @property
    def is_penalised(self) -> bool:
        """A penalty reads the tokens so far: repetition, presence or frequency, over a window that is not 0."""
        return self.repeat_last_n != 0 and (
            self.repetition_penalty != 1.0 or bool(self.presence_penalty) or bool(self.frequency_penalty))

    @property
    def is_plain_greedy(self) -> bool:
        """Greedy with nothing to adjust or report: the batch may take one vectorised argmax."""
        return (self.is_greedy and not self.is_penalised and not self.logit_bias and not self.logprobs
                and not self.is_constrained)


@dataclass(slots=True)
class TokenLogprob:
    """A sampled token's log-probability, and the most likely tokens with theirs, from the distribution the
    token was drawn from (after penalties, biases, the grammar mask and temperature; before top-k/top-p/min-p)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass(slots=True)
class EngineConfig:
    """Knobs of the engine. Bad values raise ``ValueError`` naming the field.

    Attributes:
        max_batch_size: most sequences in one step (running batch).
        max_wait_ms: longest time admission waits to gather a batch when the engine is idle. The scheduler
            waits only while requests come in bursts, and not at all when they come one at a time (see
            ``Scheduler.batch_window_s``).
        max_num_batched_tokens: token budget of one step; longer prompts are prefilled in chunks.
        block_size: tokens per KV-cache block.
        kv_cache_bytes: memory for the KV-cache pool; ``None`` sizes it from free memory.
        kv_dtype: ``"auto"`` (float32 on a CPU, the model's dtype on a GPU), ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        max_waiting: most queued requests before ``submit`` raises ``CapacityError``.
        max_model_len: longest prompt plus reply; ``None`` takes the model's own limit.
        enable_prefix_caching: share full KV blocks between requests with the same prefix.
        prefix_cache_bytes: KV memory that finished requests' prefixes keep for reuse. Once the pool's blocks ever
            written reach it, a new block evicts the least recently used cached prefix instead of taking a block
            never written; running requests may still use the whole pool (``kv_cache_bytes``). It bounds the pool's
            resident size and reuses pages already in memory (``engine/core/block_manager.py``).
        adaptive_concurrency: let the concurrency controller (``engine/core/controller.py``) lower the running
            batch, the token budget and the batching window while the most urgent request's time between
            tokens exceeds twice its solo figure, or memory runs short; ``max_batch_size`` stays the ceiling.
        deterministic: greedy replies repeat bitwise whatever else shares a step and whatever the prefix cache
            holds: row-invariant kernels and attention (``engine/model/runner.py``; CPU only). Off by default:
            it gives up the faster kernels whose rounding depends on the batch's shape (docs/BENCHMARKS.md).
        speculative: speculative decoding (``engine/core/speculative.py``): ``"off"``, ``"ngram"`` (drafts looked
            up in the request's own context), ``"self-int4"`` (the model's own int4 copy drafts) or
            ``{"draft_model": PATH}`` (a small model with the same tokenizer). Output is unchanged: greedy
            replies are token-identical and sampled ones keep their distribution.
        num_speculative_tokens: tokens drafted per step for a speculating sequence (k).
        native: native decode steps (``engine/model/native.py``): every layer of a decode-only step in one C++
            call, built once per machine with its C++ compiler. ``"auto"``: per batch bucket where a measurement
            on this machine finds it faster (cached), not at fp32; ``"on"``: wherever it can run; ``"off"``, which
            also keeps int4 layers off the extension's VNNI kernel (``engine/model/kernels.py``). Eager while the
            first build runs, where there is no compiler, and in a frozen bundle on a CPU its prebuilt copy
            cannot run.
        cuda_graphs: on a CUDA GPU, replay decode steps from CUDA graphs captured per batch and context bucket
            (``engine/model/cuda_graphs.py``); ignored on a CPU.
        compile: removed (:data:`COMPILE_REMOVED`); any value raises ``TypeError``.
    """

    max_batch_size: int = 16
    max_wait_ms: float = 5.0
    max_num_batched_tokens: int = 512
    block_size: int = 16
    kv_cache_bytes: int | None = None
    kv_dtype: str = "auto"
    max_waiting: int = 256
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    prefix_cache_bytes: int = 1 << 30
    adaptive_concurrency: bool = True
    deterministic: bool = False
    speculative: str | dict[str, str] = "off"
    num_speculative_tokens: int = 4
    native: str = "auto"
    cuda_graphs: bool = True
    compile: InitVar[object] = None  # removed: kept only to tell old callers so

    def __post_init__(self, compile: object) -> None:
        if compile is not None:
            raise TypeError(f"EngineConfig(compile=...): {COMPILE_REMOVED}")
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {self.max_wait_ms}")
        if self.max_num_batched_tokens < 16:
            raise ValueError(f"max_num_batched_tokens must be >= 16, got {self.max_num_batched_tokens}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes <= 0:
            raise ValueError(f"kv_cache_bytes must be positive, got {self.kv_cache_bytes}")
        if self.prefix_cache_bytes < 0:
            raise ValueError(f"prefix_cache_bytes must be >= 0, got {self.prefix_cache_bytes}")
        if self.kv_dtype not in ("auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16"):
            raise ValueError(f"kv_dtype must be auto, float32, bfloat16 or float16, got {self.kv_dtype!r}")
        if self.max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1, got {self.max_waiting}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        check_speculative(self.speculative)
        if not 1 <= self.num_speculative_tokens <= 16:
            raise ValueError(f"num_speculative_tokens must be in [1, 16], got {self.num_speculative_tokens}")
        if self.native not in NATIVE_MODES:
            raise ValueError(f"native must be one of {', '.join(NATIVE_MODES)}, got {self.native!r}")


SPECULATIVE_METHODS = ("off", "ngram", "self-int4")
#: Why ``compile=`` (``LLM``, ``EngineConfig``) and ``--compile`` are refused.
COMPILE_REMOVED = (
    "the torch.compile decode path was removed: it measured slower than the eager and native decode paths. "
    "Drop the option; the native decode step (EngineConfig.native, \"auto\" by default) replaces it."
)
#: ``EngineConfig.native`` values
NATIVE_MODES = ("auto", "on", "off")


def check_speculative(value: object) -> None:
    """``ValueError`` unless ``value`` is a speculative-decoding choice (see ``EngineConfig.speculative``)."""
    if isinstance(value, str):
        if value not in SPECULATIVE_METHODS:
            raise ValueError(
                f"speculative must be one of {', '.join(SPECULATIVE_METHODS)} or {{'draft_model': PATH}}, "
                f"got {value!r}"
            )
        return
    if not isinstance(value, dict) or set(value) != {"draft_model"} or not isinstance(value["draft_model"], str) \
            or not value["draft_model"]:
        raise ValueError(f"speculative as a dict must be {{'draft_model': PATH}} with a non-empty path, got {value!r}")


@dataclass(slots=True)
class RequestMetrics:
    """Timings of one request, in seconds since its arrival where noted."""

    arrival_time: float
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_time: float | None = None
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0
    num_cached_tokens: int = 0

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e_s(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival_time

    @property
    def tokens(self) -> int:
        return self.num_generated_tokens

    @property
    def tok_s(self) -> float:
        """Decode speed after the first token."""
        if self.first_token_time is None or self.last_token_time is None or self.num_generated_tokens < 2:
            return 0.0
        span = self.last_token_time - self.first_token_time
        return (self.num_generated_tokens - 1) / span if span > 0 else 0.0

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "ttft_s": self.ttft_s,
            "e2e_s": self.e2e_s,
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_generated_tokens": self.num_generated_tokens,
            "num_cached_tokens": self.num_cached_tokens,
            "tokens": self.num_generated_tokens,
            "tok_s": self.tok_s,
        }


@dataclass(slots=True)
class StepOutput:
    """What one step produced for one request."""

    request_id: str
    delta_text: str
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    metrics: dict[str, Any] | None = None
    error: str | None = None
    #: One entry per token of ``new_token_ids`` when the request asked for logprobs.
    logprobs: list[TokenLogprob] | None = None


@dataclass(slots=True)
class RequestOutput:
    """A finished request."""

    request_id: str
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None
    metrics: RequestMetrics
    error: str | None = None
    #: One entry per token of ``token_ids`` when the request asked for logprobs.
    logprobs: list[TokenLogprob] | None = None


# ---------------------------------------------------------------------------------------------------------------
# Engine metrics


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """One snapshot of the engine's figures: what ``LLM.metrics()`` / ``LLMEngine.metrics()`` return.

    Names follow vLLM's Prometheus metrics where one exists (``num_requests_running`` -> ``num_running``,
    ``time_to_first_token_seconds`` -> ``ttft_*``). Latencies are seconds; rates are per second over the
    engine's recent window; ``*_total`` fields and the prefix-cache and preemption counts grow from start-up.
    :meth:`to_dict` is the JSON form (the ``/metrics`` collector, the app's signals), :meth:`from_dict` reads
    one back, whatever version wrote it.
    """

    #: Wall-clock time (``time.time()``) the snapshot was taken.
    time: float = 0.0
    # --- throughput and latency (recent window) --------------------------------------------------------------
    throughput_tok_s: float = 0.0
    requests_per_s: float = 0.0
    ttft_p50: float = 0.0
    ttft_p90: float = 0.0
    ttft_p99: float = 0.0
    itl_p50: float = 0.0
    itl_p99: float = 0.0
    e2e_p50: float = 0.0
    e2e_p99: float = 0.0
    #: Mean sequences per step, and that over ``max_batch_size``.
    mean_batch_size: float = 0.0
    batch_efficiency: float = 0.0
    num_generated_tokens_total: int = 0
    num_requests_total: int = 0
    # --- scheduler and KV cache (now) ----------------------------------------------------------------------
    num_running: int = 0
    num_waiting: int = 0
    #: Fraction of the usable KV blocks held by requests (1 = full).
    kv_cache_usage: float = 0.0
    kv_blocks_used: int = 0
    #: Free blocks that still hold a cached prefix.
    kv_blocks_cached: int = 0
    kv_blocks_total: int = 0
    prefix_cache_hit_rate: float = 0.0
    #: Prompt tokens looked up in the prefix cache, and those found.
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    #: How long admission waits to gather a batch now.
    batch_window_ms: float = 0.0
    # --- concurrency controller -----------------------------------------------------------------------------
    #: Most sequences allowed to run at once (``max_batch_size`` without the controller).
    concurrency_limit: int = 0
    controller_adjustments_total: int = 0
    #: The controller's step token budget and its time-between-tokens target (0 without a controller).
    controller_token_budget: int = 0
    controller_target_itl_s: float = 0.0
    # --- speculative decoding -------------------------------------------------------------------------------
    spec_enabled: bool = False
    #: Share of draft tokens the model accepted, and tokens a speculating sequence gains per verification.
    spec_acceptance_rate: float = 0.0
    spec_tokens_per_step: float = 0.0

    def to_dict(self) -> dict[str, float | int | bool]:
        """Every field by name (plain numbers and a bool: JSON as it is)."""
        return {name: getattr(self, name) for name in _METRIC_TYPES}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EngineMetrics:
        """Read :meth:`to_dict`'s form back. Unknown keys are ignored and missing or unreadable values keep the
        field's default, so a snapshot from an engine of another version still reads."""
        values: dict[str, Any] = {}
        for name, kind in _METRIC_TYPES.items():
            value = data.get(name)
            if isinstance(value, (int, float)) and math.isfinite(value):  # bool is an int
                values[name] = kind(value)
        return cls(**values)


#: Field name -> the type :meth:`EngineMetrics.from_dict` converts a value to.
_METRIC_TYPES: dict[str, type] = {
    name: {"float": float, "int": int, "bool": bool}[kind]
    for name, kind in EngineMetrics.__annotations__.items()
}


# ---------------------------------------------------------------------------------------------------------------
# Hardware, models and recommendations


@dataclass(slots=True)
class GpuInfo:
    """One NVIDIA GPU as the driver (or torch) reports it."""

    index: int
    name: str
    total_bytes: int
    free_bytes: int
    compute_capability: tuple[int, int] | None


@dataclass(slots=True)
class HardwareInfo:
    """A snapshot of the machine's compute resources."""

    cpu_model: str
    physical_cores: int
    logical_cores: int
    avx2: bool
    avx512: bool
    avx512_bf16: bool
    amx: bool
    ram_total_bytes: int
    ram_available_bytes: int
    gpus: list[GpuInfo] = field(default_factory=list)
    gpu_reason: str = ""
    torch_cuda_available: bool = False
    torch_is_cpu_build: bool = True


@dataclass(slots=True)
class ModelInfo:
    """What a model is, read from its files without loading the weights."""

    path: Path
    format: str  # "safetensors", "gguf" or "pytorch"
    architecture: str
    model_type: str
    num_parameters: int | None
    stored_dtype: str
    weight_files: list[Path] = field(default_factory=list)
    file_bytes: int = 0


@dataclass(slots=True)
class Recommendation:
    """The level to load at, and the numbers behind it."""

    device: str  # "cuda" or "cpu"
    quantization: str  # "none" (fp32), "bf16", "fp16", "int8" or "int4"
    fits: str  # "yes", "tight" or "no"
    weights_bytes: int
    kv_bytes_per_token: int
    kv_budget_bytes: int
    free_bytes: int
    reason: str
    num_parameters: int = 0
    context_length: int = 0
