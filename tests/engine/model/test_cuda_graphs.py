"""Decode steps replayed from CUDA graphs (``engine/model/cuda_graphs.py``).

On a CPU the graphs' static buffers, padding rows and buckets run eagerly (``capture=False``): greedy output through
them must still equal HF ``generate`` in fp32, alone, batched and staggered. The tests marked ``gpu`` capture real
CUDA graphs and run only where torch sees a CUDA device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine import SamplingParams
from engine.api import NULL_BLOCK
from engine.model.attention import AttentionContext
from engine.model.cuda_graphs import MIN_CONTEXT, StaticInputs, batch_bucket, context_bucket
from tests.engine.conftest import TinyLLM
from tests.engine.hf_reference import assert_matches_hf
from tests.engine.model.test_correctness import MODES, PROMPTS

FUSED_FAMILIES = ("llama", "qwen3")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_batch_buckets() -> None:
    assert [batch_bucket(n, 16) for n in (1, 2, 3, 4, 5, 9, 16)] == [1, 2, 4, 4, 8, 16, 16]
    assert batch_bucket(17, 16) is None
    assert batch_bucket(11, 12) == 12  # the largest bucket is the engine's own limit
    assert batch_bucket(300, 512) is None


def test_context_buckets() -> None:
    assert context_bucket(1, 2048) == MIN_CONTEXT
    assert context_bucket(MIN_CONTEXT + 1, 2048) == 2 * MIN_CONTEXT
    assert context_bucket(1500, 2048) == 2048
    assert context_bucket(1500, 1600) == 1600  # the largest bucket is the engine's longest context
    assert context_bucket(2049, 2048) is None


def test_static_inputs_pad_every_row_past_the_step() -> None:
    null = NULL_BLOCK * 16
    inputs = StaticInputs.padding(4, 8, null, torch.float32, torch.device("cpu"))
    # a step of 3 rows leaves garbage in the last row; the next, of 2, must turn rows 2-3 into padding again
    for rows, lengths in ((3, [5, 5, 5]), (2, [3, 2])):
        longest = max(lengths)
        slots = torch.arange(rows * longest).view(rows, longest) + 100
        mask = torch.zeros(rows, 1, 1, longest)
        for r, n in enumerate(lengths):
            slots[r, n:] = null
            mask[r, ..., n:] = float("-inf")
        ctx = AttentionContext(torch.arange(rows) + 50, rows, slots, mask, [])
        ids, positions = torch.arange(rows) + 7, torch.tensor(lengths) - 1
        inputs.fill(rows, ids, positions, ctx.slot_mapping, ctx)
    assert inputs.ids.tolist() == [7, 8, 0, 0]
    assert inputs.positions.tolist() == [2, 1, 0, 0]
    assert inputs.slot_mapping.tolist() == [50, 51, null, null]
    assert inputs.slots[0, :3].tolist() == [100, 101, 102]
    assert inputs.slots[1].tolist() == [103, 104] + [null] * 6
    assert (inputs.slots[2:] == null).all()
    seen = inputs.mask[:, 0, 0] == 0
    assert seen.tolist() == [[True] * 3 + [False] * 5, [True] * 2 + [False] * 6] + [[True] + [False] * 7] * 2
    context = inputs.context()
    assert context.num_decode == 4 and context.decode_slots is inputs.slots and not context.prefills


def _check_greedy(llm: Any, reference: Any, prompts: list[list[int]], max_new: int) -> None:
    params = SamplingParams(max_tokens=max_new, temperature=0.0)
    for mode in MODES:
        outputs = MODES[mode](llm, prompts, params)
        for p, out in zip(prompts, outputs, strict=True):
            assert_matches_hf(reference, p, out, max_new)
    assert llm.metrics().kv_blocks_used == 0


@pytest.mark.parametrize("family", FUSED_FAMILIES)
def test_padded_buckets_match_hf_on_a_cpu(family: str, tiny_model_dirs: dict[str, Path], tiny_llm: TinyLLM) -> None:
    """The graphs' buffers run eagerly: padding rows and masked context buckets leave every token as HF's."""
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dirs[family], dtype="float32").eval()
    llm = tiny_llm(family, max_num_batched_tokens=64, max_batch_size=8)
    runner = llm.engine.runner
    assert runner.enable_cuda_graphs(8, llm.engine.max_model_len, capture=False).startswith("decode steps")
    graphs = runner.cuda_graphs
    assert graphs is not None
    prompts = [llm.engine.tokenize(p) for p in PROMPTS[1:7]]
    _check_greedy(llm, reference, prompts, 16)
    batches = {b for b, _ in graphs.captured}
    assert {1, 8} <= batches and len(batches) >= 3, graphs.captured  # 1 alone, 6 together (bucket 8), and between
    assert graphs.num_replays > 16 and graphs.disabled_reason is None


def test_no_capture_on_a_cpu(tiny_llm: TinyLLM) -> None:
    llm = tiny_llm()
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    assert llm.graph_status == "no CUDA graphs on cpu"
    assert llm.engine.runner.cuda_graphs is None


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("family", FUSED_FAMILIES)
def test_cuda_graphs_match_hf(family: str, tiny_model_dirs: dict[str, Path], tiny_llm: TinyLLM) -> None:
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dirs[family], dtype="float32").eval().to("cuda")
    llm = tiny_llm(family, device="cuda", max_num_batched_tokens=64, max_batch_size=8)
    graphs = llm.engine.runner.cuda_graphs
    assert graphs is not None and graphs.capture, llm.graph_status
    prompts = [llm.engine.tokenize(p) for p in PROMPTS[1:7]]
    _check_greedy(llm, reference, prompts, 16)
    assert graphs.disabled_reason is None
    assert len(graphs.captured) >= 3 and graphs.num_replays > 16
