"""What the bridge uses of the engine, named as Protocols, so that mypy sees any drift.

The bridge (``engine_bridge.py``, ``model_lifecycle.py``, ``loop.py``, ``jobs.py``) reaches the engine through
these types only: :class:`EngineApi` (the functions it calls, built by ``jobs.import_engine``), the loaded model
(:class:`BridgedLLM`) and its engine (:class:`BridgedEngine`). The real ``engine.core.llm.LLM`` must satisfy them
(``import_engine`` assigns it to :attr:`EngineApi.LLM`, where mypy checks it), and so must the test fake
(``tests/app/fake_engine.py``, checked by ``make check`` too).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from app.bridge.types import NativeBuild
from engine.api import EngineMetrics, HardwareInfo, Recommendation, SamplingParams
from engine.core.loop import Steppable

#: ``progress(fraction, stage)`` during a load.
ProgressFn = Callable[[float, str], None]


class RequestHandle(Protocol):
    """The bridge's end of one engine request (``engine.core.request.RequestHandle``)."""

    @property
    def request_id(self) -> str: ...

    @property
    def num_dropped_messages(self) -> int:
        """Messages of the chat left out to fit the context (``engine.core.context``)."""
        ...

    def cancel(self) -> None: ...


class KVCache(Protocol):
    @property
    def nbytes(self) -> int: ...


class Runner(Protocol):
    @property
    def kv(self) -> KVCache: ...


class BridgedEngine(Steppable, Protocol):
    """``LLM.engine`` as the bridge uses it: the step loop's :class:`Steppable`, plus submitting requests and
    the KV cache's size (``ModelInfo.kv_cache_bytes``), and its tokenizer (the chat's context meter)."""

    @property
    def runner(self) -> Runner: ...

    def submit(self, prompt: list[dict[str, str]] | str, params: SamplingParams, /, *,
               overflow: str | None = None) -> RequestHandle: ...

    def tokenize(self, prompt: list[dict[str, str]] | str, /) -> list[int]:
        """A prompt's token ids: text, or messages through the chat template (the context meter counts them)."""
        ...


class BridgedLLM(Protocol):
    """A loaded model, as the bridge uses it (``engine.core.llm.LLM``)."""

    @property
    def model_name(self) -> str: ...

    @property
    def device(self) -> str: ...

    @property
    def dtype(self) -> str: ...

    @property
    def device_reason(self) -> str: ...

    @property
    def weights_bytes(self) -> int: ...

    @property
    def quantization(self) -> str: ...

    @property
    def sampling_defaults(self) -> Mapping[str, float]: ...

    @property
    def engine(self) -> BridgedEngine: ...

    def close(self) -> None: ...


class LLMFactory(Protocol):
    """``engine.LLM`` as the bridge calls it: every option the app's ``LoadSettings`` sets, and no loop thread."""

    def __call__(self, model: str, *, device: str, dtype: str, quantization: str, max_batch_size: int,
                 max_model_len: int, max_wait_ms: float, kv_cache_bytes: int | None, deterministic: bool,
                 speculative: str, progress: ProgressFn, start_loop: bool) -> BridgedLLM: ...


class ResourceSampler(Protocol):
    """The resource monitor (``engine.system.monitor.Sampler``)."""

    def start(self) -> None: ...

    def stop(self, timeout: float = ...) -> None: ...


class SamplerFactory(Protocol):
    def __call__(self, interval_s: float, *, metrics_source: Callable[[], EngineMetrics | None],
                 on_sample: Callable[[dict[str, float]], None]) -> ResourceSampler: ...


class Estimator(Protocol):
    """``engine.loading.recommend.estimate``: the numbers for one level."""

    def __call__(self, model: str, level: str, /, *, device: str, context_length: int | None,
                 num_chats: int, plans: Any = None) -> Recommendation: ...


class Recommender(Protocol):
    """``engine.loading.recommend.recommend``: the best level that fits (the "file" level only with
    ``block_kernels``)."""

    def __call__(self, model: str, /, *, device: str, context_length: int | None,
                 num_chats: int, block_kernels: bool, plans: Any = None) -> Recommendation: ...


class FoundModel(Protocol):
    """One model on disk (``engine.loading.describe.FoundModel``)."""

    def to_json(self) -> dict[str, Any]: ...


class ModelFinder(Protocol):
    """``engine.loading.discovery.discover_models``."""

    def __call__(self, *, extra_dirs: Sequence[Path]) -> Sequence[FoundModel]: ...


#: An engine that builds no native decode step.
NO_NATIVE_BUILD = NativeBuild("absent")


@dataclass(frozen=True, slots=True)
class EngineApi:
    """The engine functions the bridge calls: ``jobs.import_engine()`` for the real engine, or a test fake."""

    LLM: LLMFactory
    detect_hardware: Callable[[], HardwareInfo]
    recommend: Recommender
    estimate: Estimator
    Sampler: SamplerFactory
    #: Raises ``ModelLoadError`` for a model that cannot load, judged from its files.
    inspect_model: Callable[[str], object]
    discover_models: ModelFinder
    #: The native decode step's build now (``engine.model.native.EXTENSION.state``); reads only.
    native_build: Callable[[], NativeBuild] = lambda: NO_NATIVE_BUILD
    #: ``engine.model.kernel_plans.cached_plans(deterministic)``: which kernels each shape will run on this CPU, as
    #: the plan cache stands (the estimates count the packed copies those kernels hold); None: first choices.
    kernel_plans: Callable[[bool], Any] = lambda deterministic: None
