"""The "file" precision: a GGUF file's weights multiplied in their own blocks (``csrc/gguf_kernels.cpp``).

Nothing is dequantized to 16 bits. Each fused weight (Q/K/V, gate/up, ...) is one or more runs of the file's block
bytes (:class:`engine.loading.gguf_weights.Blocks`), and ``torch.ops.hearth.gguf_mm`` multiplies activations,
quantized to int8 per block as llama.cpp does, by each run. The embedding dequantizes only the rows it looks up.
Float tensors in a file (F32/F16/BF16 2-D weights) run as dense fp32 layers.

The kernels live in the native extension, so this level is offered only where it loads
(:func:`engine.model.native.file_problem`).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.loading.formats import KERNEL_TYPES
from engine.loading.gguf_weights import GROUPED_BASE, Blocks

#: ggml type names of the float tensors a file may hold, which run dense
_FLOAT_TYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
#: the block types ``gguf_mm`` multiplies (ggml type names; engine/model/csrc/gguf_kernels.cpp)
BLOCK_TYPES = KERNEL_TYPES


def _dense(blocks: Blocks) -> torch.Tensor:
    """A float tensor's rows of bytes as fp32 values."""
    return blocks.data.view(_FLOAT_TYPES[blocks.name]).float()


class GgufLinear:
    """``x @ W.T + bias`` where W's output rows are runs of file blocks (``segments``), each multiplied in place."""

    def __init__(self, segments: list[Blocks], bias: torch.Tensor | None = None) -> None:
        unknown = [s.name for s in segments if s.name not in BLOCK_TYPES and s.name not in _FLOAT_TYPES]
        if unknown:
            raise ValueError(
                f"GGUF block type {unknown[0]} has no kernel here (supported: {', '.join(BLOCK_TYPES)}); load the "
                "model at int4, int8 or bf16 instead"
            )
        self.segments = [s if s.name in BLOCK_TYPES else s._replace(data=_dense(s)) for s in segments]
        self.bias = None if bias is None else bias.float()
        self.out_features = sum(int(s.data.shape[0]) for s in segments)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        parts = [
            torch.ops.hearth.gguf_mm(flat, s.data, s.kind) if s.name in BLOCK_TYPES
            else (flat.float() @ s.data.T).to(x.dtype)
            for s in self.segments
        ]
        y = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    @property
    def nbytes(self) -> int:
        return sum(s.data.nbytes for s in self.segments) + (0 if self.bias is None else self.bias.nbytes)


class GgufEmbedding(nn.Module):
    """The token embedding kept in its file blocks: a lookup dequantizes only the rows it reads.

    Blocks in groups of eight rows (:func:`engine.loading.gguf_weights.grouped`, which a tied head multiplies
    faster) are looked up a group at a time: each token's group is dequantized and its row kept. The rows past the
    last whole group stay in the file's layout."""

    blocks: torch.Tensor

    #: tokens looked up per dequantized batch of groups (each takes eight rows of fp32 values)
    GROUP_LOOKUPS = 256

    def __init__(self, blocks: Blocks, dtype: torch.dtype) -> None:
        super().__init__()
        self.kind, self.type_name, self.dtype = blocks.kind, blocks.name, dtype
        self.register_buffer("blocks", blocks.data, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        if self.type_name in _FLOAT_TYPES:
            values = self.blocks.index_select(0, flat).view(_FLOAT_TYPES[self.type_name]).float()
        elif self.kind < GROUPED_BASE or not len(flat):
            values = torch.ops.hearth.gguf_dequantize(self.blocks.index_select(0, flat), self.kind)
        else:
            values = torch.cat([self._from_groups(flat[i:i + self.GROUP_LOOKUPS])
                                for i in range(0, len(flat), self.GROUP_LOOKUPS)])
        return values.to(self.dtype).reshape(*ids.shape, values.shape[-1])

    def _from_groups(self, ids: torch.Tensor) -> torch.Tensor:
        rows, row_bytes = self.blocks.shape
        whole = rows // 8 * 8
        values = None
        if whole:
            clamped = ids.clamp(max=whole - 1)
            groups = self.blocks[:whole].view(-1, 8 * row_bytes).index_select(0, clamped // 8)
            eights = torch.ops.hearth.gguf_dequantize(groups.view(-1, row_bytes), self.kind).view(len(ids), 8, -1)
            values = eights[torch.arange(len(ids)), clamped % 8]
        tail = ids >= whole
        if bool(tail.any()):  # fewer than eight rows: the file's layout, which the grouped type dequantizes as is
            rest = torch.ops.hearth.gguf_dequantize(self.blocks[whole:], self.kind)[(ids - whole).clamp(min=0)]
            values = rest if values is None else torch.where(tail[:, None], rest, values)
        assert values is not None
        return values
