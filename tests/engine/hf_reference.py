"""Hugging Face ``generate`` as the reference for greedy decoding.

Our greedy tokens must equal HF's in fp32. The one allowed difference: from a step where HF's own top two
logits are within ``TIE_GAP`` of each other, rounding may pick the other token, and the texts may part.
"""

from __future__ import annotations

from typing import Any

import torch

TIE_GAP = 1e-4
#: Per model and prompt: the longest greedy continuation asked for so far, its logits, and its length limit.
_cache: dict[tuple[int, tuple[int, ...]], tuple[list[int], list[torch.Tensor], int]] = {}


def hf_greedy(model: Any, prompt_ids: list[int], max_new_tokens: int) -> tuple[list[int], list[torch.Tensor]]:
    """HF's greedy continuation of ``prompt_ids`` and the logits it chose each token from (memoised per model).

    A greedy continuation's first N tokens and logits do not depend on how many follow, so a shorter request is
    served from the longest one generated for that prompt (tests ask for the same prompts at 8 to 40 tokens).
    """
    key = (id(model), tuple(prompt_ids))
    cached = _cache.get(key)
    if cached is None or cached[2] < max_new_tokens:
        tokens, logits = _generate(model, prompt_ids, max_new_tokens)
        cached = _cache[key] = (tokens, logits, max_new_tokens)
    tokens, logits, _ = cached
    return tokens[:max_new_tokens], logits[:max_new_tokens]


def _generate(model: Any, prompt_ids: list[int], max_new_tokens: int) -> tuple[list[int], list[torch.Tensor]]:
    ids = torch.tensor([prompt_ids], device=model.device)
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=model.generation_config.eos_token_id,
        )
    return out.sequences[0, len(prompt_ids) :].tolist(), [step[0].float().cpu() for step in out.logits]


def assert_matches_hf(model: Any, prompt_ids: list[int], ours: list[int], max_new_tokens: int) -> str:
    """Fail unless ``ours`` equals HF's greedy tokens up to a genuine near-tie. Returns "exact" or "tie@N"."""
    ref, logits = hf_greedy(model, prompt_ids, max_new_tokens)
    if ours == ref:
        return "exact"
    diverged = next((i for i, (a, b) in enumerate(zip(ours, ref, strict=False)) if a != b), min(len(ours), len(ref)))
    assert diverged < len(logits), f"outputs differ only in length: ours {len(ours)} tokens, HF {len(ref)}"
    top2 = torch.topk(logits[diverged], 2).values
    gap = float(top2[0] - top2[1])
    assert gap < TIE_GAP, (
        f"greedy output diverges from HF generate at step {diverged} (ours {ours[diverged:diverged + 3]}, "
        f"HF {ref[diverged:diverged + 3]}) where HF's top-2 logit gap is {gap:.2e}, not a tie (< {TIE_GAP})"
    )
    return f"tie@{diverged}"
