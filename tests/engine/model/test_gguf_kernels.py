"""The native GGUF block kernels (engine/model/csrc/gguf_kernels.cpp): ``gguf_dequantize`` and ``gguf_mm``.

Every block type gets random valid blocks (random quant bytes, sane fp16 scales) in shapes that are not powers of
two. ``gguf_dequantize`` must give gguf's own numpy dequantize bit for bit. ``gguf_mm`` quantizes its activations
to int8 per block (d = max|x| / 127, q rounded to nearest even); the test quantizes them the same way in numpy, so
the kernel must match the float64 product of both dequantized sides to fp32 rounding, and the unquantized product
within the int8 activations' error. Each output row must be the same bits whatever else shares the call (row count,
tile, thread split), so that a greedy reply never depends on its batch. The plain loops, which every build compiles and
which a CPU without AVX2 runs (``gguf_mm_plain``), pass the same checks and agree with the AVX2 tiles. The AVX2 tiles
(``gguf_mm_avx2``) are in every build with AVX2 and pass the same checks; where the build has the 512-bit tiles
(AVX512-BW/VL and VNNI), ``gguf_mm`` runs those, and they must give the AVX2 tiles' bits exactly, so a reply is the
same on both kinds of CPU. Q4_0, Q8_0, Q4_K and Q6_K rows put in groups of eight interleaved rows (``gguf_repack``, as the "file"
level loads them; type number 128 + the ggml type's) pass the same checks for odd row counts with a partial group, and
give the same bits in the plain loops, the AVX2 tiles and the VNNI tiles.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
T = gguf.GGMLQuantizationType
#: ggml type -> (weights per block, bytes per block)
BLOCKS = {T.Q4_0: (32, 18), T.Q4_1: (32, 20), T.Q8_0: (32, 34), T.Q4_K: (256, 144), T.Q5_K: (256, 176),
          T.Q6_K: (256, 210)}
ROWS = (1, 3, 5, 17, 64)
#: The kernels this CPU runs, the AVX2 tiles (the plain loops where the build has no AVX2), and the plain loops
#: every build has.
KERNELS = ("gguf_mm", "gguf_mm_avx2", "gguf_mm_plain")
SHAPES = ((96, 512), (96, 768))


def random_blocks(qtype: T, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 [n, row bytes]: random quant bytes, with each block's fp16 scales set to sane values."""
    weights, size = BLOCKS[qtype]
    count = n * k // weights
    raw = rng.integers(0, 256, size=(count, size), dtype=np.uint8)

    def halves(low: float, high: float, per_block: int) -> np.ndarray:
        values = rng.uniform(low, high, size=(count, per_block)).astype(np.float16)
        return values.view(np.uint8).reshape(count, 2 * per_block)

    if qtype in (T.Q4_0, T.Q8_0):
        raw[:, 0:2] = halves(1e-3, 1e-2, 1)
    elif qtype == T.Q4_1:
        raw[:, 0:2] = halves(1e-3, 1e-2, 1)
        raw[:, 2:4] = halves(-0.1, 0.1, 1)
    elif qtype in (T.Q4_K, T.Q5_K):
        raw[:, 0:4] = halves(1e-4, 1e-3, 2)  # d and dmin (the sub-block scales multiply them by up to 63)
    else:
        raw[:, 208:210] = halves(1e-4, 1e-3, 1)
    return raw.reshape(n, -1)


def quantized_activations(x: np.ndarray, block: int) -> np.ndarray:
    """x as the kernel sees it: per block, d = max|x| / 127 and q = rint(x / d) (via 1 / d, in fp32), as float64."""
    rows, k = x.shape
    blocks = x.astype(np.float32).reshape(rows, k // block, block)
    d = np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inverse = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = np.rint(blocks * inverse)
    return (q.astype(np.float64) * d.astype(np.float64)).reshape(rows, k)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())


def activation_block(qtype: T) -> int:
    return 256 if BLOCKS[qtype][0] == 256 else 32


@pytest.mark.parametrize("qtype", list(BLOCKS), ids=lambda t: t.name)
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_dequantize_is_ggufs_own(hearth: object, qtype: T, n: int, k: int) -> None:
    w = random_blocks(qtype, n, k, np.random.default_rng(int(qtype) * 7 + k))
    got = hearth.gguf_dequantize(torch.from_numpy(w), int(qtype))  # type: ignore[attr-defined]
    assert got.dtype == torch.float32 and tuple(got.shape) == (n, k)
    np.testing.assert_array_equal(got.numpy(), gguf.quants.dequantize(w, qtype))


