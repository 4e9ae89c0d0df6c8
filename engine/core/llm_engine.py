"""The engine: requests in, one ``step()`` at a time, text deltas out.

``step()`` is three calls: ``scheduler.schedule()`` -> ``runner.run()`` -> ``scheduler.postprocess()``, then the
sampled tokens are detokenized and handed to each request's handle. A step that raises fails the requests of its
batch with ``finish_reason="error"``; the others go on. ``submit``, ``cancel`` and ``wake`` are thread-safe;
``step`` runs on one thread at a time, driven by :func:`engine.core.loop.run_loop` on the engine's own thread
(``start_loop``) or on the app's bridge, or called directly (tests, benchmarks).

Long because ``LLMEngine`` is the request lifecycle in one class: submission (``n``, grammars, context fitting),
the step with its failure handling, deadlines, the concurrency controller's hook, sampling (and verifying
speculative drafts, whose planning lives in ``speculative.py``) and finishing. The
caller's handle (``request.py``), the loop (``loop.py``), context fitting (``context.py``), chat templating
(``chat_template.py``) and the controller (``controller.py``) already live beside it.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any, cast

import psutil
import torch

from engine.api import (
    MAX_SEED,
    CapacityError,
    EngineConfig,
    RequestMetrics,
    SamplingParams,
    StepOutput,
    TokenLogprob,
)
from engine.core.block_manager import BlockManager
from engine.core.chat_template import chat_token_ids
from engine.core.context import fit_messages
from engine.core.controller import ConcurrencyController, StepReport
from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.loop import run_loop
from engine.core.metrics import EngineMetrics
from engine.core.request import EngineRequest, OutputCallback, Prompt, RequestHandle
from engine.core.scheduler import ScheduledBatch, Scheduler
from engine.core.sequence import Sequence
from engine.core.speculative import Speculator, make_speculator
from engine.model.grammar import GrammarCompiler
from engine.model.runner import ModelRunner
from engine.model.sampler import Sampler

log = logging.getLogger("engine")

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
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.block_manager)
        self.runner = ModelRunner(
            model, num_blocks, config.block_size, kv_dtype, quantization, quant_backend, config.deterministic,
            config.native,
        )
        self.sampler = Sampler()
        self.speculator = make_speculator(
            config, self.runner, self.sampler, draft_model, num_blocks, kv_dtype, quantization, quant_backend
        )
        self.stats = EngineMetrics(max_batch_size=config.max_batch_size)
        self.controller = (
            ConcurrencyController(config.max_batch_size, config.max_num_batched_tokens)
            if config.adaptive_concurrency else None
        )
        self._memory_fraction: float | None = None
        self._memory_checked = -math.inf
        self.eos_ids = _eos_ids(model, tokenizer)
        self.grammars = GrammarCompiler(tokenizer, self.runner.config.vocab_size, self.eos_ids)
        self._mask_pool: ThreadPoolExecutor | None = None  # fills grammar masks while the model runs
        self._requests: dict[str, EngineRequest] = {}
        self._inbox: list[EngineRequest] = []
        self._held: list[EngineRequest] = []  # parallel requests waiting for their first one's prompt KV
        self._cancels: list[str] = []
        self._cv = threading.Condition()
        self._step_lock = threading.Lock()
        self._ids = itertools.count()
        self._is_woken = False  # wake() was called; the next wait_for_work returns at once
        self._loop_thread: threading.Thread | None = None
        self._stop = threading.Event()
        #: True while a loop (``start_loop`` or the app's bridge) drives this engine.
        self.is_alive = False
        #: Why the last loop over this engine died, or None; set by ``run_loop``.
        self.loop_error: str | None = None

    # --- requests ----------------------------------------------------------------------------------------------
    def tokenize(self, prompt: Prompt, tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Token ids of a prompt: text, ids, or chat messages (through the tokenizer's chat template, which
        renders ``tools``, OpenAI-style function definitions, when given)."""
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty")
            return list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])
        if not isinstance(prompt, list) or not prompt:
            raise ValueError("prompt must be a non-empty string, list of token ids, or list of messages")
        if all(isinstance(t, int) for t in prompt):
            vocab = self.runner.config.vocab_size
            if any(not 0 <= t < vocab for t in prompt):  # type: ignore[operator]
                raise ValueError(f"prompt token ids must lie in [0, {vocab})")
            return list(prompt)  # type: ignore[arg-type]
        if all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt):
            # a trailing assistant message is a reply to continue, not a finished turn
            cont = prompt[-1]["role"] == "assistant"  # type: ignore[index]
            # message text that spells a control token stays text (engine/core/chat_template.py)
            messages = cast(list[dict[str, str]], prompt)
            extra: dict[str, Any] = {"tools": tools} if tools else {}
            return chat_token_ids(
                self.tokenizer, messages, add_generation_prompt=not cont, continue_final_message=cont, **extra
            )
        raise ValueError("messages must be dicts with 'role' and 'content'")

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
        context; None rejects it.
        """
        params = params or SamplingParams()
        if params.n > 1:
            raise ValueError("n > 1 asks for several requests: submit it with submit_n")
        if overflow is not None and isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            prompt = self.fit_context(cast(list[dict[str, str]], prompt), params, overflow)
        return self._submit(self.tokenize(prompt), [params], priority, [request_id], [on_output])[0]

    def fit_context(self, messages: list[dict[str, str]], params: SamplingParams, overflow: str) -> Prompt:
        """``messages`` cut to fit the context with room for the reply, by ``overflow``'s policy."""
        room = min(self.max_model_len, self.block_manager.num_usable_blocks * self.config.block_size)
        budget = room - min(params.max_tokens, room // 2)
        return cast(Prompt, fit_messages(messages, budget, lambda m: len(self.tokenize(cast(Prompt, m))), overflow))

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
        return self._submit(self.tokenize(prompt), each, priority, [None] * n, on_outputs or [None] * n)

    def prepare(self, params: SamplingParams) -> None:
        """Check and compile ``params``' grammar now (the first one builds the tokenizer's automaton, ~1 s), so
        ``submit`` does not pay for it on the caller's event loop. ``ValueError`` for a bad schema."""
        self.grammars.matcher(params)

    def _submit(
        self,
        token_ids: list[int],
        params_list: list[SamplingParams],
        priority: int,
        request_ids: list[str | None],
        on_outputs: list[OutputCallback | None],
    ) -> list[RequestHandle]:
        matchers = [self.grammars.matcher(p) for p in params_list]
        room = min(self.max_model_len, self.block_manager.num_usable_blocks * self.config.block_size)
        if len(token_ids) >= room:
            raise ValueError(
                f"prompt has {len(token_ids)} tokens but the context holds {room}; shorten the prompt"
            )
        with self._cv:
            if self.loop_error is not None:
                raise RuntimeError(f"the engine has stopped ({self.loop_error}); reload the model")
            if len(self._inbox) + len(self._held) + self.scheduler.num_waiting + len(params_list) > (
                self.config.max_waiting
            ):
                raise CapacityError(
                    f"{self.config.max_waiting} requests are already waiting; retry when some have finished"
                )
            handles = []
            first: EngineRequest | None = None
            for params, request_id, on_output, matcher in zip(
                params_list, request_ids, on_outputs, matchers, strict=True
            ):
                req = self._new_request(token_ids, params, priority, request_id, on_output, room)
                req.matcher, req.held_for = matcher, first
                first = first or req
                self._inbox.append(req)
                handles.append(req.handle)
            self._cv.notify_all()
        return handles

    def _new_request(
        self,
        token_ids: list[int],
        params: SamplingParams,
        priority: int,
        request_id: str | None,
        on_output: OutputCallback | None,
        room: int,
    ) -> EngineRequest:
        rid = request_id or f"req-{next(self._ids)}"
        handle = RequestHandle(self, rid, token_ids, on_output)
        seq = Sequence(rid, list(token_ids), params, priority=priority)
        req = EngineRequest(
            seq=seq,
            detok=IncrementalDetokenizer(self.tokenizer, params.stop),
            metrics=RequestMetrics(arrival_time=seq.arrival_time, num_prompt_tokens=len(token_ids)),
            handle=handle,
            max_tokens=min(params.max_tokens, room - len(token_ids)),
            eos_ids=frozenset() if params.ignore_eos else self.eos_ids,
            deadline=None if params.timeout_s is None else seq.arrival_time + params.timeout_s,
        )
        return req

    def cancel(self, request_id: str) -> None:
        with self._cv:
            self._cancels.append(request_id)
            self._cv.notify_all()

    # --- loop --------------------------------------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self._inbox or self._cancels or self._held or self.scheduler.has_work())

    def wait_for_work(self, timeout_s: float) -> bool:
        """Block until there is something to step, ``wake()`` is called, or ``timeout_s`` passes."""
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

    def _drain_inbox(self, outputs: list[StepOutput]) -> None:
        with self._cv:
            inbox, self._inbox = self._inbox, []
            cancels, self._cancels = self._cancels, []
        waiting, self._held = [*self._held, *inbox], []
        for req in waiting:
            first = req.held_for
            if first is not None and first.metrics.first_token_time is None and not first.handle.done():
                self._held.append(req)
                continue
            req.held_for = None
            self._requests[req.seq.request_id] = req
            self.scheduler.add(req.seq)
        for rid in cancels:
            cancelled = self._requests.get(rid)
            held = [r for r in self._held if r.seq.request_id == rid]
            if held:
                self._held.remove(held[0])
                cancelled = held[0]
            if cancelled is None:
                continue
            self.scheduler.abort(rid)
            cancelled.finish_reason = "abort"
            outputs.append(self._finish(cancelled, ""))
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
            outputs.append(self._finish(req, "", error=error))

    def step(self) -> list[StepOutput]:
        """Run one engine iteration; return what each touched request produced.

        If the model, the sampler or the bookkeeping raises, the requests of this step finish with
        ``finish_reason="error"`` and a message, and the engine stays usable for the rest.
        """
        with self._step_lock:
            outputs: list[StepOutput] = []
            self._drain_inbox(outputs)
            delay = self.scheduler.admission_delay_s()
            if delay > 0:
                with self._cv:
                    self._cv.wait(delay)  # an arrival wakes us early; then gather it into this batch
                self._drain_inbox(outputs)
            if self.speculator is not None:
                self.speculator.plan(self.scheduler.running, self._can_speculate, self.scheduler.token_budget)
            batch = self.scheduler.schedule()
            if not batch.seqs:
                return outputs
            top = min(self.scheduler.running, key=lambda s: s.sort_key, default=None)
            top_req = None if top is None else self._requests.get(top.request_id)
            top_before = None if top_req is None else top_req.metrics.last_token_time
            try:
                self._run_batch(batch, outputs)
            except Exception as exc:
                log.exception("engine step failed; failing its %d requests", len(batch.seqs))
                outputs += self._fail_seqs(batch.seqs, exc)
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

    def _start_masks(self, batch: ScheduledBatch) -> tuple[list[str], Future[torch.Tensor]] | None:
        """Start filling the grammar masks of the constrained sequences that sample this step, on a worker
        thread, so that they are ready when the model's forward pass is."""
        ids, matchers = [], []
        for seq, num_new in zip(batch.seqs, batch.num_new_tokens, strict=True):
            req = self._requests.get(seq.request_id)
            if req is not None and req.matcher is not None and seq.num_computed_tokens + num_new >= len(seq):
                ids.append(seq.request_id)
                matchers.append(req.matcher)
        if not matchers:
            return None
        if self._mask_pool is None:
            self._mask_pool = ThreadPoolExecutor(1, thread_name_prefix="hearth-grammar")
        return ids, self._mask_pool.submit(self.grammars.fill_masks, matchers)

    def _can_speculate(self, seq: Sequence) -> bool:
        """Grammar-constrained and logprob requests decode plainly; so does one near its end or the context's."""
        req = self._requests.get(seq.request_id)
        return (
            req is not None and req.matcher is None and not seq.params.logprobs
            and req.max_tokens - seq.num_generated_tokens > 1
            and len(seq) + self.config.num_speculative_tokens < self.max_model_len
        )

    def _run_batch(self, batch: ScheduledBatch, outputs: list[StepOutput]) -> None:
        pending = self._start_masks(batch)
        spec = self.speculator
        drafts = {} if spec is None else spec.attach(batch)
        start = time.perf_counter()
        try:
            logits, rows = self.runner.run(batch)
        finally:
            for seq, draft in drafts.values():  # the draft leaves token_ids until verified
                del seq.token_ids[len(seq.token_ids) - len(draft) :]
        if spec is not None:
            spec.policy.cost.observe(sum(batch.num_new_tokens), time.perf_counter() - start)
        self.scheduler.postprocess(batch)
        now = time.monotonic()
        itls: list[float] = []
        num_tokens = 0
        if logits is not None and drafts:
            assert spec is not None
            logits, rows, num_tokens = self._verify_drafts(spec, logits, rows, drafts, outputs, now, itls)
        if logits is not None and rows:
            seqs = [batch.seqs[i] for i in rows]
            masks: list[torch.Tensor | None] | None = None
            if pending is not None:
                by_id = dict(zip(pending[0], pending[1].result(), strict=True))
                masks = [by_id.get(s.request_id) for s in seqs]
            penalised = any(
                s.params.repetition_penalty != 1.0 or s.params.presence_penalty or s.params.frequency_penalty
                for s in seqs
            )
            result = self.sampler.sample(
                logits, [s.params for s in seqs], [s.request_id for s in seqs],
                [s.token_ids if penalised else [] for s in seqs], [s.num_prompt_tokens for s in seqs], masks,
            )
            for i, (seq, token, logprob) in enumerate(zip(seqs, result.tokens, result.logprobs, strict=True)):
                req = self._requests[seq.request_id]
                error = result.errors.get(i)
                if error is None and req.matcher is not None and not req.matcher.accept(token):
                    error = f"structured output: the grammar refused token {token} ({req.matcher.error})"
                if error is not None:  # only this request fails; the batch goes on
                    self.scheduler.abort(seq.request_id)
                    outputs.append(self._fail(req, error))
                    continue
                if req.metrics.last_token_time is not None:
                    itls.append(now - req.metrics.last_token_time)
                outputs.append(self._on_token(req, token, now, logprob))
                num_tokens += 1
        self.stats.record_step(len(batch.seqs), num_tokens, itls, now)

    def _verify_drafts(
        self, spec: Speculator, logits: torch.Tensor, rows: list[int], drafts: dict[int, tuple[Sequence, list[int]]],
        outputs: list[StepOutput], now: float, itls: list[float],
    ) -> tuple[torch.Tensor, list[int], int]:
        """Verify each drafted sequence's rows and emit what it accepted; return the other rows for sampling."""
        plain: list[int] = []
        num_tokens = 0
        at = 0
        while at < len(rows):
            i = rows[at]
            if i not in drafts:
                plain.append(at)
                at += 1
                continue
            seq, draft = drafts[i]
            req = self._requests[seq.request_id]
            p = seq.params
            penalised = p.repetition_penalty != 1.0 or p.presence_penalty or p.frequency_penalty
            tokens = self.sampler.verify(
                logits[at : at + len(draft) + 1], p, seq.request_id, seq.token_ids + draft if penalised else [],
                seq.num_prompt_tokens, draft, spec.draft_probs.get(seq.request_id),
            )
            at += len(draft) + 1
            num_accepted = len(tokens) - 1
            spec.policy.record(seq, len(draft), num_accepted)
            self.stats.record_speculation(len(draft), num_accepted, len(tokens))
            if req.metrics.last_token_time is not None:
                itls.extend([(now - req.metrics.last_token_time) / len(tokens)] * len(tokens))
            out = self._on_token(req, tokens, now)
            num_tokens += len(out.new_token_ids)
            outputs.append(out)
            if not out.finished:
                self.scheduler.accept_draft(seq, num_accepted)
                seq.num_draft_computed = min(seq.num_draft_computed, seq.num_computed_tokens)
        keep = torch.tensor(plain, dtype=torch.long, device=logits.device)
        return logits[keep], [rows[j] for j in plain], num_tokens

    def _on_token(
        self, req: EngineRequest, token: int | list[int], now: float, logprob: TokenLogprob | None = None
    ) -> StepOutput:
        """Append ``token`` (or a verified draft's tokens, in order, up to the first that finishes the request)."""
        seq, m = req.seq, req.metrics
        if m.first_token_time is None:
            m.first_token_time = now
            m.num_cached_tokens = seq.num_cached_tokens
            self.stats.record_first_token(now - m.arrival_time)
        m.last_token_time = now
        delta, emitted = "", []
        for t in [token] if isinstance(token, int) else token:
            seq.token_ids.append(t)
            emitted.append(t)
            m.num_generated_tokens += 1
            is_eos = t in req.eos_ids
            delta += "" if is_eos else req.detok.add([t])
            if is_eos or req.detok.stopped or (req.matcher is not None and req.matcher.is_finished):
                req.finish_reason = "stop"
            elif m.num_generated_tokens >= req.max_tokens:
                req.finish_reason = "length"
            if req.finish_reason is not None:
                break
        logprobs = None if logprob is None else [logprob]
        if req.finish_reason is None:
            out = StepOutput(seq.request_id, delta, emitted, logprobs=logprobs)
            req.handle._deliver(out, m)
            return out
        self.scheduler.running.remove(seq)
        self.scheduler.finish(seq)
        return self._finish(req, delta, emitted, logprobs=logprobs)

    def _finish(
        self, req: EngineRequest, delta: str, new_token_ids: list[int] | None = None, error: str | None = None,
        logprobs: list[TokenLogprob] | None = None,
    ) -> StepOutput:
        now = time.monotonic()
        delta += req.detok.finish()
        req.metrics.finish_time = now
        self.stats.record_finish(now - req.metrics.arrival_time, now)
        self._requests.pop(req.seq.request_id, None)
        self.sampler.forget(req.seq.request_id)
        if self.speculator is not None:
            self.speculator.forget(req.seq.request_id)
        out = StepOutput(
            req.seq.request_id, delta, new_token_ids or [], True, req.finish_reason, req.metrics.as_dict(), error,
            logprobs,
        )
        req.handle._deliver(out, req.metrics)
        return out

    def _fail_seqs(self, seqs: list[Sequence], exc: BaseException) -> list[StepOutput]:
        if isinstance(exc, torch.OutOfMemoryError):
            message = "out of memory while generating; lower the batch size or the KV-cache budget"
        else:
            message = f"generation failed: {exc}"
        outputs = []
        for seq in seqs:
            req = self._requests.get(seq.request_id)
            if req is None:  # finished within the step before it failed
                continue
            self.scheduler.abort(seq.request_id)
            outputs.append(self._fail(req, message))
        return outputs

    def _fail(self, req: EngineRequest, message: str) -> StepOutput:
        req.finish_reason = "error"
        return self._finish(req, "", error=message)

    def fail_all(self, message: str) -> list[StepOutput]:
        """Finish every request, queued or running, with ``finish_reason="error"`` and ``message``.

        The loop's last resort when a step raised past its own error handling, or the loop itself dies.
        """
        with self._step_lock:
            with self._cv:
                inbox, self._inbox = self._inbox, []
                self._cancels.clear()
            outputs = []
            held, self._held = self._held, []
            for req in [*self._requests.values(), *inbox, *held]:
                self.scheduler.abort(req.seq.request_id)
                try:
                    outputs.append(self._fail(req, message))
                except Exception:  # a broken detokenizer must not keep the others from finishing
                    log.exception("failing %s failed", req.seq.request_id)
                    self._requests.pop(req.seq.request_id, None)
            return outputs

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
    def metrics(self) -> dict[str, float]:
        bm = self.block_manager
        snap = self.stats.snapshot()
        snap.update(
            {
                "num_running": float(self.scheduler.num_running),
                "num_waiting": float(self.scheduler.num_waiting + len(self._inbox)),
                "kv_cache_usage": bm.num_used_blocks / bm.num_usable_blocks,
                "kv_blocks_used": float(bm.num_used_blocks),
                "kv_blocks_cached": float(bm.num_cached_blocks),
                "kv_blocks_total": float(bm.num_usable_blocks),
                "prefix_cache_hit_rate": bm.prefix_cache_hit_rate,
                "prefix_cache_queries": float(bm.num_prefix_queried_tokens),
                "prefix_cache_hits": float(bm.num_prefix_hit_tokens),
                "num_preemptions": float(self.scheduler.num_preemptions),
                "batch_window_ms": self.scheduler.batch_window_s() * 1000.0,
            }
        )
        snap["spec_enabled"] = 1.0 if self.speculator is not None and self.speculator.enabled else 0.0
        if self.controller is not None:
            snap.update(self.controller.metrics())
        else:
            snap.update({"concurrency_limit": float(self.scheduler.max_running), "controller_adjustments_total": 0.0})
        return snap


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
