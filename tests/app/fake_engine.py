"""A small stand-in for the ``engine`` package, following its public API.

``make_fake_api()`` returns the :class:`~app.bridge.protocols.EngineApi` that ``EngineBridge(api=...)`` accepts,
as ``app.bridge.jobs.import_engine`` does for the real engine; mypy (``make check``) checks the fake against the
same Protocols as the real ``LLM``. Every type comes from ``engine.api``, the contracts the real engine uses, so
none is copied here. The fake streams a canned reply one word per ``step()``, batches every running request in
each step, honours ``handle.cancel()``, and reports ``metrics()`` as an ``engine.api.EngineMetrics``.
``FakeEngine`` implements ``engine.core.loop.Steppable``, so the bridge drives it with the engine's own
``run_loop``; its handles stream and give a ``result()`` as the real ones do, and it ``tokenize``s, so the MCP tool
loop runs over it. ``FakeEngine.replies`` scripts the next answers (a Hermes ``<tool_call>`` block makes the tool
loop call a tool). It imports neither torch nor Qt.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, ClassVar

import psutil

from app.bridge.protocols import EngineApi, LLMFactory
from app.bridge.types import NativeBuild
from app.chat.token_counter import COUNT_THREAD
from engine.api import (
    BYTES_PER_PARAM,
    EngineMetrics,
    HardwareInfo,
    ModelLoadError,
    Recommendation,
    SamplingParams,
    StepOutput,
    check_level,
)
from engine.core.context import fit_messages
from tests.app.fake_requests import FakeHandle, Request

FRANCE_REPLY = "The capital of France is **Paris**. It is also the largest city in France."
LONG_REPLY = (
    "Here is a longer answer, so there is time to stop it.\n\n"
    + " ".join(f"Sentence {i} adds a few more words to the reply." for i in range(60))
    + "\n\n```python\ndef greet(name):\n    return f\"Hello, {name}!\"  # friendly\n```\n"
)

_WORDS = re.compile(r"\s*\S+\s*")


def fake_hardware() -> HardwareInfo:
    """The machine the fake engine reports: 2 cores, 6 GiB free of 8, no GPU."""
    return HardwareInfo(
        cpu_model="Fake CPU 9000",
        physical_cores=2,
        logical_cores=2,
        avx2=True,
        avx512=False,
        avx512_bf16=False,
        amx=False,
        ram_total_bytes=8 * 1024**3,
        ram_available_bytes=6 * 1024**3,
        gpus=[],
        gpu_reason="No NVIDIA GPU was found (fake engine).",
    )


def reply_for(messages: list[dict[str, str]] | str) -> str:
    """The fake model's answer: Paris for the France question, a long text otherwise.

    Like the real engine, a trailing assistant message is continued (not answered): the rest of the reply
    it starts follows.
    """
    if not isinstance(messages, str) and messages and messages[-1]["role"] == "assistant":
        partial = messages[-1]["content"]
        for reply in (FRANCE_REPLY, LONG_REPLY):
            if reply.startswith(partial):
                return reply[len(partial):]
        return " and so on."
    text = messages if isinstance(messages, str) else messages[-1].get("content") or ""
    return FRANCE_REPLY if "France" in text else LONG_REPLY


class _FakeKVCache:
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


class _FakeRunner:
    def __init__(self, kv_bytes: int) -> None:
        self.kv = _FakeKVCache(kv_bytes)


class FakeEngine:
    """Thread-safe submit/cancel/wake, step() from one driver thread, like the real engine.

    ``fail_next_steps`` makes that many coming ``step()`` calls raise, as a broken model would.
    """

    def __init__(self, max_batch_size: int, step_delay_s: float, kv_bytes: int = 0) -> None:
        #: The KV cache's size, as the real engine's ``runner.kv.nbytes`` gives it.
        self.runner = _FakeRunner(kv_bytes)
        self._lock = threading.Condition()
        self._ids = itertools.count(1)
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._max_batch_size = max_batch_size
        self._step_delay_s = step_delay_s
        self._is_woken = False
        self._started_at = time.monotonic()
        self.is_alive = False
        self.loop_error: str | None = None
        self.fail_next_steps = 0
        self.num_steps = 0
        #: Largest number of requests that produced a token in the same step.
        self.max_batch_seen = 0
        self.num_generated_total = 0
        self.step_threads: set[str] = set()
        #: ``threading.get_ident()`` of every thread that stepped the engine.
        self.step_thread_ids: set[int] = set()
        #: The messages of every submit, in order.
        self.submitted: list[list[dict[str, str]] | str] = []
        #: The sampling parameters of every submit, in order.
        self.submitted_params: list[SamplingParams] = []
        #: The next answers, in order, before the canned ones of :func:`reply_for`.
        self.replies: deque[str] = deque()
        self.tokenizer = SimpleNamespace(chat_template="{{ messages }}")  # a template that renders no tools
        self.prompts: list[Any] = []

    def tokenize(self, prompt: Any, tools: list[dict[str, Any]] | None = None) -> list[int]:
        """About one token per 4 characters of the prompt (and tools), each the prompt's number (for submit).

        The chat's context meter counts on a thread of its own: those prompts are no model's, so not recorded."""
        num_tokens = max(1, len(json.dumps([prompt, tools or []])) // 4)
        if threading.current_thread().name == COUNT_THREAD:
            return [0] * num_tokens
        with self._lock:
            self.prompts.append(prompt)
            return [len(self.prompts) - 1] * num_tokens

    def submit(self, messages: Any, params: SamplingParams,
               priority: int = 0, overflow: str | None = None) -> FakeHandle:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, not {type(params).__name__}")
        if messages and not isinstance(messages, str) and isinstance(messages[0], int):
            messages = self.prompts[messages[0]]  # token ids from tokenize()
        words = _WORDS.findall(self.replies.popleft() if self.replies else reply_for(messages))
        num_sent = len(messages)
        if overflow is not None and not isinstance(messages, str):
            messages = self.fit_context(messages, params, overflow)
        with self._lock:
            self.submitted.append(messages if isinstance(messages, str) else [dict(m) for m in messages])
            self.submitted_params.append(params)
            request = Request(f"eng-{next(self._ids)}", words, params)
            self._waiting.append(request)
            self._lock.notify_all()
        handle = FakeHandle(self._lock, request)
        handle.num_dropped_messages = num_sent - len(messages)
        return handle

    @staticmethod
    def fit_context(messages: list[dict[str, str]], params: SamplingParams, overflow: str,
                    count_tokens: Any = None) -> list[dict[str, str]]:
        """Same role as ``LLMEngine.fit_context``: the chat cut to the fake's context, 200 words. ``count_tokens``
        (a tools chat's measure, in the fake tokenizer's units) is not used: the fake's context counts words."""
        return fit_messages(messages, 200, lambda ms: sum(len(m["content"].split()) for m in ms), overflow)

    def has_work(self) -> bool:
        with self._lock:
            return bool(self._waiting or self._running)

    def wait_for_work(self, timeout_s: float) -> bool:
        with self._lock:
            has_work = self._lock.wait_for(lambda: bool(self._waiting or self._running or self._is_woken),
                                           timeout_s)
            self._is_woken = False
            return has_work

    def wake(self) -> None:
        with self._lock:
            self._is_woken = True
            self._lock.notify_all()

    def step(self) -> list[StepOutput]:
        self.step_threads.add(threading.current_thread().name)
        self.step_thread_ids.add(threading.get_ident())
        with self._lock:
            if self.fail_next_steps > 0:
                self.fail_next_steps -= 1
                raise RuntimeError("the fake model broke")
            while self._waiting and len(self._running) < self._max_batch_size:
                self._running.append(self._waiting.popleft())
            batch = list(self._running)
        if not batch:
            return []
        time.sleep(self._step_delay_s)
        outputs: list[StepOutput] = []
        with self._lock:
            self.num_steps += 1
            self.max_batch_seen = max(self.max_batch_seen, sum(not r.is_cancelled for r in batch))
            for request in batch:
                outputs.append(self._advance(request))
                request.deliver(outputs[-1])
                if outputs[-1].finished:
                    self._running.remove(request)
        return outputs

    def _advance(self, request: Request) -> StepOutput:
        if request.is_cancelled:
            return self._finish(request, "", "abort")
        word = request.words.popleft()
        request.num_generated += 1
        self.num_generated_total += 1
        if request.first_token_at is None:
            request.first_token_at = time.monotonic()
        if not request.words:
            return self._finish(request, word, "stop")
        if request.num_generated >= request.params.max_tokens:
            return self._finish(request, word, "length")
        return StepOutput(request.request_id, word, [request.num_generated], False)

    @staticmethod
    def _finish(request: Request, text: str, reason: str) -> StepOutput:
        now = time.monotonic()
        e2e = now - request.submitted_at
        ttft = (request.first_token_at or now) - request.submitted_at
        decode_s = max(now - (request.first_token_at or now), 1e-6)
        metrics = {"ttft_s": ttft, "e2e_s": e2e, "num_prompt_tokens": 12,
                   "num_generated_tokens": request.num_generated,
                   "tok_s": request.num_generated / decode_s}
        ids = [request.num_generated] if text else []
        return StepOutput(request.request_id, text, ids, True, reason, metrics)

    def fail_all(self, message: str) -> list[StepOutput]:
        with self._lock:
            requests = [*self._running, *self._waiting]
            self._running.clear()
            self._waiting.clear()
        outputs = [StepOutput(r.request_id, "", [], True, "error", {}, message) for r in requests]
        for request, out in zip(requests, outputs, strict=True):
            request.deliver(out)
        return outputs

    def metrics(self) -> EngineMetrics:
        with self._lock:
            running, waiting = len(self._running), len(self._waiting)
            generated = self.num_generated_total
        elapsed = max(time.monotonic() - self._started_at, 1e-6)
        batch = self._max_batch_size
        return EngineMetrics(
            time=time.time(), num_running=running, num_waiting=waiting,
            kv_cache_usage=running / batch, kv_blocks_used=running * 4, kv_blocks_total=batch * 4,
            throughput_tok_s=generated / elapsed, num_generated_tokens_total=generated,
            ttft_p50=0.01, ttft_p90=0.02, ttft_p99=0.03, itl_p50=0.01, itl_p99=0.02, e2e_p50=0.5, e2e_p99=1.0,
            batch_efficiency=1.0, concurrency_limit=batch,
        )


