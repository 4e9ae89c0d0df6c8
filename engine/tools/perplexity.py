"""Perplexity of a text under a loaded engine, computed through the engine's own paged forward pass."""

from __future__ import annotations

import math
from typing import Any

import torch

from engine.api import SamplingParams
from engine.core.scheduler import ScheduledBatch
from engine.core.sequence import Sequence


def perplexity(llm: Any, text: str, window: int = 512) -> float:
    """exp(mean negative log-likelihood) of ``text``, scored in independent windows of ``window`` tokens.

    Each window is prefilled in chunks of the engine's token budget through the KV cache, exactly as a
    prompt would be, so every quantization level is measured on the path that serves users.
    """
    engine = llm.engine
    ids = engine.tokenize(text)
    budget = engine.config.max_num_batched_tokens
    total_nll, total_tokens = 0.0, 0
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start : start + window]
        if len(chunk) < 2:
            break
        seq = Sequence("perplexity", list(chunk), SamplingParams(max_tokens=1))
        bm = engine.block_manager
        if not bm.can_allocate(seq, len(chunk)):
            raise ValueError(f"window of {len(chunk)} tokens does not fit the KV cache; use a smaller window")
        with engine._step_lock:
            seq.num_computed_tokens = 0
            bm.ensure_slots(seq, len(chunk))
            try:
                while seq.num_computed_tokens < len(chunk):
                    n = min(budget, len(chunk) - seq.num_computed_tokens)
                    batch = ScheduledBatch()
                    batch.add(seq, n)
                    logits, _ = engine.runner.run(batch, all_logits=True)
                    assert logits is not None
                    first = seq.num_computed_tokens
                    targets = torch.tensor(chunk[first + 1 : first + n + 1], device=logits.device)
                    logprobs = torch.log_softmax(logits[: len(targets)].float(), dim=-1)
                    total_nll -= float(logprobs.gather(1, targets[:, None]).sum())
                    total_tokens += len(targets)
                    seq.num_computed_tokens += n
            finally:
                bm.free(seq)
    return math.exp(total_nll / max(total_tokens, 1))
