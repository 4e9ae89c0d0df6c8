"""Tokens out: sampled tokens appended to their requests, detokenized, and handed to each caller's handle.

vLLM's ``OutputProcessor`` seam. :class:`OutputProcessor` owns the table of live requests the step works on. It
decides when a request ends (end of sequence, a stop string, a finished grammar, ``max_tokens``), builds the
:class:`~engine.api.StepOutput` each touched request gets, delivers it to the request's handle, and records
first-token and finish times in the engine's statistics. Failing a request (an error, a cancel, a timeout) ends
here too, so that every request leaves the engine through :meth:`OutputProcessor.finish`.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from engine.api import StepOutput, TokenLogprob
from engine.core.metrics import EngineStats
from engine.core.request import EngineRequest
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence

if TYPE_CHECKING:
    from engine.core.speculative import Speculator
    from engine.model.sampler import Sampler

log = logging.getLogger("engine")


class OutputProcessor:
    """Turns each step's tokens into outputs, and ends requests; runs on the stepping thread."""

    def __init__(
        self, scheduler: Scheduler, stats: EngineStats, sampler: Sampler, speculator: Speculator | None
    ) -> None:
        self.scheduler = scheduler
        self.stats = stats
        self.sampler = sampler
        self.speculator = speculator
        #: The requests the scheduler holds, by id: admitted and not yet finished.
        self.requests: dict[str, EngineRequest] = {}

    def on_token(
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
        return self.finish(req, delta, emitted, logprobs=logprobs)

    def finish(
        self, req: EngineRequest, delta: str, new_token_ids: list[int] | None = None, error: str | None = None,
        logprobs: list[TokenLogprob] | None = None,
    ) -> StepOutput:
        """End ``req`` with its ``finish_reason`` (set by the caller) and deliver its last output."""
        now = time.monotonic()
        delta += req.detok.finish()
        req.metrics.finish_time = now
        self.stats.record_finish(now - req.metrics.arrival_time, now)
        self.requests.pop(req.seq.request_id, None)
        self.sampler.forget(req.seq.request_id)
        if self.speculator is not None:
            self.speculator.forget(req.seq.request_id)
        out = StepOutput(
            req.seq.request_id, delta, new_token_ids or [], True, req.finish_reason, req.metrics.as_dict(), error,
            logprobs,
        )
        req.handle._deliver(out, req.metrics)
        return out

    def fail(self, req: EngineRequest, message: str) -> StepOutput:
        """End ``req`` with ``finish_reason="error"`` and ``message``."""
        req.finish_reason = "error"
        return self.finish(req, "", error=message)

    def fail_seqs(self, seqs: list[Sequence], message: str) -> list[StepOutput]:
        """Fail the requests of a batch whose step raised, with ``message``."""
        outputs = []
        for seq in seqs:
            req = self.requests.get(seq.request_id)
            if req is None:  # finished within the step before it failed
                continue
            self.scheduler.abort(seq.request_id)
            outputs.append(self.fail(req, message))
        return outputs

    def fail_all(self, reqs: list[EngineRequest], message: str) -> list[StepOutput]:
        """Fail every request of ``reqs``; one whose failing raises is dropped, and the others still end."""
        outputs = []
        for req in reqs:
            self.scheduler.abort(req.seq.request_id)
            try:
                outputs.append(self.fail(req, message))
            except Exception:  # a broken detokenizer must not keep the others from finishing
                log.exception("failing %s failed", req.seq.request_id)
                self.requests.pop(req.seq.request_id, None)
        return outputs