class FakeLLM:
    """``engine.LLM`` look-alike. ``model`` is "default" or an existing folder/.gguf path."""

    instances: ClassVar[list[FakeLLM]] = []

    def __init__(self, model: str, device: str = "auto", dtype: str = "auto", quantization: str = "auto",
                 max_batch_size: int = 16, max_wait_ms: float = 5.0, kv_cache_bytes: int | None = None,
                 max_model_len: int | None = None, progress: Callable[[float, str], None] | None = None,
                 start_loop: bool = True,
                 deterministic: bool = False, speculative: str = "off", *, load_delay_s: float = 0.0,
                 step_delay_s: float = 0.01) -> None:
        quantization = check_level(quantization)
        self.deterministic = deterministic
        self.speculative = speculative
        if start_loop:
            raise AssertionError("the bridge drives the loop itself; it must pass start_loop=False")
        stages = ["Reading config", "Loading weights", "Allocating KV cache"]
        for i, stage in enumerate(stages):
            if progress is not None:
                progress(i / len(stages), stage)
            time.sleep(load_delay_s / len(stages))
            if i == 0 and model != "default" and not Path(model).exists():
                raise ModelLoadError(f"No model found at {model}. "
                                     "Pick a Hugging Face folder or a .gguf file.")
        self.model_name = "fake-smollm" if model == "default" else Path(model).name
        self.device = "cpu" if device == "auto" else device
        self.dtype = "bfloat16" if dtype == "auto" else dtype
        self.device_reason = "No GPU was found, so the model runs on the CPU."
        #: What the constructor was asked for, and the level used ("auto" resolves as the fake recommends).
        self.requested_quantization = quantization
        self.quantization = recommend(model).quantization if quantization == "auto" else quantization
        self.weights_bytes = estimate(model, self.quantization).weights_bytes
        self.max_batch_size = max_batch_size
        self.kv_cache_bytes = kv_cache_bytes
        self.max_model_len = max_model_len
        self.sampling_defaults = {"temperature": 0.3, "top_p": 0.3, "repetition_penalty": 1.1, "repeat_last_n": 64} \
            if model == "default" else {}
        self.engine = FakeEngine(max_batch_size, step_delay_s, kv_cache_bytes or 0)
        self.is_closed = False
        #: ``threading.get_ident()`` of the thread that loaded the model, and of the one that closed it (0: open).
        self.load_thread = threading.get_ident()
        self.close_thread = 0
        FakeLLM.instances.append(self)

    def metrics(self) -> EngineMetrics:
        return self.engine.metrics()

    def close(self) -> None:
        self.is_closed = True
        self.close_thread = threading.get_ident()


