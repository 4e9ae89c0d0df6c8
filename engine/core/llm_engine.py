"""The engine: requests in, one ``step()`` at a time, text deltas out.

Split along vLLM's seam: :class:`~engine.core.intake.Intake` takes requests in (prompts, checks, the queue);
:meth:`LLMEngine.step` drains it, expires deadlines, lets the scheduler pick a batch and hands it to
:class:`~engine.core.executor.BatchExecutor` (the model, sampling, verifying speculative drafts), then reports
to the concurrency controller; :class:`~engine.core.output.OutputProcessor` turns the tokens into outputs for
each request's handle. A step that raises fails the requests of its batch with ``finish_reason="error"``; the
others go on. ``submit``, ``cancel`` and ``wake`` are thread-safe; ``step`` runs on one thread at a time, driven
by :func:`engine.core.loop.run_loop` on the engine's own thread (``start_loop``) or on the app's bridge, or
called directly (tests, benchmarks).
"""
from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

import psutil
import torch

from engine.api import MAX_SEED, EngineConfig, EngineMetrics, SamplingParams, StepOutput
from engine.core.block_manager import BlockManager
from engine.core.controller import ConcurrencyController, StepReport
from engine.core.executor import BatchExecutor
from engine.core.intake import Intake
from engine.core.loop import run_loop
from engine.core.metrics import EngineStats
from engine.core.output import OutputProcessor
from engine.core.request import OutputCallback, Prompt, RequestHandle
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from engine.core.speculative import make_speculator
from engine.model.grammar import GrammarCompiler
from engine.model.runner import ModelRunner
from engine.model.sampler import Sampler
from engine.system.memory import trim_heap

log = logging.getLogger("engine")

#: seconds an idle engine keeps its steps' temporaries in the heap before giving them back (``trim_heap``). Pages
#: given back are faulted in again by the next request: trimmed at once, the next 1,000-token 8B prefill ran at
#: 47-51 tok/s against 52-55 kept (alternating rounds 8 s apart, a 2-core EPYC VM). The heap keeps at most
#: ``engine.system.memory.KEEP_FREED`` meanwhile.
HEAP_IDLE_TRIM_S = 60.0


