"""Compiled decode steps: the fused decoder's layer, compiled by torch.compile (inductor) per batch bucket.

On a small model most of an eager decode step is per-op overhead: some twenty torch calls per layer, each a few
microseconds of dispatch. Inductor fuses the norms, rotary embedding, KV writes, gathers and residual adds into a
few generated C++ kernels around the matmuls (which stay torch's packed int4/int8 or dense kernels).

What is compiled is one decoder layer of a decode-only step (:func:`decode_layer`), with every weight passed as an
argument, so the thirty-odd layers of a model share one graph. One graph per autotune batch bucket
(``engine/model/autotune.py``: 1, 2-4, 5-16, 17+ rows, as each bucket may run other kernels): the one-row bucket is
static, the others are dynamic in the batch; the context length (the gathered KV slots) is always dynamic, so a
growing context never recompiles. Steps with a prefill chunk, and deterministic mode, run eager.

A bucket is compiled in the background the first time a step lands in it (steps meanwhile run eager), on a
scratch KV pool, so loading stays fast. Inductor's artifacts are cached on disk under the data dir
(``TORCHINDUCTOR_CACHE_DIR``), so a second start pays a few seconds of tracing, not a compile. Any failure (no C++
compiler, a frozen bundle, a compile or run error) leaves that bucket eager, with the reason logged.

``mode="auto"`` times the compiled layer against the same layer run eager once compiled, and keeps it only where it
is at least :data:`MIN_GAIN` faster; the verdict is cached per machine, torch version, thread count and layer
shape in ``data_dir()/compile.json``.

The layer math mirrors ``FusedDecoder._layers`` and the decode branch of ``attention.paged_attention``; a test
checks that greedy output stays token-identical to eager at fp32.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from engine.model.autotune import BUCKETS, PaddedRows, TunedLinear, bucket_index
from engine.model.quantization import DenseLinear, Int4Linear, Int4VnniLinear, Int8Linear
from engine.system import hardware
from engine.system.paths import data_dir

log = logging.getLogger("engine")

#: ``auto`` keeps a compiled bucket only where it is at least this much faster than eager (0.05 = 5 %).
MIN_GAIN = 0.05
CACHE_FILENAME = "compile.json"
#: Part of every cache key: bump it when the compiled layer or the way it is judged changes.
COMPILE_VERSION = "v1"
_SCRATCH_CONTEXT = 64  # context length of the compile and timing calls (any length >= 2 gives the same graph)


class LinearSpec(NamedTuple):
    """A linear layer as tensors and a kind, so that every layer's kernel is an argument of one graph."""

    kind: str  # "int4", "int4_vnni" (native only), "int8" or "dense"
    weight: torch.Tensor
    scales: torch.Tensor | None
    group_size: int
    bias: torch.Tensor | None
    row_multiple: int = 1  # calls are padded to a multiple of this many rows (deterministic plans)


def linear_spec(kernel: Any, bucket: int, dtype: torch.dtype, padded: bool = False) -> LinearSpec | None:
    """``kernel`` as it runs in ``bucket``, in a form the compiled layer can call; None if it has none.

    ``padded`` also describes kernels that run on row-padded calls (their ``row_multiple``): the native step pads;
    the compiled layer does not.
    """
    multiple = 1
    if isinstance(kernel, TunedLinear):
        kernel = kernel.kernel_at(bucket, padded)
    if isinstance(kernel, PaddedRows) and padded:
        multiple, kernel = kernel.multiple, kernel.kernel
    if isinstance(kernel, Int4VnniLinear) and not padded:
        return None  # the native extension's own op: the native step calls it, a compiled graph does not
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
    if isinstance(kernel, DenseLinear) and kernel.weight.dtype == dtype:
        return LinearSpec("dense", kernel.weight, None, 0, bias)
    return None  # packed fp16, padded rows, a cast: eager only


def _linear(x: torch.Tensor, spec: LinearSpec) -> torch.Tensor:
    if spec.kind == "int4" and spec.scales is not None:
        y = torch._weight_int4pack_mm_for_cpu(x, spec.weight, spec.group_size, spec.scales)
    elif spec.kind == "int4_vnni" and spec.scales is not None:
        y = torch.ops.hearth.int4_vnni_mm(x, spec.weight, spec.group_size, spec.scales)
    elif spec.kind == "int8" and spec.scales is not None:
        y = torch._weight_int8pack_mm(x, spec.weight, spec.scales)
    else:
        return F.linear(x, spec.weight, spec.bias)
    return y if spec.bias is None else y + spec.bias