#: The fake model's size: a 4-billion-parameter model, so int8 fits in the fake's 6 GiB of free RAM and bf16 does not.
FAKE_NUM_PARAMETERS = 4_000_000_000
_KV_PER_TOKEN = 2 * 32 * 8 * 128 * 2
_CONTEXT = 4096


def estimate(model: Any, level: str, hardware: Any = None, context_length: int | None = None,
             device: str = "auto", num_chats: int = 1, plans: Any = None) -> Recommendation:
    """Same role as ``engine.loading.recommend.estimate``: the numbers for loading ``model`` at ``level``."""
    if model != "default" and not Path(str(model)).exists():
        raise ValueError(f"model: {model!r} is not a config, a model folder, a .gguf file or 'default'")
    level = "int8" if level == "auto" else level
    info = hardware if hardware is not None else fake_hardware()
    free = info.ram_available_bytes
    context = context_length or _CONTEXT
    if level == "file":  # the fake model is no GGUF file: the real estimate says so, and fits "no"
        return Recommendation("cpu", level, "no", 0, _KV_PER_TOKEN, _KV_PER_TOKEN * context, free,
                              "The 'file' precision runs a GGUF file's own blocks on the CPU; this model is not a "
                              "GGUF file.", FAKE_NUM_PARAMETERS, context)
    weights = int(FAKE_NUM_PARAMETERS * BYTES_PER_PARAM[level])
    need = weights + _KV_PER_TOKEN * context
    fits = "no" if need > free * 0.95 else "tight" if need > free * 0.75 else "yes"
    return Recommendation("cpu", level, fits, weights, _KV_PER_TOKEN, _KV_PER_TOKEN * context, free,
                          f"{level} weights ({weights / 1e9:.1f} GB) fit in the fake's free RAM.",
                          FAKE_NUM_PARAMETERS, context)


