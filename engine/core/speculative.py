"""Speculative decoding: who drafts, what, and whether it pays.

A speculating sequence decodes its last token together with a draft of up to k more (``Sequence.draft_token_ids``):
one step computes all of them like a short prefill chunk whose every position yields logits, and the sampler
(``Sampler.verify``) keeps the longest prefix the target model agrees with, plus one token of its own. The scheduler
reserves the draft's slots (``Scheduler._add_speculative``) and gives back the rejected ones
(``Scheduler.accept_draft``); only accepted tokens publish prefix-cache hashes.

Drafts come from the request's own context (``"ngram"``, :func:`ngram_draft`, no model) or from a smaller model
(``engine/model/drafter.py``: the model's own int4 copy, or a separate draft model).

Adaptive, in :class:`SpecPolicy`: a sequence whose acceptance rate stays low stops drafting for a while (a backoff
that doubles while it keeps failing), and the whole batch stops when the step cost model says drafts cost more
compute than they save (many streams make a step compute-bound). Both are re-checked every step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.api import EngineConfig
from engine.core.scheduler import ScheduledBatch
from engine.core.sequence import Sequence

if TYPE_CHECKING:
    import torch

    from engine.model.runner import ModelRunner
    from engine.model.sampler import Sampler

#: the longest and shortest context suffix the n-gram lookup matches
NGRAM_MAX, NGRAM_MIN = 4, 2
#: how far back the n-gram lookup searches
NGRAM_LOOKBACK = 4096


class SpeculationRefused(ValueError):
    """The speculation asked for cannot run on this model or level: the caller's option, not a damaged file."""


def ngram_draft(tokens: list[int], k: int, max_n: int = NGRAM_MAX, min_n: int = NGRAM_MIN) -> list[int]:
    """Prompt-lookup draft: the ``k`` tokens that followed the latest earlier occurrence of the context's last
    n tokens (longest n first); empty when nothing matches."""
    size = len(tokens)
    lo = max(0, size - NGRAM_LOOKBACK)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        pattern = tokens[size - n :]
        last = pattern[-1]
        for end in range(size - 2, lo + n - 2, -1):  # the occurrence ends at ``end``, before the suffix itself
            if tokens[end] == last and tokens[end - n + 1 : end + 1] == pattern:
                return tokens[end + 1 : end + 1 + k]
    return []


@dataclass(slots=True)
class StepCost:
    """Step time as ``a + b * tokens``, fitted online with exponential forgetting over measured steps."""

    decay: float = 0.98
    #: before any spread of step sizes is seen: a small model on a CPU, where a token adds ~2 % to a decode step
    prior_a: float = 1.0
    prior_b: float = 0.02
    _w: float = 0.0
    _t: float = 0.0
    _tt: float = 0.0
    _y: float = 0.0
    _ty: float = 0.0

    def observe(self, num_tokens: int, seconds: float) -> None:
        d = self.decay
        self._w = d * self._w + 1.0
        self._t = d * self._t + num_tokens
        self._tt = d * self._tt + num_tokens * num_tokens
        self._y = d * self._y + seconds
        self._ty = d * self._ty + num_tokens * seconds

    def coefficients(self) -> tuple[float, float]:
        """``(a, b)``: fixed seconds per step and seconds per token (the prior's ratio until fitted)."""
        if self._w < 16:
            return self.prior_a, self.prior_b
        mean_t, mean_y = self._t / self._w, self._y / self._w
        var = self._tt / self._w - mean_t * mean_t
        if var < 1.0:  # every step had about the same size: no slope to see
            return self.prior_a, self.prior_b
        b = max(0.0, (self._ty / self._w - mean_t * mean_y) / var)
        a = max(mean_y - b * mean_t, 1e-3 * mean_y, 1e-9)
        return a, b


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one verification yields when each draft token is accepted with probability ``alpha``."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


