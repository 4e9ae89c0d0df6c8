"""The AVX512-VNNI kernels (``Int4VnniLinear`` and ``Int8VnniLinear``, ``torch.ops.hearth.int4_vnni_mm`` and
``int8_vnni_mm``) against torch's int4 and int8 kernels.

They read torch's own int4 and int8 bytes and quantize activations to two int8 planes (about 16 bits), so they
must agree with torch's kernels to within the activation dtype's rounding, compute each row alone, refuse shapes
they cannot run, and serve (int4 layers and the native step, the int8 lm_head) only where the tuner may pick them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine import LLM, SamplingParams
from engine.model import autotune, kernel_timing, native, plan_cache, vnni
from engine.model.autotune import Kernel, PaddedRows, Tuner
from engine.model.kernels import KernelBuilder
from engine.model.quantization import Int4Linear, Int4VnniLinear, Int8Linear, Int8VnniLinear
from engine.model.tuned_linear import TunedLinear


@pytest.fixture(scope="module")
def vnni_kernels() -> None:
    problem = native.EXTENSION.start(wait=True) or vnni.vnni_problem()
    if problem is not None:
        pytest.skip(problem)


def _layer(out_features: int, in_features: int, bias: bool = False, seed: int = 0) -> Int4Linear:
    gen = torch.Generator().manual_seed(seed)
    b = torch.randn(out_features, generator=gen) if bias else None
    return Int4Linear.quantize(torch.randn(out_features, in_features, generator=gen) * 0.05, b)


def _activations(rows: int, in_features: int, seed: int = 1) -> torch.Tensor:
    """Normal activations with two channels 60x larger, as a norm's output often has."""
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(seed))
    x[:, 3] *= 60
    x[:, in_features // 2 + 7] *= -60
    return x


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _agrees_with(kernel: Kernel, base: Kernel, rows: int, out_features: int) -> None:
    """``kernel`` against torch's ``base`` on ``rows`` rows of 160 activations, in fp32 and bf16."""
    x = _activations(rows, 160)
    # fp32: only the activations' two int8 planes differ (about 1/32000 of each group's largest value); one plane
    # alone gives ~1e-2 here, with the outlier channels
    assert _rel(kernel(x), base(x)) < 2e-4
    # bf16: as close as the two kernels' output rounding allows
    xb = x.to(torch.bfloat16)
    y = kernel(xb)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, out_features)
    assert _rel(y, base(xb)) < 4e-3


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, 16, 33])
@pytest.mark.parametrize("bias", [False, True])
def test_it_computes_what_torchs_int4_kernel_computes(rows: int, bias: bool, vnni_kernels: None) -> None:
    base = _layer(192, 160, bias)
    _agrees_with(Int4VnniLinear(base), base, rows, 192)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 15, 16, 17, 40])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("gemv", [False, True])
def test_the_int8_kernel_computes_what_torchs_computes(rows: int, bias: bool, gemv: bool, vnni_kernels: None) -> None:
    gen = torch.Generator().manual_seed(0)
    base = Int8Linear.quantize(torch.randn(200, 160, generator=gen), torch.randn(200, generator=gen) if bias else None)
    kernel = Int8VnniLinear(base, gemv)
    # passes of 16 rows (lanes) or 4 (gemv): one, part of one, one and a bit, several; K = 160 leaves a 32-wide tail
    _agrees_with(kernel, base, rows, 200)
    assert kernel.nbytes == base.nbytes  # no memory of its own


@pytest.mark.parametrize("kind", ["int4", "int8", "int8_gemv"])
def test_rows_are_computed_alone(kind: str, vnni_kernels: None) -> None:
    """Row-invariant: a row's output is bitwise the same alone or among any number of other rows."""
    weight = torch.randn(128, 96, generator=torch.Generator().manual_seed(0)) * 0.05
    if kind == "int4":
        kernel: Int4VnniLinear | Int8VnniLinear = Int4VnniLinear(Int4Linear.quantize(weight))
    else:
        kernel = Int8VnniLinear(Int8Linear.quantize(weight), gemv=kind == "int8_gemv")
    x = _activations(40, 96).to(torch.bfloat16)
    together = kernel(x)
    for r in (0, 1, 5, 39):
        assert torch.equal(kernel(x[r : r + 1])[0], together[r])
    assert torch.equal(kernel(x[:7]), together[:7])
    assert autotune.row_multiple(kernel, 96, torch.bfloat16) == 1


