"""Turns a step's logits into next tokens: greedy, temperature, top-k, top-p, repetition penalty, seeds."""

from __future__ import annotations

import torch

from engine.api import SamplingParams


class Sampler:
    """Samples one token per row. Greedy rows take a single vectorised argmax; the others go row by row,
    each with its own generator so a seeded request reproduces whatever it is batched with."""

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
    ) -> list[int]:
        """Pick the next token of each row of ``logits`` ([rows, vocab])."""
        logits = logits.float()
        if all(p.is_greedy and p.repetition_penalty == 1.0 for p in params):
            return logits.argmax(dim=-1).tolist()
        out: list[int] = []
        for row, p, rid, history in zip(logits, params, request_ids, histories, strict=True):
            if p.repetition_penalty != 1.0 and history:
                row = apply_repetition_penalty(row, history, p.repetition_penalty)
            if p.is_greedy:
                out.append(int(row.argmax()))
                continue
            probs = filtered_probs(row, p.temperature, p.top_k, p.top_p)
            token = torch.multinomial(probs.cpu(), 1, generator=self._generator(rid, p.seed))
            out.append(int(token))
        return out


def apply_repetition_penalty(row: torch.Tensor, history: list[int], penalty: float) -> torch.Tensor:
    """CTRL-style penalty, as in HF: divide positive logits of seen tokens by ``penalty``, multiply negative."""
    row = row.clone()
    idx = torch.tensor(sorted(set(history)), dtype=torch.long, device=row.device)
    seen = row[idx]
    row[idx] = torch.where(seen > 0, seen / penalty, seen * penalty)
    return row


def filtered_probs(row: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Probabilities after temperature, top-k and nucleus (top-p) filtering."""
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
    return probs
