"""Turns a step's logits into next tokens: greedy, temperature, top-k, top-p, min-p, penalties, logit biases,
grammar masks, logprobs and seeds.

Per row, in order: repetition penalty (over prompt and reply), presence and frequency penalties (over the reply,
OpenAI's semantics), logit biases, the grammar mask, temperature. Logprobs come from that distribution (the one the
token is drawn from), before top-k, top-p and min-p truncate it. A row that fails (NaN logits, a grammar that
allows nothing) is reported in :attr:`SampleResult.errors`; the other rows still get their tokens.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from engine.api import SamplingParams, TokenLogprob
from engine.model.grammar import apply_mask


@dataclass(slots=True)
class SampleResult:
    """One step's tokens. ``tokens[i]`` is -1 where ``errors`` has row ``i``."""

    tokens: list[int]
    logprobs: list[TokenLogprob | None]
    errors: dict[int, str] = field(default_factory=dict)


class Sampler:
    """Samples one token per row. When every row is greedy with nothing to adjust or report, the batch takes a
    single vectorised argmax; the others go row by row, each with its own generator so a seeded request
    reproduces whatever it is batched with."""

    def __init__(self) -> None:
        self._generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

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
        logits = logits.float()
        if masks is None and all(p.is_plain_greedy for p in params):
            return SampleResult(logits.argmax(dim=-1).tolist(), [None] * len(params))
        result = SampleResult([], [])
        for i, (row, p, rid, history) in enumerate(zip(logits, params, request_ids, histories, strict=True)):
            try:
                num_prompt = num_prompt_tokens[i] if num_prompt_tokens is not None else 0
                mask = masks[i] if masks is not None else None
                token, logprob = self._sample_row(row, p, rid, history, num_prompt, mask)
            except Exception as exc:  # noqa: BLE001 -- one bad row must not take the batch down
                result.errors[i] = f"sampling failed: {exc}"
                token, logprob = -1, None
            result.tokens.append(token)
            result.logprobs.append(logprob)
        return result

    def _sample_row(self, row: torch.Tensor, p: SamplingParams, rid: str, history: list[int], num_prompt: int,
                    mask: torch.Tensor | None) -> tuple[int, TokenLogprob | None]:
        row = adjusted_logits(row, p, history, num_prompt)
        if mask is not None:
            row = apply_mask(row, mask)
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


def adjusted_logits(row: torch.Tensor, p: SamplingParams, history: list[int], num_prompt: int) -> torch.Tensor:
    """``row`` after the repetition penalty, presence and frequency penalties and logit biases."""
    if p.repetition_penalty != 1.0 and history:
        row = apply_repetition_penalty(row, history, p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and len(history) > num_prompt:
        row = apply_presence_frequency(row, history[num_prompt:], p.presence_penalty, p.frequency_penalty)
    if p.logit_bias:
        row = row.clone()
        vocab = row.numel()
        ids = [t for t in p.logit_bias if t < vocab]
        if ids:
            idx = torch.tensor(ids, dtype=torch.long, device=row.device)
            row[idx] += torch.tensor([p.logit_bias[t] for t in ids], dtype=row.dtype, device=row.device)
    return row


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
