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
#: ``0`` keeps a file's Q4_0, Q8_0, Q4_K and Q6_K layers in the file's own row order (the per-row tiles of ``gguf_mm``) instead of the
#: groups of eight interleaved rows :meth:`GgufWeights.blocks` makes of them
GROUPED_ENV = "HEARTH_GGUF_GROUPED"
#: the ggml types ``torch.ops.hearth.gguf_repack_`` puts in groups of eight rows (engine/model/csrc/gguf_kernels.cpp)
_GROUPED = frozenset({"Q4_0", "Q8_0", "Q4_K", "Q6_K"})
#: a grouped layout's type number is this plus its file type's (engine/model/csrc/gguf_kernels.h)
GROUPED_BASE = 128


class Blocks(NamedTuple):
    """One GGUF tensor's rows as the file stores them: ``data`` is uint8 [rows, bytes per row] of ggml type
    ``kind`` (its number in ``gguf.GGMLQuantizationType``, as the block kernels take it), ``name`` its type name.
    Rows put in groups of eight (:func:`grouped`) keep ``name`` and take the grouped layout's number as ``kind``."""

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
        self._read: dict[str, Blocks] = {}  # single tensors read by :meth:`blocks` (a tied head's embedding)
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
        neighbours of the same type, each run read with plain file reads straight into one buffer (no copy to
        stack them). llama's permuted Q/K rows are put in HF order. Float tensors come as type F32/F16/BF16 rows
        of their bytes."""
        tensors = [self._tensors[self._gguf_name(name) or ""] for name in hf_names]
        embedding = self._gguf_name("model.embed_tokens.weight")
        if len(hf_names) == 1 and (tensors[0].name == embedding or not _groups(tensors[0].kind)):
            # read once however many layers take it alone (embedding and tied head); a tied head's rows in groups
            # of eight too, which the embedding's lookups undo (GgufEmbedding): over the file's row order it took
            # 1.8-2.9x as long at eight rows (a 1B file's Q6_K and Q8_0 heads, AVX512 EPYC). An embedding no head
            # reads stays in the file's order, where a lookup dequantizes only its own rows.
            tensor = tensors[0]
            if tensor.name not in self._read:
                blocks = Blocks(tensor.kind, tensor.kind_id, self.rows(hf_names[0], tensor))
                tied = self._gguf_name("lm_head.weight") == embedding
                self._read[tensor.name] = grouped(blocks) if tied else blocks
            return [self._read[tensor.name]]
        runs: list[list[int]] = []  # indices into hf_names, neighbours of one type and row width
        for i, tensor in enumerate(tensors):
            last = tensors[runs[-1][0]] if runs else None
            if last is not None and last.kind_id == tensor.kind_id and _row_bytes(last) == _row_bytes(tensor):
                runs[-1].append(i)
            else:
                runs.append([i])
        out = []
        for run in runs:
            first = tensors[run[0]]
            data = np.empty((sum(tensors[i].rows for i in run), _row_bytes(first)), dtype=np.uint8)
            start = 0
            for i in run:
                rows = tensors[i].rows
                self._read_rows(hf_names[i], tensors[i], data[start:start + rows])
                start += rows
            out.append(grouped(Blocks(first.kind, first.kind_id, torch.from_numpy(data))))
        return out

    def rows(self, hf_name: str, tensor: TensorEntry) -> torch.Tensor:
        """One tensor's rows of bytes (uint8 [rows, bytes per row]) read from the file, in HF row order."""
        raw = np.empty((tensor.rows, _row_bytes(tensor)), dtype=np.uint8)
        self._read_rows(hf_name, tensor, raw)
        return torch.from_numpy(raw)

    def _read_rows(self, hf_name: str, tensor: TensorEntry, out: np.ndarray) -> None:
        """Read one tensor's rows into ``out`` (uint8 [rows, bytes per row], contiguous), in HF row order."""
        nbytes = tensor.nbytes
        with open(self.path, "rb") as f:  # plain reads: pages of the memory map are never touched, so never held
            view = out.reshape(-1).data
            done = 0
            while done < nbytes:
                got = os.preadv(f.fileno(), [view[done:]], tensor.offset + done)
                if got <= 0:
                    raise OSError(f"{self.path} ended inside tensor {tensor.name}")
                done += got
        if self._layout is not None and self._layout.permute_qk and (".q_proj." in hf_name or ".k_proj." in hf_name):
            out[:] = out[qk_order(tensor.rows, self._heads if ".q_proj." in hf_name else self._kv_heads)]

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


def _groups(kind: str) -> bool:
    """Whether blocks of this ggml type are put in groups of eight rows here."""
    return kind in _GROUPED and os.environ.get(GROUPED_ENV, "1") != "0" and hasattr(torch.ops.hearth, "gguf_repack_")


def _grouped_kind(kind_id: int) -> int:
    """The grouped layout's type number for a ggml type number in the loaded extension, or -1."""
    return int(torch.ops.hearth.gguf_grouped_type(kind_id))


def grouped(blocks: Blocks) -> Blocks:
    """A layer's own blocks (``data`` not shared) with their rows put in groups of eight in place where the native
    kernels have a grouped layout for the type (Q4_0, Q8_0, Q4_K, Q6_K): one vector then holds 4 bytes of 8 rows, and ``gguf_mm``
    multiplies 8 rows at once with no horizontal sums (engine/model/csrc/gguf_kernels.cpp). The same bytes in
    another order; the products agree with the file-order tiles' to fp32 rounding (those add Q4_0's -8 offset in
    fp32 once per eight blocks, the grouped tiles take it off each block's integer sum). ``HEARTH_GGUF_GROUPED=0``
    keeps the file's order."""
    if not _groups(blocks.name) or _grouped_kind(blocks.kind) < 0:
        return blocks
    kind = int(torch.ops.hearth.gguf_repack_(blocks.data, blocks.kind))
    return blocks._replace(kind=kind)


def _row_bytes(tensor: TensorEntry) -> int:
    return tensor.nbytes // tensor.rows


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
