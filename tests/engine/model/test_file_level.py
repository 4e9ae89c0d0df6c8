"""The "file" precision: a GGUF model run in its own blocks (Q4_K with Q6_K, Q4_0, Q8_0), never dequantized.

The files are random-weight GGUFs in the block types users download (``engine/tools/make_gguf.py``), tiny shapes.
Their reference is the same file read dequantized to fp32: the block kernels quantize activations to int8 per
block, as llama.cpp does, so the logits agree closely but not exactly; greedy output repeats exactly whatever
shares the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from engine import LLM, ModelLoadError, SamplingParams
from engine.loading.recommend import estimate, recommend
from engine.model.gguf_linear import GgufEmbedding, GgufLinear
from engine.model.native import file_problem
from engine.tools.make_gguf import write_gguf

pytestmark = pytest.mark.skipif(file_problem() is not None, reason=f"no block kernels here: {file_problem()}")

OPTIONS: dict[str, Any] = {"start_loop": False, "kv_cache_bytes": 8 << 20}
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("gguf")
    files = {}
    for kind in ("Q4_K_M", "Q4_0", "Q8_0"):
        files[kind] = folder / f"tiny-{kind}.gguf"
        write_gguf(files[kind], "tiny", kind, seed=1)
    return files


@pytest.fixture
def open_llm() -> Iterator[Callable[..., LLM]]:
    made: list[LLM] = []

    def make(path: Path, level: str) -> LLM:
        made.append(LLM(path, quantization=level, **OPTIONS))
        return made[-1]

    yield make
    for llm in made:
        llm.close()


def _first_logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    """The logits the engine samples the first token from."""
    runner = llm.engine.runner
    captured: list[torch.Tensor] = []
    run = runner.run

    def spy(*args: Any, **kwargs: Any) -> Any:
        logits, rows = run(*args, **kwargs)
        if logits is not None:
            captured.append(logits.detach().float().clone())
        return logits, rows

    runner.run = spy  # type: ignore[method-assign]
    try:
        llm.generate([ids], SamplingParams(max_tokens=1, temperature=0.0))
    finally:
        del runner.run
    return captured[0][0]


@pytest.mark.parametrize("kind", ["Q4_K_M", "Q4_0", "Q8_0"])
def test_each_file_type_runs_in_its_blocks_close_to_its_dequantized_values(
    kind: str, tiny_files: dict[str, Path], open_llm: Callable[..., LLM]
) -> None:
    path = tiny_files[kind]
    llm = open_llm(path, "file")
    runner = llm.engine.runner
    layers = int(runner.config.num_hidden_layers)
    assert runner.weights_from_gguf == 4 * layers + 1  # every fused layer and the head
    assert isinstance(runner.model.model.embed_tokens, GgufEmbedding)
    assert isinstance(runner._decoder.lm_head, GgufLinear)
    # the weights are the file's bytes, not a dequantized copy (norms are fp32, a few KiB)
    assert llm.weights_bytes <= path.stat().st_size
    # the decoder layers' Q4_0, Q8_0, Q4_K and Q6_K rows are put in groups of eight at load (type numbers 128 + the ggml
    # type's), and so is a tied head, whose bytes the embedding's lookups share
    kinds = {s.kind for layer in runner._decoder._stack.layers for s in layer.qkv.segments}
    assert kinds == {"Q4_K_M": {128 + 12, 128 + 14}, "Q4_0": {128 + 2}, "Q8_0": {128 + 8}}[kind], kinds
    head = runner._decoder.lm_head.segments
    assert {s.kind for s in head} == {"Q4_K_M": {142}, "Q4_0": {142}, "Q8_0": {136}}[kind]
    assert head[0].data.data_ptr() == runner.model.model.embed_tokens.blocks.data_ptr()
    ids = [5, 17, 300, 4000, 12, 9, 77]
    ours = _first_logits(llm, ids)
    reference = _first_logits(open_llm(path, "fp32"), ids)
    error = float((ours - reference).norm() / reference.norm())
    assert error < 0.03, f"{kind}: relative error {error:.4f} of the logits against the dequantized fp32 model"


def test_an_untied_files_embedding_stays_in_the_files_row_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, open_llm: Callable[..., LLM]
) -> None:
    """Only a tied head puts the embedding's rows in groups of eight: with its own output tensor, the head is
    grouped and the embedding keeps the file's order, where a lookup dequantizes just its rows."""
    import dataclasses

    from engine.tools import make_gguf

    monkeypatch.setitem(make_gguf.SHAPES, "tiny-untied", dataclasses.replace(make_gguf.SHAPES["tiny"], tied=False))
    path = tmp_path / "untied.gguf"
    write_gguf(path, "tiny-untied", "Q8_0", seed=3)
    llm = open_llm(path, "file")
    runner = llm.engine.runner
    assert runner.model.model.embed_tokens.kind == 8  # Q8_0, the file's order
    assert {s.kind for s in runner._decoder.lm_head.segments} == {128 + 8}
    assert len(llm.generate([[5, 17, 300, 4000]], GREEDY)[0].token_ids) > 0


