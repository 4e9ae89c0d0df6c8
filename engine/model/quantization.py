"""Weight quantization for the fused decoder: one callable per linear layer.

Levels: ``fp32``/``bf16``/``fp16`` keep dense weights; ``int8`` and ``int4`` quantize the decoder's linear layers
(the embedding stays in the model dtype for its row lookups; on a CPU the fused decoder's ``lm_head`` may run int8,
see ``engine/model/kernels.py``). GGUF blocks load straight into the int4/int8 kernels
(``engine/loading/formats``: ``Int4Linear.from_parts``, ``Int8Linear.from_q8``).

Backends, chosen per device:

* **CPU, torch packed kernels.** int8 is weight-only with one scale per output channel, through
  ``torch._weight_int8pack_mm``; int4 is weight-only in groups of 32 input channels (asymmetric, scale and zero
  per group), through ``torch._weight_int4pack_mm_for_cpu``. bitsandbytes is built for CUDA and runs far slower than
  these on a CPU (docs/BENCHMARKS.md), so it is not used there.
* **CPU, bf16/fp16 models.** fbgemm's packed fp16-weight GEMM with fp32 activations (``PackedFp16Linear``).
* **CUDA, bitsandbytes.** int8 is LLM.int8 (``Linear8bitLt``); int4 is NF4 with bf16 compute (``Linear4bit``).

Every backend exposes the same call: ``layer(x) -> y`` for ``x`` of shape ``[tokens, in_features]``.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from engine.api import WEIGHT_LEVELS
from engine.loading.formats.gguf_blocks import Int4Parts, Q8Parts

log = logging.getLogger("engine")

INT4_GROUP_SIZE = 32


def int4_parts(weight: torch.Tensor, group_size: int = INT4_GROUP_SIZE) -> Int4Parts:
    """Asymmetric 4-bit quantization per group of input channels (min/max, as GGUF's Q4_1)."""
    n, k = weight.shape
    if k % group_size:
        raise ValueError(f"int4 needs in_features divisible by {group_size}, got {k}")
    w = weight.float().view(n, k // group_size, group_size)
    lo = w.amin(dim=-1, keepdim=True)
    hi = w.amax(dim=-1, keepdim=True)
    scale = ((hi - lo) / 15.0).clamp(min=1e-8)
    q = torch.round((w - lo) / scale).clamp(0, 15).to(torch.int32).view(n, k)
    zero = lo + 8.0 * scale
    return Int4Parts(q, scale.view(n, -1), zero.view(n, -1))


@dataclass(slots=True)
class DenseLinear:
    """A plain ``F.linear`` (the unquantized case)."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes + (0 if self.bias is None else self.bias.nbytes)


@dataclass(slots=True)
class Int8Linear:
    """Weight-only int8 with per-output-channel scales (CPU packed kernel)."""

    qweight: torch.Tensor  # int8 [out, in]
    scales: torch.Tensor  # fp32 [out]
    bias: torch.Tensor | None = None
    _scales_by_dtype: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def quantize(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Int8Linear:
        w = weight.float()
        scales = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-8)
        q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        return cls(q, scales, bias)

    @classmethod
    def from_q8(cls, parts: Q8Parts, bias: torch.Tensor | None = None) -> Int8Linear:
        """From GGUF Q8_0 blocks: the exact block values, requantized to one scale per row (the kernel's form)."""
        return cls.quantize(parts.dequantize(), bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        scales = self._scales_by_dtype.get(x.dtype)
        if scales is None:
            scales = self._scales_by_dtype[x.dtype] = self.scales.to(x.dtype)
        y = torch._weight_int8pack_mm(x, self.qweight, scales)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def dequantize(self) -> torch.Tensor:
        return self.qweight.float() * self.scales[:, None]

    @property
    def nbytes(self) -> int:
        return self.qweight.nbytes + self.scales.nbytes + (0 if self.bias is None else self.bias.nbytes)


class Int8AsInt4Pair:
    """An :class:`Int8Linear`'s very weights, run as two of torch's int4 kernels: its high and low nibbles.

    With ``u = q + 128 = 16·h + l`` (``h``, ``l`` in 0..15) and ``w = s·q``: ``w = (h − 8)·16s + (l − 8)·s + 8s``,
    two int4 layers with scale ``16s``, zero 0 and scale ``s``, zero ``8s``, exact in the activation dtype (the int8
    kernel rounds ``s`` to it too). It exists because torch's int4 kernel reads its bytes faster than its int8 kernel
    reads half as many (docs/BENCHMARKS.md). Only rounding differs: in bf16 each half is rounded before the sum,
    about twice the int8 kernel's error (tested). The tuner keeps it where it measures faster.
    """

    __slots__ = ("_sz", "bias", "group_size", "high", "in_features", "low", "scales")

    def __init__(self, base: Int8Linear) -> None:
        u = base.qweight.to(torch.int32) + 128
        self.in_features = int(u.shape[1])
        self.group_size = next(g for g in (256, 128, 64, 32) if self.in_features % g == 0)
        self.high = torch._convert_weight_to_int4pack_for_cpu((u // 16).contiguous(), 1)
        self.low = torch._convert_weight_to_int4pack_for_cpu((u % 16).contiguous(), 1)
        self.scales = base.scales
        self.bias = base.bias
        self._sz: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    def _scales_zeros(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Each half's [groups, out, 2] scales and zeros in ``dtype`` (one scale per row, repeated per group)."""
        pair = self._sz.get(dtype)
        if pair is None:
            s = self.scales.to(dtype)
            groups = self.in_features // self.group_size

            def table(scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
                return torch.stack([scale, zero], -1)[None].expand(groups, -1, -1).contiguous()

            pair = self._sz[dtype] = (table(s * 16, torch.zeros_like(s)), table(s, s * 8))
        return pair

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        high, low = self._scales_zeros(x.dtype)
        g = self.group_size
        y = torch._weight_int4pack_mm_for_cpu(x, self.high, g, high)
        y = y + torch._weight_int4pack_mm_for_cpu(x, self.low, g, low)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    @property
    def nbytes(self) -> int:
        return self.high.nbytes + self.low.nbytes + self.scales.nbytes + (0 if self.bias is None else self.bias.nbytes)


@dataclass(slots=True)
class Int4Linear:
    """Weight-only int4 in groups along the input dimension (CPU packed kernel)."""

    packed: torch.Tensor  # uint8, torch's CPU int4 layout
    scales_zeros: torch.Tensor  # fp32 [in / group, out, 2]: w = (q - 8) * scale + zero
    group_size: int
    out_features: int
    bias: torch.Tensor | None = None
    _sz_by_dtype: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def quantize(
        cls, weight: torch.Tensor, bias: torch.Tensor | None = None, group_size: int = INT4_GROUP_SIZE
    ) -> Int4Linear:
        return cls.from_parts(int4_parts(weight, group_size), bias)

    @classmethod
    def from_parts(cls, parts: Int4Parts, bias: torch.Tensor | None = None) -> Int4Linear:
        """From unpacked 4-bit values with a scale and zero per 32 weights (e.g. GGUF Q4_0/Q4_1/Q4_K blocks)."""
        n, k = parts.q.shape
        scales_zeros = torch.stack([parts.scale, parts.zero], dim=-1).transpose(0, 1).contiguous()
        packed = torch._convert_weight_to_int4pack_for_cpu(parts.q.contiguous(), 1)
        return cls(packed, scales_zeros.float(), k // parts.scale.shape[1], n, bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        sz = self._sz_by_dtype.get(x.dtype)
        if sz is None:
            sz = self._sz_by_dtype[x.dtype] = self.scales_zeros.to(x.dtype)
        y = torch._weight_int4pack_mm_for_cpu(x, self.packed, self.group_size, sz)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales_zeros.nbytes + (0 if self.bias is None else self.bias.nbytes)


class Int4VnniLinear:
    """An :class:`Int4Linear`'s very bytes, run by the native extension's AVX512-VNNI kernel
    (``torch.ops.hearth.int4_vnni_mm``, ``engine/model/csrc/vnni.cpp``).

    It splits each row's activations per 32 values into two int8 planes (about 16 bits) and sums four 4-bit x
    8-bit products per 32-bit lane, where torch's kernel dequantizes every weight to fp32 and multiplies in fp32:
    the integer products do more work per instruction, which pays once several rows share each weight read (one
    row is bound by reading the weights either way). It agrees with torch's kernel to the output's rounding. It
    holds no memory of its own (``base`` owns it), and each row is computed alone (row-invariant). Offered by
    ``engine/model/kernels.py`` only where ``engine.model.vnni.vnni_problem`` finds none.
    """

    __slots__ = ("base",)

    #: the activation dtypes it takes (as the model dtype; others are not offered it)
    dtypes = (torch.bfloat16, torch.float32)

    def __init__(self, base: Int4Linear) -> None:
        self.base = base

    def scales_zeros(self, dtype: torch.dtype) -> torch.Tensor:
        """The base kernel's scales and zeros in ``dtype`` (shared with it)."""
        sz = self.base._sz_by_dtype.get(dtype)
        if sz is None:
            sz = self.base._sz_by_dtype[dtype] = self.base.scales_zeros.to(dtype)
        return sz

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        b = self.base
        y = torch.ops.hearth.int4_vnni_mm(x, b.packed, b.group_size, self.scales_zeros(x.dtype))
        return y if b.bias is None else y + b.bias.to(y.dtype)

    @property
    def nbytes(self) -> int:
        return self.base.nbytes


class Int8VnniLinear:
    """An :class:`Int8Linear`'s very weights, run by the native extension's AVX512-VNNI kernel
    (``torch.ops.hearth.int8_vnni_mm``), activations as two int8 planes (about 16 bits).

    Made for the lm_head, in two ways: ``gemv`` streams each channel's weights once per 4 rows (for few rows);
    otherwise 16 rows share each instruction (for many). Each way is row-invariant; they round differently, so
    they are two tuner candidates. It holds no memory of its own (``base`` owns it). Offered only where
    ``engine.model.vnni.vnni_problem`` finds none.
    """

    __slots__ = ("base", "gemv")

    dtypes = Int4VnniLinear.dtypes

    def __init__(self, base: Int8Linear, gemv: bool = False) -> None:
        self.base = base
        self.gemv = gemv

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        b = self.base
        y = torch.ops.hearth.int8_vnni_mm(x, b.qweight, b.scales, self.gemv)
        return y if b.bias is None else y + b.bias.to(y.dtype)

    @property
    def nbytes(self) -> int:
        return self.base.nbytes


class PackedFp16Linear:
    """fp16 weights in fbgemm's packed layout, fp32 activations and accumulation (CPU).

    Used for bf16/fp16 models on the CPU. Every bf16 weight in fp16's range converts to fp16 exactly (fp16 has more
    mantissa bits), so this computes the bf16 model in fp32 while reading 2 bytes per weight. It beats both fp32 and
    bf16 ``F.linear`` (docs/BENCHMARKS.md): bf16 GEMM on a CPU without avx512_bf16 runs row by row, and fp32 reads
    twice the bytes.
    """

    #: the activation dtype the kernel takes (callers cast to it and back)
    input_dtype = torch.float32

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        w = weight.detach().float()
        self.out_features, self.in_features = w.shape
        with warnings.catch_warnings():  # torch marks the fbgemm fp16 ops deprecated; they are pinned with torch
            warnings.simplefilter("ignore")
            self.packed = torch.fbgemm_pack_gemm_matrix_fp16(w.contiguous())
            self.bias = (bias.detach().float() if bias is not None else torch.zeros(self.out_features)).contiguous()
            self(torch.zeros(1, self.in_features))  # torch warns once per process, at the first call: here

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.fbgemm_linear_fp16_weight(x, self.packed, self.bias)

    @property
    def nbytes(self) -> int:
        return self.out_features * self.in_features * 2 + self.bias.nbytes


class BnbLinear:
    """bitsandbytes LLM.int8 or NF4 (the CUDA path; also runs, slowly, on a CPU for tests)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, level: str, device: torch.device) -> None:
        import bitsandbytes as bnb

        out_features, in_features = weight.shape
        w = weight.detach().to(torch.float16 if level == "int8" else torch.bfloat16).cpu()
        module: torch.nn.Module
        if level == "int8":
            module = bnb.nn.Linear8bitLt(in_features, out_features, bias=bias is not None, has_fp16_weights=False)
            module.weight = bnb.nn.Int8Params(w, requires_grad=False, has_fp16_weights=False)
        else:
            module = bnb.nn.Linear4bit(
                in_features, out_features, bias=bias is not None, compute_dtype=torch.bfloat16, quant_type="nf4"
            )
            module.weight = bnb.nn.Params4bit(w, requires_grad=False, quant_type="nf4")
        if bias is not None:
            module.bias = torch.nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.module = module.to(device)  # moving it quantizes it

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x).to(x.dtype)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.module.state_dict().values() if isinstance(t, torch.Tensor))


Linear = DenseLinear | Int8Linear | Int4Linear | Int4VnniLinear | Int8VnniLinear | BnbLinear | PackedFp16Linear

# A bitsandbytes level is used only if a probe matrix survives quantize -> matmul within these bounds (the int8
# and NF4 formats themselves stay well under them; bitsandbytes 0.50's CPU NF4 on AVX512_BF16 CPUs gives ~0.4).
BNB_MAX_REL_ERROR = {"int8": 0.05, "int4": 0.2}
_bnb_verdicts: dict[tuple[str, str, int], str | None] = {}


def bitsandbytes_problem(level: str, device: torch.device, in_features: int = 128) -> str | None:
    """Why bitsandbytes must not serve ``level`` on ``device``, or None when a probe matmul comes out right.

    The probe is a seeded 64 x ``in_features`` matrix quantized by bitsandbytes and multiplied against a dense
    reference. The verdict is cached per device, level and input width: bitsandbytes 0.50's CPU NF4 is right for
    wide layers and wrong (relative error ~0.4) for layers narrower than its 64-weight block.
    """
    key = (str(device), level, in_features)
    if key not in _bnb_verdicts:
        gen = torch.Generator().manual_seed(0)
        w, x = torch.randn(64, in_features, generator=gen), torch.randn(4, in_features, generator=gen)
        ref = x @ w.t()
        try:
            layer = BnbLinear(w, None, level, device)
            xin = x.to(device, torch.float16 if level == "int8" else torch.bfloat16)
            y = layer(xin).float().cpu()
            err = float((y - ref).norm() / ref.norm())
        except Exception as exc:  # noqa: BLE001 (any failure inside bitsandbytes disqualifies it the same way)
            _bnb_verdicts[key] = f"bitsandbytes {level} failed a probe matmul on {device}: {exc}"
        else:
            bound = BNB_MAX_REL_ERROR[level]
            ok = math.isfinite(err) and err < bound
            _bnb_verdicts[key] = (
                None
                if ok
                else f"bitsandbytes {level} computes wrong results on this {device.type} for {in_features}-wide "
                f"layers (relative error {err:.2f} on a probe matrix, limit {bound})"
            )
        if _bnb_verdicts[key] is not None:
            log.warning("%s; those layers use another kernel", _bnb_verdicts[key])
    return _bnb_verdicts[key]


def make_linear(
    weight: torch.Tensor, bias: torch.Tensor | None, level: str, device: torch.device, backend: str = "auto"
) -> Linear:
    """The linear layer for ``level`` on ``device``. ``backend`` forces "torch" or "bitsandbytes" (tests)."""
    if level not in WEIGHT_LEVELS:
        return DenseLinear(weight, bias)
    if backend == "auto":
        backend = "bitsandbytes" if device.type == "cuda" else "torch"
    if backend == "bitsandbytes":
        problem = bitsandbytes_problem(level, device, weight.shape[1])
        if problem is None:
            return BnbLinear(weight, bias, level, device)
        if device.type != "cpu":  # torch's packed kernels are CPU-only: keep the layer dense
            return DenseLinear(weight.to(device), None if bias is None else bias.to(device))
    if level == "int8":
        return Int8Linear.quantize(weight, bias)
    if weight.shape[1] % INT4_GROUP_SIZE:
        return Int8Linear.quantize(weight, bias)  # odd shapes keep 8 bits rather than fail
    return Int4Linear.quantize(weight, bias)
