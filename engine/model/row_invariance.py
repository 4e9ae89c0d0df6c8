"""Row invariance for deterministic mode: whether each output row of a kernel is bitwise the same whatever rows
share its call, and the row padding that makes a kernel so.

A greedy reply must not depend on what else shares a step (``engine/model/autotune.py``, deterministic mode), and
BLAS kernels often treat a partial block of rows differently, so a kernel that is not row-invariant as it stands
may be once every call is padded to a multiple of 2, 4, 8 or 16 rows (:class:`PaddedRows`).
"""

from __future__ import annotations

from typing import Protocol

import torch

#: Row paddings tried, in order, to make a kernel row-invariant: every call then runs a multiple of that many rows.
ROW_MULTIPLES = (1, 2, 4, 8, 16)
#: Call sizes (before padding) in which the invariance check computes its probe rows.
_CHECK_ROWS = (1, 2, 3, 5, 7, 16, 33, 70)
#: Rows the invariance check computes alone and in every call size.
_PROBE_ROWS = 48


class Kernel(Protocol):
    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...
    @property
    def nbytes(self) -> int: ...


class PaddedRows:
    """Runs ``kernel`` on a multiple of ``multiple`` rows: zero rows are added and their outputs dropped."""

    __slots__ = ("input_dtype", "kernel", "multiple")

    def __init__(self, kernel: Kernel, multiple: int) -> None:
        self.kernel, self.multiple = kernel, multiple
        self.input_dtype: torch.dtype | None = getattr(kernel, "input_dtype", None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        extra = -rows % self.multiple
        if not extra:
            return self.kernel(x)
        return self.kernel(torch.cat([x, x.new_zeros(extra, x.shape[1])]))[:rows]

    @property
    def nbytes(self) -> int:
        return self.kernel.nbytes


def is_row_invariant(kernel: Kernel, in_features: int, dtype: torch.dtype) -> bool:
    """Whether each output row of ``kernel`` is bitwise the same whatever rows share the call, and however many.

    :data:`_PROBE_ROWS` random rows are computed one per call, then packed into calls of each of
    :data:`_CHECK_ROWS` rows (the last call topped up with other rows). Many probe rows are needed: a kernel
    whose reduction order changes with the row count may still round most rows (in bf16) to the same values.
    """
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(_PROBE_ROWS + max(_CHECK_ROWS), in_features, generator=gen).to(dtype)
    cast = getattr(kernel, "input_dtype", None)

    def call(a: torch.Tensor) -> torch.Tensor:
        return kernel(a.to(cast)).to(dtype) if cast is not None and cast != dtype else kernel(a)

    alone: list[torch.Tensor] = []  # each probe row computed alone, as the checks first need it

    def alone_rows(start: int, end: int) -> torch.Tensor:
        while len(alone) < end:
            alone.append(call(x[len(alone) : len(alone) + 1]))
        return torch.cat(alone[start:end])

    with torch.inference_mode():
        for rows in _CHECK_ROWS[1:]:
            for start in range(0, _PROBE_ROWS, rows):
                got = call(x[start : start + rows])[: _PROBE_ROWS - start]
                if not torch.equal(got, alone_rows(start, min(start + rows, _PROBE_ROWS))):
                    return False  # a kernel that is not invariant most often shows it in the first call of 2 rows
    return True


def row_multiple(kernel: Kernel, in_features: int, dtype: torch.dtype) -> int | None:
    """The least of :data:`ROW_MULTIPLES` whose padding makes ``kernel`` row-invariant; None if none does."""
    for multiple in ROW_MULTIPLES:
        if is_row_invariant(PaddedRows(kernel, multiple), in_features, dtype):
            return multiple
    return None