def recommend(model: Any, hardware: Any = None, context_length: int | None = None,
              device: str = "auto", num_chats: int = 1, block_kernels: bool = True, plans: Any = None) -> Recommendation:
    """Same role as ``engine.loading.recommend.recommend``: the best level that fits (int8 for the fake model, which
    is no GGUF file: ``block_kernels`` changes nothing)."""
    for level in ("bf16", "int8", "int4"):
        rec = estimate(model, level, hardware, context_length, device)
        if rec.fits != "no":
            return rec
    return rec


class FakeSampler:
    """Same role as ``engine.system.monitor.Sampler``: process memory plus the engine's metrics, per interval."""

    def __init__(self, interval_s: float = 1.0, metrics_source: Callable[[], EngineMetrics | None] | None = None,
                 on_sample: Callable[[dict[str, float]], None] | None = None) -> None:
        self._interval_s = interval_s
        self._metrics_source = metrics_source
        self._on_sample = on_sample
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            sample: dict[str, float] = {"time": time.time(),
                                        "process_rss_bytes": float(psutil.Process().memory_info().rss)}
            metrics = self._metrics_source() if self._metrics_source is not None else None
            if metrics is not None:  # as the real sampler does: the figures by name, all numbers
                sample.update((name, float(value)) for name, value in metrics.to_dict().items() if name != "time")
            if self._on_sample is not None:
                self._on_sample(sample)
            if self._stop.wait(self._interval_s):
                return


