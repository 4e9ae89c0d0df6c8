"""A fused decoder layer as the native decode step takes it, and the cache of ``native="auto"``'s verdicts.

The native step (``engine/model/native.py``) runs every layer of a decode-only step in one C++ call, so each layer's
kernels travel as tensors and a kind (:class:`LinearSpec`) rather than as Python objects. The layer math itself
lives once in Python (``FusedDecoder._decoder_layers`` in ``engine/model/llama.py``) and once in C++ (the layer
loop in ``csrc/decode_step.cpp`` over the op families beside it).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from engine.model.autotune import PaddedRows
from engine.model.gguf_linear import BLOCK_TYPES, GgufLinear
from engine.model.quantization import DenseLinear, Int4Linear, Int4VnniLinear, Int8Linear
from engine.model.tuned_linear import TunedLinear
from engine.system import hardware
from engine.system.paths import data_dir

log = logging.getLogger("engine")

#: Where ``native="auto"`` keeps its verdicts, in the data dir.
CACHE_FILENAME = "native.json"
#: Part of every cache key: bump it when the way a verdict is reached changes.
VERDICT_VERSION = "v1"

#: ``rotary(x, positions)`` -> cos, sin as the eager path computes them ([T, 1, D]).
Rotary = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class LinearSpec(NamedTuple):
    """A linear layer as tensors and a kind, as the native step takes it."""

    kind: str  # "int4", "int4_vnni", "int8" or "dense"
    weight: torch.Tensor
    scales: torch.Tensor | None
    group_size: int
    bias: torch.Tensor | None
    row_multiple: int = 1  # calls are padded to a multiple of this many rows (deterministic plans)


def linear_spec(kernel: Any, bucket: int, dtype: torch.dtype) -> LinearSpec | None:
    """``kernel`` as it runs in ``bucket`` (row padding included), as the native step takes it; None if it has no
    such form."""
    multiple = 1
    if isinstance(kernel, TunedLinear):
        kernel = kernel.kernel_at(bucket, padded=True)
    if isinstance(kernel, PaddedRows):
        multiple, kernel = kernel.multiple, kernel.kernel
    spec = _bare_spec(kernel, dtype)
    return spec if spec is None or multiple == 1 else spec._replace(row_multiple=multiple)


def _bare_spec(kernel: Any, dtype: torch.dtype) -> LinearSpec | None:
    bias = None if getattr(kernel, "bias", None) is None else kernel.bias.to(dtype)
    if isinstance(kernel, Int4Linear):  # the scales the eager kernel caches per dtype, shared
        sz = kernel._sz_by_dtype.setdefault(dtype, kernel.scales_zeros.to(dtype))
        return LinearSpec("int4", kernel.packed, sz, kernel.group_size, bias)
    if isinstance(kernel, Int4VnniLinear):
        base = kernel.base
        bias = None if base.bias is None else base.bias.to(dtype)
        return LinearSpec("int4_vnni", base.packed, kernel.scales_zeros(dtype), base.group_size, bias)
    if isinstance(kernel, Int8Linear):
        scales = kernel._scales_by_dtype.setdefault(dtype, kernel.scales.to(dtype))
        return LinearSpec("int8", kernel.qweight, scales, 0, bias)
    if isinstance(kernel, GgufLinear) and 1 <= len(kernel.segments) <= 2 and all(
        s.name in BLOCK_TYPES for s in kernel.segments
    ):
        # the group size slot carries the ggml type, and a second run's type in its second byte (its blocks go
        # where the scales would)
        first, *rest = kernel.segments
        second = rest[0].data if rest else None
        kinds = first.kind | (rest[0].kind << 8 if rest else 0)
        return LinearSpec("gguf", first.data, second, kinds, bias)
    if isinstance(kernel, DenseLinear) and kernel.weight.dtype == dtype:
        return LinearSpec("dense", kernel.weight, None, 0, bias)
    return None  # packed fp16, a cast: eager only


@dataclass(frozen=True, slots=True)
class LayerShape:
    """The constants of a decoder layer."""

    q_dim: int
    kv_dim: int
    head_dim: int
    num_heads: int
    eps: float
    scale: float


class LayerWeights(NamedTuple):
    """One decoder layer's norms and linear layers, as the native step takes them."""

    input_norm: torch.Tensor
    qkv: LinearSpec
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o: LinearSpec
    post_norm: torch.Tensor
    gate_up: LinearSpec
    down: LinearSpec


class VerdictCache:
    """``native="auto"``'s measured verdicts on disk: native or eager, per machine, torch, threads, model and
    bucket. An entry is ``{"native": bool, "reason": str, ...}``."""

    _lock = threading.Lock()

    def __init__(self) -> None:
        self.path = data_dir() / CACHE_FILENAME

    @staticmethod
    def key(signature: str, bucket: int, num_threads: int | None = None) -> str:
        threads = torch.get_num_threads() if num_threads is None else num_threads
        machine = f"{hardware.detect().cpu_model}|torch {torch.__version__}|{threads} threads"
        return f"{VERDICT_VERSION}|{machine}|{signature}|bucket {bucket}"

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def get(self, key: str) -> dict[str, Any] | None:
        entry = self._load().get(key)
        return entry if isinstance(entry, dict) and "native" in entry else None

    def put(self, key: str, entry: dict[str, Any]) -> None:
        with self._lock:
            data = self._load()
            data[key] = entry
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
                os.replace(tmp, self.path)
            except OSError as exc:  # a read-only data dir only costs the next start a re-measurement
                log.info("native verdicts not written (%s)", exc)