@dataclass(slots=True)
class _SeqState:
    rate: float = 0.7  # moving average of the share of drafted tokens accepted
    backoff: int = 0  # tokens the current pause lasts; 0 = never paused
    paused_until: int = -1  # generated-token count at which drafting resumes


@dataclass(slots=True)
class SpecPolicy:
    """When drafting pays. Counts and timings come in; no clock is read, so tests feed their own."""

    k: int
    min_rate: float = 0.3  # below this moving acceptance rate a sequence pauses drafting
    first_backoff: int = 8
    max_backoff: int = 256
    margin: float = 1.05  # drafting must promise this much more tokens per second than plain decoding
    cost: StepCost = field(default_factory=StepCost)
    #: seconds a step spends drafting (a draft model's forward passes), moving average over drafting steps
    draft_s: float = 0.0
    _seqs: dict[str, _SeqState] = field(default_factory=dict)
    is_batch_enabled: bool = True

    def seq_enabled(self, seq: Sequence) -> bool:
        state = self._seqs.get(seq.request_id)
        return state is None or seq.num_generated_tokens >= state.paused_until

    def rate_of(self, request_id: str) -> float:
        state = self._seqs.get(request_id)
        return _SeqState().rate if state is None else state.rate

    def record(self, seq: Sequence, num_drafted: int, num_accepted: int) -> None:
        """One verification of ``seq``: ``num_accepted`` of ``num_drafted`` draft tokens kept."""
        state = self._seqs.setdefault(seq.request_id, _SeqState())
        state.rate = 0.7 * state.rate + 0.3 * (num_accepted / max(1, num_drafted))
        if state.rate >= self.min_rate:
            if state.rate > 0.5:
                state.backoff = 0
            return
        state.backoff = min(self.max_backoff, state.backoff * 2 if state.backoff else self.first_backoff)
        state.paused_until = seq.num_generated_tokens + state.backoff
        state.rate = 0.5  # the probe after the pause starts from a neutral estimate

    def forget(self, request_id: str) -> None:
        self._seqs.pop(request_id, None)

    def decide_batch(self, rates: list[float], num_other_tokens: int) -> bool:
        """Whether drafting for sequences with these acceptance rates beats plain decoding this step.

        Plain: ``n`` tokens for ``a + b * (n + other)`` seconds. Drafting: ``sum(E(rate))`` tokens for
        ``a + b * (n * (k + 1) + other)`` plus the drafting time. Many streams (or a big prefill alongside) make ``b`` dominate, and the
        drafts' extra tokens then cost more than they return.
        """
        if not rates:
            return self.is_batch_enabled
        a, b = self.cost.coefficients()
        n = len(rates)
        plain = n / (a + b * (n + num_other_tokens))
        spec_s = a + b * (n * (self.k + 1) + num_other_tokens) + self.draft_s
        spec = sum(expected_tokens(r, self.k) for r in rates) / spec_s
        self.is_batch_enabled = spec > plain * self.margin
        return self.is_batch_enabled


#: a model drafter: ``propose(seqs, k)`` -> per sequence, its draft and the draft's probabilities (None: one-hot)
ProposeFn = Callable[[Seq[Sequence], int], Seq[tuple[list[int], Any]]]


