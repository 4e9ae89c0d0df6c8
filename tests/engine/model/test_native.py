"""Native decode steps (engine/model/native.py, engine/model/csrc/decode_step.cpp).

The native step must give HF ``generate``'s greedy tokens in fp32 (alone, batched, staggered) on tiny random models
of every fused family and of the head sizes its vector paths specialise (64 and 128), and on the real default model.
It must fall back to eager, with a reason, wherever it cannot run, and refuse bad indices instead of crashing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from engine import LLM, SamplingParams
from engine.api import COMPILE_REMOVED, EngineConfig
from engine.architectures import ARCHITECTURES, TESTED_MODEL_TYPES
from engine.model import native
from engine.model.layer_spec import VerdictCache
from tests.engine.conftest import TOKENIZER_FILES
from tests.engine.hf_reference import assert_matches_hf
from tests.engine.model.test_correctness import MODES, PROMPTS

FUSED = tuple(t for t in TESTED_MODEL_TYPES if ARCHITECTURES[t].path == "fused")
PROBLEM = native.native_problem(torch.device("cpu"), torch.float32)
needs_native = pytest.mark.skipif(PROBLEM is not None, reason=f"no native step here: {PROBLEM}")


@pytest.fixture(scope="module")
def extension() -> None:
    problem = native.EXTENSION.start(wait=True)
    if problem is not None:
        pytest.skip(problem)


def _check_greedy(llm: Any, reference: Any, prompts: list[list[int]], max_new: int) -> list[str]:
    params = SamplingParams(max_tokens=max_new, temperature=0.0)
    verdicts = []
    for mode in MODES:
        outputs = MODES[mode](llm, prompts, params)
        verdicts += [assert_matches_hf(reference, p, out, max_new) for p, out in zip(prompts, outputs, strict=True)]
    assert llm.metrics().kv_blocks_used == 0
    return verdicts


def _native(llm: Any) -> native.NativeDecode:
    decoder = llm.engine.runner._decoder
    assert decoder is not None and decoder.native is not None, llm.decode_status
    return decoder.native


def _tiny_llama(folder: Path, tokenizer_dir: Path, heads: int, kv_heads: int, head_dim: int) -> Path:
    import shutil

    import transformers

    config = transformers.LlamaConfig(
        vocab_size=49152, hidden_size=heads * head_dim, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
        initializer_range=0.15, bos_token_id=1, eos_token_id=2, pad_token_id=2, tie_word_embeddings=False,
    )
    torch.manual_seed(1)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, folder / name)
    return folder


def _matches_hf(folder: Path, deterministic: bool = False) -> None:
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(folder, dtype="float32").eval()
    llm = LLM(folder, dtype="float32", start_loop=False, kv_cache_bytes=8 << 20, max_num_batched_tokens=64,
              native="on", deterministic=deterministic)
    try:
        decode = _native(llm)
        assert decode.every_step == deterministic
        prompts = [llm.engine.tokenize(p) for p in PROMPTS[1:7]]
        _check_greedy(llm, reference, prompts, 16)
        assert decode.steps > 16, decode.status()
        assert all(reason.startswith("native") for reason in decode.reasons.values()), decode.reasons
    finally:
        llm.close()


@needs_native
@pytest.mark.parametrize("family", FUSED)
def test_native_steps_match_hf(family: str, tiny_model_dirs: dict[str, Path], extension: None) -> None:
    _matches_hf(tiny_model_dirs[family])


@needs_native
@pytest.mark.parametrize("family", FUSED)
def test_every_step_native_matches_hf(family: str, tiny_model_dirs: dict[str, Path], extension: None) -> None:
    """Deterministic mode runs every step natively, prefill chunks (64-token budget: long prompts are chunked)
    and batched decodes alike; fp32 dense kernels there run on row-padded calls."""
    _matches_hf(tiny_model_dirs[family], deterministic=True)


@needs_native
def test_deterministic_int4_runs_every_step_natively(extension: None, shared_default_llm: Callable[..., Any]) -> None:
    """The app's default ("Repeatable replies", int4): prefill, decodes and prefix-cache hits all native."""
    llm = shared_default_llm("int4", deterministic=True)
    decode = _native(llm)
    assert decode.every_step
    params = SamplingParams(max_tokens=12, temperature=0.0)
    question = [{"role": "user", "content": "Name the capital city of France."}]
    before = decode.steps
    alone = llm.chat(question, params).token_ids
    assert decode.steps - before >= len(alone)  # the prefill and every decode
    handles = [llm.engine.submit(question, params)] + [
        llm.engine.submit([{"role": "user", "content": q}], params) for q in PROMPTS[1:4]
    ]
    while not all(h.done() for h in handles):
        llm.engine.step()
    assert handles[0].result().token_ids == alone  # a prefix-cache hit, inside a batch of four
    assert "Paris" in llm.engine.tokenizer.decode(alone)
    assert decode.reasons == {0: "native for every step (row-invariant: deterministic mode)"}


