"""Turns a step's logits into next tokens: greedy, temperature, top-k, top-p, min-p, penalties, logit biases,
grammar masks, logprobs and seeds.

Per row, in order: repetition penalty (over prompt and reply), presence and frequency penalties (over the reply,
OpenAI's semantics), both over the last ``SamplingParams.repeat_last_n`` tokens only when that is set, logit
biases, the grammar mask, temperature. Logprobs come from that distribution (the one the token is drawn from),
before top-k, top-p and min-p truncate it. A row that fails (NaN logits, a grammar that
allows nothing) is reported in :attr:`SampleResult.errors`; the other rows still get their tokens.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import torch

from engine.api import SamplingParams, TokenLogprob
from engine.model.grammar import apply_masks


@dataclass(slots=True)
class SampleResult:
    """One step's tokens. ``tokens[i]`` is -1 where ``errors`` has row ``i``."""

    tokens: list[int]
    logprobs: list[TokenLogprob | None]
    errors: dict[int, str] = field(default_factory=dict)


_DRAFT_PREFIX = "draft:"


class Sampler:
    """Samples one token per row. When every row is greedy with nothing to adjust or report, the batch takes a
    single vectorised argmax; the others go row by row, each with its own generator so a seeded request
    reproduces whatever it is batched with."""

    def __init__(self) -> None:
        self._generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)
        self._generators.pop(_DRAFT_PREFIX + request_id, None)

    def draft_generator(self, request_id: str, seed: int | None) -> torch.Generator | None:
        """A seeded request's second generator, for a draft model's samples (``engine/model/drafter.py``)."""
        return self._generator(_DRAFT_PREFIX + request_id, None if seed is None else seed ^ 0x5EC)

    def _generator(self, request_id: str, seed: int | None) -> torch.Generator | None:
        if seed is None:
            return None
        gen = self._generators.get(request_id)
        if gen is None:
            gen = torch.Generator(device="cpu")
            gen.manual_seed(seed)
            self._generators[request_id] = gen
        return gen

    def sample(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        request_ids: list[str],
        histories: list[list[int]],
        num_prompt_tokens: list[int] | None = None,
        masks: list[torch.Tensor | None] | None = None,
    ) -> SampleResult:
        """Pick the next token of each row of ``logits`` ([rows, vocab]).

        ``histories`` holds each row's tokens so far (prompt then reply; empty when no penalty needs them),
        ``num_prompt_tokens`` how many of them are the prompt (0 when not given), ``masks`` each row's packed
        grammar bitmask or None.
        """
        masked = masks is not None and any(m is not None for m in masks)
        if not masked and all(p.is_plain_greedy for p in params):
            return self._greedy(logits, len(params))  # in the logits' own dtype: the same argmax, no fp32 copy
        logits = logits.float()
        if masked:
            assert masks is not None
            logits = apply_masks(logits, masks)  # all rows at once: -inf stays -inf through every later step
        if all(p.is_plain_greedy for p in params):
            return self._greedy(logits, len(params))
        result = SampleResult([], [])
        for i, (row, p, rid, history) in enumerate(zip(logits, params, request_ids, histories, strict=True)):
            try:
                num_prompt = num_prompt_tokens[i] if num_prompt_tokens is not None else 0
                token, logprob = self._sample_row(row, p, rid, history, num_prompt)
            except Exception as exc:  # noqa: BLE001 -- one bad row must not take the batch down
                result.errors[i] = f"sampling failed: {exc}"
                token, logprob = -1, None
            result.tokens.append(token)
            result.logprobs.append(logprob)
        return result

    @staticmethod
    def _greedy(logits: torch.Tensor, num_rows: int) -> SampleResult:
        """One vectorised max; rows with nothing allowed (a grammar's dead end) or NaN fail alone.

        A row's max is NaN when any of its logits is (``max`` propagates NaN) and -inf when none is allowed, so
        one pass finds both the tokens and the rows that fail; ties go to the first index, as ``argmax``.
        """
        values, tokens = logits.max(dim=-1)
        result = SampleResult(tokens.tolist(), [None] * num_rows)
        for i, top in enumerate(values.tolist()):
            if math.isnan(top) or top == -math.inf:
                result.errors[i] = "sampling failed: no token is allowed, or the model produced NaN logits"
                result.tokens[i] = -1
        return result

    def _sample_row(self, row: torch.Tensor, p: SamplingParams, rid: str, history: list[int],
                    num_prompt: int) -> tuple[int, TokenLogprob | None]:
        row = adjusted_logits(row, p, history, num_prompt)
        if not bool(torch.isfinite(row).any()):
            raise ValueError("no token is allowed (the logits are all -inf or NaN)")
        if torch.isnan(row).any():
            raise ValueError("the model produced NaN logits")
        if p.is_greedy:
            token = int(row.argmax())
            scaled = row
        else:
            scaled = row / p.temperature
            probs = filtered_probs(scaled, 1.0, p.top_k, p.top_p, p.min_p)
            token = int(torch.multinomial(probs.cpu(), 1, generator=self._generator(rid, p.seed)))
        if not p.logprobs:
            return token, None
        return token, token_logprob(scaled, token, p.top_logprobs)


    def verify(
        self,
        logits: torch.Tensor,
        p: SamplingParams,
        request_id: str,
        history: list[int],
        num_prompt: int,
        drafts: list[int],
        draft_probs: torch.Tensor | None = None,
    ) -> list[int]:
        """Verify a speculative draft; return the tokens to emit: the accepted draft tokens and one more.

        ``logits`` holds ``len(drafts) + 1`` rows: row ``j`` scores the token after ``drafts[:j]``. ``history`` is
        the sequence's tokens with the draft appended (empty when no penalty reads it). The target distribution
        of each row is the one :meth:`sample` draws from (penalties, biases, temperature, top-k/p, min-p).
        Rejection sampling (Leviathan et al. 2023) keeps it exactly: accept ``x`` with probability
        ``min(1, p(x) / q(x))``, else draw from ``max(0, p - q)`` renormalised; ``draft_probs`` is ``q`` per
        drafted token, None for a deterministic draft (``q`` one-hot). Greedy requests accept a draft token
        exactly when it is the argmax, so their output equals plain decoding's.
        """
        logits = logits.float()
        base = len(history) - len(drafts) if history else 0
        gen = None if p.is_greedy else self._generator(request_id, p.seed)
        out: list[int] = []
        for j, row in enumerate(logits):
            seen = history[: base + j] if history else []
            if p.is_plain_greedy:
                probs, target = None, int(row.argmax())
            else:
                probs, target = target_probs(row, p, seen, num_prompt)
            if j == len(drafts):  # every draft token was accepted: one more from the last row
                out.append(target if probs is None else _draw(probs, gen))
                break
            x = drafts[j]
            if probs is None:
                if x == target:
                    out.append(x)
                    continue
                out.append(target)
                break
            q = None if draft_probs is None else draft_probs[j].float()
            q_x = 1.0 if q is None else float(q[x])
            if q_x > 0 and float(torch.rand(1, generator=gen)) < min(1.0, float(probs[x]) / q_x):
                out.append(x)
                continue
            if q is None:
                residual = probs.clone()
                residual[x] = 0.0
            else:
                residual = (probs - q).clamp_(min=0.0)
            out.append(_draw(residual if float(residual.sum()) > 0 else probs, gen))
            break
        return out


