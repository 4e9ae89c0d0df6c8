"""Random GGUF blocks that dequantize to weights like a trained model's (std about 0.02, finite, centred).

The quant codes are random bytes. The fp16 scales (and the 6-bit sub-scales of the K-quants, packed as ggml packs
them) are chosen so that the dequantized values have the spread of a real checkpoint's linear weights: a kernel
then meets ordinary magnitudes, not overflow or denormal noise. Used by ``engine/tools/make_gguf.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType

#: The standard deviation the dequantized weights aim at.
WEIGHT_STD = 0.02
# population std of a uniform code over 0..n-1
_STD4, _STD5, _STD6, _STD8 = (((n * n - 1) / 12) ** 0.5 for n in (16, 32, 64, 256))


def raw_bytes(rng: np.random.Generator, nbytes: int) -> np.ndarray:
    """``nbytes`` uniform random bytes (the bit generator's raw words, the fastest numpy offers)."""
    words = rng.bit_generator.random_raw(-(-nbytes // 8))
    return np.asarray(words, dtype="<u8").view(np.uint8)[:nbytes]


def _jitter(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` factors in [0.75, 1.25], one per block, so blocks differ in scale as real ones do."""
    return 0.75 + raw_bytes(rng, n).astype(np.float32) / 510.0


def _f16(values: np.ndarray) -> np.ndarray:
    """fp16 values as their two little-endian bytes per row."""
    return values.astype("<f2").view(np.uint8).reshape(-1, 2)


def pack_k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and eight 6-bit mins per block into ggml's 12 bytes (``get_scale_min_k4``'s inverse)."""
    out = np.empty((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
    return out


def _k_scales(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Sub-scales in 32..63, each min within a step or two of its scale (so that ``d*sc*q - dmin*m`` is centred
    when ``dmin = d * mean code``)."""
    r = raw_bytes(rng, n * 8).reshape(n, 8)
    sc = 32 + (r & 31)
    m = np.minimum(sc + 1 - ((r >> 5) & 3), 63).astype(np.uint8)
    return sc, m


def _q4_0(rng: np.random.Generator, n: int) -> np.ndarray:
    out = raw_bytes(rng, n * 18).reshape(n, 18)
    out[:, 0:2] = _f16(WEIGHT_STD / _STD4 * _jitter(rng, n))
    return out


def _q4_1(rng: np.random.Generator, n: int) -> np.ndarray:
    out = raw_bytes(rng, n * 20).reshape(n, 20)
    d = (WEIGHT_STD / _STD4 * _jitter(rng, n)).astype(np.float16)
    out[:, 0:2] = _f16(d)
    out[:, 2:4] = _f16(-7.5 * d.astype(np.float32))
    return out


def _q8_0(rng: np.random.Generator, n: int) -> np.ndarray:
    out = raw_bytes(rng, n * 34).reshape(n, 34)
    out[:, 0:2] = _f16(WEIGHT_STD / _STD8 * _jitter(rng, n))
    return out


def _k_quant(rng: np.random.Generator, n: int, size: int, std: float, mean_code: float) -> np.ndarray:
    """Q4_K and Q5_K: d, dmin, packed sub-scales, then the random codes (and high bits)."""
    out = raw_bytes(rng, n * size).reshape(n, size)
    d = (WEIGHT_STD / (std * 47.5) * _jitter(rng, n)).astype(np.float16)
    out[:, 0:2] = _f16(d)
    out[:, 2:4] = _f16(mean_code * d.astype(np.float32))
    out[:, 4:16] = pack_k_scales(*_k_scales(rng, n))
    return out


def _q4_k(rng: np.random.Generator, n: int) -> np.ndarray:
    return _k_quant(rng, n, 144, _STD4, 7.5)


def _q5_k(rng: np.random.Generator, n: int) -> np.ndarray:
    return _k_quant(rng, n, 176, _STD5, 15.5)


def _q6_k(rng: np.random.Generator, n: int) -> np.ndarray:
    """Q6_K: ql[128], qh[64], 16 int8 sub-scales (64..127 here), then d."""
    out = raw_bytes(rng, n * 210).reshape(n, 210)
    out[:, 192:208] = 64 + (out[:, 192:208] & 63)
    out[:, 208:210] = _f16(WEIGHT_STD / (_STD6 * 95.5) * _jitter(rng, n))
    return out


_PACKERS: dict[GGMLQuantizationType, Callable[[np.random.Generator, int], np.ndarray]] = {
    Q.Q4_0: _q4_0, Q.Q4_1: _q4_1, Q.Q8_0: _q8_0, Q.Q4_K: _q4_k, Q.Q5_K: _q5_k, Q.Q6_K: _q6_k,
}
#: The block types :func:`random_tensor` packs (besides F16 and F32).
BLOCK_TYPES = tuple(_PACKERS)


def random_tensor(rng: np.random.Generator, qtype: GGMLQuantizationType, rows: int, cols: int) -> np.ndarray:
    """A ``rows`` x ``cols`` weight in ``qtype``: uint8 ``[rows, row bytes]`` for block types, else float values.

    Raises:
        ValueError: ``cols`` is not a whole number of ``qtype``'s blocks, or ``qtype`` is not supported.
    """
    if qtype == Q.F16:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * WEIGHT_STD).astype(np.float16)
    if qtype == Q.F32:
        return rng.standard_normal((rows, cols), dtype=np.float32) * WEIGHT_STD
    packer = _PACKERS.get(qtype)
    if packer is None:
        raise ValueError(f"no random packer for {qtype.name}; supported: F16, F32, "
                         + ", ".join(t.name for t in BLOCK_TYPES))
    block, size = GGML_QUANT_SIZES[qtype]
    if cols % block:
        raise ValueError(f"a row of {cols} values is not a whole number of {qtype.name} blocks ({block} each)")
    return packer(rng, rows * cols // block).reshape(rows, cols // block * size)
