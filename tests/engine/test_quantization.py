"""Quantization levels: kernels against dense math, every level through the engine, quality bounds, recommendations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine import LLM, SamplingParams
from engine.api import GpuInfo, HardwareInfo, check_level
from engine.loading.recommend import estimate, recommend
from engine.model import quantization
from engine.model.quantization import (
    BnbLinear,
    DenseLinear,
    Int4Linear,
    Int8Linear,
    bitsandbytes_problem,
    make_linear,
)
from engine.tools.perplexity import perplexity

TEXT = (Path(__file__).parent.parent / "data" / "gettysburg_and_austen.txt").read_text()
GB = 1_000_000_000


def _rel_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref).norm() / ref.norm())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_and_int4_kernels_track_the_dense_matmul(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    w, x = torch.randn(256, 128), torch.randn(5, 128)
    ref = x @ w.t()
    assert _rel_error(Int8Linear.quantize(w)(x.to(dtype)), ref) < 0.02
    assert _rel_error(Int4Linear.quantize(w)(x.to(dtype)), ref) < 0.15


@pytest.mark.parametrize("level", ["int8", "int4"])
def test_bitsandbytes_serves_only_where_its_probe_is_right(level: str, caplog: pytest.LogCaptureFixture) -> None:
    """The CUDA levels go through bitsandbytes. Where its kernels are wrong (0.50's CPU NF4 for layers narrower than
    its 64-weight block), the load-time probe refuses it with a logged reason and the layer falls back to torch's
    kernels; either way the layer computes the right thing."""
    torch.manual_seed(0)
    w, x = torch.randn(64, 32), torch.randn(3, 32)
    ref = x @ w.t()
    cpu = torch.device("cpu")
    quantization._bnb_verdicts.clear()
    with caplog.at_level("WARNING", logger="engine"):
        problem = bitsandbytes_problem(level, cpu, in_features=32)
        layer = make_linear(w, None, level, cpu, backend="bitsandbytes")
    xin = x if level == "int8" else x.bfloat16()
    if problem is None:
        assert isinstance(layer, BnbLinear)
        assert _rel_error(layer(xin), ref) < quantization.BNB_MAX_REL_ERROR[level]
    else:
        assert "relative error" in problem or "failed" in problem
        assert problem in caplog.text
        assert isinstance(layer, Int8Linear | Int4Linear)
        assert _rel_error(layer(xin), ref) < 0.15
    # a probe that computes garbage is always refused: its verdict is what make_linear obeys
    quantization._bnb_verdicts[(str(cpu), level, 32)] = "bitsandbytes is wrong here (test)"
    try:
        assert not isinstance(make_linear(w, None, level, cpu, backend="bitsandbytes"), BnbLinear)
    finally:
        quantization._bnb_verdicts.clear()


def test_level_names_are_checked() -> None:
    assert check_level("INT8") == "int8"
    assert check_level("bfloat16") == "bf16"
    with pytest.raises(ValueError, match="quantization"):
        check_level("int3")
    assert isinstance(make_linear(torch.randn(4, 32), None, "bf16", torch.device("cpu")), DenseLinear)
    assert isinstance(make_linear(torch.randn(4, 33), None, "int4", torch.device("cpu")), Int8Linear)


@pytest.mark.parametrize(("level", "backend"), [("int8", "torch"), ("int4", "torch"), ("int8", "bitsandbytes")])
@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_every_level_runs_batched_through_the_engine(
    level: str, backend: str, family: str, tiny_model_dirs: dict[str, Path]
) -> None:
    llm = LLM(
        tiny_model_dirs[family], quantization=level, quant_backend=backend, start_loop=False, kv_cache_bytes=4 << 20
    )
    try:
        assert llm.quantization == level
        params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
        outs = llm.generate(["one two three", "a b", "the quick brown fox jumps"], params)
        assert [len(o.token_ids) for o in outs] == [6, 6, 6]
        assert llm.metrics()["kv_blocks_used"] == 0
    finally:
        llm.close()


@pytest.fixture(scope="module")
def perplexities(default_model_dir: Path) -> dict[str, tuple[float, int, list[int]]]:
    """Perplexity, weight bytes and a greedy continuation for each level of the default model."""
    results = {}
    prompt = [{"role": "user", "content": "What is the capital of France?"}]
    for level in ("bf16", "int8", "int4"):
        llm = LLM("default", quantization=level, start_loop=False, kv_cache_bytes=64 << 20)
        try:
            greedy = llm.chat(prompt, SamplingParams(max_tokens=16, temperature=0.0))
            results[level] = (perplexity(llm, TEXT), llm.weights_bytes, greedy.token_ids, greedy.text)
        finally:
            llm.close()
    return results  # type: ignore[return-value]


def test_quantized_quality_stays_within_bounds(perplexities: dict[str, Any]) -> None:
    base = perplexities["bf16"][0]
    # measured here: bf16 16.36, int8 16.28 (-0.5 %), int4 16.40 (+0.3 %); the bounds leave room for other CPUs
    assert abs(perplexities["int8"][0] / base - 1) < 0.015
    assert abs(perplexities["int4"][0] / base - 1) < 0.03
    for level in ("bf16", "int8", "int4"):
        assert "Paris" in perplexities[level][3]


def test_quantized_weights_take_less_memory(perplexities: dict[str, Any]) -> None:
    bf16, int8, int4 = (perplexities[k][1] for k in ("bf16", "int8", "int4"))
    assert int4 < int8 < 0.7 * bf16


def _hw(ram_gb: float = 32, gpus: list[GpuInfo] | None = None, bf16: bool = False) -> HardwareInfo:
    """A synthetic machine. ``bf16`` adds avx512_bf16; fbgemm's packed fp16 GEMM is this torch build's own."""
    return HardwareInfo(
        cpu_model="test",
        physical_cores=8,
        logical_cores=16,
        avx2=True,
        avx512=bf16,
        avx512_bf16=bf16,
        amx=False,
        ram_total_bytes=int(ram_gb * GB),
        ram_available_bytes=int(ram_gb * GB),
        gpus=gpus or [],
        gpu_reason="" if gpus else "no NVIDIA driver found",
        torch_cuda_available=bool(gpus),
        torch_is_cpu_build=not gpus,
    )


LLAMA_8B = {
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
}
MISTRAL_7B = {**LLAMA_8B, "model_type": "mistral", "vocab_size": 32000, "max_position_embeddings": 32768}


def _gpu(gb: float, capability: tuple[int, int] = (8, 9)) -> list[GpuInfo]:
    """A GPU as detection reports it: the compute capability is a (major, minor) tuple, never a string."""
    return [GpuInfo(index=0, name="Test GPU", total_bytes=int(gb * GB), free_bytes=int(gb * GB),
                    compute_capability=capability)]


def test_recommend_reads_the_compute_capability_as_detection_reports_it() -> None:
    """pynvml and torch both give a tuple; a Hopper GPU (9, 0) runs bf16, a Turing GPU (7, 5) fp16."""
    assert recommend(LLAMA_8B, hardware=_hw(gpus=_gpu(80, (9, 0)))).quantization == "bf16"
    assert recommend(LLAMA_8B, hardware=_hw(gpus=_gpu(80, (7, 5)))).quantization == "fp16"


def test_recommend_24gb_gpu_8b_model_runs_bf16() -> None:
    rec = recommend(LLAMA_8B, hardware=_hw(gpus=_gpu(24)))
    assert (rec.device, rec.quantization) == ("cuda", "bf16")
    assert rec.fits in ("yes", "tight")
    assert 15 * GB < rec.weights_bytes < 17 * GB
    assert rec.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2


def test_recommend_8gb_gpu_8b_model_drops_to_int4() -> None:
    rec = recommend(LLAMA_8B, hardware=_hw(gpus=_gpu(8)))
    assert (rec.device, rec.quantization) == ("cuda", "int4")
    assert rec.fits in ("yes", "tight")
    assert "bf16 would need" in rec.reason


def test_recommend_no_gpu_16gb_ram_8b_model_uses_int8_on_cpu() -> None:
    rec = recommend(LLAMA_8B, hardware=_hw(ram_gb=16))
    assert (rec.device, rec.quantization) == ("cpu", "int8")
    assert rec.fits in ("yes", "tight")
    assert recommend(LLAMA_8B, hardware=_hw(ram_gb=64, bf16=True)).quantization == "bf16"


def test_recommend_4gb_free_7b_model_does_not_fit_and_says_why() -> None:
    rec = recommend(MISTRAL_7B, hardware=_hw(ram_gb=4))
    assert rec.fits == "no"
    assert "GiB" in rec.reason and "int4" in rec.reason
    assert rec.free_bytes == 4 * GB


def test_estimate_gives_the_numbers_for_one_level() -> None:
    hw = _hw(gpus=_gpu(8))
    best = recommend(LLAMA_8B, hardware=hw)
    same = estimate(LLAMA_8B, best.quantization, hardware=hw)
    assert (same.weights_bytes, same.kv_budget_bytes, same.free_bytes) == (
        best.weights_bytes, best.kv_budget_bytes, best.free_bytes)
    assert same.fits == best.fits
    bf16 = estimate(LLAMA_8B, "bf16", hardware=hw)
    assert bf16.fits == "no" and 15 * GB < bf16.weights_bytes < 17 * GB
    assert bf16.reason.startswith("bf16 needs") and "will not fit" in bf16.reason
    assert estimate(LLAMA_8B, "auto", hardware=hw) == best
    assert estimate(LLAMA_8B, "fp32", hardware=hw).quantization == "fp32"
    assert estimate(LLAMA_8B, "none", hardware=hw).quantization == "fp32"  # the old name stays an alias


def test_recommend_reads_the_default_models_config() -> None:
    rec = recommend("default")
    assert 130_000_000 < rec.num_parameters < 140_000_000
    assert rec.fits == "yes"