def _draw(probs: torch.Tensor, gen: torch.Generator | None) -> int:
    return int(torch.multinomial(probs.cpu() / probs.sum(), 1, generator=gen))


def target_probs(row: torch.Tensor, p: SamplingParams, history: list[int],
                 num_prompt: int) -> tuple[torch.Tensor | None, int]:
    """The distribution a token is drawn from after ``row`` (None for greedy) and its most likely token."""
    row = adjusted_logits(row.float(), p, history, num_prompt)
    if p.is_greedy:
        return None, int(row.argmax())
    probs = filtered_probs(row / p.temperature, 1.0, p.top_k, p.top_p, p.min_p)
    return probs, int(probs.argmax())


def adjusted_logits(row: torch.Tensor, p: SamplingParams, history: list[int], num_prompt: int) -> torch.Tensor:
    """``row`` after the repetition penalty, presence and frequency penalties (over ``p.repeat_last_n``'s window
    of ``history``) and logit biases."""
    history, num_prompt = penalty_window(history, num_prompt, p.repeat_last_n)
    if p.repetition_penalty != 1.0 and history:
        row = apply_repetition_penalty(row, history, p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and len(history) > num_prompt:
        row = apply_presence_frequency(row, history[num_prompt:], p.presence_penalty, p.frequency_penalty)
    if p.logit_bias:
        idx, values = _bias_tensors(p.logit_bias, row.numel(), row.device)
        if idx.numel():
            row = row.index_add(0, idx, values.to(row.dtype))
    return row


_BIAS_CACHE: dict[tuple[int, int, str], tuple[dict[int, float], torch.Tensor, torch.Tensor]] = {}
_BIAS_CACHE_SIZE = 256


def _bias_tensors(bias: dict[int, float], vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A request's logit biases as index and value tensors, built once per request rather than at every step.

    Keyed by the dict's identity; the entry holds the dict, so the identity cannot be reused while cached. Ids
    past the vocabulary are dropped.
    """
    key = (id(bias), vocab, str(device))
    hit = _BIAS_CACHE.get(key)
    if hit is not None and hit[0] is bias:
        return hit[1], hit[2]
    ids = [t for t in bias if t < vocab]
    idx = torch.tensor(ids, dtype=torch.long, device=device)
    values = torch.tensor([bias[t] for t in ids], dtype=torch.float32, device=device)
    if len(_BIAS_CACHE) >= _BIAS_CACHE_SIZE:
        _BIAS_CACHE.pop(next(iter(_BIAS_CACHE)))
    _BIAS_CACHE[key] = (bias, idx, values)
    return idx, values


def penalty_window(history: list[int], num_prompt: int, last_n: int | None) -> tuple[list[int], int]:
    """The tokens the penalties read, and how many of them are the prompt's: the last ``last_n`` of ``history``
    (all of it for None or -1, none for 0), as llama.cpp's and Ollama's ``repeat_last_n``."""
    if last_n is None or last_n < 0 or last_n >= len(history):
        return history, num_prompt
    if last_n == 0:
        return [], 0
    start = len(history) - last_n
    return history[start:], max(num_prompt - start, 0)


def apply_repetition_penalty(row: torch.Tensor, history: list[int], penalty: float) -> torch.Tensor:
    """CTRL-style penalty, as in HF: divide positive logits of seen tokens by ``penalty``, multiply negative."""
    row = row.clone()
    idx = torch.tensor(sorted(set(history)), dtype=torch.long, device=row.device)
    seen = row[idx]
    row[idx] = torch.where(seen > 0, seen / penalty, seen * penalty)
    return row


def apply_presence_frequency(row: torch.Tensor, generated: list[int], presence: float,
                             frequency: float) -> torch.Tensor:
    """OpenAI's penalties: ``logit -= frequency * count + presence`` for every token generated so far."""
    counts = Counter(generated)
    row = row.clone()
    idx = torch.tensor(list(counts), dtype=torch.long, device=row.device)
    n = torch.tensor(list(counts.values()), dtype=row.dtype, device=row.device)
    row[idx] -= frequency * n + presence
    return row


def token_logprob(scaled: torch.Tensor, token: int, top: int) -> TokenLogprob:
    """The log-probability of ``token`` under ``softmax(scaled)``, with the ``top`` most likely tokens."""
    logprobs = torch.log_softmax(scaled, dim=-1)
    best: list[tuple[int, float]] = []
    if top:
        values, ids = torch.topk(logprobs, min(top, logprobs.numel()))
        # tokens the grammar or a bias ruled out (-inf) are no alternatives, and JSON cannot carry -inf
        best = [(i, v) for i, v in zip(ids.tolist(), values.tolist(), strict=True) if v > float("-inf")]
    return TokenLogprob(token, float(logprobs[token]), best)


def filtered_probs(row: torch.Tensor, temperature: float, top_k: int, top_p: float,
                   min_p: float = 0.0) -> torch.Tensor:
    """Probabilities after temperature, top-k, nucleus (top-p) and min-p filtering."""
    row = row / temperature
    if 0 < top_k < row.numel():
        kth = torch.topk(row, top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    probs = torch.softmax(row, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = sorted_probs.cumsum(0)
        drop = cumulative - sorted_probs > top_p  # keep the smallest set whose mass reaches top_p
        sorted_probs[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        probs = probs / probs.sum()
    if min_p > 0.0:
        probs = probs.masked_fill(probs < min_p * probs.max(), 0.0)
        probs = probs / probs.sum()
    return probs