@pytest.mark.parametrize("kind", ["Q4_K_M", "Q4_0"])
def test_greedy_output_repeats_whatever_shares_the_batch(
    kind: str, tiny_files: dict[str, Path], open_llm: Callable[..., LLM]
) -> None:
    """Activations are quantized per row and every row's sums run in one order, so a reply does not depend on the
    rows beside it (decode and prefill, one row or many; Q4_0's layers in groups of eight rows)."""
    llm = open_llm(tiny_files[kind], "file")
    prompt = [11, 400, 2200, 31, 7, 8000, 5]
    alone = llm.generate([prompt], GREEDY)[0].token_ids
    others = [[3, 4, 5] * 20, [900 + i for i in range(37)], [42]]
    together = llm.generate([others[0], prompt, *others[1:]], GREEDY)[1].token_ids
    assert together == alone


def test_recommend_offers_the_files_own_blocks_first(tiny_files: dict[str, Path]) -> None:
    """A Q4_K_M file has Q6_K tensors, which no packed level runs exactly: its own blocks come first, at the file's
    size."""
    path = tiny_files["Q4_K_M"]
    rec = recommend(path, device="cpu")
    assert rec.quantization == "file"
    assert "Q4_K and Q6_K blocks" in rec.reason
    assert rec.weights_bytes <= path.stat().st_size
    assert estimate(path, "file", device="cpu").weights_bytes == rec.weights_bytes
    without = recommend(path, device="cpu", block_kernels=False)
    assert without.quantization != "file"
    # a model with no blocks to keep: the app's Precision choice shows why "file" does not apply
    other = estimate("default", "file", device="cpu")
    assert other.fits == "no" and "GGUF file" in other.reason


def test_the_file_level_refuses_models_it_cannot_run_in_place(default_model_dir: Path) -> None:
    """A safetensors folder has no blocks to keep: a clear error that names the other choices."""
    with pytest.raises(ModelLoadError, match="choose int4, int8 or bf16|Choose int4, int8 or bf16"):
        LLM(default_model_dir, quantization="file", **OPTIONS)


def test_self_int4_speculation_needs_dense_weights(tiny_files: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="use 'ngram'"):
        LLM(tiny_files["Q4_0"], quantization="file", speculative="self-int4", **OPTIONS)


def test_decode_steps_run_natively_over_two_runs_of_blocks(tiny_files: dict[str, Path]) -> None:
    """A Q4_K_M file's Q/K/V mixes Q4_K and Q6_K rows on some layers: the native step takes both runs, and its
    decode logits are the eager layers' (the same kernels, summed in the same order)."""
    path = tiny_files["Q4_K_M"]
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    steps = {}
    for native in ("on", "off"):
        llm = LLM(path, quantization="file", native=native, **OPTIONS)
        try:
            runner = llm.engine.runner
            qkv = [layer.qkv for layer in runner._decoder._stack.layers]
            assert {len(k.segments) for k in qkv} == {1, 2}  # the mix this test is about
            captured: list[torch.Tensor] = []
            run = runner.run

            def spy(*args: Any, _run: Any = run, _out: list[torch.Tensor] = captured, **kwargs: Any) -> Any:
                logits, rows = _run(*args, **kwargs)
                if logits is not None:
                    _out.append(logits.detach().float().clone())
                return logits, rows

            runner.run = spy  # type: ignore[method-assign]
            llm.generate([[7, 300, 21, 5000, 9]], params)
            steps[native] = captured
            if native == "on":
                assert runner.native_status.startswith("1 rows: native"), runner.native_status
        finally:
            llm.close()
    for on, off in zip(steps["on"][1:], steps["off"][1:], strict=True):  # the decode steps
        assert float((on - off).norm() / off.norm()) < 1e-4


