"""AsyncLLMEngine over a tiny random model on the engine's own loop thread."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import LLM, SamplingParams, StepOutput
from engine.api import EngineMetrics
from engine.serving.async_engine import AsyncLLMEngine
from tests.engine.conftest import build_tiny_model


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Iterator[LLM]:
    folder = build_tiny_model("llama", tmp_path_factory.mktemp("tiny-llama"), default_model_dir)
    model = LLM(folder, dtype="float32", kv_cache_bytes=8 << 20, max_batch_size=8, start_loop=True)
    yield model
    model.close()


def params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def wait_until_idle(llm: LLM, timeout_s: float = 5.0) -> EngineMetrics:
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = llm.metrics()
        if metrics.num_running == 0 and metrics.kv_blocks_used == 0 and not llm.engine.has_work():
            return metrics
        assert time.monotonic() < deadline, metrics
        time.sleep(0.01)


def test_stream_yields_every_token_then_finishes(llm: LLM) -> None:
    async def run() -> list[StepOutput]:
        return [out async for out in AsyncLLMEngine(llm).stream("Hello there", params(6))]

    outputs = asyncio.run(run())
    assert [len(o.new_token_ids) for o in outputs] == [1] * 6
    assert [o.finished for o in outputs] == [False] * 5 + [True]
    assert outputs[-1].finish_reason == "length" and outputs[-1].metrics["num_generated_tokens"] == 6
    expected = llm.generate("Hello there", params(6))[0].text
    assert "".join(o.delta_text for o in outputs) == expected


def test_concurrent_streams_share_one_loop(llm: LLM) -> None:
    async def one(engine: AsyncLLMEngine, prompt: str) -> int:
        return sum([len(o.new_token_ids) async for o in engine.stream(prompt, params(5))])

    async def run() -> list[int]:
        engine = AsyncLLMEngine(llm)
        return await asyncio.gather(*(one(engine, f"Prompt number {i}") for i in range(6)))

    assert asyncio.run(run()) == [5] * 6
    wait_until_idle(llm)


def test_stopping_early_cancels_and_frees_blocks(llm: LLM) -> None:
    async def run() -> tuple[int, float]:
        engine = AsyncLLMEngine(llm)
        seen = 0
        async for _ in engine.stream("Tell me everything " * 20, params(500)):
            seen += 1
            if seen == 3:
                used = llm.metrics().kv_blocks_used
                break
        return seen, used

    seen, used_while_running = asyncio.run(run())
    assert seen == 3 and used_while_running > 0
    wait_until_idle(llm)


def test_cancelled_task_cancels_its_request(llm: LLM) -> None:
    async def run() -> None:
        engine = AsyncLLMEngine(llm)
        started = asyncio.Event()

        async def consume() -> None:
            async for _ in engine.stream("A long reply please", params(500)):
                started.set()

        task = asyncio.create_task(consume())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    wait_until_idle(llm)


def test_submit_raises_at_once_for_a_prompt_longer_than_the_context(llm: LLM) -> None:
    async def run() -> None:
        with pytest.raises(ValueError, match="tokens but the context holds"):
            AsyncLLMEngine(llm).submit("word " * 5000, params(4))

    asyncio.run(run())


def test_a_failing_output_callback_does_not_stop_the_engine(llm: LLM, caplog: Any) -> None:
    def broken(out: StepOutput) -> None:
        raise RuntimeError("boom")

    with caplog.at_level("ERROR", logger="engine"):
        handle = llm.engine.submit("Hi", params(3), on_output=broken)
        result = handle.result(timeout=30)
    assert result.finish_reason == "length" and len(result.token_ids) == 3
    assert "on_output callback" in caplog.text


def test_a_failing_step_fails_its_stream_and_the_loop_lives_on(llm: LLM, monkeypatch: Any) -> None:
    engine = llm.engine
    run = engine.runner.run

    def broken(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(engine.runner, "run", run)  # only this once
        raise RuntimeError("kernel fault")

    async def stream() -> list[StepOutput]:
        return [out async for out in AsyncLLMEngine(llm).stream("Hello there", params(4))]

    monkeypatch.setattr(engine.runner, "run", broken)
    failed = asyncio.run(stream())
    assert [o.finished for o in failed] == [True]
    assert failed[0].finish_reason == "error" and failed[0].error == "generation failed: kernel fault"
    assert engine.is_alive and engine.loop_error is None
    assert [len(o.new_token_ids) for o in asyncio.run(stream())] == [1] * 4
    wait_until_idle(llm)