class FakeNativeBuild:
    """Same role as ``engine.model.native.EXTENSION``'s state: a test sets :attr:`state` (and :attr:`problem`) as the
    build would go; the bridge reads them by calling it."""

    def __init__(self, state: str = "absent", problem: str = "") -> None:
        self.state = state
        self.problem = problem

    def __call__(self) -> NativeBuild:
        return NativeBuild(self.state, self.problem)


def make_fake_api(load_delay_s: float = 0.0, step_delay_s: float = 0.01,
                  native_build: FakeNativeBuild | None = None) -> EngineApi:
    """Return the engine's functions, with an LLM that loads and steps with the given delays, and a native decode
    step that is never asked for unless ``native_build`` says otherwise."""

    def llm(model: str, **options: Any) -> FakeLLM:
        return FakeLLM(model, load_delay_s=load_delay_s, step_delay_s=step_delay_s, **options)

    return EngineApi(
        LLM=llm,
        detect_hardware=fake_hardware,
        recommend=recommend,
        estimate=estimate,
        Sampler=FakeSampler,
        inspect_model=inspect_model,
        discover_models=discover_models,
        native_build=native_build or FakeNativeBuild(),
    )


def inspect_model(model: str) -> None:
    """Same role as ``engine.loading.validate.inspect_model``: a missing path raises ``ModelLoadError``."""
    if model != "default" and not Path(model).exists():
        raise ModelLoadError(f"No model found at {model}. Pick a Hugging Face folder or a .gguf file.")


#: What the fake ``discover_models`` finds: one model Hearth runs and one it cannot.
FOUND_MODELS = [
    {"name": "SmolLM2-135M-Instruct", "path": "default", "source": "huggingface", "format": "safetensors",
     "architecture": "LlamaForCausalLM", "model_type": "llama", "num_parameters": 134_515_008,
     "quantization": "BF16", "size_bytes": 269_060_000, "context_length": 8192, "runnable": True, "reason": "",
     "fits": "yes", "recommended_level": "bf16", "fit_reason": "bf16 fits."},
    {"name": "whisper-tiny", "path": "/models/whisper-tiny", "source": "lmstudio", "format": "safetensors",
     "architecture": "WhisperForConditionalGeneration", "model_type": "whisper", "num_parameters": 37_000_000,
     "quantization": "F32", "size_bytes": 151_000_000, "context_length": None, "runnable": False,
     "reason": "Hearth runs text models; whisper is a speech model.", "fits": None, "recommended_level": None,
     "fit_reason": ""},
]


class _Found:
    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def to_json(self) -> dict[str, Any]:
        return dict(self._data)


def discover_models(home: Path | None = None, extra_dirs: Sequence[Path] = (),
                    hardware: HardwareInfo | None = None) -> list[_Found]:
    """Same role as ``engine.loading.discovery.discover_models``: :data:`FOUND_MODELS`, plus one "user" model
    per added folder."""
    extra = [{**FOUND_MODELS[0], "name": Path(d).name, "path": str(d), "source": "user"} for d in extra_dirs]
    return [_Found(m) for m in FOUND_MODELS + extra]


if TYPE_CHECKING:  # mypy (make check) proves the fake is what the bridge takes the engine for
    _FAKE_LLM: LLMFactory = FakeLLM
