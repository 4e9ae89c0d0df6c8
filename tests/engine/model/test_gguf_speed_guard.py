"""A speed floor for the GGUF block kernels (engine/model/csrc/gguf_kernels.cpp), against torch in the same run.

The reference is torch's dense fp32 matmul (``F.linear``) of the same weights, dequantized, on the same shapes:
what running the file without these kernels would cost at best. A decode row (m = 1) is bound by the weights'
bytes, and the blocks are a fraction of fp32's, so the kernel must beat the reference outright. A prompt (m = 128)
is bound by arithmetic, where the int8 GEMM and the fp32 GEMM run level within a factor of two; the floor there
catches a GEMM that falls back to row-by-row GEMVs or loses its register tiling. Both run on one thread, their
calls interleaved, each figure the median of several rounds, so a loaded machine slows both alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch
import torch.nn.functional as F

#: ggml type name -> (number, weights per block, bytes per block, offset of its fp16 scale(s), how many)
TYPES = {"Q4_K": (12, 256, 144, 0, 2), "Q6_K": (14, 256, 210, 208, 1)}
N, K = 1024, 2048
#: m -> the most the kernel's time may be, as a multiple of the reference's (median against median)
CEILINGS = {1: 1.0, 128: 1.5}
ROUNDS = 11


@pytest.fixture
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def random_blocks(name: str, rng: np.random.Generator) -> torch.Tensor:
    """uint8 [N, row bytes]: random quant bytes with small positive fp16 scales, valid blocks of the type."""
    _, weights, size, at, halves = TYPES[name]
    count = N * K // weights
    raw = rng.integers(0, 256, size=(count, size), dtype=np.uint8)
    scales = rng.uniform(1e-4, 1e-3, size=(count, halves)).astype(np.float16)
    raw[:, at : at + 2 * halves] = scales.view(np.uint8).reshape(count, 2 * halves)
    return torch.from_numpy(raw.reshape(N, -1))


def seconds(call: Callable[[], object], repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - start) / repeats


@pytest.mark.parametrize("layout", ["file", "grouped"])
@pytest.mark.parametrize("name", list(TYPES))
@pytest.mark.parametrize("m", list(CEILINGS))
def test_the_kernels_are_not_slower_than_torchs_dense_matmul(
    hearth: object, one_thread: None, name: str, m: int, layout: str
) -> None:
    """The file's own block order, and the rows in groups of eight that the "file" precision runs (``gguf_repack``:
    the VNNI build's z tiles at one row, its panels at 128)."""
    w = random_blocks(name, np.random.default_rng(m + TYPES[name][0]))
    dense = hearth.gguf_dequantize(w, TYPES[name][0])  # type: ignore[attr-defined]
    kind = TYPES[name][0]
    if layout == "grouped":
        w, kind = hearth.gguf_repack(w, kind), 128 + kind  # type: ignore[attr-defined]
    x = torch.randn(m, K, generator=torch.Generator().manual_seed(m))
    ours = lambda: hearth.gguf_mm(x, w, kind)  # type: ignore[attr-defined]
    reference = lambda: F.linear(x, dense)
    # each timing spans about 20 ms of calls, the two interleaved so that load and clock changes fall on both
    ours(), reference()
    repeats = max(1, round(20e-3 / max(seconds(reference, 3), 1e-6)))
    ratios = []
    for _ in range(ROUNDS):
        ratios.append(seconds(ours, repeats) / seconds(reference, repeats))
    ratio = statistics.median(ratios)
    assert ratio <= CEILINGS[m], (
        f"{name} ({layout}), m={m}: gguf_mm takes {ratio:.2f}x the time of torch's dense fp32 matmul on the same shape "
        f"(ceiling {CEILINGS[m]}x; rounds {[round(r, 2) for r in ratios]})"
    )