@needs_native
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(5, 1, 64), (4, 2, 128)])
def test_native_head_sizes_match_hf(
    heads: int, kv_heads: int, head_dim: int, tmp_path: Path, default_model_dir: Path, extension: None
) -> None:
    """The vector paths for 64 and 128 wide heads, with query groups of 5 (4 + 1) and 2 per KV head."""
    _matches_hf(_tiny_llama(tmp_path / "model", default_model_dir, heads, kv_heads, head_dim))


@needs_native
def test_default_model_native_matches_hf(default_llm: Any, default_hf_model: Any, extension: None) -> None:
    runner = default_llm.engine.runner
    prompts = [default_llm.engine.tokenize(p) for p in PROMPTS]
    prompts[0] = default_llm.engine.tokenize([{"role": "user", "content": PROMPTS[0]}])
    assert runner.enable_native("on").startswith("native")
    try:
        decode = _native(default_llm)
        verdicts = _check_greedy(default_llm, default_hf_model, prompts, 24)
        assert verdicts.count("exact") >= len(verdicts) - 2, verdicts
        assert decode.steps > 24
    finally:
        runner.enable_native("auto")  # fp32: back to torch's own ops
    assert runner._decoder is not None and runner._decoder.native is None


@needs_native
def test_a_failing_native_step_falls_back_to_eager(
    tiny_model_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, extension: None
) -> None:
    from transformers import AutoModelForCausalLM

    folder = tiny_model_dirs["llama"]
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype="float32").eval()
    llm = LLM(folder, dtype="float32", start_loop=False, kv_cache_bytes=8 << 20, native="on")
    try:
        decode = _native(llm)

        def broken() -> Any:
            def op(*args: Any) -> torch.Tensor:
                raise RuntimeError("simulated kernel failure")

            return op

        monkeypatch.setattr(native.EXTENSION, "op", broken)
        prompt = llm.engine.tokenize(PROMPTS[1])
        out = llm.generate([prompt], SamplingParams(max_tokens=8, temperature=0.0))[0]
        assert_matches_hf(reference, prompt, out.token_ids, 8)
        assert decode.reasons[0].startswith("eager: the native step failed (RuntimeError: simulated")
        assert "eager: the native step failed" in llm.decode_status
    finally:
        llm.close()


@needs_native
def test_bad_slots_raise_instead_of_crashing(tiny_model_dirs: dict[str, Path], extension: None) -> None:
    llm = LLM(tiny_model_dirs["llama"], dtype="float32", start_loop=False, kv_cache_bytes=8 << 20, native="on")
    try:
        decode, kv = _native(llm), llm.engine.runner.kv
        flat = decode.weights_for(1)
        assert flat is not None
        x = torch.zeros(1, 64)
        cos, sin = torch.ones(1, 1, 16), torch.zeros(1, 1, 16)
        slots, lens = torch.tensor([[16, 17]]), torch.tensor([2])
        with torch.inference_mode():
            decode.run(flat, x, cos, sin, kv.k, kv.v, torch.tensor([17]), slots, lens)  # in range: fine
            for bad_map, bad_slots, bad_lens in (
                (torch.tensor([kv.k.shape[1]]), slots, lens),  # writes past the pool
                (torch.tensor([17]), torch.tensor([[16, -1]]), lens),  # reads before it
                (torch.tensor([17]), slots, torch.tensor([3])),  # a length past its row of slots
            ):
                with pytest.raises(RuntimeError, match="out of range"):
                    decode.run(flat, x, cos, sin, kv.k, kv.v, bad_map, bad_slots, bad_lens)
    finally:
        llm.close()


