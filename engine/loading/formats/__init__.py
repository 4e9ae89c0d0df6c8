"""The GGUF block types whose quantized weights the engine reads itself, one :class:`BlockFormat` row each.

A row says how one block is laid out, what it dequantizes to and which CPU level's kernel runs it as it is. The
rows are plain data (no torch), so the recommendation reads them before any weight is loaded; each type's torch
code sits in :mod:`engine.loading.formats.gguf_blocks`, under the same name:

* ``unpack``: the blocks as the parts a packed kernel takes (:class:`~engine.loading.formats.gguf_blocks.Int4Parts`
  for torch's int4 groups of 32, :class:`~engine.loading.formats.gguf_blocks.Q8Parts` for int8);
* ``dequantize`` (where the native loader needs it): fp32 values computed in the same operations and order as the
  ``gguf`` package's numpy code, so they are bitwise what transformers' GGUF loader produces.

Adding a block type touches this package (a row here, its unpack in ``gguf_blocks.py``), the kernel that runs its
parts (``engine/model/quantization.py``), and ``tests/engine/loading/test_gguf_weights.py``, which compares the unpacked
blocks with ``gguf``'s numpy dequantize.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FileLevel = Literal["int4", "int8"]


@dataclass(frozen=True, slots=True)
class BlockFormat:
    """One GGUF block type.

    Attributes:
        name: the ggml type name ("Q4_0").
        weights: weights per block.
        nbytes: bytes per block.
        layout: the block's fields in file order.
        formula: what a weight is, in the fields' terms.
        level: the CPU level whose kernel runs these blocks as they are: "int4" where torch's int4 group-32 form
            (w = (q − 8)·scale + zero) holds them exactly, "int8" where they are int8 values with block scales.
    """

    name: str
    weights: int
    nbytes: int
    layout: str
    formula: str
    level: FileLevel


#: Every block type the engine reads itself, by ggml type name.
BLOCK_FORMATS: dict[str, BlockFormat] = {f.name: f for f in (
    BlockFormat("Q4_0", 32, 18, "fp16 d, 16 bytes of 4-bit q (byte j: value j low, j + 16 high)",
                "w = d·(q − 8)", "int4"),
    BlockFormat("Q4_1", 32, 20, "fp16 d, fp16 m, 16 bytes of 4-bit q (as Q4_0)", "w = d·q + m", "int4"),
    BlockFormat("Q4_K", 256, 144,
                "fp16 d, fp16 dmin, 12 bytes of eight 6-bit sub-scales sc and sub-minimums mn, 128 bytes of 4-bit q "
                "(four chunks of 64 values: 32 low nibbles, then 32 high)",
                "w = d·sc·q − dmin·mn, per sub-block of 32", "int4"),
    BlockFormat("Q8_0", 32, 34, "fp16 d, 32 int8 q", "w = d·q", "int8"),
)}  # fmt: skip


#: The block types the native block kernels multiply as they are (engine/model/csrc/gguf_kernels.cpp): what the
#: "file" precision runs, by ggml type name.
KERNEL_TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
#: Float tensor types, which the "file" precision runs as dense fp32 layers.
FLOAT_TYPES = ("F32", "F16", "BF16")


def file_level(kind: str) -> FileLevel | None:
    """The CPU level that runs blocks of ``kind`` (a ggml type name) as they are; None for other types."""
    fmt = BLOCK_FORMATS.get(kind)
    return None if fmt is None else fmt.level
