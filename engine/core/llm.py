"""``LLM``: load a model, start an engine over it, and generate."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self, cast

import psutil
import torch

from engine.api import (
    LEVEL_DTYPES,
    WEIGHT_LEVELS,
    EngineConfig,
    EngineMetrics,
    ModelLoadError,
    RequestOutput,
    SamplingParams,
    check_level,
)
from engine.core.llm_engine import LLMEngine
from engine.core.request import Prompt, RequestHandle
from engine.core.speculative import SpeculationRefused
from engine.loading.default_model import sampling_defaults
from engine.loading.loader import LoadedModel, load_model
from engine.loading.ollama import manifest_name
from engine.loading.recommend import recommend
from engine.model.autotune_progress import reporting
from engine.model.drafter import same_vocabulary
from engine.model.kv_cache import kv_bytes_per_token, resolve_kv_dtype
from engine.model.native import STILL_BUILDING, file_problem
from engine.system import hardware
from engine.system.memory import give_back

log = logging.getLogger("engine")

ProgressFn = Any
_CPU_KV_SHARE = 0.5  # at most half the free RAM goes to the KV cache by default


class LLM:
    """A loaded model with a running engine.

    Args:
        model: "default", an HF folder, or a .gguf file.
        device: "auto", "cpu" or "cuda"; an unusable CUDA request falls back to the CPU with a warning.
        dtype: "auto", "float32", "bfloat16" or "float16".
        quantization: "auto", "fp32" (alias "none"), "bf16", "fp16", "int8" or "int4" (see ``engine/quantization.py``).
            "auto" takes ``engine.loading.recommend``'s choice for this machine.
        progress: ``progress(fraction, stage)`` for a progress bar.
        start_loop: run the engine on its own thread. The app passes False and runs the same loop
            (``engine.core.loop.run_loop``) on a thread of its own.
        **engine_options: fields of :class:`EngineConfig` (``max_batch_size``, ``max_wait_ms``,
            ``kv_cache_bytes``, ...).
    """

    def __init__(
        self,
        model: str | Path = "default",
        device: str = "auto",
        dtype: str = "auto",
        quantization: str = "auto",
        progress: ProgressFn | None = None,
        start_loop: bool = True,
        quant_backend: str = "auto",
        **engine_options: Any,
    ) -> None:
        self.config = EngineConfig(**engine_options)  # TypeError on an unknown option, ValueError on a bad value
        hardware.configure_threads()
        if start_loop:
            self._set_up_on_the_loop_thread(lambda: self._set_up(model, device, dtype, quantization, progress,
                                                                 quant_backend))
        else:
            self._set_up(model, device, dtype, quantization, progress, quant_backend)

    def _set_up_on_the_loop_thread(self, set_up: Callable[[], None]) -> None:
        """Load and warm up on a new thread that then runs the engine's loop; wait until it is ready.

        Every torch op of the engine then runs on one thread. With OpenMP, each thread that runs parallel work
        keeps its own team of workers: a model loaded on the caller's thread and stepped on another leaves two
        teams contending for the cores, each waiting on the other's threads, and every step slows down (most on a
        machine with few cores; docs/BENCHMARKS.md).
        """
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            try:
                set_up()
            except BaseException as exc:  # noqa: BLE001 -- handed to the caller's thread, raised there
                failure.append(exc)
                ready.set()
                return
            self.engine.run_loop_here(started=ready.set)

        threading.Thread(target=run, name="hearth-engine", daemon=True).start()
        ready.wait()
        if failure:
            raise failure[0]

    def _set_up(self, model: str | Path, device: str, dtype: str, quantization: str, progress: ProgressFn | None,
                quant_backend: str) -> None:
        level = check_level(quantization)
        if level == "auto":
            # an explicit dtype means "this precision, no weight quantization"
            level = self._auto_level(model, device) if dtype == "auto" else "fp32"
        elif level == "file" and file_problem(wait=False) == STILL_BUILDING:
            level = self._level_while_building(model, device, progress)
        if dtype == "auto":
            dtype = LEVEL_DTYPES[level]
        self.quantization = level
        loaded = load_model(model, device=device, dtype=dtype, progress=progress, keep_blocks=level == "file")
        speculative = self.config.speculative
        draft = self._load_draft(loaded, speculative["draft_model"]) if isinstance(speculative, dict) else None
        try:
            if level in WEIGHT_LEVELS and progress is not None:
                progress(0.9, "quantize")

            bar = [0.9]  # where the layers built so far have taken the progress bar

            def layer_built(done: int, total: int) -> None:  # "quantize 3/30": the layers built (quantized) so far
                bar[0] = 0.9 + 0.04 * done / total
                if progress is not None:
                    progress(bar[0], f"quantize {done}/{total}")

            def tuning(what: str, count: int) -> None:  # each shape measured, named: the lm_head's may take long
                if progress is not None:
                    progress(bar[0], f"tune {what}")

            with reporting(tuning):
                self.engine = self._build_engine(loaded, level, quant_backend, draft, layer_built)
            self.engine.runner.enable_native(self.config.native)
            #: whether decode steps replay from CUDA graphs, and why not (``EngineConfig.cuda_graphs``)
            self.graph_status = "off (cuda_graphs=False)"
            if self.config.cuda_graphs:
                self.graph_status = self.engine.runner.enable_cuda_graphs(
                    self.config.max_batch_size, self.engine.max_model_len
                )
            if progress is not None:
                progress(0.95, "warm up")
            self._warm_up(loaded.path)
            #: the kernel shapes this load ran untimed, measured now while the model is idle, for the next load
            self.tuning = self.engine.runner.tune_in_background(self.engine.has_work)
        except torch.OutOfMemoryError as exc:
            del loaded
            self._release()
            raise ModelLoadError(
                "not enough memory for the KV cache; lower the KV-cache budget or the batch size"
            ) from exc
        except (ModelLoadError, SpeculationRefused):
            self.__dict__.pop("engine", None)
            del loaded
            self._release()
            raise
        except Exception as exc:  # noqa: BLE001 -- a file that loads but cannot run says so, in words
            summary = (str(exc).strip().splitlines() or [""])[0][:300]
            where = loaded.path
            self.__dict__.pop("engine", None)
            del loaded
            self._release()
            raise ModelLoadError(
                f"{where} loaded but cannot run ({type(exc).__name__}: {summary}). The file is damaged or its "
                "settings are impossible; re-download it, or pick another model."
            ) from None
        self.model_name = self._name_of(model, loaded.path)
        self.path = loaded.path
        self.device = str(loaded.device)
        self.dtype = str(loaded.dtype).removeprefix("torch.")
        self.device_reason = loaded.device_reason
        self.weights_bytes = self.engine.runner.weights_bytes
        self.num_parameters = loaded.num_parameters
        self.tokenizer = loaded.tokenizer
        #: ``SamplingParams`` keywords this model should start with (its generation_config.json, or a preset)
        self.sampling_defaults = sampling_defaults("default" if str(model) == "default" else loaded.path)
        if progress is not None:
            progress(1.0, "ready")

    @staticmethod
    def _name_of(model: str | Path, path: Path) -> str:
        """What the model is called (served as, listed as): for an Ollama blob (``blobs/sha256-…``) the name of its
        tag (``smollm2:135m``), as ``ollama list`` calls it; else the file's or folder's name."""
        if str(model) == "default":
            return "SmolLM2-135M-Instruct"
        try:
            tag = manifest_name(Path(model))
        except (OSError, ValueError):  # a damaged store: the blob keeps its own name
            tag = None
        return tag or Path(path).name

    @staticmethod
    def _auto_level(model: str | Path, device: str) -> str:
        try:
            rec = recommend(model, device=device)
            if rec.quantization == "file":
                # the block kernels need the native extension; while it is still being built in the background this
                # load runs without them rather than wait for the compiler (a later load finds it built)
                problem = file_problem(wait=False)
                if problem is not None:
                    log.info("the GGUF file's blocks cannot run as they are: %s", problem)
                    rec = recommend(model, device=device, block_kernels=False)
        except Exception:  # noqa: BLE001 -- the loader will report what is wrong with the model
            return "bf16"
        log.info("quantization auto -> %s: %s", rec.quantization, rec.reason)
        return rec.quantization

    @staticmethod
    def _level_while_building(model: str | Path, device: str, progress: ProgressFn | None) -> str:
        """The level a "file" load runs at while the native extension (its block kernels) is still being built in
        the background: the one "auto" picks without the block kernels. The load never waits for the compiler; the
        next load, once the build is done, runs the file's blocks."""
        try:
            level = recommend(model, device=device, block_kernels=False).quantization
        except Exception:  # noqa: BLE001 -- the loader will report what is wrong with the model
            level = "bf16"
        log.info("the 'file' precision's block kernels are still being built; this load runs %s (the file's own "
                 "blocks from the next load, once they are built)", level)
        if progress is not None:
            progress(0.0, f"block kernels still building: loading {level}")
        return level

    def _build_engine(
        self, loaded: LoadedModel, level: str, quant_backend: str, draft: torch.nn.Module | None,
        layer_built: Callable[[int, int], None] | None = None,
    ) -> LLMEngine:
        cfg = self.config
        kv_dtype = resolve_kv_dtype(cfg.kv_dtype, loaded.dtype, loaded.device)
        per_token = kv_bytes_per_token(loaded.config, kv_dtype)
        model_len = int(getattr(loaded.config, "max_position_embeddings", 0) or 4096)
        max_model_len = min(model_len, cfg.max_model_len or model_len)
        # every concurrent chat at the full context length: more is never needed
        cap = cfg.max_batch_size * -(-max_model_len // cfg.block_size) + 1
        budget = cfg.kv_cache_bytes or self._default_kv_budget(loaded.device, cap * per_token * cfg.block_size)
        num_blocks = int(min(budget // (per_token * cfg.block_size), cap))
        if num_blocks < 2:
            raise ModelLoadError(
                f"the KV-cache budget of {budget / 1e6:.1f} MB holds less than one block "
                f"({per_token * cfg.block_size / 1e6:.2f} MB); raise the KV-cache budget"
            )
        log.info("KV cache: %d blocks (%.0f MiB) for %d tokens x %d sequences", num_blocks,
                 num_blocks * per_token * cfg.block_size / 2**20, max_model_len, cfg.max_batch_size)
        return LLMEngine(
            loaded.model, loaded.tokenizer, cfg, num_blocks, kv_dtype, max_model_len, level, quant_backend, draft,
            layer_built,
        )

    @staticmethod
    def _load_draft(loaded: LoadedModel, path: str) -> torch.nn.Module:
        """The speculative draft model, on the target's device and dtype; its tokenizer must be the target's."""
        draft = load_model(path, device=str(loaded.device), dtype=str(loaded.dtype).removeprefix("torch."))
        if not same_vocabulary(loaded.tokenizer, draft.tokenizer):
            raise ValueError(
                f"the draft model {path} has a different tokenizer from the model's; speculative decoding needs a "
                "draft model of the same family (the same vocabulary)"
            )
        return draft.model

    @staticmethod
    def _default_kv_budget(device: torch.device, needed: int) -> int:
        """``needed`` (the context length x the concurrent sequences), or less where memory is short."""
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            return int(min(needed, free * 0.8))
        return int(min(needed, psutil.virtual_memory().available * _CPU_KV_SHARE))

    def _warm_up(self, path: Path) -> None:
        """One short request through prefill and decode, so the first user request does not pay for it."""
        start = time.perf_counter()
        handle = self.engine.submit([1, 2, 3, 4, 5, 6, 7, 8], SamplingParams(max_tokens=3, temperature=0.0))
        while not handle.done():
            self.engine.step()
        result = handle.result()
        if result.finish_reason == "error":  # e.g. weights that make NaN: every request would fail the same way
            raise ModelLoadError(
                f"{path} loaded but its first request failed ({result.error}). The file is damaged; "
                "re-download it, or pick another model."
            )
        self.engine.block_manager.reset_prefix_cache()
        self.engine.block_manager.num_prefix_queried_tokens = 0
        self.engine.block_manager.num_prefix_hit_tokens = 0
        self.engine.stats.reset()
        log.info("warm-up took %.2f s", time.perf_counter() - start)

    # --- generation --------------------------------------------------------------------------------------------
    def generate(
        self, prompts: Prompt | list[str] | list[list[int]], params: SamplingParams | None = None
    ) -> list[RequestOutput]:
        """Run all prompts through the engine concurrently; return outputs in prompt order."""
        is_one = isinstance(prompts, str) or (isinstance(prompts, list) and bool(prompts) and isinstance(prompts[0], int))
        batch = cast(list[Prompt], [prompts] if is_one else prompts)
        handles = [self.engine.submit(p, params) for p in batch]
        return self._wait_for(handles)

    def chat(self, messages: list[dict[str, str]], params: SamplingParams | None = None) -> RequestOutput:
        """Answer a conversation, formatted with the tokenizer's chat template."""
        return self._wait_for([self.engine.submit(messages, params)])[0]

    def _wait_for(self, handles: list[RequestHandle]) -> list[RequestOutput]:
        """The handles' outputs: waited for while a loop steps the engine, else stepped for here."""
        if not self.engine.is_alive:
            while not all(h.done() for h in handles):
                self.engine.step()
        return [h.result() for h in handles]  # a dying loop fails every request, so this always returns

    @property
    def decode_status(self) -> str:
        """How decode steps run: CUDA graphs on a GPU; natively or eager on a CPU (and why)."""
        if self.device.startswith("cuda"):
            return self.graph_status
        return self.engine.runner.native_status

    def metrics(self) -> EngineMetrics:
        """The engine's figures now (see :class:`~engine.api.EngineMetrics`)."""
        return self.engine.metrics()

    def close(self) -> None:
        """Stop the engine and free the model and the KV cache."""
        tuning = self.__dict__.pop("tuning", None)
        if tuning is not None:
            tuning.stop()  # within one timed call; it lets go of the candidates it measured
        engine = getattr(self, "engine", None)
        if engine is None:
            return
        engine.stop_loop()
        del self.engine, engine  # the last references, so that what _release frees includes the model
        self._release()

    @staticmethod
    def _release() -> None:
        give_back()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
