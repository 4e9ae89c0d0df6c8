"""One scheduled batch through the model: grammar masks, the forward pass, sampling, verifying drafts.

The middle of ``LLMEngine.step``: after the scheduler picked the batch and before the outputs go to their
handles. :class:`BatchExecutor` fills the grammar masks of constrained rows on a worker thread while the model
runs, samples the rows due a token, verifies the rows of speculating sequences (drafts planned in
``speculative.py``), and hands every token to :class:`~engine.core.output.OutputProcessor`.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from engine.api import StepOutput
from engine.core.metrics import EngineStats
from engine.core.output import OutputProcessor
from engine.core.scheduler import ScheduledBatch, Scheduler
from engine.core.sequence import Sequence
from engine.core.speculative import Speculator
from engine.model.grammar import GrammarCompiler
from engine.model.runner import ModelRunner
from engine.model.sampler import Sampler


class BatchExecutor:
    """Runs the engine's batches; on the stepping thread."""

    def __init__(
        self,
        runner: ModelRunner,
        sampler: Sampler,
        speculator: Speculator | None,
        scheduler: Scheduler,
        grammars: GrammarCompiler,
        output: OutputProcessor,
        stats: EngineStats,
    ) -> None:
        self.runner = runner
        self.sampler = sampler
        self.speculator = speculator
        self.scheduler = scheduler
        self.grammars = grammars
        self.output = output
        self.requests = output.requests
        self.stats = stats
        self._mask_pool: ThreadPoolExecutor | None = None  # fills grammar masks while the model runs

    def _start_masks(self, batch: ScheduledBatch) -> tuple[list[str], Future[torch.Tensor]] | None:
        """Start filling the grammar masks of the constrained sequences that sample this step, on a worker
        thread, so that they are ready when the model's forward pass is."""
        ids, matchers = [], []
        for seq, num_new in zip(batch.seqs, batch.num_new_tokens, strict=True):
            req = self.requests.get(seq.request_id)
            if req is not None and req.matcher is not None and seq.num_computed_tokens + num_new >= len(seq):
                ids.append(seq.request_id)
                matchers.append(req.matcher)
        if not matchers:
            return None
        if self._mask_pool is None:
            self._mask_pool = ThreadPoolExecutor(1, thread_name_prefix="hearth-grammar")
        return ids, self._mask_pool.submit(self.grammars.fill_masks, matchers)

    def run(self, batch: ScheduledBatch, outputs: list[StepOutput]) -> None:
        """Run ``batch`` through the model, sample or verify each row that is due a token, and append what each
        request produced to ``outputs``. A request the sampler or its grammar refuses fails alone; anything
        else that raises is the caller's to handle (the whole batch fails)."""
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
            penalised = any(s.params.is_penalised for s in seqs)
            result = self.sampler.sample(
                logits, [s.params for s in seqs], [s.request_id for s in seqs],
                [s.token_ids if penalised else [] for s in seqs], [s.num_prompt_tokens for s in seqs], masks,
            )
            for i, (seq, token, logprob) in enumerate(zip(seqs, result.tokens, result.logprobs, strict=True)):
                req = self.requests[seq.request_id]
                error = result.errors.get(i)
                if error is None and req.matcher is not None and not req.matcher.accept(token):
                    error = f"structured output: the grammar refused token {token} ({req.matcher.error})"
                if error is not None:  # only this request fails; the batch goes on
                    self.scheduler.abort(seq.request_id)
                    outputs.append(self.output.fail(req, error))
                    continue
                if req.metrics.last_token_time is not None:
                    itls.append(now - req.metrics.last_token_time)
                outputs.append(self.output.on_token(req, token, now, logprob))
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
            req = self.requests[seq.request_id]
            p = seq.params
            tokens = self.sampler.verify(
                logits[at : at + len(draft) + 1], p, seq.request_id, seq.token_ids + draft if p.is_penalised else [],
                seq.num_prompt_tokens, draft, spec.draft_probs.get(seq.request_id),
            )
            at += len(draft) + 1
            num_accepted = len(tokens) - 1
            spec.policy.record(seq, len(draft), num_accepted)
            self.stats.record_speculation(len(draft), num_accepted, len(tokens))
            if req.metrics.last_token_time is not None:
                itls.extend([(now - req.metrics.last_token_time) / len(tokens)] * len(tokens))
            out = self.output.on_token(req, tokens, now)
            num_tokens += len(out.new_token_ids)
            outputs.append(out)
            if not out.finished:
                self.scheduler.accept_draft(seq, num_accepted)
                seq.num_draft_computed = min(seq.num_draft_computed, seq.num_computed_tokens)
        keep = torch.tensor(plain, dtype=torch.long, device=logits.device)
        return logits[keep], [rows[j] for j in plain], num_tokens
