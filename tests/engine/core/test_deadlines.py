"""Request deadlines: ``SamplingParams(timeout_s=...)`` ends a request with ``finish_reason="timeout"``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from engine import LLM
from engine.api import SamplingParams


@pytest.fixture(scope="module")
def one_at_a_time(tiny_model_dirs: dict[str, Path]) -> LLM:
    llm = LLM(tiny_model_dirs["llama"], dtype="float32", start_loop=False, kv_cache_bytes=4 << 20, max_batch_size=1)
    yield llm
    llm.close()


def test_a_running_request_past_its_deadline_keeps_its_text_and_frees_its_blocks(one_at_a_time: LLM) -> None:
    engine = one_at_a_time.engine
    streamed: list[int] = []
    params = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True, timeout_s=0.5)
    handle = engine.submit([5, 6, 7, 8], params, on_output=lambda out: streamed.extend(out.new_token_ids))
    while len(streamed) < 3:
        engine.step()
    time.sleep(0.55)
    while not handle.done():
        engine.step()
    out = handle.result(timeout=0)
    assert out.finish_reason == "timeout"
    assert 3 <= len(out.token_ids) < 400 and out.error is None
    assert one_at_a_time.metrics().kv_blocks_used == 0


def test_a_request_that_never_started_says_so(one_at_a_time: LLM) -> None:
    engine = one_at_a_time.engine
    busy = engine.submit([5, 6, 7], SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))
    late = engine.submit([9, 10], SamplingParams(max_tokens=5, temperature=0.0, timeout_s=0.1))
    engine.step()
    time.sleep(0.15)
    while not late.done():
        engine.step()
    out = late.result(timeout=0)
    assert out.finish_reason == "timeout" and out.token_ids == []
    assert out.error and "without starting" in out.error
    while not busy.done():
        engine.step()
    assert busy.result(timeout=0).finish_reason == "length"
    assert one_at_a_time.metrics().kv_blocks_used == 0


@pytest.mark.parametrize("value", [0, -1.0, float("inf"), float("nan"), "5"])
def test_impossible_timeouts_are_refused(value: object) -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        SamplingParams(timeout_s=value)  # type: ignore[arg-type]