def test_shapes_it_cannot_run_raise(vnni_kernels: None) -> None:
    base = _layer(96, 64)  # 96 output channels: not whole blocks of 64
    with pytest.raises(RuntimeError, match="N % 64"):
        Int4VnniLinear(base)(torch.randn(2, 64))
    base = _layer(128, 64)
    with pytest.raises(RuntimeError, match="dtype"):  # scales in bf16, activations in fp32
        torch.ops.hearth.int4_vnni_mm(torch.randn(2, 64), base.packed, 32, base.scales_zeros.to(torch.bfloat16))
    with pytest.raises(RuntimeError, match="bf16 or fp32"):
        Int4VnniLinear(base)(torch.randn(2, 64, dtype=torch.float16))
    with pytest.raises(RuntimeError, match="N % 8"):
        Int8VnniLinear(Int8Linear.quantize(torch.randn(12, 64)))(torch.randn(2, 64))


def test_a_packed_layout_it_does_not_read_is_caught(monkeypatch: pytest.MonkeyPatch, vnni_kernels: None) -> None:
    """Should torch pack int4 differently (another release, another CPU capability), the probe matmul disagrees
    and int4 layers keep torch's kernel."""
    original = torch._weight_int4pack_mm_for_cpu

    def other_layout(x: torch.Tensor, packed: torch.Tensor, group: int, sz: torch.Tensor) -> torch.Tensor:
        return original(x, packed.roll(1, dims=1), group, sz)  # reads the same bytes another way

    monkeypatch.setattr(torch, "_weight_int4pack_mm_for_cpu", other_layout)
    monkeypatch.setattr(vnni, "_vnni_verdict", vnni._UNCHECKED)
    problem = vnni.vnni_problem()
    assert problem is not None and "disagrees with torch's int4 kernel" in problem
    builder = KernelBuilder("int4", torch.bfloat16, torch.device("cpu"), "auto", None, None)
    assert not builder.vnni


@pytest.mark.parametrize(("native_mode", "out_features", "offered"), [("auto", 128, True), ("off", 128, False),
                                                                      ("auto", 96, False)])
def test_the_builder_offers_it_beside_torchs_kernel(
    native_mode: str, out_features: int, offered: bool, vnni_kernels: None
) -> None:
    builder = KernelBuilder("int4", torch.bfloat16, torch.device("cpu"), "auto", None, None, native_mode)
    builds, preferred, free = builder._candidates("qkv", ["w"], torch.randn(out_features, 64), None)
    assert preferred == "int4" and not free
    assert ("int4_vnni" in builds) == offered
    if offered:
        kernel = builds["int4_vnni"]()
        assert isinstance(kernel, Int4VnniLinear) and kernel.base is builds["int4"]()  # one copy of the bytes
    head, preferred, free = builder._candidates("lm_head", ["w"], torch.randn(out_features, 64), None)
    assert ("int8_vnni" in head) == ("int8_gemv" in head) == (native_mode != "off")
    for name in ("int8_vnni", "int8_gemv"):
        if name in head:
            kernel = head[name]()
            assert isinstance(kernel, Int8VnniLinear) and kernel.base is head["int8"]()
            assert kernel.gemv == (name == "int8_gemv")


def test_an_fp32_int4_model_starts_on_the_vnni_kernels_before_anything_is_measured(
    vnni_kernels: None, tmp_path: Path
) -> None:
    """An fp32 model's int4 draft (``speculative="self-int4"``): torch's int4 and int8 kernels have no fast fp32
    path, so the untimed plan of a first load runs the VNNI kernels, and the shapes are still measured later."""
    tuner = Tuner(torch.float32, plan_cache.PlanCache(tmp_path / "autotune.json"), 1 << 30, layers=1, defer=True)
    builder = KernelBuilder("int4", torch.float32, torch.device("cpu"), "auto", None, tuner)
    assert builder.tunable and builder.vnni
    w = torch.randn(128, 64)
    layer = builder("qkv", ["w"], w, None)
    head = builder("lm_head", ["w"], torch.randn(128, 64), None)
    assert isinstance(layer, TunedLinear) and set(layer.plan.kernels) == {"int4_vnni"}
    assert isinstance(head, TunedLinear) and set(head.plan.kernels) == {"int8_gemv"}
    assert layer.plan.untimed and [p.role for p in tuner.pending] == ["qkv", "lm_head"]
    x = torch.randn(3, 64)
    out, ref = layer(x), Int4Linear.quantize(w, None)(x)  # torch's kernel on the same int4 weights
    assert out.dtype == torch.float32 and float((out - ref).norm() / ref.norm()) < 0.02
    # bf16 keeps torch's kernel first: which is faster there differs by CPU, and the measurement decides
    bf16 = KernelBuilder("int4", torch.bfloat16, torch.device("cpu"), "auto", None, None)
    assert bf16._candidates("qkv", ["w"], w, None)[1] == "int4"
    assert bf16._candidates("lm_head", ["w"], w, None)[1] == "int8"


