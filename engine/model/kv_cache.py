"""The KV pool: per layer, K and V for every slot of every block, preallocated once.

A token's slot is ``block_id * block_size + offset``; the block manager (``engine/core/block_manager.py``) hands
out the block ids. Block ``NULL_BLOCK`` is never handed out: padded attention reads point at it, under a
mask that gives it zero weight. It starts zero and stays finite (the padding rows of a CUDA-graph step,
``cuda_graphs.py``, write their K/V to its first slot).
"""

from __future__ import annotations

from typing import Any

import torch

from engine import architectures
from engine.api import NULL_BLOCK, dtype_name

#: The reserved, always-zero block.


def kv_bytes_per_token(config: Any, dtype: torch.dtype) -> int:
    """KV bytes one token costs at ``dtype`` (see :func:`engine.architectures.kv_bytes_per_token`)."""
    return architectures.kv_bytes_per_token(config, dtype.itemsize)


def resolve_kv_dtype(name: str, model_dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.dtype:
    """The KV dtype for ``EngineConfig.kv_dtype``.

    "auto" is float32 on a CPU and the model's own dtype elsewhere. A CPU runs decode attention in fp32 (torch's
    bf16 attention is several times slower there), so an fp32 pool is read as it is stored: no cast per layer and
    step, and a lone sequence's keys are a view of the pool, not a copy: decode attention is bound by reading the
    context's K and V every layer and step, and a cast would add a pass over them each time (docs/BENCHMARKS.md).
    It holds half as many tokens per byte.
    """
    if name == "auto":
        return torch.float32 if torch.device(device).type == "cpu" else model_dtype
    try:
        return getattr(torch, dtype_name(name))
    except ValueError:
        raise ValueError(f"kv_dtype must be auto, float32, bfloat16 or float16, got {name!r}") from None


class KVCache:
    """The preallocated pool: per layer, K and V as [num_blocks * block_size, kv_heads, head_dim]."""

    def __init__(self, config: Any, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device):
        _, num_kv_heads, head_dim = architectures.attention_shape(config)
        shape = (config.num_hidden_layers, num_blocks * block_size, num_kv_heads, head_dim)
        # empty, not zeros: untouched pages are never committed on the CPU. Only the null block must be finite.
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        null = slice(NULL_BLOCK * block_size, (NULL_BLOCK + 1) * block_size)
        self.k[:, null].zero_()
        self.v[:, null].zero_()
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype

    def copy_prefix(self, source: int, target: int, num_tokens: int) -> None:
        """Copy the K/V of block ``source``'s first ``num_tokens`` slots, every layer, into block ``target``."""
        if not 0 < num_tokens <= self.block_size or NULL_BLOCK in (source, target) or source == target:
            raise ValueError(f"cannot copy {num_tokens} slots from block {source} to block {target}")
        src = slice(source * self.block_size, source * self.block_size + num_tokens)
        dst = slice(target * self.block_size, target * self.block_size + num_tokens)
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes
