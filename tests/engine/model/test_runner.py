"""The model runner (``engine/model/runner.py``) on tiny random models: the path it takes from the registry, how
it packs a step's sequences, and the logits it returns, checked against the HF model run over each whole sequence.

Batches are built here as the scheduler would hand them over (``StepBatch``), with block tables chosen by hand.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from engine.architectures import ARCHITECTURES, execution_path
from engine.model.runner import AUTOTUNE_ENV, ModelRunner

BLOCK_SIZE = 16
NUM_BLOCKS = 16
VOCAB = 49152  # the tiny models' (tests/engine/conftest.py)


@dataclass
class Seq:
    token_ids: list[int]
    block_table: list[int]
    num_computed_tokens: int = 0


@dataclass
class Batch:
    seqs: list[Seq]
    num_new_tokens: list[int]
    num_draft_tokens: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.seqs)


def tokens(n: int, first: int = 100) -> list[int]:
    return [first + 7 * i % 5000 for i in range(n)]


@pytest.fixture(autouse=True)
def _no_kernel_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every layer runs its level's stored kernel: nothing is timed or written to the plan cache."""
    monkeypatch.setenv(AUTOTUNE_ENV, "off")


#: ``make(family_or_model, **runner_options) -> (runner, reference)``: a runner and an untouched HF copy.
MakeRunner = Callable[..., tuple[ModelRunner, Any]]


@pytest.fixture
def make_runner(tiny_model_dirs: dict[str, Path]) -> MakeRunner:
    def make(model: str | Any = "llama", **options: Any) -> tuple[ModelRunner, Any]:
        if isinstance(model, str):
            model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dirs[model], dtype=torch.float32)
        model.eval()
        reference = copy.deepcopy(model)  # the runner rebuilds its model's weights and attention
        return ModelRunner(model, NUM_BLOCKS, BLOCK_SIZE, torch.float32, **options), reference

    return make


def hf_logits(reference: Any, ids: list[int]) -> torch.Tensor:
    """The HF model's logits at every position of ``ids``, the whole sequence at once."""
    with torch.inference_mode():
        return reference(torch.tensor([ids])).logits[0]


def run(runner: ModelRunner, batch: Batch, **kw: Any) -> tuple[torch.Tensor | None, list[int]]:
    """One step, then each sequence's computed count advanced as the scheduler's postprocess does."""
    logits, rows = runner.run(batch, **kw)
    for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
        seq.num_computed_tokens += n
    return logits, rows


# --- the path ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("family", "fused"), [("llama", True), ("qwen3", True), ("gemma", False)])
def test_the_registry_picks_the_path(make_runner: MakeRunner, family: str, fused: bool) -> None:
    runner, _ = make_runner(family)
    assert ARCHITECTURES[family].path == ("fused" if fused else "hf")
    assert runner.is_fused is fused
    assert (runner._decoder is not None) is fused
    if not fused:
        assert runner.model.config._attn_implementation == "hearth_paged"
        assert runner.enable_native("auto") == "eager: the HF-module path"
    assert runner.enable_cuda_graphs(4, 64) == "no CUDA graphs on cpu"


def test_a_fused_type_with_a_feature_the_decoder_lacks_runs_its_hf_modules(
        tiny_model_dirs: dict[str, Path], make_runner: MakeRunner) -> None:
    config = transformers.AutoConfig.from_pretrained(tiny_model_dirs["llama"])
    config.mlp_bias = True  # the fused decoder has no MLP biases
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.down_proj.bias.normal_(0, 0.5)  # biases that change the output
    assert execution_path(config) == "hf"
    runner, reference = make_runner(model)
    assert not runner.is_fused
    ids = tokens(9)
    logits, rows = run(runner, Batch([Seq(ids, [1])], [9]))
    assert rows == [0] and logits is not None
    torch.testing.assert_close(logits[0], hf_logits(reference, ids)[-1], atol=1e-4, rtol=1e-4)


# --- packing -------------------------------------------------------------------------------------------------

def test_prepare_packs_decodes_first_and_maps_each_token_to_its_slot(make_runner: MakeRunner) -> None:
    runner, _ = make_runner("llama")
    decode = Seq(tokens(21), [3, 7], num_computed_tokens=20)
    prefill = Seq(tokens(13, 900), [5])
    partial = Seq(tokens(25, 2000), [9, 10])
    ids, pos, logit_row = runner.prepare(Batch([prefill, decode, partial], [13, 1, 10]))
    assert ids.tolist() == decode.token_ids[20:] + prefill.token_ids + partial.token_ids[:10]
    assert pos.tolist() == [20, *range(13), *range(10)]
    # in batch order: the prefill's last token sits after the decode; the unfinished chunk samples nothing
    assert logit_row == [13, 0, -1]
    ctx = runner.ctx
    assert ctx is not None and ctx.num_decode == 1 and ctx.decode_lens == [21]
    assert ctx.slot_mapping.tolist() == [7 * 16 + 4, *range(5 * 16, 5 * 16 + 13), *range(9 * 16, 9 * 16 + 10)]
    assert [(c.start, c.num_tokens, c.context_len) for c in ctx.prefills] == [(1, 13, 13), (14, 10, 10)]