def test_beside_torchs_kernel_it_costs_no_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two kernels over one kernel's bytes: the tuner keeps both where each is faster, charging no memory budget,
    and the layer counts the bytes once. (Fakes: no extension needed.)"""

    class Fake:
        def __init__(self, nbytes: int) -> None:
            self.nbytes = nbytes

        def __call__(self, x: torch.Tensor) -> torch.Tensor:
            return x

    base = Fake(1000)
    over = Fake(1040)  # the base's bytes and 40 of its own
    over.base = base  # type: ignore[attr-defined]

    def fake_time(kernel: object, rows: int, in_features: int, dtype: torch.dtype) -> list[float]:
        few = rows < 16  # torch's kernel is faster for few rows, the other from 16 rows
        return [(1.0 if few == (kernel is base) else 3.0)] * kernel_timing._REPEATS

    monkeypatch.setattr(kernel_timing, "time_kernel", fake_time)
    tuner = Tuner(torch.bfloat16, None, extra_budget=2000, layers=30)  # far less than another copy would need
    plan = tuner.plan_for("gate_up", (8, 4), {"int4": base, "int4_vnni": over}, "int4", frozenset())
    assert plan.kernels == ("int4", "int4", "int4_vnni", "int4_vnni")
    assert tuner.budget == 2000 - 40 * 30  # only its own bytes, in every layer
    assert TunedLinear({"int4": base, "int4_vnni": over}, plan).nbytes == 1040
    small = Tuner(torch.bfloat16, None, extra_budget=1000, layers=30)  # not even those
    assert small.plan_for("gate_up", (8, 4), {"int4": base, "int4_vnni": over}, "int4", frozenset()).used == ["int4"]


@pytest.mark.slow  # loads the default model at int4
def test_native_steps_run_it_as_eager_layers_do(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, vnni_kernels: None
) -> None:
    """The default model at int4 with every decoder layer on the VNNI kernel: decode steps in the native step give
    the same greedy tokens as eager ones, alone and in a batch."""

    def fake_time(kernel: object, rows: int, in_features: int, dtype: torch.dtype) -> list[float]:
        inner = kernel.kernel if isinstance(kernel, PaddedRows) else kernel
        return [1.0 if isinstance(inner, Int4VnniLinear) else 5.0] * kernel_timing._REPEATS

    monkeypatch.setattr(kernel_timing, "time_kernel", fake_time)
    monkeypatch.setattr(plan_cache, "data_dir", lambda: tmp_path)  # plans from the fake timings stay here
    monkeypatch.setenv("HEARTH_AUTOTUNE", "load")  # the fake timings choose this load's kernels, not the next's
    llm = LLM("default", quantization="int4", native="on", start_loop=False, kv_cache_bytes=64 << 20)
    try:
        for choice in llm.engine.runner.kernel_choices:
            if choice.role != "lm_head":
                assert choice.plan.kernels == ("int4_vnni",) * 4, choice
        params = SamplingParams(max_tokens=10, temperature=0.0)
        prompts = ["Name the capital city of France.", "Count from one to five.", "What is a cat?"]
        chats = [[{"role": "user", "content": p}] for p in prompts]

        def run() -> list[list[int]]:
            handles = [llm.engine.submit(chat, params) for chat in chats]
            while not all(h.done() for h in handles):
                llm.engine.step()
            return [h.result().token_ids for h in handles]

        decoder = llm.engine.runner._decoder
        assert decoder is not None and decoder.native is not None
        native_tokens = run()
        assert decoder.native.steps > 0, llm.decode_status
        assert "Paris" in llm.engine.tokenizer.decode(native_tokens[0])
        llm.engine.runner.enable_native("off")
        assert run() == native_tokens
    finally:
        llm.close()
