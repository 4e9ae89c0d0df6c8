"""Greedy decoding equals HF ``generate`` in fp32: alone, batched together, and staggered into a running batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine import SamplingParams
from engine.architectures import ARCHITECTURES, TESTED_MODEL_TYPES
from tests.engine.conftest import TinyLLM
from tests.engine.hf_reference import assert_matches_hf

MAX_NEW = 24
PROMPTS = [
    "Hi",
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Write a haiku about the sea.",
    "List three primary colours and explain why each one is called primary in painting.",
    "Once upon a time, in a village at the edge of a great forest, there lived an old clockmaker who",
    "Translate to French: The weather is lovely today and we are going to the beach after lunch.",
    "Q: What is 17 times 23? Show your working step by step, then give the final answer.\nA:",
]


def _run_together(llm: Any, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    handles = [llm.engine.submit(p, params) for p in prompts]
    while not all(h.done() for h in handles):
        llm.engine.step()
    return [h.result().token_ids for h in handles]


def _run_staggered(llm: Any, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    """Each new request arrives while the earlier ones are mid-decode (or mid-prefill)."""
    handles = []
    for p in prompts:
        handles.append(llm.engine.submit(p, params))
        for _ in range(3):
            llm.engine.step()
    while not all(h.done() for h in handles):
        llm.engine.step()
    return [h.result().token_ids for h in handles]


def _run_alone(llm: Any, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    return [_run_together(llm, [p], params)[0] for p in prompts]


MODES = {"together": _run_together, "staggered": _run_staggered, "alone": _run_alone}


@pytest.fixture(scope="module")
def default_prompt_ids(default_llm: Any) -> list[list[int]]:
    ids = [default_llm.engine.tokenize(p) for p in PROMPTS]
    # two chat-formatted prompts as well, sharing the system prompt prefix
    ids[0] = default_llm.engine.tokenize([{"role": "user", "content": "Hi"}])
    ids[3] = default_llm.engine.tokenize([{"role": "user", "content": PROMPTS[3]}])
    return ids


@pytest.mark.parametrize("mode", MODES)
def test_default_model_matches_hf(
    mode: str, default_llm: Any, default_hf_model: Any, default_prompt_ids: list[list[int]]
) -> None:
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0)
    outputs = MODES[mode](default_llm, default_prompt_ids, params)
    verdicts = [
        assert_matches_hf(default_hf_model, p, out, MAX_NEW)
        for p, out in zip(default_prompt_ids, outputs, strict=True)
    ]
    assert verdicts.count("exact") >= len(verdicts) - 1, verdicts
    assert default_llm.metrics().kv_blocks_used == 0


@pytest.mark.parametrize("family", TESTED_MODEL_TYPES)
def test_tiny_models_match_hf(family: str, tiny_model_dirs: dict[str, Path], tiny_llm: TinyLLM) -> None:
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dirs[family], dtype="float32").eval()
    llm = tiny_llm(family, max_num_batched_tokens=64)
    assert llm.engine.runner.is_fused == (ARCHITECTURES[family].path == "fused")
    prompts = [llm.engine.tokenize(p) for p in PROMPTS[1:7]]
    params = SamplingParams(max_tokens=16, temperature=0.0)
    for mode in ("together", "staggered"):
        outputs = MODES[mode](llm, prompts, params)
        for p, out in zip(prompts, outputs, strict=True):
            assert_matches_hf(reference, p, out, 16)
    assert llm.metrics().kv_blocks_used == 0
