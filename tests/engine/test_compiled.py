"""Compiled decode steps (engine/model/compiled.py): token-identical to eager, no recompiles, eager fallbacks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from engine import LLM, SamplingParams
from engine.api import EngineConfig
from engine.model.compiled import VerdictCache, compile_problem

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
]
NO_COMPILER = compile_problem(torch.device("cpu"))


def _generate(llm: LLM, batched: bool) -> list[list[int]]:
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    messages = [[{"role": "user", "content": p}] for p in PROMPTS]
    if not batched:
        return [llm.chat(m, params).token_ids for m in messages]
    handles = [llm.engine.submit(m, params) for m in messages]
    tokens: dict[str, list[int]] = {h.request_id: [] for h in handles}
    while not all(h.done() for h in handles):
        for out in llm.engine.step():
            tokens[out.request_id] += out.new_token_ids
    return [tokens[h.request_id] for h in handles]


@pytest.mark.skipif(NO_COMPILER is not None, reason=f"decode steps cannot be compiled here: {NO_COMPILER}")
def test_compiled_decode_matches_eager_without_recompiles(tiny_model_dirs: dict[str, Path]) -> None:
    from torch._dynamo.utils import counters

    llm = LLM(tiny_model_dirs["llama"], dtype="float32", start_loop=False, kv_cache_bytes=8 << 20, compile="default")
    try:
        decoder = llm.engine.runner._decoder
        assert decoder is not None and decoder.compiled is not None, llm.compile_status
        compiled = decoder.compiled
        for rows in (1, 3):  # the one-row bucket and the 2-4 bucket
            assert compiled.prepare(rows).startswith("compiled"), compiled.reasons
        graphs = counters["stats"]["unique_graphs"]
        with_compile = [_generate(llm, batched) for batched in (False, True)]
        # every step of a growing context (and a shrinking batch) ran on the graphs compiled above
        assert counters["stats"]["unique_graphs"] == graphs
        assert all(not reason.startswith("eager") for reason in compiled.reasons.values()), compiled.reasons
        decoder.compiled = None
        eager = [_generate(llm, batched) for batched in (False, True)]
        assert with_compile == eager
    finally:
        llm.close()


def test_frozen_bundle_runs_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    assert compile_problem(torch.device("cpu")) == "a frozen bundle carries no C++ compiler"


def test_auto_reads_a_cached_eager_verdict(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HEARTH_DATA_DIR", str(tmp_path))
    llm = LLM(tiny_model_dirs["llama"], dtype="float32", start_loop=False, kv_cache_bytes=8 << 20, compile="auto")
    try:
        decoder = llm.engine.runner._decoder
        if decoder is None or decoder.compiled is None:
            pytest.skip(f"decode steps cannot be compiled here: {llm.compile_status}")
        compiled = decoder.compiled
        compiled.prepare(1)  # the warm-up's bucket: measured once, the verdict written
        assert compiled.reasons[0].startswith(("compiled", "eager")), compiled.reasons
        cache = VerdictCache()
        key = VerdictCache.key(compiled.signature, 1)
        cache.put(key, {"compiled": False, "reason": "measured slower"})
        assert compiled.prepare(3) == "eager: measured slower (cached)"
        assert cache.get(VerdictCache.key(compiled.signature, 0)) is not None
    finally:
        llm.close()


def test_compile_mode_is_checked() -> None:
    with pytest.raises(ValueError, match="compile"):
        EngineConfig(compile="fast")
