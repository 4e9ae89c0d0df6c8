"""GGUF blocks straight into torch's packed kernels: each block type of ``engine.loading.formats`` against ``gguf``'s
numpy dequantize, matching matmuls, the default model's Q4_1."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.architectures import qk_order
from engine.loading.formats import BLOCK_FORMATS
from engine.loading.formats.gguf_blocks import DEQUANTIZE, UNPACK, Int4Parts, Q8Parts, unpack_int4, unpack_q8
from engine.model.quantization import Int4Linear, Int8Linear

TEXT = (Path(__file__).parents[2] / "data" / "gettysburg_and_austen.txt").read_text()
#: fp16 fields at the start of each block (scale, or scale and minimum)
_HALVES = {"Q4_0": 1, "Q4_1": 2, "Q4_K": 2, "Q8_0": 1}
INT4_KINDS = sorted(k for k, f in BLOCK_FORMATS.items() if f.level == "int4")


def _random_blocks(kind: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random quantized rows of ``kind`` with sane (small, finite) fp16 scales."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, cols // block * size), dtype=np.uint8)
    blocks = raw.reshape(rows, -1, size)
    halves = (rng.standard_normal((rows, blocks.shape[1], _HALVES[kind])) * 0.01).astype(np.float16)
    blocks[..., : 2 * _HALVES[kind]] = halves.view(np.uint8).reshape(rows, blocks.shape[1], -1)
    return raw


def _reference(raw: np.ndarray, kind: str, rows: int, cols: int) -> torch.Tensor:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return torch.from_numpy(
        dequantize(raw, GGMLQuantizationType[kind]).reshape(rows, cols).astype(np.float32)
    )


@pytest.mark.parametrize("kind", INT4_KINDS)
def test_int4_blocks_unpack_exactly_and_the_kernel_matches_them(kind: str) -> None:
    rows, cols = 64, 512
    raw = _random_blocks(kind, rows, cols)
    ref = _reference(raw, kind, rows, cols)
    parts = unpack_int4(torch.from_numpy(raw), kind)
    # (q - 8) * scale + zero is the file's formula, up to fp32 rounding of the regrouped terms
    assert torch.allclose(parts.dequantize(), ref, rtol=0, atol=1e-6 * float(ref.abs().max()))
    x = torch.randn(5, cols)
    want = x @ ref.t()
    layer = Int4Linear.from_parts(parts)
    assert torch.allclose(
        layer(x), want, rtol=1e-4, atol=1e-4 * float(want.abs().max())
    )  # fp32 scales: exact
    got = layer(x.bfloat16()).float()  # bf16 activations: the kernel rounds scale and zero to bf16
    assert float((got - want).norm() / want.norm()) < 0.02


def test_q8_blocks_unpack_exactly_and_requantize_per_row_closely() -> None:
    rows, cols = 64, 512
    raw = _random_blocks("Q8_0", rows, cols)
    ref = _reference(raw, "Q8_0", rows, cols)
    parts = unpack_q8(torch.from_numpy(raw))
    assert torch.equal(parts.dequantize(), ref)
    x = torch.randn(5, cols)
    want = x @ ref.t()
    err = float((Int8Linear.from_q8(parts)(x) - want).norm() / want.norm())
    assert err < 0.02  # per-row int8 of per-block int8 values: half a step of the row's largest weight


def test_qk_rows_are_reordered_as_transformers_does() -> None:
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    rows = 9 * 64
    expected = LlamaTensorProcessor()._reverse_permute_weights(np.arange(rows), 9, 9)
    assert torch.equal(torch.tensor(qk_order(rows, 9)), torch.from_numpy(expected))


def test_every_block_format_matches_ggml_and_unpacks_for_its_level() -> None:
    """One row per block type: its size is ggml's, it unpacks into its level's parts, and with no test left out."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    assert set(UNPACK) == set(BLOCK_FORMATS) == set(_HALVES)
    assert set(DEQUANTIZE) <= set(BLOCK_FORMATS) | set(_K_HALVES)
    for kind, fmt in BLOCK_FORMATS.items():
        assert GGML_QUANT_SIZES[GGMLQuantizationType[kind]] == (fmt.weights, fmt.nbytes), kind
        parts = UNPACK[kind](torch.from_numpy(_random_blocks(kind, 2, 256)))
        assert isinstance(parts, Int4Parts if fmt.level == "int4" else Q8Parts), kind
    with pytest.raises(ValueError, match="no int4 form"):
        unpack_int4(torch.zeros(1, 34, dtype=torch.uint8), "Q8_0")