@pytest.mark.parametrize("qtype", list(BLOCKS), ids=lambda t: t.name)
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("kernel", KERNELS)
def test_matmul_matches_the_dequantized_product(hearth: object, kernel: str, qtype: T, n: int, k: int) -> None:
    mm = getattr(hearth, kernel)
    rng = np.random.default_rng(int(qtype) * 11 + k)
    w = random_blocks(qtype, n, k, rng)
    dense = gguf.quants.dequantize(w, qtype).astype(np.float64)
    for m in ROWS:
        x = rng.standard_normal((m, k)).astype(np.float32)
        x[0, :40] *= 30.0  # a few large channels, as real activations have
        y = mm(torch.from_numpy(x), torch.from_numpy(w), int(qtype)).numpy()
        assert y.dtype == np.float32 and y.shape == (m, n)
        exact = quantized_activations(x, activation_block(qtype)) @ dense.T
        assert relative_error(y, exact) < 1e-5, (m, relative_error(y, exact))
        assert relative_error(y, x.astype(np.float64) @ dense.T) < 6e-2, m  # int8 activations: their own error


@pytest.mark.parametrize("qtype", list(BLOCKS), ids=lambda t: t.name)
@pytest.mark.parametrize("kernel", KERNELS)
def test_each_row_is_the_same_bits_whatever_shares_the_call(hearth: object, kernel: str, qtype: T) -> None:
    mm = getattr(hearth, kernel)
    k = 544 if BLOCKS[qtype][0] == 32 else 768  # 17 blocks of 32 (a partial run of 8), or 3 super-blocks
    rng = np.random.default_rng(int(qtype) + 5)
    w = torch.from_numpy(random_blocks(qtype, 37, k, rng))
    x = torch.from_numpy(rng.standard_normal((41, k)).astype(np.float32))
    full = mm(x, w, int(qtype))
    for m in (1, 2, 7, 8, 9, 16, 17, 41):
        assert torch.equal(mm(x[:m], w, int(qtype)), full[:m]), m
    for i in range(41):
        assert torch.equal(mm(x[i : i + 1], w, int(qtype)), full[i : i + 1]), i
    for rows in ([40, 3, 17], [5, 1, 33, 8, 2, 9, 30, 12, 0, 39], list(range(40, 0, -3))):
        assert torch.equal(mm(x[rows], w, int(qtype)), full[rows]), rows
    assert torch.equal(mm(x, w[5:], int(qtype)), full[:, 5:])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(mm(x, w, int(qtype)), full)
        assert torch.equal(mm(x[3:4], w, int(qtype)), full[3:4])
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("qtype", list(BLOCKS), ids=lambda t: t.name)
def test_bfloat16_activations(hearth: object, qtype: T) -> None:
    rng = np.random.default_rng(int(qtype))
    w = random_blocks(qtype, 40, 512, rng)
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(int(qtype))).to(torch.bfloat16)
    y = hearth.gguf_mm(x, torch.from_numpy(w), int(qtype))  # type: ignore[attr-defined]
    assert y.dtype == torch.bfloat16 and tuple(y.shape) == (5, 40)
    exact = quantized_activations(x.float().numpy(), activation_block(qtype)) @ gguf.quants.dequantize(w, qtype).T
    assert relative_error(y.float().numpy(), exact) < 1e-2  # the output's bf16 rounding
    same = hearth.gguf_mm(x.float(), torch.from_numpy(w), int(qtype))  # type: ignore[attr-defined]
    assert torch.equal(y, same.to(torch.bfloat16))


def test_strided_and_empty_inputs(hearth: object) -> None:
    rng = np.random.default_rng(1)
    w = torch.from_numpy(random_blocks(T.Q4_K, 64, 512, rng))
    x = torch.randn(512, 6)
    strided = hearth.gguf_mm(x.t(), w, int(T.Q4_K))  # type: ignore[attr-defined]
    assert torch.equal(strided, hearth.gguf_mm(x.t().contiguous(), w, int(T.Q4_K)))  # type: ignore[attr-defined]
    empty = hearth.gguf_mm(torch.zeros(0, 512), w, int(T.Q4_K))  # type: ignore[attr-defined]
    assert tuple(empty.shape) == (0, 64)
    zeros = hearth.gguf_mm(torch.zeros(2, 512), w, int(T.Q4_K))  # type: ignore[attr-defined]
    assert torch.equal(zeros, torch.zeros(2, 64))