class LLMEngine:
    """Continuous-batching engine over one loaded model."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        config: EngineConfig,
        num_blocks: int,
        kv_dtype: torch.dtype,
        max_model_len: int,
        quantization: str = "fp32",
        quant_backend: str = "auto",
        draft_model: torch.nn.Module | None = None,
        layer_built: Callable[[int, int], None] | None = None,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.block_manager)
        self.runner = ModelRunner(
            model, num_blocks, config.block_size, kv_dtype, quantization, quant_backend, config.deterministic,
            config.native, layer_built,
        )
        self.block_manager.copy_kv = self.runner.kv.copy_prefix
        self.block_manager.resident_blocks = max(1, config.prefix_cache_bytes * num_blocks // max(1, self.runner.kv.nbytes))
        self.sampler = Sampler()
        self.speculator = make_speculator(
            config, self.runner, self.sampler, draft_model, num_blocks, kv_dtype, quantization, quant_backend
        )
        self.stats = EngineStats(max_batch_size=config.max_batch_size)
        self.controller = (
            ConcurrencyController(config.max_batch_size, config.max_num_batched_tokens)
            if config.adaptive_concurrency else None
        )
        self._memory_fraction: float | None = None
        self._memory_checked = -math.inf
        self.eos_ids = _eos_ids(model, tokenizer)
        self.grammars = GrammarCompiler(tokenizer, self.runner.config.vocab_size, self.eos_ids)
        self.intake = Intake(
            tokenizer, config, max_model_len, self.runner.config.vocab_size, self.block_manager, self.scheduler,
            self.grammars, self.eos_ids, lambda: self.loop_error,
        )
        self.output = OutputProcessor(self.scheduler, self.stats, self.sampler, self.speculator)
        self.executor = BatchExecutor(self.runner, self.sampler, self.speculator, self.scheduler, self.grammars,
                                      self.output, self.stats)
        self._requests = self.output.requests
        self._cv = self.intake.cv
        self._step_lock = threading.Lock()
        self._is_woken = False  # wake() was called; the next wait_for_work returns at once
        self._idle_since: float | None = None  # when the last step left no work, until the heap is trimmed
        self._loop_thread: threading.Thread | None = None
        self._stop = threading.Event()
        #: True while a loop (``start_loop`` or the app's bridge) drives this engine.
        self.is_alive = False
        #: Why the last loop over this engine died, or None; set by ``run_loop``.
        self.loop_error: str | None = None

    # --- requests (engine/core/intake.py) ----------------------------------------------------------------------
    def tokenize(self, prompt: Prompt, tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Token ids of a prompt: text, ids, or chat messages (through the tokenizer's chat template, which
        renders ``tools``, OpenAI-style function definitions, when given)."""
        return self.intake.tokenize(prompt, tools)

    def submit(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        priority: int = 0,
        request_id: str | None = None,
        on_output: OutputCallback | None = None,
        overflow: str | None = None,
    ) -> RequestHandle:
        """Queue a request without blocking. Lower ``priority`` values run first (0 = interactive chat).

        ``on_output(step_output)`` is called on the stepping thread for each output (see ``RequestHandle``).
        ``overflow`` (``engine.core.context.OVERFLOW_POLICIES``) says what to drop from a chat longer than the
        context; None rejects it. The handle's ``num_dropped_messages`` says how many were dropped.
        """
        params = params or SamplingParams()
        if params.n > 1:
            raise ValueError("n > 1 asks for several requests: submit it with submit_n")
        num_sent = len(prompt)
        if overflow is not None and isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            prompt = self.fit_context(cast(list[dict[str, str]], prompt), params, overflow)
        handle = self.intake.submit(self.tokenize(prompt), [params], priority, [request_id], [on_output],
                                    self.cancel)[0]
        if overflow is not None and isinstance(prompt, list):
            handle.num_dropped_messages = num_sent - len(prompt)
        return handle

    def fit_context(self, messages: list[dict[str, str]], params: SamplingParams, overflow: str,
                    count_tokens: Callable[[list[dict[str, str]]], int] | None = None) -> Prompt:
        """``messages`` cut to fit the context with room for the reply, by ``overflow``'s policy; ``count_tokens``
        measures a cut chat as it will be sent (``Intake.fit_context``)."""
        return self.intake.fit_context(messages, params, overflow, count_tokens)

    def submit_n(
        self,
        prompt: Prompt,
        params: SamplingParams,
        priority: int = 0,
        on_outputs: list[OutputCallback | None] | None = None,
    ) -> list[RequestHandle]:
        """Queue ``params.n`` requests over the same prompt and return their handles.

        The first computes the prompt; the others wait until it has, then take its KV blocks from the prefix
        cache (full blocks are shared, not copied). A seeded request's i-th sequence uses ``seed + i``.
        """
        n = params.n
        each = [replace(params, n=1, seed=None if params.seed is None else (params.seed + i) % (MAX_SEED + 1))
                for i in range(n)]
        return self.intake.submit(self.tokenize(prompt), each, priority, [None] * n, on_outputs or [None] * n,
                                  self.cancel)

    def prepare(self, params: SamplingParams) -> None:
        """Check and compile ``params``' grammar now (the first one builds the tokenizer's automaton, the costly
        part), so ``submit`` does not pay for it on the caller's event loop. ``ValueError`` for a bad schema."""
        self.grammars.matcher(params)

    def cancel(self, request_id: str) -> None:
        self.intake.cancel(request_id)

    # --- loop --------------------------------------------------------------------------------------------------
    def has_work(self) -> bool:
        return self.intake.has_work() or self.scheduler.has_work()

    def wait_for_work(self, timeout_s: float) -> bool:
        """Block until there is something to step, ``wake()`` is called, or ``timeout_s`` passes; first give the
        heap back to the system if the engine has been idle for ``HEAP_IDLE_TRIM_S``."""
        if self._idle_since is not None and time.monotonic() - self._idle_since >= HEAP_IDLE_TRIM_S:
            if not self.has_work():
                trim_heap()  # the steps' temporaries, kept in the heap while requests came, go back to the system
            self._idle_since = None
        with self._cv:
            if not self.has_work() and not self._is_woken:
                self._cv.wait(timeout_s)
            self._is_woken = False
            return self.has_work()

    def wake(self) -> None:
        """End a ``wait_for_work`` now (or make the next one return at once): a loop has something to do."""
        with self._cv:
            self._is_woken = True
            self._cv.notify_all()

    # --- the step ----------------------------------------------------------------------------------------------
    def _drain_inbox(self, outputs: list[StepOutput]) -> None:
        ready, cancels = self.intake.drain()
        for req in ready:
            self._requests[req.seq.request_id] = req
            self.scheduler.add(req.seq)
        for rid in cancels:
            cancelled = self.intake.release(rid) or self._requests.get(rid)
            if cancelled is None:
                continue
            self.scheduler.abort(rid)
            cancelled.finish_reason = "abort"
            outputs.append(self.output.finish(cancelled, ""))
        self._expire(outputs)

    def _expire(self, outputs: list[StepOutput]) -> None:
        """End the requests whose deadline has passed: their text so far stays, their blocks are freed."""
        now = time.monotonic()
        for req in [r for r in self._requests.values() if r.deadline is not None and now >= r.deadline]:
            timeout_s = req.seq.params.timeout_s
            started = req.metrics.first_token_time is not None
            self.scheduler.abort(req.seq.request_id)
            req.finish_reason = "timeout"
            error = None if started else (
                f"the request waited {timeout_s:g} s (its timeout) without starting: the engine is busy; "
                "retry later or allow a longer timeout"
            )
            outputs.append(self.output.finish(req, "", error=error))

    def step(self) -> list[StepOutput]:
        """Run one engine iteration; return what each touched request produced.

        If the model, the sampler or the bookkeeping raises, the requests of this step finish with
        ``finish_reason="error"`` and a message, and the engine stays usable for the rest.
        """
        with self._step_lock:
            outputs: list[StepOutput] = []
            self._drain_inbox(outputs)
            delay = self.scheduler.admission_delay_s()
            while delay > 0:  # until the window from the oldest arrival ends, or the batch is full
                with self._cv:
                    self._cv.wait(delay)  # an arrival wakes us early; then gather it into this batch
                self._drain_inbox(outputs)
                delay = self.scheduler.admission_delay_s()
            if self.speculator is not None:
                self.speculator.plan(self.scheduler.running, self._can_speculate, self.scheduler.token_budget)
            batch = self.scheduler.schedule()
            if not batch.seqs:
                return outputs
            top = min(self.scheduler.running, key=lambda s: s.sort_key, default=None)
            top_req = None if top is None else self._requests.get(top.request_id)
            top_before = None if top_req is None else top_req.metrics.last_token_time
            try:
                self.executor.run(batch, outputs)
            except Exception as exc:
                log.exception("engine step failed; failing its %d requests", len(batch.seqs))
                outputs += self.output.fail_seqs(batch.seqs, _failure(exc))
            if not self.has_work():
                self._idle_since = time.monotonic()  # the heap goes back after HEAP_IDLE_TRIM_S of this
            if self.controller is not None:
                top_after = None if top_req is None else top_req.metrics.last_token_time
                itl = None if top_before is None or top_after is None else top_after - top_before
                outranks = top is not None and any(
                    seq.priority > top.priority for seq in (*self.scheduler.running, *self.scheduler.waiting)
                )
                self._control(itl or None, alone=len(batch.seqs) == 1, outranks=outranks)
            return outputs

    def _control(self, top_itl_s: float | None, alone: bool, outranks: bool) -> None:
        """Report this step to the concurrency controller and apply its knobs to the scheduler."""
        assert self.controller is not None
        now = time.monotonic()
        if now - self._memory_checked > 1.0:  # a /proc read: once a second is plenty
            self._memory_checked = now
            rss, available = psutil.Process().memory_info().rss, psutil.virtual_memory().available
            self._memory_fraction = rss / (rss + available)
        bm, sched = self.block_manager, self.scheduler
        self.controller.observe(StepReport(
            now=now,
            num_running=sched.num_running,
            num_waiting=sched.num_waiting,
            top_itl_s=top_itl_s,
            top_alone=alone,
            kv_free_fraction=bm.num_free_blocks / max(1, bm.num_usable_blocks),
            memory_fraction=self._memory_fraction,
            top_outranks=outranks,
        ))
        sched.max_running = self.controller.limit
        sched.token_budget = self.controller.token_budget
        sched.window_scale = self.controller.window_scale

    def _can_speculate(self, seq: Sequence) -> bool:
        """Grammar-constrained and logprob requests decode plainly; so does one near its end or the context's."""
        req = self._requests.get(seq.request_id)
        return (
            req is not None and req.matcher is None and not seq.params.logprobs
            and req.max_tokens - seq.num_generated_tokens > 1
            and len(seq) + self.config.num_speculative_tokens < self.max_model_len
        )

    def fail_all(self, message: str) -> list[StepOutput]:
        """Finish every request, queued or running, with ``finish_reason="error"`` and ``message``.

        The loop's last resort when a step raised past its own error handling, or the loop itself dies.
        """
        with self._step_lock:
            return self.output.fail_all([*self._requests.values(), *self.intake.take_all()], message)

    def start_loop(self) -> None:
        """Run :func:`~engine.core.loop.run_loop` on a daemon thread of its own until ``stop_loop()``."""
        if self._loop_thread is not None:
            return
        self._stop.clear()
        self._loop_thread = threading.Thread(target=self._run_loop, name="hearth-engine", daemon=True)
        self.is_alive = True  # from now on, not once the thread gets going: callers must not step meanwhile
        self._loop_thread.start()

    def run_loop_here(self, started: Callable[[], None] | None = None) -> None:
        """Run the loop on the calling thread, which becomes the engine's loop thread, until ``stop_loop()``.

        ``started`` is called once the engine counts as driven (``is_alive``), before the first step.
        """
        if self._loop_thread is not None:
            raise RuntimeError("the engine already has a loop thread")
        self._stop.clear()
        self._loop_thread = threading.current_thread()
        self.is_alive = True
        if started is not None:
            started()
        self._run_loop()

    def _run_loop(self) -> None:
        # run_loop logs what killed it and records it in loop_error; the thread just ends
        with contextlib.suppress(BaseException):
            run_loop(self, self._stop)

    def stop_loop(self) -> None:
        self._stop.set()
        self.wake()
        if self._loop_thread is not None:
            self._loop_thread.join(timeout=10)
            self._loop_thread = None

    # --- metrics -----------------------------------------------------------------------------------------------
    def metrics(self) -> EngineMetrics:
        """The engine's figures now: the recent window's, the scheduler's, the KV cache's and the controller's."""
        bm, sched = self.block_manager, self.scheduler
        snap = replace(
            self.stats.snapshot(),
            time=time.time(),
            num_running=sched.num_running,
            num_waiting=sched.num_waiting + self.intake.num_queued,
            kv_cache_usage=bm.num_used_blocks / bm.num_usable_blocks,
            kv_blocks_used=bm.num_used_blocks,
            kv_blocks_cached=bm.num_cached_blocks,
            kv_blocks_total=bm.num_usable_blocks,
            prefix_cache_hit_rate=bm.prefix_cache_hit_rate,
            prefix_cache_queries=bm.num_prefix_queried_tokens,
            prefix_cache_hits=bm.num_prefix_hit_tokens,
            num_preemptions=sched.num_preemptions,
            batch_window_ms=sched.batch_window_s() * 1000.0,
            spec_enabled=self.speculator is not None and self.speculator.enabled,
            concurrency_limit=sched.max_running,
        )
        return snap if self.controller is None else self.controller.metrics(snap)


def _failure(exc: BaseException) -> str:
    """What the requests of a batch whose step raised ``exc`` are told."""
    if isinstance(exc, torch.OutOfMemoryError):
        return "out of memory while generating; lower the batch size or the KV-cache budget"
    return f"generation failed: {exc}"


def _eos_ids(model: torch.nn.Module, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        eos = getattr(source, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, (list, tuple)):
            ids.update(int(e) for e in eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


__all__ = ["LLMEngine"]
