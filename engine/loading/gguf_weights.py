"""A GGUF file's own quantized weights, unpacked into the parts torch's packed CPU kernels take.

transformers loads a GGUF by dequantizing every tensor; the int4/int8 levels would then quantize those weights a
second time. This module reads the blocks instead, so the kernels run the very weights llama.cpp runs:

* **Q4_0** (32 weights, scale ``d``): w = d·(q − 8).
* **Q4_1** (32 weights, scale ``d``, minimum ``m``): w = d·q + m.
* **Q4_K** (256 weights in 8 sub-blocks of 32, 6-bit sub-scales and sub-minimums): w = d·sc·q − dmin·mn.

torch's int4 group-32 format dequantizes as (q − 8)·scale + zero, so each of these is exact with scale = d (or
d·sc) and zero = 0, m + 8d or 8·d·sc − dmin·mn: :class:`Int4Parts`. The kernel keeps scale and zero in the
activation dtype (bf16), which rounds them; that is the only difference.

* **Q8_0** (32 int8 weights, scale ``d``): w = d·q. torch's int8 kernel takes one scale per output channel, so
  these are requantized per row from the exact values (:class:`Q8Parts`); the error is half an int8 step of the
  row's largest weight.

Rows come out in the HF model's order: llama.cpp stores Llama's Q and K projections with their rotary halves
interleaved, and the same row permutation transformers undoes is applied to the blocks (rows are independent).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger("engine")

#: Set by the loader on a model read from a GGUF file: the file's path.
GGUF_SOURCE_ATTR = "hearth_gguf_source"
#: The block types with an exact int4 form.
INT4_TYPES = ("Q4_0", "Q4_1", "Q4_K")
GROUP = 32

_LAYER = re.compile(r"model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)_proj\.weight$")
_GGUF_PROJ = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate", "up": "ffn_up",
              "down": "ffn_down"}  # fmt: skip
#: Architectures whose GGUF layout is known here; True where Q/K rows are permuted (as transformers undoes).
_ARCHITECTURES = {"llama": True, "qwen2": False, "qwen3": False}


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


def _f16(raw: torch.Tensor) -> torch.Tensor:
    """Two bytes per block (the last dim) read as a little-endian fp16, returned as fp32 [n, blocks]."""
    return raw.contiguous().view(torch.float16)[..., 0].float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """16 bytes -> 32 values: byte j holds value j (low nibble) and value j + 16 (high nibble)."""
    return torch.cat((qs & 0xF, qs >> 4), dim=-1)


def unpack_int4(raw: torch.Tensor, kind: str) -> Int4Parts:
    """Unpack blocks (uint8 [n, bytes per row]) of a Q4_0/Q4_1/Q4_K tensor."""
    n = raw.shape[0]
    if kind == "Q4_0":
        blocks = raw.view(n, -1, 18)
        d = _f16(blocks[..., 0:2])
        q = _nibbles(blocks[..., 2:18])
        zero = torch.zeros_like(d)
    elif kind == "Q4_1":
        blocks = raw.view(n, -1, 20)
        d, m = _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])
        q = _nibbles(blocks[..., 4:20])
        zero = m + 8 * d
    elif kind == "Q4_K":
        blocks = raw.view(n, -1, 144)
        d_super, dmin = _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])
        sc, mn = _k4_scales(blocks[..., 4:16].long())
        qs = blocks[..., 16:144].reshape(n, -1, 4, 32)  # four chunks of 64 values: low nibbles, then high
        q = torch.stack((qs & 0xF, qs >> 4), dim=3).reshape(n, -1, 8, 32)
        d = (d_super[..., None] * sc).reshape(n, -1)
        zero = (8 * d_super[..., None] * sc - dmin[..., None] * mn).reshape(n, -1)
        q = q.reshape(n, -1, 32)
    else:
        raise ValueError(f"{kind} has no int4 form")
    return Int4Parts(q.reshape(n, -1).to(torch.int32), d, zero)


def _k4_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K's eight 6-bit sub-scales and sub-minimums from its 12 packed bytes (ggml's get_scale_min_k4)."""
    lo_sc, lo_mn = s[..., 0:4] & 63, s[..., 4:8] & 63
    hi_sc = (s[..., 8:12] & 0xF) | ((s[..., 0:4] >> 6) << 4)
    hi_mn = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return torch.cat((lo_sc, hi_sc), -1).float(), torch.cat((lo_mn, hi_mn), -1).float()