def test_the_bench_times_decode_and_a_fresh_prefill_at_the_file_level(
    tiny_files: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m engine.bench --model FILE --level file --prefill N`` prints its setup (with the CPU's SIMD flags),
    the prefill row and the decode rows as JSON lines."""
    import json

    from engine.tools import bench

    monkeypatch.setenv("HEARTH_AUTOTUNE", "load")  # as the bench sets it, and gone after this test
    argv = ["--model", str(tiny_files["Q4_0"]), "--level", "file", "--prefill", "48", "--repeats", "1",
            "--concurrency", "1,2", "--max-tokens", "4", "--skip-hf", "--skip-multi-turn"]
    assert bench.main(argv) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    setup = next(r for r in rows if r["system"] == "hearth_setup")
    assert setup["level"] == "file" and setup["weights_mib"] <= tiny_files["Q4_0"].stat().st_size / 2**20
    assert isinstance(setup["cpu_flags"], list) and setup["threads"] >= 1
    prefill = next(r for r in rows if r["system"] == "prefill")
    assert prefill["prompt_tokens"] == 48 and prefill["hearth_tok_s"] > 0
    assert {r["concurrency"] for r in rows if r["system"] == "hearth"} == {1, 2}


def test_the_bench_times_our_server_over_http_with_server(
    tiny_files: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--server`` (which ``--llama-server`` implies) times ``python -m engine.serve`` on the same file and level
    over HTTP, as llama.cpp's server is timed: every stream writes its ``max_tokens`` tokens, and the fresh prompt
    is read through the server too."""
    import json

    from engine.tools import bench

    monkeypatch.setenv("HEARTH_AUTOTUNE", "load")
    argv = ["--model", str(tiny_files["Q4_K_M"]), "--level", "file", "--prefill", "40", "--repeats", "2",
            "--concurrency", "1,3", "--max-tokens", "5", "--skip-hf", "--skip-multi-turn", "--server"]
    assert bench.main(argv) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    prefill = next(r for r in rows if r["system"] == "prefill")
    assert prefill["path"] == "server" and len(prefill["hearth_rounds"]) == 2 and prefill["hearth_tok_s"] > 0
    decode = {r["concurrency"]: r for r in rows if r["system"] == "hearth"}
    assert set(decode) == {1, 3} and all(r["path"] == "server" for r in decode.values())
    assert decode[3]["tokens"] == 15 and len(decode[3]["rounds_tok_s"]) == 2 and decode[3]["min_stream_tok_s"] > 0


def test_native_verdicts_are_kept_per_block_mix(tiny_files: dict[str, Path], open_llm: Callable[..., LLM]) -> None:
    """Whether the native step beats eager is cached per model signature: files of one shape in different block
    types must not share a verdict."""
    signatures = {kind: open_llm(tiny_files[kind], "file").engine.runner._signature() for kind in ("Q4_K_M", "Q4_0")}
    assert signatures["Q4_K_M"] != signatures["Q4_0"]
    assert "Q4_K" in signatures["Q4_K_M"] and "Q6_K" in signatures["Q4_K_M"] and "Q4_0" in signatures["Q4_0"]


def test_the_default_models_own_gguf_at_file_level_keeps_bf16s_perplexity(
    shared_default_llm: Callable[..., LLM],
) -> None:
    """The default model's Q4_1/Q8_0 file run in its blocks, int8 activations included, scores the same text within
    0.5 % of the bf16 model (measured here: 16.362 against 16.369), holding no more than the file's own bytes (a
    third of bf16's dense weights: 96.6 MB against 269 MB; bf16's figure grows with the extra kernels its plans
    build, so it is the file that bounds it)."""
    from engine.loading.default_model import source_gguf_path
    from engine.tools.perplexity import perplexity
    from tests.engine.model.test_quantization import TEXT

    bf16 = shared_default_llm("bf16")
    llm = LLM(source_gguf_path(), quantization="file", start_loop=False, kv_cache_bytes=64 << 20)
    try:
        ratio = perplexity(llm, TEXT) / perplexity(bf16, TEXT)
        assert abs(ratio - 1) < 0.005, f"file-level perplexity is {ratio:.4f}x bf16's"
        assert llm.weights_bytes <= source_gguf_path().stat().st_size < 0.4 * bf16.weights_bytes
    finally:
        llm.close()
