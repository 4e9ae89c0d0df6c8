"""Each GGUF block type of :data:`engine.loading.formats.BLOCK_FORMATS` in torch: unpacked for the packed kernels,
and dequantized as the ``gguf`` package's numpy code does.

transformers loads a GGUF by dequantizing every tensor; the int4/int8 levels would then quantize those weights a
second time. The kernels take the file's own blocks instead, so they run the very weights llama.cpp runs:

* torch's int4 group-32 format dequantizes as (q − 8)·scale + zero, so Q4_0 (scale d, zero 0), Q4_1 (d, m + 8d)
  and Q4_K (d·sc, 8·d·sc − dmin·mn) are exact: :class:`Int4Parts`. The kernel keeps scale and zero in the
  activation dtype (bf16), which rounds them; that is the only difference.
* torch's int8 kernel takes one scale per output channel, so Q8_0 blocks are requantized per row from the exact
  values (:class:`Q8Parts`, ``Int8Linear.from_q8``); the error is half an int8 step of the row's largest weight.

Rows are independent: a caller may reorder them (llama's permuted Q/K rows) before or after unpacking.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch

from engine.loading.formats import BLOCK_FORMATS

#: Weights per group of torch's int4 kernel and per block of the 32-weight types.
GROUP = 32


@dataclass(slots=True)
class Int4Parts:
    """Weights as torch's int4 group-32 kernel reads them: w = (q − 8)·scale + zero."""

    q: torch.Tensor  # int32 [n, k], 0..15
    scale: torch.Tensor  # fp32 [n, k / 32]
    zero: torch.Tensor  # fp32 [n, k / 32]

    def dequantize(self) -> torch.Tensor:
        n, k = self.q.shape
        q = self.q.view(n, k // GROUP, GROUP).float()
        return ((q - 8) * self.scale[..., None] + self.zero[..., None]).view(n, k)


@dataclass(slots=True)
class Q8Parts:
    """Q8_0 weights: w = q·scale with one scale per 32-weight block."""

    q: torch.Tensor  # int8 [n, k]
    scale: torch.Tensor  # fp32 [n, k / 32]

    def dequantize(self) -> torch.Tensor:
        n, k = self.q.shape
        return (self.q.view(n, k // GROUP, GROUP).float() * self.scale[..., None]).view(n, k)


def _blocks(raw: torch.Tensor, kind: str) -> torch.Tensor:
    """Rows of raw bytes (uint8 [n, bytes per row]) as [n, blocks, bytes per block]."""
    return raw.view(raw.shape[0], -1, BLOCK_FORMATS[kind].nbytes)


def _f16(raw: torch.Tensor) -> torch.Tensor:
    """Two bytes per block (the last dim) read as a little-endian fp16, returned as fp32 [..., 1]."""
    return raw.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """16 bytes -> 32 values: byte j holds value j (low nibble) and value j + 16 (high nibble)."""
    return torch.cat((qs & 0xF, qs >> 4), dim=-1)


# --- Q4_0: fp16 d, 16 bytes of nibbles; w = d·(q − 8) ----------------------------------------------------------
def _unpack_q4_0(raw: torch.Tensor) -> Int4Parts:
    blocks = _blocks(raw, "Q4_0")
    d = _f16(blocks[..., 0:2])[..., 0]
    return _int4(_nibbles(blocks[..., 2:18]), d, torch.zeros_like(d))


def _dequantize_q4_0(raw: torch.Tensor) -> torch.Tensor:
    blocks = _blocks(raw, "Q4_0")
    return _f16(blocks[..., 0:2]) * (_nibbles(blocks[..., 2:18]).to(torch.int8) - 8).float()


# --- Q4_1: fp16 d, fp16 m, 16 bytes of nibbles; w = d·q + m -----------------------------------------------------
def _unpack_q4_1(raw: torch.Tensor) -> Int4Parts:
    blocks = _blocks(raw, "Q4_1")
    d, m = _f16(blocks[..., 0:2])[..., 0], _f16(blocks[..., 2:4])[..., 0]
    return _int4(_nibbles(blocks[..., 4:20]), d, m + 8 * d)


def _dequantize_q4_1(raw: torch.Tensor) -> torch.Tensor:
    blocks = _blocks(raw, "Q4_1")
    return _f16(blocks[..., 0:2]) * _nibbles(blocks[..., 4:20]).float() + _f16(blocks[..., 2:4])


# --- Q4_K: 256 weights in 8 sub-blocks of 32 with 6-bit sub-scales and sub-minimums; w = d·sc·q − dmin·mn --------
def _unpack_q4_k(raw: torch.Tensor) -> Int4Parts:
    n = raw.shape[0]
    blocks = _blocks(raw, "Q4_K")
    d_super, dmin = _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])  # [n, blocks, 1]
    sc, mn = _k4_scales(blocks[..., 4:16].long())
    qs = blocks[..., 16:144].reshape(n, -1, 4, 32)  # four chunks of 64 values: low nibbles, then high
    q = torch.stack((qs & 0xF, qs >> 4), dim=3).reshape(n, -1, 32)
    d = (d_super * sc).reshape(n, -1)
    return _int4(q, d, (8 * d_super * sc - dmin * mn).reshape(n, -1))


def _k4_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K's eight 6-bit sub-scales and sub-minimums from its 12 packed bytes (ggml's get_scale_min_k4)."""
    lo_sc, lo_mn = s[..., 0:4] & 63, s[..., 4:8] & 63
    hi_sc = (s[..., 8:12] & 0xF) | ((s[..., 0:4] >> 6) << 4)
    hi_mn = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return torch.cat((lo_sc, hi_sc), -1).float(), torch.cat((lo_mn, hi_mn), -1).float()


# --- Q8_0: fp16 d, 32 int8 q; w = d·q ---------------------------------------------------------------------------
def _unpack_q8_0(raw: torch.Tensor) -> Q8Parts:
    blocks = _blocks(raw, "Q8_0")
    q = blocks[..., 2:34].contiguous().view(torch.int8).reshape(raw.shape[0], -1)
    return Q8Parts(q, _f16(blocks[..., 0:2])[..., 0])


def _dequantize_q8_0(raw: torch.Tensor) -> torch.Tensor:
    blocks = _blocks(raw, "Q8_0")
    return _f16(blocks[..., 0:2]) * blocks[..., 2:34].contiguous().view(torch.int8).float()


def _int4(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> Int4Parts:
    return Int4Parts(q.reshape(q.shape[0], -1).to(torch.int32), scale, zero)


#: Each block type's unpacking into its kernel's parts.
UNPACK: dict[str, Callable[[torch.Tensor], Int4Parts | Q8Parts]] = {
    "Q4_0": _unpack_q4_0, "Q4_1": _unpack_q4_1, "Q4_K": _unpack_q4_k, "Q8_0": _unpack_q8_0,
}  # fmt: skip
#: Block types dequantized in torch (bitwise as ``gguf``'s numpy code); others go through that code.
DEQUANTIZE: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "Q4_0": _dequantize_q4_0, "Q4_1": _dequantize_q4_1, "Q8_0": _dequantize_q8_0,
}  # fmt: skip


def unpack_int4(raw: torch.Tensor, kind: str) -> Int4Parts:
    """Unpack the blocks (uint8 [n, bytes per row]) of a tensor whose type the int4 kernel runs."""
    fmt = BLOCK_FORMATS.get(kind)
    if fmt is None or fmt.level != "int4":
        raise ValueError(f"{kind} has no int4 form")
    return cast(Int4Parts, UNPACK[kind](raw))


def unpack_q8(raw: torch.Tensor) -> Q8Parts:
    """Unpack Q8_0 blocks (uint8 [n, bytes per row])."""
    return _unpack_q8_0(raw)


def dequantize(kind: str, raw: torch.Tensor) -> torch.Tensor:
    """Rows of a tensor's file bytes (uint8 [rows, bytes per row]) of ggml type ``kind`` as fp32 [rows, columns].

    Block types with a torch form are computed in the same operations and order as ``gguf``'s numpy code, so the
    values are bitwise those transformers' GGUF loader produces (a near tie in the logits stays where it was).
    """
    if kind in DEQUANTIZE:
        return DEQUANTIZE[kind](raw)
    if kind == "F32":
        return raw.view(torch.float32).clone()
    if kind == "F16":
        return raw.view(torch.float16).float()
    if kind == "BF16":
        return raw.view(torch.bfloat16).float()
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as numpy_dequantize

    values = numpy_dequantize(raw.numpy(), GGMLQuantizationType[kind]).astype(np.float32)
    return torch.from_numpy(values).reshape(raw.shape[0], -1)