def unpack_q8(raw: torch.Tensor) -> Q8Parts:
    """Unpack Q8_0 blocks (uint8 [n, bytes per row])."""
    blocks = raw.view(raw.shape[0], -1, 34)
    q = blocks[..., 2:34].contiguous().view(torch.int8).reshape(raw.shape[0], -1)
    return Q8Parts(q, _f16(blocks[..., 0:2]))


def qk_order(rows: int, heads: int) -> torch.Tensor:
    """HF row i of a Q/K projection is GGUF row ``order[i]`` (transformers' reverse permutation)."""
    dim = rows // heads // 2
    return torch.arange(rows).view(heads, dim, 2).transpose(1, 2).reshape(rows)


_qk_order = qk_order


class GgufWeights:
    """The quantized tensors of one GGUF file, addressed by HF parameter names."""

    def __init__(self, path: Path, config: Any) -> None:
        from gguf import GGUFReader

        self.path = path
        self._reader = GGUFReader(path)
        self._tensors = {t.name: t for t in self._reader.tensors}
        arch_field = self._reader.fields.get("general.architecture")
        self.architecture = bytes(arch_field.parts[-1]).decode() if arch_field is not None else ""
        # as the native loader reads them (engine/loading/native.py): llama.cpp permutes every llama-arch Q/K
        self._permuted = _ARCHITECTURES.get(self.architecture, False)
        self._heads = int(config.num_attention_heads)
        self._kv_heads = int(getattr(config, "num_key_value_heads", None) or self._heads)

    @property
    def supported(self) -> bool:
        """Whether this file's tensor layout is known (else its weights are requantized as usual)."""
        return self.architecture in _ARCHITECTURES

    def kind(self, hf_name: str) -> str | None:
        """The ggml type of the tensor behind an HF parameter, or None when the file has no such tensor."""
        tensor = self._tensors.get(self._gguf_name(hf_name) or "")
        return None if tensor is None else tensor.tensor_type.name

    def _gguf_name(self, hf_name: str) -> str | None:
        if hf_name == "model.embed_tokens.weight":
            return "token_embd.weight"
        if hf_name == "lm_head.weight":
            return "output.weight" if "output.weight" in self._tensors else "token_embd.weight"
        match = _LAYER.match(hf_name)
        if match is None or match.group(3) not in _GGUF_PROJ:
            return None
        return f"blk.{match.group(1)}.{_GGUF_PROJ[match.group(3)]}.weight"

    def _raw(self, hf_name: str) -> torch.Tensor:
        tensor = self._tensors[self._gguf_name(hf_name) or ""]
        raw = torch.from_numpy(np.array(tensor.data))  # a copy: the memory map is read-only
        if self._permuted and (".q_proj." in hf_name or ".k_proj." in hf_name):
            raw = raw[qk_order(raw.shape[0], self._heads if ".q_proj." in hf_name else self._kv_heads)]
        return raw

    def int4_parts(self, hf_names: list[str]) -> Int4Parts | None:
        """The named tensors stacked along the output rows, if every one has an int4 form."""
        kinds = [self.kind(name) for name in hf_names]
        if not self.supported or any(k not in INT4_TYPES for k in kinds):
            return None
        parts = [unpack_int4(self._raw(name), k or "") for name, k in zip(hf_names, kinds, strict=True)]
        return Int4Parts(*(torch.cat([getattr(p, f) for p in parts]) for f in ("q", "scale", "zero")))

    def q8_parts(self, hf_names: list[str]) -> Q8Parts | None:
        """The named tensors stacked along the output rows, if every one is Q8_0."""
        if not self.supported or any(self.kind(name) != "Q8_0" for name in hf_names):
            return None
        parts = [unpack_q8(self._raw(name)) for name in hf_names]
        return Q8Parts(torch.cat([p.q for p in parts]), torch.cat([p.scale for p in parts]))


def matches(dequantized: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether file blocks dequantize to the model's (dequantized, possibly bf16-rounded) weight."""
    if dequantized.shape != weight.shape:
        return False
    w = weight.float()
    return bool((dequantized - w).abs().max() <= 1e-2 * float(w.abs().max()) + 1e-6)


def source_of(model: Any) -> GgufWeights | None:
    """The GGUF weights behind a model the loader read from a GGUF file, or None."""
    path = getattr(model, GGUF_SOURCE_ATTR, None)
    if path is None:
        return None
    try:
        weights = GgufWeights(Path(path), model.config)
    except Exception as exc:  # noqa: BLE001 (any unreadable file means: quantize from the dense weights)
        log.warning("could not read the quantized blocks of %s (%s); weights are requantized", path, exc)
        return None
    return weights if weights.supported else None