def test_bad_inputs_raise(hearth: object) -> None:
    w = torch.from_numpy(random_blocks(T.Q4_0, 8, 64, np.random.default_rng(2)))
    x = torch.randn(2, 64)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        hearth.gguf_mm(x.half(), w, int(T.Q4_0))  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="not a multiple of the block"):
        hearth.gguf_mm(torch.randn(2, 48), w, int(T.Q4_0))  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="bytes per row"):
        hearth.gguf_mm(torch.randn(2, 96), w, int(T.Q4_0))  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="has no kernel"):
        hearth.gguf_mm(x, w, int(T.Q2_K))  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="has no kernel"):
        hearth.gguf_dequantize(w, 99)  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="uint8"):
        hearth.gguf_mm(x, w.to(torch.int8), int(T.Q4_0))  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="2-D"):
        hearth.gguf_mm(x[0], w, int(T.Q4_0))  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="whole number"):
        hearth.gguf_dequantize(w[:, :17], int(T.Q4_0))  # type: ignore[attr-defined]


def test_the_plain_loops_agree_with_the_fast_kernels(hearth: object) -> None:
    """The loops a CPU without AVX2 runs give what this CPU's kernels give, to fp32 rounding."""
    rng = np.random.default_rng(3)
    for qtype in BLOCKS:
        w = torch.from_numpy(random_blocks(qtype, 48, 768, rng))
        x = torch.from_numpy(rng.standard_normal((7, 768)).astype(np.float32))
        fast = hearth.gguf_mm(x, w, int(qtype)).numpy().astype(np.float64)  # type: ignore[attr-defined]
        plain = hearth.gguf_mm_plain(x, w, int(qtype)).numpy()  # type: ignore[attr-defined]
        assert relative_error(plain, fast) < 1e-5, qtype.name


def test_the_wide_tiles_give_the_avx2_tiles_bits(hearth: object) -> None:
    """Where gguf_mm runs the 512-bit tiles, each output is the AVX2 tiles' own bits: the same integer sums per lane,
    then the same fp32 code. Rows 1 to 19 cover the one-row GEMV and full and partial groups of eight."""
    from engine.system.hardware import cpu_flags_and_model

    family = hearth.gguf_kernel_family()  # type: ignore[attr-defined]
    assert family in ("avx512", "avx2", "plain")
    if {"avx512bw", "avx512vl", "avx512_vnni"} <= set(cpu_flags_and_model()[0]):
        assert family == "avx512", "this CPU has AVX512-BW/VL and VNNI, so a -march=native build has the 512-bit tiles"
    rng = np.random.default_rng(4)
    for qtype in BLOCKS:
        w = torch.from_numpy(random_blocks(qtype, 40, 1024, rng))
        for m in (1, 2, 8, 9, 19):
            x = torch.from_numpy(rng.standard_normal((m, 1024)).astype(np.float32))
            fast = hearth.gguf_mm(x, w, int(qtype))  # type: ignore[attr-defined]
            narrow = hearth.gguf_mm_avx2(x, w, int(qtype))  # type: ignore[attr-defined]
            assert torch.equal(fast, narrow), (qtype.name, m, family)


# --- Q4_0, Q8_0, Q4_K and Q6_K rows in groups of eight (gguf_repack; ggml type + 128 for gguf_mm) ------------------
#: Row counts around the groups of eight: a lone partial group, odd counts, whole groups with and without a tail.
GROUPED_ROWS = (1, 3, 7, 8, 9, 13, 16, 19, 37)
GROUPED = (T.Q4_0, T.Q8_0, T.Q4_K, T.Q6_K)


def grouped(hearth: object, w: np.ndarray, qtype: T) -> torch.Tensor:
    return hearth.gguf_repack(torch.from_numpy(w), int(qtype))  # type: ignore[attr-defined]


def several_blocks(qtype: T) -> tuple[int, int]:
    """Two widths of several blocks: 3 and 17 blocks of 32 (a partial run of 8 in the file-order tiles), or 1 and
    3 super-blocks."""
    return (96, 544) if BLOCKS[qtype][0] == 32 else (256, 768)