@dataclass(frozen=True, slots=True)
class LayerShape:
    """The constants of a decoder layer (hashable: part of the cache key)."""

    q_dim: int
    kv_dim: int
    head_dim: int
    num_heads: int
    eps: float
    scale: float


class LayerWeights(NamedTuple):
    input_norm: torch.Tensor
    qkv: LinearSpec
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o: LinearSpec
    post_norm: torch.Tensor
    gate_up: LinearSpec
    down: LinearSpec


def decode_layer(
    s: LayerShape,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    w: LayerWeights,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slot_mapping: torch.Tensor,
    slots: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """One fused decoder layer over B single-token decodes. x: [B, hidden]; slots, mask: [B, L], [B, 1, 1, L]."""
    t, hd, nh, qd, kvd = x.shape[0], s.head_dim, s.num_heads, s.q_dim, s.kv_dim
    h = F.rms_norm(x, w.input_norm.shape, w.input_norm, s.eps)
    qkv = _linear(h, w.qkv)
    qk = qkv[:, : qd + kvd].view(t, -1, hd)
    v = qkv[:, qd + kvd :].view(t, -1, hd)
    if w.q_norm is not None and w.k_norm is not None:
        qn = F.rms_norm(qk[:, :nh], w.q_norm.shape, w.q_norm, s.eps)
        qk = torch.cat((qn, F.rms_norm(qk[:, nh:], w.k_norm.shape, w.k_norm, s.eps)), 1)
    half = hd // 2
    rotated = torch.cat((qk[..., half:].neg(), qk[..., :half]), dim=-1)
    qk = torch.addcmul(qk * cos, rotated, sin)
    q, k = qk[:, :nh], qk[:, nh:]
    k_pool.index_copy_(0, slot_mapping, k.to(k_pool.dtype))
    v_pool.index_copy_(0, slot_mapping, v.to(v_pool.dtype))
    # attention in fp32, spelled out: inductor fuses the gathers, casts, mask and softmax around two batched
    # matmuls, where torch's SDPA inside a compiled graph ran several times slower than eager (torch 2.13, CPU)
    f32 = torch.float32
    kvh = k_pool.shape[1]
    keys = k_pool[slots].to(f32).permute(0, 2, 3, 1)  # [B, KVH, D, L]
    values = v_pool[slots].to(f32).transpose(1, 2)  # [B, KVH, L, D]
    scores = torch.matmul(q.to(f32).view(t, kvh, -1, hd), keys) * s.scale + mask  # [B, KVH, heads per KV, L]
    o = torch.matmul(scores.softmax(dim=-1), values)
    x = x + _linear(o.to(x.dtype).reshape(t, qd), w.o)
    h = F.rms_norm(x, w.post_norm.shape, w.post_norm, s.eps)
    gate, up = _linear(h, w.gate_up).chunk(2, dim=-1)
    return x + _linear(F.silu(gate) * up, w.down)


def mark_dynamic(
    bucket: int,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slot_mapping: torch.Tensor,
    slots: torch.Tensor,
    mask: torch.Tensor,
) -> None:
    """Mark the dims a real step varies in: the context length, and the batch outside the one-row bucket.

    The compile call marks its inputs; real steps mark theirs too, so that a recompile (should a guard ever
    fail) is just as general and a growing context cannot recompile every step.
    """
    dynamic: list[tuple[torch.Tensor, int]] = [(slots, 1), (mask, 3)]
    if bucket > 0:
        dynamic += [(x, 0), (cos, 0), (sin, 0), (slot_mapping, 0), (slots, 0), (mask, 0)]
    for tensor, dim in dynamic:
        torch._dynamo.mark_dynamic(tensor, dim)


def compile_problem(device: torch.device) -> str | None:
    """Why decode steps cannot be compiled here, or None when they can."""
    if getattr(sys, "frozen", False):
        return "a frozen bundle carries no C++ compiler"
    if device.type != "cpu":
        return f"compiled steps are implemented for the CPU only, not {device.type}"
    try:
        from torch._inductor import cpp_builder

        compiler = cpp_builder.get_cpp_compiler()
    except Exception as exc:  # noqa: BLE001 -- inductor raises its own error types when no compiler is found
        return f"no C++ compiler ({exc})"
    if shutil.which(compiler) is None and not os.path.exists(compiler):
        return f"no C++ compiler ({compiler} not found)"
    return None


def configure_cache() -> None:
    """Keep inductor's artifacts (FX graph cache, generated kernels) in the data dir, across starts."""
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(data_dir() / "inductor")


class VerdictCache:
    """``auto``'s measured verdicts on disk: compiled or eager, per machine, torch, threads, shape and bucket."""

    _lock = threading.Lock()

    def __init__(self) -> None:
        self.path = data_dir() / CACHE_FILENAME

    @staticmethod
    def key(signature: str, bucket: int, num_threads: int | None = None) -> str:
        threads = torch.get_num_threads() if num_threads is None else num_threads
        machine = f"{hardware.detect().cpu_model}|torch {torch.__version__}|{threads} threads"
        return f"{COMPILE_VERSION}|{machine}|{signature}|bucket {bucket}"

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def get(self, key: str) -> dict[str, Any] | None:
        entry = self._load().get(key)
        return entry if isinstance(entry, dict) and "compiled" in entry else None

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
                log.info("compile verdicts not written (%s)", exc)


Rotary = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class CompiledDecode:
    """The compiled decode layer of one fused decoder, one graph per batch bucket, compiled in the background.

    Args:
        mode: "auto", "default" or "max-autotune" (inductor's modes; "auto" compiles with "default").
        shape: the layer's constants.
        layers: every layer's weights, per bucket: ``layers(bucket)`` (None where a kernel cannot be compiled).
        hidden: the hidden size; dtype: the activation dtype.
        kv_layout: ``(kv_heads, head_dim, kv_dtype)`` of the pool.
        rotary: ``rotary(x, positions)`` -> cos, sin as the eager path computes them ([T, 1, D]).
        signature: names the model and its kernels, for ``auto``'s cache.
    """

    def __init__(
        self,
        mode: str,
        shape: LayerShape,
        layers: Callable[[int], list[LayerWeights] | None],
        hidden: int,
        dtype: torch.dtype,
        kv_layout: tuple[int, int, torch.dtype],
        rotary: Rotary,
        signature: str,
    ) -> None:
        self.mode = mode
        self.shape = shape
        self._layers = layers
        self._hidden, self._dtype, self._kv_layout, self._rotary = hidden, dtype, kv_layout, rotary
        self.signature = signature
        # the compile threads run with the thread count the decoder was built under (a thread started elsewhere,
        # e.g. by Qt's pool, may see another): what they compile, time and record is what the steps run
        self._num_threads = torch.get_num_threads()
        self._lock = threading.Lock()
        self._ready: dict[int, tuple[Callable[..., torch.Tensor], list[LayerWeights]]] = {}
        self._threads: dict[int, threading.Thread] = {}
        #: why each bucket runs as it does, for logs and ``python -m engine info``
        self.reasons: dict[int, str] = {}
        configure_cache()

    # --- the step ------------------------------------------------------------------------------------------------
    def layers_for(self, rows: int) -> tuple[Callable[..., torch.Tensor], list[LayerWeights]] | None:
        """The compiled layer and weights for a decode step of ``rows`` sequences; None (eager) until ready.

        The first call for a bucket starts its compile in the background.
        """
        bucket = bucket_index(rows)
        ready = self._ready.get(bucket)
        if ready is None and bucket not in self.reasons:
            self.prepare(rows, wait=False)
        return ready

    def fail(self, rows: int, exc: BaseException) -> None:
        """A compiled step raised: that bucket runs eager from now on."""
        bucket = bucket_index(rows)
        with self._lock:
            self._ready.pop(bucket, None)
            self.reasons[bucket] = f"eager: the compiled step failed ({type(exc).__name__}: {exc})"
        log.warning("compiled decode step for %s rows failed; eager from now on: %s", rows, exc)

    def prepare(self, rows: int, wait: bool = True, timeout: float | None = None) -> str:
        """Compile the bucket of ``rows`` (in the background unless ``wait``); return how that bucket runs."""
        bucket = bucket_index(rows)
        with self._lock:
            if bucket not in self.reasons and bucket not in self._threads:
                started = threading.Thread(
                    target=self._compile, args=(bucket,), name=f"hearth-compile-{bucket}", daemon=True
                )
                self._threads[bucket] = started
                started.start()
            thread = self._threads.get(bucket)
        if wait and thread is not None:
            thread.join(timeout)
        return self.reasons.get(bucket, "compiling")

    # --- compile and judge -----------------------------------------------------------------------------------
    def _compile(self, bucket: int) -> None:
        torch.set_num_threads(self._num_threads)
        try:
            reason = self._compile_bucket(bucket)
        except Exception as exc:  # noqa: BLE001 -- any compile error: eager, with the reason
            reason = f"eager: compile failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
            log.warning("decode step for bucket %s not compiled: %s", bucket, exc)
        with self._lock:
            self.reasons[bucket] = reason
        log.info("decode steps of %s rows: %s", _bucket_name(bucket), reason)

    def _compile_bucket(self, bucket: int) -> str:
        weights = self._layers(bucket)
        if weights is None:
            return "eager: a kernel of this bucket has no compiled form"
        cache = VerdictCache() if self.mode == "auto" else None
        key = VerdictCache.key(self.signature, bucket, self._num_threads) if cache is not None else ""
        verdict = cache.get(key) if cache is not None else None
        if verdict is not None and not verdict["compiled"]:
            return f"eager: {verdict['reason']} (cached)"
        inductor_mode = "default" if self.mode == "auto" else self.mode
        fn = torch.compile(decode_layer, fullgraph=True, dynamic=False, mode=inductor_mode)
        start = time.perf_counter()
        args = self._scratch(bucket)
        with torch.inference_mode():
            fn(self.shape, *self._call_args(args, weights[0]))
        took = time.perf_counter() - start
        if cache is not None and verdict is None:
            eager_s, compiled_s = self._time(fn, args, weights)
            gain = eager_s / compiled_s - 1
            ok = gain >= MIN_GAIN
            reason = f"{gain:+.0%} per layer against eager ({eager_s * 1e6:.0f} vs {compiled_s * 1e6:.0f} us)"
            cache.put(key, {"compiled": ok, "reason": reason, "eager_us": eager_s * 1e6, "compiled_us": compiled_s * 1e6})
            if not ok:
                return f"eager: {reason}"
        else:
            reason = f"{inductor_mode} mode" if verdict is None else f"{verdict['reason']} (cached)"
        with self._lock:
            self._ready[bucket] = (fn, weights)
        return f"compiled in {took:.1f} s: {reason}"

    def _scratch(self, bucket: int) -> dict[str, Any]:
        """Inputs like a real step's, over a scratch KV pool, marked dynamic where a real step varies."""
        rows, length = BUCKETS[bucket], _SCRATCH_CONTEXT
        heads, head_dim, kv_dtype = self._kv_layout
        # K and V pools: a layer of a 4-D tensor each, made outside inference mode, like the real ones (the same
        # tensor kind, and two storages: aliased pools would compile a graph the real ones fail the guards of)
        pools = [torch.zeros(1, length + rows, heads, head_dim, dtype=kv_dtype) for _ in range(2)]
        with torch.inference_mode():
            x = torch.randn(rows, self._hidden).to(self._dtype)
            pos = torch.full((rows,), length - 1, dtype=torch.long)
            cos, sin = self._rotary(x, pos)
            slot_mapping = torch.arange(length, length + rows)
            slots = torch.arange(length).repeat(rows, 1)
            mask = torch.zeros(rows, 1, 1, length)
        args = {"x": x, "cos": cos, "sin": sin, "pools": pools, "slot_mapping": slot_mapping, "slots": slots}
        args["mask"] = mask
        mark_dynamic(bucket, x, cos, sin, slot_mapping, slots, mask)
        return args

    @staticmethod
    def _call_args(args: dict[str, Any], w: LayerWeights) -> tuple[Any, ...]:
        k_pool, v_pool = args["pools"][0][0], args["pools"][1][0]
        for pool in (k_pool, v_pool):
            torch._dynamo.mark_dynamic(pool, 0)  # the real pool has another size
        return args["x"], args["cos"], args["sin"], w, k_pool, v_pool, args["slot_mapping"], args["slots"], args["mask"]

    def _time(
        self, fn: Callable[..., torch.Tensor], args: dict[str, Any], weights: list[LayerWeights]
    ) -> tuple[float, float]:
        """Best-of-rounds time of one step's layers, eager and compiled, interleaved (seconds per layer)."""
        best = {"eager": float("inf"), "compiled": float("inf")}
        runs: dict[str, Callable[..., torch.Tensor]] = {"eager": decode_layer, "compiled": fn}
        with torch.inference_mode():
            for _ in range(5):
                for name, run in runs.items():
                    start = time.perf_counter()
                    for w in weights:
                        run(self.shape, *self._call_args(args, w))
                    best[name] = min(best[name], (time.perf_counter() - start) / len(weights))
        return best["eager"], best["compiled"]


def _bucket_name(bucket: int) -> str:
    return ("1", "2-4", "5-16", "17+")[bucket]
