"""A GGUF file's own quantized weights, addressed by HF parameter names, for torch's packed CPU kernels.

The file's tensor names and row order come from the model registry's GGUF layout (:mod:`engine.architectures`:
llama.cpp stores llama's Q and K projections with their rotary halves interleaved, and the same row permutation
transformers undoes is applied to the blocks); what each block type holds and how it unpacks is
:mod:`engine.loading.formats`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.architectures import gguf_layout, qk_order
from engine.loading.formats import file_level
from engine.loading.formats.gguf_blocks import Int4Parts, Q8Parts, unpack_int4, unpack_q8

log = logging.getLogger("engine")

#: Set by the loader on a model read from a GGUF file: the file's path.
GGUF_SOURCE_ATTR = "hearth_gguf_source"


class GgufWeights:
    """The quantized tensors of one GGUF file, addressed by HF parameter names."""

    def __init__(self, path: Path, config: Any) -> None:
        from gguf import GGUFReader

        self.path = path
        self._reader = GGUFReader(path)
        self._tensors = {t.name: t for t in self._reader.tensors}
        arch_field = self._reader.fields.get("general.architecture")
        self.architecture = bytes(arch_field.parts[-1]).decode() if arch_field is not None else ""
        self._layout = gguf_layout(self.architecture)
        self._heads = int(config.num_attention_heads)
        self._kv_heads = int(getattr(config, "num_key_value_heads", None) or self._heads)

    @property
    def supported(self) -> bool:
        """Whether this file's tensor layout is known (else its weights are requantized as usual)."""
        return self._layout is not None

    def kind(self, hf_name: str) -> str | None:
        """The ggml type of the tensor behind an HF parameter, or None when the file has no such tensor."""
        tensor = self._tensors.get(self._gguf_name(hf_name) or "")
        return None if tensor is None else tensor.tensor_type.name

    def _gguf_name(self, hf_name: str) -> str | None:
        if self._layout is None:
            return None
        name = self._layout.gguf_name(hf_name)
        if hf_name == "lm_head.weight" and name not in self._tensors:
            return self._layout.gguf_name("model.embed_tokens.weight")  # a tied head: the embedding's blocks
        return name

    def _raw(self, hf_name: str) -> torch.Tensor:
        tensor = self._tensors[self._gguf_name(hf_name) or ""]
        raw = torch.from_numpy(np.array(tensor.data))  # a copy: the memory map is read-only
        if self._layout is not None and self._layout.permute_qk and (".q_proj." in hf_name or ".k_proj." in hf_name):
            raw = raw[qk_order(raw.shape[0], self._heads if ".q_proj." in hf_name else self._kv_heads)]
        return raw

    def int4_parts(self, hf_names: list[str]) -> Int4Parts | None:
        """The named tensors stacked along the output rows, if every one has an int4 form."""
        kinds = [self.kind(name) for name in hf_names]
        if not self.supported or any(file_level(k or "") != "int4" for k in kinds):
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