@pytest.mark.parametrize("qtype", GROUPED, ids=lambda t: t.name)
@pytest.mark.parametrize("n", GROUPED_ROWS)
def test_grouped_rows_hold_the_files_rows(hearth: object, qtype: T, n: int) -> None:
    """The groups are the file's bytes in another order: they dequantize to gguf's own values, the in-place repack
    gives the same bytes, and the type numbers say which layout is which."""
    k = several_blocks(qtype)[0]
    w = random_blocks(qtype, n, k, np.random.default_rng(n))
    g = grouped(hearth, w, qtype)
    assert g.shape == w.shape and g.dtype == torch.uint8
    kind = 128 + int(qtype)
    assert int(hearth.gguf_grouped_type(int(qtype))) == kind  # type: ignore[attr-defined]
    assert int(hearth.gguf_grouped_type(int(T.Q4_1))) == -1  # type: ignore[attr-defined]
    np.testing.assert_array_equal(hearth.gguf_dequantize(g, kind).numpy(), gguf.quants.dequantize(w, qtype))  # type: ignore[attr-defined]
    in_place = torch.from_numpy(w.copy())
    assert hearth.gguf_repack_(in_place, int(qtype)) == kind  # type: ignore[attr-defined]
    assert torch.equal(in_place, g)
    if n >= 8:
        assert not torch.equal(g[:8], torch.from_numpy(w[:8]))
    assert torch.equal(g[n // 8 * 8 :], torch.from_numpy(w[n // 8 * 8 :]))  # a partial group stays as in the file
    with pytest.raises(RuntimeError, match="no grouped layout"):
        hearth.gguf_repack(torch.from_numpy(w), int(T.Q4_1))  # type: ignore[attr-defined]


@pytest.mark.parametrize("qtype", GROUPED, ids=lambda t: t.name)
@pytest.mark.parametrize("n", [5, 16, 37])
def test_an_embedding_in_groups_looks_up_the_files_rows(
    hearth: object, qtype: T, n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tied head's embedding is kept in groups of eight rows: each lookup gives gguf's own values of the row,
    in the groups and in the partial group after them, one token or many, repeated or not."""
    from engine.loading.gguf_weights import Blocks
    from engine.model.gguf_linear import GgufEmbedding

    k = several_blocks(qtype)[0]
    w = random_blocks(qtype, n, k, np.random.default_rng(n + 1))
    embedding = GgufEmbedding(Blocks(qtype.name, 128 + int(qtype), grouped(hearth, w, qtype)), torch.float32)
    monkeypatch.setattr(GgufEmbedding, "GROUP_LOOKUPS", 4)  # several batches of groups in one lookup
    ids = torch.tensor([[n - 1, 0, 3, n - 1, n // 2], [1, 1, 1, n - 2, 4]])
    want = gguf.quants.dequantize(w, qtype)[ids.numpy()]
    np.testing.assert_array_equal(embedding(ids).numpy(), want)
    np.testing.assert_array_equal(embedding(torch.tensor([n - 1])).numpy(), want[0, :1])
    assert embedding(torch.zeros(0, dtype=torch.long)).shape == (0, k)


@pytest.mark.parametrize("qtype", GROUPED, ids=lambda t: t.name)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("wide", [False, True], ids=["fewer_blocks", "more_blocks"])
def test_grouped_matmul_matches_the_dequantized_product(hearth: object, qtype: T, kernel: str, wide: bool) -> None:
    mm = getattr(hearth, kernel)
    k = several_blocks(qtype)[int(wide)]
    rng = np.random.default_rng(k + len(kernel))
    for n in GROUPED_ROWS:
        w = random_blocks(qtype, n, k, rng)
        g = grouped(hearth, w, qtype)
        dense = gguf.quants.dequantize(w, qtype).astype(np.float64)
        x = rng.standard_normal((19, k)).astype(np.float32)
        x[0, :40] *= 30.0
        exact = quantized_activations(x, activation_block(qtype)) @ dense.T
        for m in (1, 2, 3, 4, 5, 19):
            y = mm(torch.from_numpy(x[:m]), g, 128 + int(qtype)).numpy()
            assert y.dtype == np.float32 and y.shape == (m, n)
            assert relative_error(y, exact[:m]) < 1e-5, (n, m, relative_error(y, exact[:m]))


@pytest.mark.parametrize("qtype", GROUPED, ids=lambda t: t.name)
@pytest.mark.parametrize("kernel", KERNELS)
def test_grouped_rows_are_the_same_bits_whatever_shares_the_call(hearth: object, qtype: T, kernel: str) -> None:
    """Greedy decoding must not depend on the batch: each output row is the same bits alone, in any row count from
    1 to 19 (tiles of 4 activation rows and their remainders), in any order, and on one thread or several."""
    mm = getattr(hearth, kernel)
    kind = 128 + int(qtype)
    k = several_blocks(qtype)[1]
    rng = np.random.default_rng(8)
    w = grouped(hearth, random_blocks(qtype, 45, k, rng), qtype)
    x = torch.from_numpy(rng.standard_normal((19, k)).astype(np.float32))
    full = mm(x, w, kind)
    for m in range(1, 20):
        assert torch.equal(mm(x[:m], w, kind), full[:m]), m
    for i in range(19):
        assert torch.equal(mm(x[i : i + 1], w, kind), full[i : i + 1]), i
    for rows in ([18, 3, 11], [5, 1, 13, 8, 2, 9, 0], list(range(18, 0, -3))):
        assert torch.equal(mm(x[rows], w, kind), full[rows]), rows
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(mm(x, w, kind), full)
        assert torch.equal(mm(x[3:4], w, kind), full[3:4])
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("qtype", GROUPED, ids=lambda t: t.name)
def test_grouped_rows_keep_their_bits_where_the_tiles_change_with_the_row_count(hearth: object, qtype: T) -> None:
    """The VNNI build runs Q4_K eight rows a pass below 48 rows and in pairs of groups from 48 (Q4_0 from 16): a
    row is the same bits in a call of any size on either side, and the AVX2 tiles' bits."""
    kind = 128 + int(qtype)
    rng = np.random.default_rng(11)
    k = several_blocks(qtype)[1]
    w = grouped(hearth, random_blocks(qtype, 48, k, rng), qtype)
    x = torch.from_numpy(rng.standard_normal((60, k)).astype(np.float32))
    full = hearth.gguf_mm(x, w, kind)  # type: ignore[attr-defined]
    assert torch.equal(full, hearth.gguf_mm_avx2(x, w, kind))  # type: ignore[attr-defined]
    for m in (1, 7, 8, 9, 15, 16, 17, 47, 48, 49):
        assert torch.equal(hearth.gguf_mm(x[:m], w, kind), full[:m]), m  # type: ignore[attr-defined]
    assert torch.equal(hearth.gguf_mm(x[50:], w, kind), full[50:])  # type: ignore[attr-defined]


@pytest.mark.parametrize("qtype", GROUPED, ids=lambda t: t.name)
def test_grouped_kernels_give_the_same_bits_in_every_build(hearth: object, qtype: T) -> None:
    """The VNNI tiles (gguf_mm where the build has them), the AVX2 tiles and the plain loops sum the same integers
    per block and scale them with the same fp32 operations, so the grouped rows are the same bits in all three (the
    partial group at the end runs the file-order tiles, where the plain loops agree to fp32 rounding)."""
    rng = np.random.default_rng(9)
    kind = 128 + int(qtype)
    for n, k in ((40, 1024), (21, several_blocks(qtype)[0])):
        w = grouped(hearth, random_blocks(qtype, n, k, rng), qtype)
        whole = n // 8 * 8
        for m in (1, 2, 5, 9, 19):
            x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32))
            fast = hearth.gguf_mm(x, w, kind)  # type: ignore[attr-defined]
            assert torch.equal(fast, hearth.gguf_mm_avx2(x, w, kind)), (n, m)  # type: ignore[attr-defined]
            plain = hearth.gguf_mm_plain(x, w, kind)  # type: ignore[attr-defined]
            assert torch.equal(fast[:, :whole], plain[:, :whole]), (n, m)
            assert relative_error(plain.numpy(), fast.numpy().astype(np.float64)) < 1e-5


@pytest.mark.parametrize("qtype", GROUPED, ids=lambda t: t.name)
def test_grouped_bfloat16_activations(hearth: object, qtype: T) -> None:
    rng = np.random.default_rng(10)
    kind = 128 + int(qtype)
    w = grouped(hearth, random_blocks(qtype, 40, 512, rng), qtype)
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(10)).to(torch.bfloat16)
    y = hearth.gguf_mm(x, w, kind)  # type: ignore[attr-defined]
    assert y.dtype == torch.bfloat16 and tuple(y.shape) == (5, 40)
    assert torch.equal(y, hearth.gguf_mm(x.float(), w, kind).to(torch.bfloat16))  # type: ignore[attr-defined]
