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

import contextlib
from collections.abc import Callable, Iterator
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


# --- K-quants, dequantized only (the loader's dense levels): ggml's super-blocks of 256 weights -------------------
#: Bytes per 256-weight block of the K-quant types dequantized here but not in :data:`BLOCK_FORMATS`.
_K_BLOCK_BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}


def _k_blocks(raw: torch.Tensor, kind: str) -> torch.Tensor:
    """Rows of raw bytes as one block per row: [rows · blocks, bytes per block]."""
    return raw.reshape(-1, _K_BLOCK_BYTES[kind])


def _float(x: torch.Tensor) -> torch.Tensor:
    """Small integers as fp32 (exact), converted by numpy: several times faster than torch's uint8/int8 cast."""
    return torch.from_numpy(x.numpy().astype(np.float32))


def _bits(x: torch.Tensor, shifts: tuple[int, ...], mask: int) -> torch.Tensor:
    """``(x >> s) & mask`` for each shift, in a new axis before ``x``'s last (numpy's broadcast shift), as uint8."""
    out = torch.empty((*x.shape[:-1], len(shifts), x.shape[-1]), dtype=torch.uint8)
    for i, s in enumerate(shifts):
        part = out[..., i, :]
        if s:
            torch.bitwise_right_shift(x, s, out=part)
            part &= mask
        else:
            torch.bitwise_and(x, mask, out=part)
    return out


def _dequantize_q4_k(raw: torch.Tensor) -> torch.Tensor:
    blocks = _k_blocks(raw, "Q4_K")
    nb = blocks.shape[0]
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])  # [nb, 1]
    sc, mn = _k4_scales(blocks[:, 4:16].long())
    dd, dm = (d * sc).reshape(nb, -1, 1), (dmin * mn).reshape(nb, -1, 1)
    q = _float(_bits(blocks[:, 16:144].reshape(nb, -1, 32), (0, 4), 0x0F).reshape(nb, -1, 32))
    return q.mul_(dd).sub_(dm).reshape(raw.shape[0], -1)  # in place: d·q, then − dm, each rounded as numpy does


def _dequantize_q5_k(raw: torch.Tensor) -> torch.Tensor:
    blocks = _k_blocks(raw, "Q5_K")
    nb = blocks.shape[0]
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    sc, mn = _k4_scales(blocks[:, 4:16].long())
    dd, dm = (d * sc).reshape(nb, -1, 1), (dmin * mn).reshape(nb, -1, 1)
    q = _bits(blocks[:, 48:176].reshape(nb, -1, 32), (0, 4), 0x0F).reshape(nb, -1, 32)
    qh = _bits(blocks[:, 16:48].reshape(nb, -1, 32), tuple(range(8)), 0x01).reshape(nb, -1, 32)
    q |= qh.bitwise_left_shift_(4)
    return _float(q).mul_(dd).sub_(dm).reshape(raw.shape[0], -1)


def _dequantize_q6_k(raw: torch.Tensor) -> torch.Tensor:
    blocks = _k_blocks(raw, "Q6_K")
    nb = blocks.shape[0]
    scales = blocks[:, 192:208].contiguous().view(torch.int8).float()
    d = (_f16(blocks[:, 208:210]) * scales).reshape(nb, 16, 1)
    q = _bits(blocks[:, 0:128].reshape(nb, -1, 64), (0, 4), 0x0F).reshape(nb, -1, 32)
    qh = _bits(blocks[:, 128:192].reshape(nb, -1, 32), (0, 2, 4, 6), 0x03).reshape(nb, -1, 32)
    q |= qh.bitwise_left_shift_(4)
    values = _float(q.view(torch.int8)).sub_(32)  # (q − 32) in int8 is exact in fp32 too
    return values.reshape(nb, 16, -1).mul_(d).reshape(raw.shape[0], -1)


def _int4(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> Int4Parts:
    return Int4Parts(q.reshape(q.shape[0], -1).to(torch.int32), scale, zero)


#: Each block type's unpacking into its kernel's parts.
UNPACK: dict[str, Callable[[torch.Tensor], Int4Parts | Q8Parts]] = {
    "Q4_0": _unpack_q4_0, "Q4_1": _unpack_q4_1, "Q4_K": _unpack_q4_k, "Q8_0": _unpack_q8_0,
}  # fmt: skip
#: Block types dequantized in torch (bitwise as ``gguf``'s numpy code); others go through that code.
DEQUANTIZE: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "Q4_0": _dequantize_q4_0, "Q4_1": _dequantize_q4_1, "Q8_0": _dequantize_q8_0,
    "Q4_K": _dequantize_q4_k, "Q5_K": _dequantize_q5_k, "Q6_K": _dequantize_q6_k,
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


def dequantize(kind: str, raw: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rows of a tensor's file bytes (uint8 [rows, bytes per row]) of ggml type ``kind`` as [rows, columns] of
    ``dtype``: the fp32 values, rounded to ``dtype`` where it is narrower.

    Block types with a torch form are computed in the same operations and order as ``gguf``'s numpy code, so the
    values are bitwise those transformers' GGUF loader produces (a near tie in the logits stays where it was). They
    are computed a slice of rows at a time (:data:`_CHUNK_VALUES` values), each slice's passes over its values
    while they are in the CPU's cache, straight into the result.
    """
    if kind not in DEQUANTIZE:
        return _dequantize_whole(kind, raw).to(dtype)
    rows = raw.shape[0]
    fmt = BLOCK_FORMATS.get(kind)
    weights, nbytes = (fmt.weights, fmt.nbytes) if fmt is not None else (256, _K_BLOCK_BYTES[kind])
    columns = raw.shape[1] // nbytes * weights
    step = max(1, _CHUNK_VALUES // max(columns, 1))
    if step >= rows:
        return DEQUANTIZE[kind](raw).reshape(rows, columns).to(dtype)
    out = torch.empty(rows, columns, dtype=dtype)
    with _one_thread():
        for start in range(0, rows, step):
            part = raw[start : start + step]
            out[start : start + step] = DEQUANTIZE[kind](part).reshape(part.shape[0], columns)
    return out


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """torch's ops on one thread within the block. A slice's ops are short: split over the cores, each would wait on
    every core at its end, and on a busy machine (another process holding a core) that wait is most of its time
    (a 1B model's slices took 20 times longer on two threads than on one, at load average 9 on 2 cores)."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


#: Values per slice of rows that :func:`dequantize` computes at once: its fp32 temporaries then fit in a core's
#: cache, where a whole tensor's would stream through memory once per operation.
_CHUNK_VALUES = 1 << 18


def _dequantize_whole(kind: str, raw: torch.Tensor) -> torch.Tensor:
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
