"""The layer a tuned plan runs (:class:`TunedLinear`: one kernel per batch bucket, rows padded where the plan
says so) and what its kernels hold in memory; plans are made in ``engine/model/autotune.py``."""

from __future__ import annotations

import torch

from engine.model.plan_cache import Plan
from engine.model.row_invariance import Kernel, PaddedRows


class TunedLinear:
    """A linear layer that runs, for each bucket of row counts, the kernel its plan chose.

    A kernel with an ``input_dtype`` (packed fp16 takes fp32) gets its input cast, and its output cast back.
    A plan with a ``row_multiple`` pads every call to a multiple of that many rows.
    """

    __slots__ = ("_by_bucket", "_casts", "kernels", "plan", "shared")

    def __init__(self, kernels: dict[str, Kernel], plan: Plan, shared: frozenset[str] = frozenset()) -> None:
        self.kernels = {name: kernels[name] for name in plan.used}
        self.plan = plan
        self.shared = shared
        pad = plan.row_multiple
        self._by_bucket = tuple(
            kernels[name] if pad == 1 else PaddedRows(kernels[name], pad) for name in plan.kernels
        )
        self._casts = tuple(getattr(kernels[name], "input_dtype", None) for name in plan.kernels)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        b = 0 if rows <= 1 else 1 if rows <= 4 else 2 if rows <= 16 else 3
        cast = self._casts[b]
        if cast is not None and x.dtype != cast:
            return self._by_bucket[b](x.to(cast)).to(x.dtype)
        return self._by_bucket[b](x)

    def kernel_at(self, bucket: int, padded: bool = False) -> Kernel | None:
        """The kernel ``bucket`` runs, when it runs with no input cast and (unless ``padded``, which returns the
        :class:`PaddedRows` wrapper) no row padding; otherwise None."""
        if self._casts[bucket] is not None or (self.plan.row_multiple != 1 and not padded):
            return None
        return self._by_bucket[bucket]

    @property
    def nbytes(self) -> int:
        """Bytes this layer adds (kernels sharing memory held elsewhere count nothing; kernels over one kernel's
        bytes count those once, plus what each holds of its own)."""
        kept = [k for name, k in self.kernels.items() if name not in self.shared]
        owners = {id(memory_owner(k)): memory_owner(k) for k in kept}
        return sum(k.nbytes for k in owners.values()) + sum(k.nbytes - memory_owner(k).nbytes for k in kept)


def memory_owner(kernel: Kernel) -> Kernel:
    """The kernel whose memory ``kernel`` reads: its ``base`` where it runs another kernel's bytes, else itself.
    Such a kernel's ``nbytes`` counts its base's bytes and its own."""
    return getattr(kernel, "base", kernel)