@needs_native
def test_auto_keeps_fp32_eager_and_reads_cached_verdicts(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extension: None
) -> None:
    monkeypatch.setenv("HEARTH_DATA_DIR", str(tmp_path))
    folder = tiny_model_dirs["llama"]
    fp32 = LLM(folder, dtype="float32", start_loop=False, kv_cache_bytes=8 << 20)
    try:
        assert "fp32 runs torch's own ops" in fp32.decode_status
    finally:
        fp32.close()
    llm = LLM(folder, quantization="int4", start_loop=False, kv_cache_bytes=8 << 20)
    try:
        decode = _native(llm)
        assert decode.weights_for(1) is not None or decode.reasons[0].startswith("eager")  # the warm-up's bucket
        assert decode.reasons[0].split(":")[0] in ("native", "eager"), decode.reasons
        cache = VerdictCache()
        assert cache.get(VerdictCache.key(decode.signature, 0)) is not None, decode.reasons  # measured, written
        cache.put(VerdictCache.key(decode.signature, 1), {"native": False, "reason": "measured slower"})
        assert decode.weights_for(3) is None
        assert decode.reasons[1] == "eager: measured slower (cached)"
    finally:
        llm.close()


@needs_native
def test_a_verdict_timed_on_a_busy_machine_is_timed_again_when_it_is_quiet(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extension: None
) -> None:
    """A first load on a busy machine must not fix the verdict for good: its timings say little."""
    monkeypatch.setenv("HEARTH_DATA_DIR", str(tmp_path))
    quiet = [False]
    monkeypatch.setattr(native, "machine_quiet", lambda: quiet[0])
    timed: list[int] = []
    real_time = native.NativeDecode._time

    def counted(self: Any, bucket: int, handle: int) -> tuple[float, float]:
        timed.append(bucket)
        return real_time(self, bucket, handle)

    monkeypatch.setattr(native.NativeDecode, "_time", counted)
    key = None
    for load, is_quiet in enumerate((False, False, True, True, True, True)):
        quiet[0] = is_quiet
        llm = LLM(tiny_model_dirs["llama"], quantization="int4", start_loop=False, kv_cache_bytes=8 << 20)
        try:
            decode = _native(llm)
            decode.weights_for(1)
            key = VerdictCache.key(decode.signature, 0)
        finally:
            llm.close()
        verdict = VerdictCache().get(key)
        assert verdict is not None
        assert verdict["provisional"] is (load < 2), (load, verdict)
    # timed on the busy first load; kept (not timed) on the busy second; timed again on the first quiet one; kept after
    assert timed.count(0) == 2, timed


def test_where_native_steps_cannot_run() -> None:
    cpu = torch.device("cpu")
    assert native.native_problem(cpu, torch.bfloat16) == "native steps read an fp32 KV pool, not torch.bfloat16"
    assert native.native_problem(torch.device("cuda"), torch.float32).startswith("native steps are implemented")


def test_a_frozen_bundle_loads_its_prebuilt_step_on_cpus_that_can_run_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.system import hardware

    cpu = torch.device("cpu")
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    assert native.native_problem(cpu, torch.float32) == (
        "a frozen bundle carries no C++ compiler, and this one no prebuilt native step"
    )
    prebuilt = tmp_path / native.BUNDLED_LIBRARY
    prebuilt.parent.mkdir()
    prebuilt.write_bytes(b"")
    assert native.library_path() == prebuilt  # loaded from the bundle, never built
    flags = {"avx2", "fma", "f16c", "bmi2", "sse4_2"}
    monkeypatch.setattr(hardware, "cpu_flags_and_model", lambda: (flags, "a CPU"))
    assert native.native_problem(cpu, torch.float32) is None
    vnni_copy = tmp_path / native.BUNDLED_BUILDS[0][0]  # the copy with the VNNI kernels: where the CPU has them
    vnni_copy.write_bytes(b"")
    assert native.library_path() == prebuilt
    flags.update(native.BUNDLED_BUILDS[0][2])
    assert native.library_path() == vnni_copy and native.native_problem(cpu, torch.float32) is None
    flags.difference_update({"avx512_vnni", "avx2"})
    assert native.native_problem(cpu, torch.float32) == (
        "this CPU lacks avx2, which the bundle's prebuilt native step needs"
    )


