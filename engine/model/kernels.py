"""Builds each fused linear layer's kernel: the level's candidates, the GGUF file's own blocks, the tuned plan.

For the fused decoder on a CPU with torch's kernels (``KernelBuilder``):

* **fp32** stays one dense ``F.linear`` (it must match HF token for token).
* **bf16/fp16**: dense, or fbgemm's packed fp16 (``PackedFp16Linear``).
* **int8/int4** decoder layers: the level's one packed copy of the weights (a dense copy of the dequantized weights
  is faster for batched rows on CPUs with AVX512_BF16, but would undo the memory the level saves). int8 runs
  torch's int8 kernel. int4 runs torch's int4 kernel, or, where the native extension has one for this CPU
  (AVX512-VNNI), ``Int4VnniLinear`` over the very same bytes: int8-plane activations multiplied as integers, where
  torch's kernel dequantizes every weight to fp32 first, so it gains most on batched rows. Layers whose input width
  is not a multiple of 32 (the int4 group) use int8.
* **lm_head** at int8/int4: int8 (in torch's int8 kernel, as two int4 kernels over the same weights' nibbles,
  ``Int8AsInt4Pair``, or, with the native extension's VNNI kernels, ``Int8VnniLinear`` over torch's int8 bytes),
  or the dense embedding it is tied to (free: it is held for lookups anyway).

At the "file" level every layer is a ``GgufLinear`` over the GGUF file's own blocks, whatever their types
(``engine/model/gguf_linear.py``): nothing is requantized or tuned.

Where the model came from a GGUF file, Q4_0/Q4_1/Q4_K tensors become int4 kernels and Q8_0 tensors int8 kernels
straight from the file's blocks, when their dequantized values match the loaded weights (checked per tensor).
Which candidate runs each batch bucket is measured (``engine/model/autotune.py``). In deterministic mode every
CPU layer, fp32 ones included, goes through the tuner, which keeps only row-invariant kernels (padding rows where
that makes one invariant). Elsewhere (CUDA, forced backends) layers are built by
:func:`engine.model.quantization.make_linear`, one kernel per level, with nothing to tune.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch

from engine.loading.formats.gguf_blocks import Int4Parts
from engine.loading.gguf_weights import GgufWeights, matches
from engine.model.autotune import Kernel, LazyKernels, Tuner
from engine.model.gguf_linear import GgufLinear
from engine.model.plan_cache import Plan
from engine.model.quantization import (
    INT4_GROUP_SIZE,
    DenseLinear,
    Int4Linear,
    Int4VnniLinear,
    Int8AsInt4Pair,
    Int8Linear,
    Int8VnniLinear,
    PackedFp16Linear,
    make_linear,
)
from engine.model.tuned_linear import TunedLinear
from engine.model.vnni import vnni_problem
from engine.system.hardware import fbgemm_fp16_available

log = logging.getLogger("engine")

Build = Callable[[], Kernel]


class KernelBuilder:
    """``builder(role, names, weight, bias)`` -> the linear layer for one fused weight.

    Args:
        level: "int8"/"int4", or None for dense weights.
        dtype: the model's dtype (activations run in it).
        device: where the model runs.
        backend: "auto", "torch" or "bitsandbytes" (see ``make_linear``).
        gguf: the GGUF file the model was read from, when its blocks may be used.
        tuner: measures and caches kernel plans; None runs each level's stored kernel.
        native: ``EngineConfig.native``: unless "off", int4 layers and the int8 lm_head may also run the native
            extension's VNNI kernels over the same bytes (``Int4VnniLinear``, ``Int8VnniLinear``), where the tuner
            measures them faster.
    """

    def __init__(
        self,
        level: str | None,
        dtype: torch.dtype,
        device: torch.device,
        backend: str,
        gguf: GgufWeights | None,
        tuner: Tuner | None,
        native: str = "auto",
    ) -> None:
        self.level, self.dtype, self.device, self.backend = level, dtype, device, backend
        self.gguf = gguf
        self.tuner = tuner
        self.from_file = 0  # weights taken straight from the GGUF blocks
        self.deterministic = tuner is not None and tuner.deterministic
        on_cpu = device.type == "cpu" and backend in ("auto", "torch")
        # fp32 layers stay HF's own dense op unless timed for row invariance; quantized ones (an fp32 model's int4
        # draft) are tuned like any other level's
        self.tunable = on_cpu and (dtype != torch.float32 or self.deterministic or level is not None)
        #: the native extension's VNNI kernels may serve (int4 layers, the int8 lm_head)
        self.vnni = (
            self.tunable and level in ("int8", "int4") and native != "off" and dtype in Int4VnniLinear.dtypes
            and vnni_problem() is None
        )

    def __call__(
        self, role: str, names: list[str], weight: torch.Tensor, bias: torch.Tensor | None
    ) -> Kernel:
        if self.level == "file":  # the file's own blocks, whatever their types (weight is only a shape)
            if self.gguf is None:
                raise ValueError("the 'file' precision needs the GGUF file the model was read from")
            self.from_file += 1
            return GgufLinear(self.gguf.blocks(names), bias)
        if not self.tunable:
            if self.level is None or role == "lm_head":
                return DenseLinear(weight, bias)
            return make_linear(weight, bias, self.level, self.device, self.backend)
        builds, preferred, free = self._candidates(role, names, weight, bias)
        if self.tuner is None or (len(builds) == 1 and not self.deterministic):
            return builds[preferred]()
        shape = (int(weight.shape[0]), int(weight.shape[1]))
        known = self.tuner.plans.get((role, shape))
        adopt = known is None
        if known is None:  # a cached plan: only the kernels it runs are built (the lm_head's others cost seconds)
            known = self.tuner.cached(role, shape, list(builds))
        if known is not None and all(name in builds for name in known.used):
            used = {name: builds[name]() for name in known.used}
            if adopt:
                self.tuner.adopt(role, shape, known, used, free)
            return TunedLinear(used, known, free)
        kernels = LazyKernels(builds)  # built when measured or run: an untimed plan builds only what it runs
        plan: Plan = self.tuner.plan_for(role, shape, kernels, preferred, free)
        return TunedLinear({name: kernels[name] for name in plan.used}, plan, free)

    # --- candidates ------------------------------------------------------------------------------------------
    def _candidates(
        self, role: str, names: list[str], weight: torch.Tensor, bias: torch.Tensor | None
    ) -> tuple[dict[str, Build], str, frozenset[str]]:
        """Builders of each candidate kernel, the level's own kernel, and the candidates that cost no memory."""
        dtype = self.dtype

        def dense() -> Build:
            return lambda: DenseLinear(weight.to(dtype), None if bias is None else bias.to(dtype))

        if self.level is None:
            builds: dict[str, Build] = {"dense": dense()}
            if fbgemm_fp16_available() and dtype != torch.float32:  # fp16 weights would round fp32 ones
                builds["fp16_packed"] = lambda: PackedFp16Linear(weight, bias)
            return builds, "dense", frozenset({"dense"})
        if role == "lm_head":
            q8 = self.gguf.q8_parts(names) if self.gguf is not None else None
            int8 = functools.cache(lambda: Int8Linear.from_q8(q8, bias) if q8 else Int8Linear.quantize(weight, bias))
            head: dict[str, Build] = {"dense": dense(), "int8": int8}
            if not weight.shape[1] % INT4_GROUP_SIZE and not weight.shape[0] % 16:  # the int4 kernel's layout
                head["int8_nibbles"] = lambda: Int8AsInt4Pair(int8())
            if self.vnni and not weight.shape[1] % 32 and not weight.shape[0] % 8:
                head["int8_vnni"] = lambda: Int8VnniLinear(int8())
                head["int8_gemv"] = lambda: Int8VnniLinear(int8(), gemv=True)
            return head, self._first_choice(head, "int8_gemv", "int8"), frozenset({"dense"})
        # decoder layers at int8/int4: the level's one packed kernel. A dense copy of the dequantized weights can
        # win on batched rows on CPUs with AVX512_BF16 (docs/BENCHMARKS.md), but would hold more memory than the
        # bf16 model itself: the level is chosen to save it
        parts = self._int4_parts(names, weight) if self.level == "int4" else None
        if parts is not None:
            return self._int4(functools.cache(lambda: Int4Linear.from_parts(parts, bias)), weight)
        q8 = self.gguf.q8_parts(names) if self.gguf is not None else None
        if q8 is not None and matches(q8.dequantize(), weight):
            self.from_file += 1
            return {"int8": lambda: Int8Linear.from_q8(q8, bias)}, "int8", frozenset()
        if self.level == "int8" or weight.shape[1] % INT4_GROUP_SIZE:
            return {"int8": lambda: Int8Linear.quantize(weight, bias)}, "int8", frozenset()
        return self._int4(functools.cache(lambda: Int4Linear.quantize(weight, bias)), weight)

    def _int4(self, build: Callable[[], Int4Linear], weight: torch.Tensor) -> tuple[dict[str, Build], str, frozenset[str]]:
        """torch's int4 kernel, and the VNNI kernel over the very same bytes where it can run (no memory of its own:
        the tuner sees it share ``build()``'s)."""
        builds: dict[str, Build] = {"int4": build}
        if self.vnni and not weight.shape[0] % 64:  # its blocks of 64 output channels
            builds["int4_vnni"] = lambda: Int4VnniLinear(build())
        return builds, self._first_choice(builds, "int4_vnni", "int4"), frozenset()

    def _first_choice(self, builds: dict[str, Build], vnni: str, level: str) -> str:
        """The kernel a shape runs before it is measured. torch's int4 and int8 kernels have no fast path for fp32
        activations (an fp32 model's int4 draft): there they ran 20-150x slower than the VNNI kernels, 12 ms against
        0.08-0.1 ms for one row of a 2048x8192 layer (docs/BENCHMARKS.md), so fp32 starts on the VNNI kernel."""
        return vnni if self.dtype == torch.float32 and vnni in builds else level

    def _int4_parts(self, names: list[str], weight: torch.Tensor) -> Int4Parts | None:
        """The GGUF file's int4 blocks for these tensors, if it has them and they match the loaded weight."""
        if self.gguf is None:
            return None
        parts = self.gguf.int4_parts(names)
        if parts is None:
            return None
        if not matches(parts.dequantize(), weight):
            log.warning("GGUF blocks of %s do not match the loaded weights; requantizing them", names[0])
            return None
        self.from_file += 1
        return parts
