"""A GGUF file's own quantized weights, addressed by HF parameter names, for torch's packed CPU kernels.

The file's tensor names and row order come from the model registry's GGUF layout (:mod:`engine.architectures`:
llama.cpp stores llama's Q and K projections with their rotary halves interleaved, and the same row permutation
transformers undoes is applied to the blocks); what each block type holds and how it unpacks is
:mod:`engine.loading.formats`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from engine.architectures import GgufLayout, gguf_layout, qk_order
from engine.loading.formats import file_level
from engine.loading.formats.gguf_blocks import Int4Parts, Q8Parts, unpack_int4, unpack_q8
from engine.loading.gguf_reader import TensorEntry, read_tensor_table

log = logging.getLogger("engine")

#: Set by the loader on a model read from a GGUF file: the file's path.
GGUF_SOURCE_ATTR = "hearth_gguf_source"


class Blocks(NamedTuple):
    """One GGUF tensor's rows as the file stores them: ``data`` is uint8 [rows, bytes per row] of ggml type
    ``kind`` (its number in ``gguf.GGMLQuantizationType``, as the block kernels take it), ``name`` its type name."""

    name: str
    kind: int
    data: torch.Tensor


class GgufWeights:
    """The quantized tensors of one GGUF file, addressed by HF parameter names."""

    def __init__(self, path: Path, config: Any) -> None:
        self.path = path
        metadata, entries = read_tensor_table(path)
        self._tensors = {e.name: e for e in entries}
        self.architecture = str(metadata.get("general.architecture", ""))
        self._layout = gguf_layout(self.architecture)
        #: every tensor of the file, in file order
        self.entries = entries
        self._read: dict[str, torch.Tensor] = {}  # single tensors read by :meth:`blocks` (a tied head's embedding)
        self._heads = int(config.num_attention_heads)
        self._kv_heads = int(getattr(config, "num_key_value_heads", None) or self._heads)

    @property
    def layout(self) -> GgufLayout | None:
        """The registry's GGUF layout of this file's architecture, if it lists one."""
        return self._layout

    @property
    def supported(self) -> bool:
        """Whether this file's tensor layout is known (else its weights are requantized as usual)."""
        return self._layout is not None

    def kind(self, hf_name: str) -> str | None:
        """The ggml type of the tensor behind an HF parameter, or None when the file has no such tensor."""
        tensor = self._tensors.get(self._gguf_name(hf_name) or "")
        return None if tensor is None else tensor.kind

    def _gguf_name(self, hf_name: str) -> str | None:
        if self._layout is None:
            return None
        name = self._layout.gguf_name(hf_name)
        if hf_name == "lm_head.weight" and name not in self._tensors:
            return self._layout.gguf_name("model.embed_tokens.weight")  # a tied head: the embedding's blocks
        return name

    def _raw(self, hf_name: str) -> torch.Tensor:
        return self.rows(hf_name, self._tensors[self._gguf_name(hf_name) or ""])

    def blocks(self, hf_names: list[str]) -> list[Blocks]:
        """The named tensors (stacked along the output rows) as the file's blocks: one :class:`Blocks` per run of
        neighbours of the same type, each one contiguous copy read with plain file reads. llama's permuted Q/K
        rows are put in HF order. Float tensors come as type F32/F16/BF16 rows of their bytes."""
        runs: list[tuple[str, int, list[torch.Tensor]]] = []
        for name in hf_names:
            gguf_name = self._gguf_name(name) or ""
            tensor = self._tensors[gguf_name]
            if len(hf_names) == 1:  # read once however many layers take it alone (embedding and tied head)
                if gguf_name not in self._read:
                    self._read[gguf_name] = self.rows(name, tensor)
                rows = self._read[gguf_name]
            else:
                rows = self.rows(name, tensor)
            if runs and runs[-1][1] == tensor.kind_id and runs[-1][2][0].shape[1] == rows.shape[1]:
                runs[-1][2].append(rows)
            else:
                runs.append((tensor.kind, tensor.kind_id, [rows]))
        return [Blocks(name, kind, parts[0] if len(parts) == 1 else torch.cat(parts)) for name, kind, parts in runs]

    def rows(self, hf_name: str, tensor: TensorEntry) -> torch.Tensor:
        """One tensor's rows of bytes (uint8 [rows, bytes per row]) read from the file, in HF row order."""
        rows, nbytes = tensor.rows, tensor.nbytes
        raw = np.empty((rows, nbytes // rows), dtype=np.uint8)
        with open(self.path, "rb") as f:  # plain reads: pages of the memory map are never touched, so never held
            view = raw.reshape(-1).data
            done = 0
            while done < nbytes:
                got = os.preadv(f.fileno(), [view[done:]], tensor.offset + done)
                if got <= 0:
                    raise OSError(f"{self.path} ended inside tensor {tensor.name}")
                done += got
        if self._layout is not None and self._layout.permute_qk and (".q_proj." in hf_name or ".k_proj." in hf_name):
            raw = raw[qk_order(rows, self._heads if ".q_proj." in hf_name else self._kv_heads)]
        return torch.from_numpy(raw)

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