@needs_native
@pytest.mark.parametrize(("name", "march", "needs"), native.BUNDLED_BUILDS, ids=lambda v: str(v).split("/")[-1][:24])
def test_the_bundles_builds_load_and_run(
    name: str, march: tuple[str, ...], needs: tuple[str, ...], tmp_path: Path, tiny_model_dirs: dict[str, Path]
) -> None:
    """Each of the bundle's copies (for any AVX2 CPU; for AVX512-VNNI ones, with the VNNI kernels), in a fresh
    process: it loads, and native steps give eager's tokens."""
    import subprocess

    if not set(needs) <= native.hardware.cpu_flags_and_model()[0]:
        pytest.skip(f"this CPU cannot run {name}")
    prebuilt = tmp_path / "decode_step.so"
    native.build(prebuilt, march=march)
    vnni = "avx512_vnni" in needs
    script = f"""
import torch
from engine import LLM, SamplingParams
from engine.model import native
native.EXTENSION._load(__import__("pathlib").Path({str(prebuilt)!r}))
assert native.EXTENSION.ready, native.EXTENSION.problem
assert torch.ops.hearth.vnni_available() == {vnni}
params = SamplingParams(max_tokens=12, temperature=0.0)
for mode in ("on", "off"):
    llm = LLM({str(tiny_model_dirs["llama"])!r}, dtype="float32", start_loop=False, kv_cache_bytes=8 << 20, native=mode)
    print(mode, llm.generate(["Write a haiku about the sea."], params)[0].token_ids)
    llm.close()
if {vnni}:
    from engine.model.vnni import vnni_problem
    assert vnni_problem() is None, vnni_problem()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line.startswith(("on ", "off ")))
    assert lines["on"] == lines["off"], done.stdout


def test_a_failed_build_leaves_steps_eager(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compiler error: the reason is kept and nothing half-built is left behind."""
    monkeypatch.setenv("CXX", "false")  # a "compiler" that always fails
    extension = native._Extension()
    monkeypatch.setattr(native, "library_path", lambda: tmp_path / "decode_step.so")
    assert extension.start(wait=True) is not None
    assert extension.problem is not None and extension.problem.startswith("the native step did not build")
    assert not extension.ready and list(tmp_path.iterdir()) == []


def test_a_native_step_that_cannot_start_leaves_the_model_loading(
    tiny_model_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.model.llama import FusedDecoder

    def broken(*args: Any, **kwargs: Any) -> str | None:
        raise FileNotFoundError("decode_step.cpp")

    monkeypatch.setattr(FusedDecoder, "enable_native", broken)
    llm = LLM(tiny_model_dirs["llama"], dtype="float32", start_loop=False, kv_cache_bytes=8 << 20, native="on")
    try:
        assert "eager: the native step did not start (FileNotFoundError" in llm.decode_status
        assert len(llm.generate(["Hi"], SamplingParams(max_tokens=4, temperature=0.0))[0].token_ids) == 4
    finally:
        llm.close()


def test_native_mode_is_checked() -> None:
    with pytest.raises(ValueError, match="native"):
        EngineConfig(native="fast")


def test_the_removed_compile_option_is_refused_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    """The torch.compile decode path is gone (slower than eager and native): old callers learn why, and what
    replaces it, from ``EngineConfig``, ``LLM`` (before any model loads) and the benchmark's ``--compile``."""
    from engine.tools import bench

    assert "native decode step (EngineConfig.native" in COMPILE_REMOVED
    for value in ("default", "off", "auto"):
        with pytest.raises(TypeError, match="torch.compile decode path was removed"):
            EngineConfig(compile=value)
    with pytest.raises(TypeError, match="slower than the eager and native decode paths"):
        LLM("no-such-model", compile="default")
    assert EngineConfig().native == "auto"  # the default still builds
    for argv in (["--compile", "max-autotune"], ["--compile"]):
        with pytest.raises(SystemExit) as exit_info:
            bench.main(argv)
        assert exit_info.value.code == 2
        assert "--compile: the torch.compile decode path was removed" in capsys.readouterr().err


def test_a_native_step_built_after_the_load_began_runs_from_the_next_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """A first start builds the extension in the background; a step that turned native mid-conversation could change a
    greedy reply's tokens, so that load stays eager to its end, and says so."""
    layers: list[int] = []

    def decoder() -> native.NativeDecode:
        return native.NativeDecode(
            "on", None, lambda bucket: layers.append(bucket), 8, torch.float32, (1, 1, 8), None,  # type: ignore[arg-type]
            None, "tiny",  # type: ignore[arg-type]
        )

    monkeypatch.setattr(native.EXTENSION, "ready", False)
    monkeypatch.setattr(native.EXTENSION, "problem", None)
    during = decoder()
    monkeypatch.setattr(native.EXTENSION, "ready", True)  # the build ends while that model runs
    assert during.weights_for(1) is None and layers == []  # eager: its layers are never handed over
    assert "from the next load" in during.status()
    after = decoder()  # the next load finds it built
    assert not after.built_after_load
    assert after.weights_for(1) is None and layers == [0]  # it asks for the layers (none here: eager, with a reason)