def test_a_chunk_after_cached_tokens_attends_to_them(make_runner: MakeRunner) -> None:
    runner, _ = make_runner("llama")
    seq = Seq(tokens(25), [4, 2], num_computed_tokens=10)
    runner.prepare(Batch([seq], [15]))
    ctx = runner.ctx
    assert ctx is not None and ctx.num_decode == 0
    chunk = ctx.prefills[0]
    assert (chunk.start, chunk.num_tokens, chunk.context_len) == (0, 15, 25)
    assert chunk.slots is not None and chunk.slots.tolist() == [*range(64, 80), *range(32, 41)]
    assert chunk.mask is not None and chunk.mask.shape == (15, 25)
    assert chunk.mask[0].tolist() == [True] * 11 + [False] * 14  # token 10 sees tokens 0..10
    assert chunk.mask[-1].all()


# --- logits --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_a_packed_prefill_and_decode_step_gives_each_sequence_its_logits(make_runner: MakeRunner,
                                                                         family: str) -> None:
    runner, reference = make_runner(family)
    a, b, c = Seq(tokens(20), [3, 7]), Seq(tokens(13, 900), [5]), Seq(tokens(25, 2000), [9, 1])
    logits, rows = run(runner, Batch([a], [20]))
    assert logits is not None and logits.shape == (1, VOCAB) and rows == [0]
    a.token_ids.append(int(logits[0].argmax()))

    # one step: a new prefill, a decode and the first chunk of a longer prompt, in that batch order
    logits, rows = run(runner, Batch([b, a, c], [13, 1, 10]))
    assert logits is not None and logits.shape == (2, VOCAB)
    assert rows == [0, 1]  # c's chunk does not end its prompt: no row for it
    torch.testing.assert_close(logits[0], hf_logits(reference, b.token_ids)[-1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[1], hf_logits(reference, a.token_ids)[-1], atol=1e-4, rtol=1e-4)

    # the rest of c over its cached first chunk, beside two decodes of different lengths (a padded read)
    a.token_ids.append(int(logits[1].argmax()))
    b.token_ids.append(int(logits[0].argmax()))
    logits, rows = run(runner, Batch([a, c, b], [1, 15, 1]))
    assert logits is not None and rows == [0, 1, 2]
    for row, seq in enumerate((a, c, b)):
        torch.testing.assert_close(logits[row], hf_logits(reference, seq.token_ids)[-1], atol=1e-4, rtol=1e-4)


def test_a_step_that_completes_no_prompt_returns_no_logits(make_runner: MakeRunner) -> None:
    for family in ("llama", "gemma"):
        runner, _ = make_runner(family)
        logits, rows = run(runner, Batch([Seq(tokens(30), [1, 2])], [12]))
        assert logits is None and rows == []
        assert runner.ctx is None  # the step's context does not outlive it


def test_all_logits_scores_every_packed_token(make_runner: MakeRunner) -> None:
    runner, reference = make_runner("llama")
    ids = tokens(18)
    logits, rows = run(runner, Batch([Seq(ids, [6, 2])], [18]), all_logits=True)
    assert logits is not None and logits.shape == (18, VOCAB) and rows == list(range(18))
    torch.testing.assert_close(logits, hf_logits(reference, ids), atol=1e-4, rtol=1e-4)


def test_a_drafted_sequence_gets_a_row_per_draft_token_plus_one(make_runner: MakeRunner) -> None:
    runner, reference = make_runner("llama")
    plain, drafted = Seq(tokens(6, 300), [8]), Seq(tokens(12), [4])
    logits, rows = run(runner, Batch([plain, drafted], [6, 12], num_draft_tokens=[0, 3]))
    assert rows == [0, 1, 1, 1, 1]
    assert logits is not None and logits.shape == (5, VOCAB)
    torch.testing.assert_close(logits[0], hf_logits(reference, plain.token_ids)[-1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[1:], hf_logits(reference, drafted.token_ids)[-4:], atol=1e-4, rtol=1e-4)


# --- weights -------------------------------------------------------------------------------------------------

def test_int8_on_the_hf_path_swaps_every_decoder_linear(make_runner: MakeRunner) -> None:
    dense, reference = make_runner("gemma")
    runner, _ = make_runner("gemma", quantization="int8")
    assert runner.weight_quantization == "int8" and dense.weight_quantization is None
    linears = [m for layer in runner.model.model.layers for m in layer.modules() if isinstance(m, torch.nn.Linear)]
    assert linears == []
    assert runner.weights_bytes < dense.weights_bytes
    ids = tokens(10)
    logits, _ = run(runner, Batch([Seq(ids, [1])], [10]))
    assert logits is not None
    want = hf_logits(reference, ids)[-1]
    assert torch.nn.functional.cosine_similarity(logits[0], want, dim=0) > 0.99
    assert not torch.equal(logits[0], want)