#: Where the fp16 fields of the K-quant types dequantized only lie in a block: (first byte, how many fp16s).
_K_HALVES = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208, 1)}


def _random_dequantize_blocks(kind: str, rows: int, cols: int, seed: int) -> np.ndarray:
    if kind in _HALVES:
        return _random_blocks(kind, rows, cols, seed)
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, cols // block * size), dtype=np.uint8)
    blocks = raw.reshape(rows, -1, size)
    first, count = _K_HALVES[kind]
    halves = (rng.standard_normal((rows, blocks.shape[1], count)) * 0.01).astype(np.float16)
    blocks[..., first : first + 2 * count] = halves.view(np.uint8).reshape(rows, blocks.shape[1], -1)
    return raw


@pytest.mark.parametrize("kind", sorted(DEQUANTIZE))
def test_torch_dequantize_is_bitwise_ggufs(kind: str) -> None:
    """The native loader's dequantize: the same values as ``gguf``'s numpy code, bit for bit (the K-quants of a
    Q4_K_M file too, which the loader dequantizes at the dense levels)."""
    rows, cols = 8, 512
    raw = _random_dequantize_blocks(kind, rows, cols, seed=1)
    got = DEQUANTIZE[kind](torch.from_numpy(raw)).reshape(rows, cols)
    assert torch.equal(got, _reference(raw, kind, rows, cols))


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q8_0"])
def test_dequantize_in_slices_of_rows_is_the_whole_tensor_rounded(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """dequantize() computes a slice of rows at a time, straight into the load dtype: the very values of the whole
    tensor's fp32 rounded to it, including a last slice shorter than the others."""
    from engine.loading.formats import gguf_blocks

    rows, cols = 37, 512
    raw = torch.from_numpy(_random_dequantize_blocks(kind, rows, cols, seed=2))
    whole = _reference(raw.numpy(), kind, rows, cols)
    monkeypatch.setattr(gguf_blocks, "_CHUNK_VALUES", 4 * cols)  # slices of 4 rows: 10 slices, the last of 1 row
    for dtype in (torch.float32, torch.bfloat16):
        got = gguf_blocks.dequantize(kind, raw, dtype)
        assert got.dtype == dtype
        assert torch.equal(got, whole.to(dtype))


@pytest.fixture(scope="module")
def gguf_int4() -> Iterator[Any]:
    """The default model's own Q4_1 GGUF at int4, every layer on its packed kernel (no dense alternatives)."""
    from engine import LLM
    from engine.loading.default_model import source_gguf_path

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HEARTH_AUTOTUNE", "off")
        llm = LLM(str(source_gguf_path()), quantization="int4", start_loop=False, kv_cache_bytes=64 << 20)
    yield llm
    llm.close()


def test_default_gguf_runs_its_own_blocks_and_answers(gguf_int4: Any, shared_default_llm: Callable[..., Any]) -> None:
    from engine import SamplingParams
    from engine.tools.perplexity import perplexity

    runner = gguf_int4.engine.runner
    assert runner.weights_from_gguf == 4 * int(runner.config.num_hidden_layers)  # qkv, o, gate_up, down
    answer = gguf_int4.chat(  # not "What is the capital of France?", whose first token is a near-tie
        [{"role": "user", "content": "Name the capital city of France."}],
        SamplingParams(max_tokens=16, temperature=0),
    )
    assert "Paris" in answer.text
    int4_ppl = perplexity(gguf_int4, TEXT)
    bf16_ppl = perplexity(shared_default_llm("bf16"), TEXT)  # the converted folder of the same file
    assert abs(int4_ppl / bf16_ppl - 1) < 0.01, (int4_ppl, bf16_ppl)
