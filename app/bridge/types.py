"""The data the bridge's API takes and its signals carry: plain dataclasses and the names of choices."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from engine.api import QUANTIZATION_LEVELS, SPECULATIVE_METHODS, EngineMetrics

#: ``ModelInfo.device`` of a remote server's model.
REMOTE_DEVICE = "remote server"
#: The model spec the engine resolves to its bundled default model.
DEFAULT_MODEL_SPEC = "default"
DEVICES = ("auto", "cpu", "cuda")
#: The context length used when none is chosen (the engine clamps it to the model's own limit).
DEFAULT_CONTEXT = 4096
MIN_CONTEXT = 256
DTYPES = ("auto", "float32", "bfloat16", "float16")
#: What to drop from a chat longer than the context (``engine.core.context.OVERFLOW_POLICIES``), in words.
OVERFLOW_POLICIES = {"truncate_middle": "Drop turns from the middle (keep the system prompt and first turn)",
                     "rolling_window": "Drop the oldest turns (keep the system prompt)",
                     "stop": "Stop and say the chat is too long"}


@dataclass(slots=True)
class LoadSettings:
    """Engine settings that take effect on the next model load."""

    #: Concurrent chats: the engine's max batch size. The KV cache holds this many full contexts.
    max_batch_size: int = 4
    max_wait_ms: float = 5.0
    #: KV-cache budget in MiB; 0 lets the engine size it from free memory.
    kv_cache_mb: int = 0
    #: One of ``QUANTIZATION_LEVELS``; "auto" lets the engine pick from free memory.
    quantization: str = "auto"
    #: Longest prompt plus reply, in tokens; 0 takes the model's own limit, at most :data:`DEFAULT_CONTEXT`.
    context_length: int = 0
    #: One of :data:`OVERFLOW_POLICIES`: what to drop when a chat outgrows the context.
    overflow: str = "truncate_middle"
    #: Greedy replies repeat bitwise whatever else runs or is cached (``EngineConfig.deterministic``). On in the
    #: app: "Regenerate at temperature 0" must give the same answer. It costs speed, so the engine's default is off.
    deterministic: bool = True
    #: Speculative decoding (``EngineConfig.speculative``): "off", "ngram" or "self-int4"; replies are unchanged.
    #: "ngram" in the app: faster on a reply that quotes the chat, no loss on open chat (``engine.bench
    #: --speculative``, docs/BENCHMARKS.md); with repeatable replies it does not change a single bit of a greedy reply.
    speculative: str = "ngram"

    def __post_init__(self) -> None:
        if self.overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"overflow must be one of {', '.join(OVERFLOW_POLICIES)}, got {self.overflow!r}")
        if self.context_length < 0 or 0 < self.context_length < MIN_CONTEXT:
            raise ValueError(f"context_length must be 0 or at least {MIN_CONTEXT}, got {self.context_length}")
        if self.speculative not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative must be one of {', '.join(SPECULATIVE_METHODS)}, got {self.speculative!r}")
        if self.quantization not in QUANTIZATION_LEVELS:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATION_LEVELS)}, "
                             f"got {self.quantization!r}")
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {self.max_batch_size}")
        if self.max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must not be negative, got {self.max_wait_ms}")
        if self.kv_cache_mb < 0:
            raise ValueError(f"kv_cache_mb must not be negative, got {self.kv_cache_mb}")

    @property
    def kv_cache_bytes(self) -> int | None:
        return self.kv_cache_mb * 1024 * 1024 if self.kv_cache_mb else None

    @property
    def max_model_len(self) -> int:
        """The context the engine is given: the chosen length, or :data:`DEFAULT_CONTEXT`."""
        return self.context_length or DEFAULT_CONTEXT


@dataclass(slots=True)
class ModelInfo:
    """What ``model_loaded`` carries: the loaded model and where it runs."""

    spec: str
    model_name: str
    device: str
    dtype: str
    device_reason: str
    weights_bytes: int
    load_s: float
    #: The quantization level the model was loaded at ("fp32", "bf16", "fp16", "int8", "int4"; "" if unknown).
    quantization: str = ""
    #: ``SamplingParams`` keywords the model starts with (its generation_config.json or Hearth's preset).
    sampling_defaults: dict[str, Any] = field(default_factory=dict)
    #: The KV cache's size and the context it serves (0 when unknown or remote).
    kv_cache_bytes: int = 0
    context_length: int = 0
    #: The engine settings the model was loaded with (None for a remote server's model).
    settings: LoadSettings | None = None

    @property
    def precision(self) -> str:
        """The precision the weights run at, for labels: "int4" or "int8" for a quantized model (its compute dtype
        says nothing of that), the dtype's name ("bfloat16", "float16", "float32") for a float level, else the
        dtype as loaded (a remote model: its host)."""
        level = self.quantization
        return _FLOAT_LEVEL_DTYPES.get(level, level) if level and level != "auto" else self.dtype


#: The float quantization levels by the dtype they run in ("none" is the old name of fp32).
_FLOAT_LEVEL_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "none": "float32"}


#: The states of the native decode step's build (``engine.model.native.EXTENSION.state``).
NATIVE_BUILD_STATES = ("absent", "building", "ready", "failed")


@dataclass(frozen=True, slots=True)
class NativeBuild:
    """What ``native_build_changed`` carries: the engine's native decode step, built once per machine in the
    background while a model runs without it. ``state`` is one of :data:`NATIVE_BUILD_STATES` ("absent": no build
    was asked for); ``problem`` says why a "failed" one failed."""

    state: str
    problem: str = ""

    def __post_init__(self) -> None:
        if self.state not in NATIVE_BUILD_STATES:
            raise ValueError(f"state must be one of {', '.join(NATIVE_BUILD_STATES)}, got {self.state!r}")


@dataclass(slots=True)
class QuantizationAdvice:
    """What ``recommendation_ready`` carries: the recommended level for a model, and the numbers for each level."""

    spec: str
    device: str
    #: ``engine.api.Recommendation`` for the best level, or None if the model could not be inspected.
    recommendation: Any = None
    #: Level ("fp32", "bf16", "fp16", "int8", "int4") -> its ``Recommendation`` (``fits`` says if it fits).
    estimates: dict[str, Any] = field(default_factory=dict)
    #: Why there is no recommendation, in plain words ("" when there is one).
    error: str = ""


@dataclass(slots=True)
class ServerState:
    """What ``server_state_changed`` carries: whether "Serve on localhost" is serving, and where."""

    is_running: bool
    url: str = ""
    #: Why it is not running (empty after a plain stop).
    message: str = ""


@dataclass(slots=True)
class RequestInfo:
    """What ``request_finished`` carries."""

    request_id: str
    conversation_id: str
    finish_reason: str | None
    #: ttft_s, e2e_s, num_prompt_tokens, num_generated_tokens, tok_s (may be empty).
    metrics: dict[str, Any] = field(default_factory=dict)


#: The key of a ``metrics_updated`` dict's wall-clock time: the engine's (``EngineMetrics.time``) or the resource
#: monitor's.
SAMPLE_TIME = "time"
#: The names of the engine's figures in a ``metrics_updated`` dict (``EngineMetrics.to_dict()``), but its time.
ENGINE_FIGURES = frozenset(f.name for f in fields(EngineMetrics)) - {SAMPLE_TIME}


def engine_metrics_in(snapshot: Mapping[str, Any]) -> EngineMetrics | None:
    """The engine's figures in a ``metrics_updated`` dict, or None for a resource sample without any."""
    return EngineMetrics.from_dict(snapshot) if not ENGINE_FIGURES.isdisjoint(snapshot) else None


def resource_figures_in(snapshot: Mapping[str, Any]) -> dict[str, float]:
    """The resource monitor's figures in a ``metrics_updated`` dict (``engine.system.monitor``: memory, CPU, GPUs):
    every number that is neither an engine figure nor the time."""
    return {name: float(value) for name, value in snapshot.items()
            if name not in ENGINE_FIGURES and name != SAMPLE_TIME and isinstance(value, (int, float))}
