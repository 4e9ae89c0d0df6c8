"""A draft model for speculative decoding: the loaded model's own int4 copy, or a separate small model.

The drafter is a second :class:`~engine.model.runner.ModelRunner` with a KV pool of its own, addressed by the
target sequence's block table: the draft's K/V of the token at position p sits at the same slot as the target's.
So the drafter needs no block bookkeeping. Each sequence remembers how far the draft's KV reaches
(``num_draft_computed``); a draft first catches up on the tokens it has not seen (the prompt, the last accepted
tokens), then runs one token at a time for the rest of the k. Stale draft KV can only lower the acceptance rate:
the target model verifies every token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from engine.api import SamplingParams
from engine.model.runner import ModelRunner
from engine.model.sampler import Sampler, target_probs


class DraftSequence(Protocol):
    """What the drafter reads and updates of a scheduled sequence (``engine.core.sequence.Sequence``)."""

    request_id: str
    token_ids: list[int]
    block_table: list[int]
    params: SamplingParams
    num_prompt_tokens: int
    num_draft_computed: int


@dataclass(slots=True)
class _View:
    token_ids: list[int]
    block_table: list[int]
    num_computed_tokens: int


@dataclass(slots=True)
class _Batch:
    seqs: list[_View]
    num_new_tokens: list[int]

    def __len__(self) -> int:
        return len(self.seqs)


class ModelDrafter:
    """Drafts k tokens per sequence with a small model over its own KV pool."""

    def __init__(self, runner: ModelRunner, sampler: Sampler, target_vocab: int) -> None:
        self.runner = runner
        self.sampler = sampler
        self.target_vocab = target_vocab

    @classmethod
    def build(
        cls,
        model: torch.nn.Module,
        num_blocks: int,
        block_size: int,
        kv_dtype: torch.dtype,
        quantization: str,
        sampler: Sampler,
        target_vocab: int,
        quant_backend: str = "auto",
    ) -> ModelDrafter:
        runner = ModelRunner(model, num_blocks, block_size, kv_dtype, quantization, quant_backend)
        return cls(runner, sampler, target_vocab)

    def propose(self, seqs: Sequence[DraftSequence], k: int) -> list[tuple[list[int], torch.Tensor | None]]:
        """Each sequence's draft of ``k`` tokens and, for sampled requests, the draft distribution of each."""
        views = []
        for seq in seqs:
            start = min(seq.num_draft_computed, len(seq.token_ids) - 1)
            views.append(_View(list(seq.token_ids), seq.block_table, start))
        drafts: list[list[int]] = [[] for _ in seqs]
        probs: list[list[torch.Tensor]] = [[] for _ in seqs]
        for _ in range(k):
            batch = _Batch(views, [len(v.token_ids) - v.num_computed_tokens for v in views])
            logits, rows = self.runner.run(batch)
            assert logits is not None and rows == list(range(len(views)))
            for i, (seq, view, row) in enumerate(zip(seqs, views, logits, strict=True)):
                token, q = self._draw(seq, view.token_ids, row)
                drafts[i].append(token)
                if q is not None:
                    probs[i].append(q)
                view.num_computed_tokens = len(view.token_ids)
                view.token_ids.append(token)
        for seq, view in zip(seqs, views, strict=True):
            seq.num_draft_computed = view.num_computed_tokens
        return [(d, torch.stack(p) if p else None) for d, p in zip(drafts, probs, strict=True)]

    def _draw(self, seq: DraftSequence, tokens: list[int], row: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        p = seq.params
        row = _fit_vocab(row.float(), self.target_vocab)
        q, best = target_probs(row, p, tokens if p.is_penalised else [], seq.num_prompt_tokens)
        if q is None:
            return best, None
        gen = self.sampler.draft_generator(seq.request_id, p.seed)
        return int(torch.multinomial(q.cpu(), 1, generator=gen)), q


def _fit_vocab(row: torch.Tensor, vocab: int) -> torch.Tensor:
    """The draft's logits over the target's vocabulary (a padded embedding may make the sizes differ)."""
    if row.numel() == vocab:
        return row
    if row.numel() > vocab:
        return row[:vocab]
    return torch.cat([row, row.new_full((vocab - row.numel(),), float("-inf"))])


def same_vocabulary(tokenizer: Any, other: Any) -> bool:
    """Whether two tokenizers map every token to the same id (a draft model must share the target's)."""
    return bool(tokenizer.get_vocab() == other.get_vocab())


__all__ = ["ModelDrafter", "same_vocabulary"]