class Speculator:
    """The engine's speculative-decoding glue: plan drafts before scheduling, fill model drafts after it."""

    def __init__(self, method: str, k: int, propose: ProposeFn | None = None) -> None:
        self.method = method
        self.k = k
        self.policy = SpecPolicy(k)
        self._propose = propose
        self.draft_probs: dict[str, Any] = {}

    @property
    def enabled(self) -> bool:
        return self.policy.is_batch_enabled

    def plan(self, running: Iterable[Sequence], eligible: Callable[[Sequence], bool], budget: int) -> None:
        """Set each running decode's ``num_spec_wanted`` (and, for n-gram, its draft) for the next schedule."""
        decodes, num_other = [], 0
        for seq in running:
            seq.draft_token_ids, seq.num_spec_wanted = [], 0
            if seq.num_uncomputed_tokens == 1 and seq.num_generated_tokens:
                decodes.append(seq)
            else:
                num_other += seq.num_uncomputed_tokens
        num_other = min(num_other, budget)
        wanted = [s for s in decodes if eligible(s) and self.policy.seq_enabled(s)]
        if not self.policy.decide_batch([self.policy.rate_of(s.request_id) for s in wanted], num_other):
            return
        for seq in wanted:
            if self.method == "ngram":
                seq.draft_token_ids = ngram_draft(seq.token_ids, self.k)
                seq.num_spec_wanted = len(seq.draft_token_ids)
            else:
                seq.num_spec_wanted = self.k

    def fill(self, seqs: list[Sequence], num_drafts: list[int]) -> None:
        """Draft now for the scheduled sequences that reserved room without a draft (model drafters)."""
        self.draft_probs.clear()
        todo = [s for s, d in zip(seqs, num_drafts, strict=True) if d and not s.draft_token_ids]
        if not todo or self._propose is None:
            return
        start = time.perf_counter()
        for seq, (draft, probs) in zip(todo, self._propose(todo, self.k), strict=True):
            seq.draft_token_ids = draft
            self.draft_probs[seq.request_id] = probs
        seconds = time.perf_counter() - start
        policy = self.policy
        policy.draft_s = seconds if not policy.draft_s else 0.8 * policy.draft_s + 0.2 * seconds

    def attach(self, batch: ScheduledBatch) -> dict[int, tuple[Sequence, list[int]]]:
        """Put each scheduled draft at the end of its sequence's ``token_ids`` for the runner (the engine takes
        it off again after the forward pass); a draft shorter than its reservation shrinks the row."""
        self.fill(batch.seqs, batch.num_draft_tokens)
        drafts = {}
        for i, (seq, reserved) in enumerate(zip(batch.seqs, batch.num_draft_tokens, strict=True)):
            if not reserved:
                continue
            draft, seq.draft_token_ids = seq.draft_token_ids[:reserved], []
            batch.num_new_tokens[i] -= reserved - len(draft)
            batch.num_draft_tokens[i] = len(draft)
            if draft:
                seq.token_ids.extend(draft)
                drafts[i] = (seq, draft)
        return drafts

    def forget(self, request_id: str) -> None:
        self.policy.forget(request_id)
        self.draft_probs.pop(request_id, None)


def make_speculator(
    config: EngineConfig,
    runner: ModelRunner,
    sampler: Sampler,
    draft_model: torch.nn.Module | None,
    num_blocks: int,
    kv_dtype: torch.dtype,
    quantization: str,
    quant_backend: str,
) -> Speculator | None:
    """The speculator ``config.speculative`` asks for, with its draft model built over its own KV pool."""
    method, k = config.speculative, config.num_speculative_tokens
    if method == "off":
        return None
    if method == "ngram":
        return Speculator("ngram", k)
    from engine.model.drafter import ModelDrafter

    if method == "self-int4":
        if not runner.is_fused:
            raise SpeculationRefused(
                "speculative='self-int4' needs a Llama-family model (the fused path); use 'ngram'"
            )
        if quantization == "int4":
            raise SpeculationRefused(
                "the model already runs int4, so its int4 copy would be no faster; use 'ngram'"
            )
        if quantization == "file":
            raise SpeculationRefused(
                "the model runs its GGUF file's own blocks, which leave no dense weights to make an int4 copy of; "
                "use 'ngram'"
            )
        model, level, name = runner.model, "int4", "self-int4"
    else:
        if draft_model is None:
            raise ValueError("speculative={'draft_model': ...}: the draft model was not loaded")
        model, level, name = draft_model, "fp32", "draft-model"
    drafter = ModelDrafter.build(
        model, num_blocks, config.block_size, kv_dtype, level, sampler, int(runner.config.vocab_size), quant_backend
    )
    return Speculator(name, k, drafter.propose)


__all__ = ["SpecPolicy", "SpeculationRefused", "Speculator", "StepCost", "expected_tokens", "ngram_draft"]
