"""Engine behaviour on real weights: cancellation, preemption, prefix reuse, capacity, random workloads."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import LLM, CapacityError, ModelLoadError, SamplingParams
from engine.api import EngineMetrics
from tests.engine.hf_reference import assert_matches_hf


def _drive(llm: Any, handles: list[Any]) -> None:
    while not all(h.done() for h in handles):
        llm.engine.step()


@pytest.fixture(scope="module")
def tiny_llm(tiny_model_dirs: dict[str, Path]) -> Any:
    llm = LLM(tiny_model_dirs["llama"], dtype="float32", start_loop=False, kv_cache_bytes=4 << 20)
    yield llm
    llm.close()


def test_cancel_mid_stream_leaves_other_streams_untouched(default_llm: Any) -> None:
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    prompts = ["The history of Rome", "A recipe for bread", "How rain forms"]
    solo = [default_llm.generate([p], params)[0].token_ids for p in prompts]
    handles = [default_llm.engine.submit(p, params) for p in prompts]
    for _ in range(6):
        default_llm.engine.step()
    handles[1].cancel()
    _drive(default_llm, handles)
    cancelled = handles[1].result()
    assert cancelled.finish_reason == "abort"
    assert 0 < len(cancelled.token_ids) < 20
    assert cancelled.token_ids == solo[1][: len(cancelled.token_ids)]
    assert handles[0].result().token_ids == solo[0]
    assert handles[2].result().token_ids == solo[2]
    metrics = default_llm.metrics()
    assert metrics.kv_blocks_used == 0
    assert metrics.num_running == 0


def test_second_chat_turn_hits_the_prefix_cache(default_llm: Any) -> None:
    params = SamplingParams(max_tokens=16, temperature=0.0)
    messages = [{"role": "user", "content": "Name a large city in Japan and say one thing about it."}]
    first = default_llm.chat(messages, params)
    hits_before = default_llm.metrics().prefix_cache_hits
    messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And another?"}]
    second = default_llm.chat(messages, params)
    assert second.metrics.num_cached_tokens >= 32
    assert default_llm.metrics().prefix_cache_hits >= hits_before + second.metrics.num_cached_tokens
    assert default_llm.metrics().prefix_cache_hit_rate > 0


def test_preemption_under_a_tiny_kv_budget_keeps_outputs_identical(tiny_model_dirs: dict[str, Path]) -> None:
    from transformers import AutoModelForCausalLM

    folder = tiny_model_dirs["llama"]
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype="float32").eval()
    # 12 usable blocks of 16 tokens for 6 streams that each grow to 49 tokens (3 blocks): preemption is certain
    per_block = 2 * 2 * 2 * 16 * 4 * 16
    llm = LLM(folder, dtype="float32", start_loop=False, kv_cache_bytes=13 * per_block, max_batch_size=6)
    try:
        params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
        prompts = [llm.engine.tokenize(f"Story number {i} begins on a {w} day") for i, w in enumerate("abcdef")]
        handles = [llm.engine.submit(p, params) for p in prompts]
        _drive(llm, handles)
        assert llm.metrics().num_preemptions > 0
        for p, h in zip(prompts, handles, strict=True):
            out = h.result()
            assert len(out.token_ids) == 40
            reference.generation_config.eos_token_id = None
            assert_matches_hf(reference, p, out.token_ids, 40)
        assert llm.metrics().kv_blocks_used == 0
    finally:
        llm.close()


def test_full_queue_raises_capacity_error(tiny_model_dirs: dict[str, Path]) -> None:
    llm = LLM(tiny_model_dirs["llama"], dtype="float32", start_loop=False, kv_cache_bytes=4 << 20, max_waiting=2)
    try:
        llm.engine.submit("a", SamplingParams(max_tokens=2))
        llm.engine.submit("b", SamplingParams(max_tokens=2))
        with pytest.raises(CapacityError, match="waiting"):
            llm.engine.submit("c", SamplingParams(max_tokens=2))
    finally:
        llm.close()


def test_prompt_longer_than_the_context_is_refused(tiny_llm: Any) -> None:
    with pytest.raises(ValueError, match="context holds"):
        tiny_llm.engine.submit(list(range(5, 600)), SamplingParams(max_tokens=2))


def test_stop_strings_are_cut_out(default_llm: Any) -> None:
    out = default_llm.generate(["Count: 1, 2, 3, 4,"], SamplingParams(max_tokens=20, temperature=0.0, stop=[" 6"]))[0]
    assert out.finish_reason == "stop"
    assert " 6" not in out.text
    assert "5" in out.text


def test_generate_with_a_loop_thread_and_streaming_handle(tiny_model_dirs: dict[str, Path]) -> None:
    llm = LLM(tiny_model_dirs["llama"], dtype="float32", kv_cache_bytes=4 << 20)  # start_loop=True
    try:
        handle = llm.engine.submit("Hello there", SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
        text = "".join(handle)
        assert text == handle.result(timeout=30).text
        outs = llm.generate(["one", "two"], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        assert [len(o.token_ids) for o in outs] == [4, 4]
    finally:
        llm.close()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(
            st.integers(1, 40),  # prompt length
            st.integers(1, 12),  # max tokens
            st.integers(0, 4),  # steps to wait before submitting
            st.booleans(),  # cancel midway
        ),
        min_size=1,
        max_size=6,
    )
)
def test_random_workloads_leak_no_blocks_and_match_solo_runs(tiny_llm: Any, plan: list[tuple]) -> None:
    engine = tiny_llm.engine
    params_for = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for _, m, _, _ in plan]
    prompts = [[(7 * i + j) % 400 + 10 for j in range(n)] for i, (n, _, _, _) in enumerate(plan)]
    handles = []
    for (_, _, wait, cancel), prompt, params in zip(plan, prompts, params_for, strict=True):
        for _ in range(wait):
            engine.step()
        handles.append((engine.submit(prompt, params), cancel))
    for step in range(400):
        if step == 2:
            for handle, cancel in handles:
                if cancel:
                    handle.cancel()
        if all(h.done() for h, _ in handles):
            break
        engine.step()
    assert tiny_llm.metrics().kv_blocks_used == 0
    for (handle, cancel), prompt, params in zip(handles, prompts, params_for, strict=True):
        out = handle.result(timeout=0)
        solo = tiny_llm.generate([prompt], params)[0].token_ids
        if cancel and out.finish_reason == "abort":
            assert out.token_ids == solo[: len(out.token_ids)]
        else:
            assert out.token_ids == solo


def test_a_failing_step_fails_its_requests_and_the_engine_goes_on(tiny_llm: Any, monkeypatch: Any) -> None:
    engine = tiny_llm.engine
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    sample = engine.sampler.sample

    def broken(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(engine.sampler, "sample", sample)  # only this once
        raise OverflowError("seed out of range")

    monkeypatch.setattr(engine.sampler, "sample", broken)
    handles = [engine.submit(p, params) for p in ("one", "two")]
    _drive(tiny_llm, handles)
    for handle in handles:
        out = handle.result(timeout=0)
        assert out.finish_reason == "error" and out.error == "generation failed: seed out of range"
    with pytest.raises(RuntimeError, match="seed out of range"):
        "".join(handles[0])
    assert tiny_llm.metrics().kv_blocks_used == 0
    assert len(tiny_llm.generate(["three"], params)[0].token_ids) == 4


def test_run_loop_steps_publishes_metrics_and_waits_idle_without_polling(tiny_llm: Any) -> None:
    from engine.core.loop import run_loop

    engine = tiny_llm.engine
    stop = threading.Event()
    steps: list[int] = []
    snapshots: list[dict[str, Any]] = []
    loop = threading.Thread(target=run_loop, args=(engine, stop, lambda outs: steps.append(len(outs)),
                                                   snapshots.append), kwargs={"metrics_interval_s": 0.2})
    loop.start()
    try:
        out = engine.submit("Hello", SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)).result(30)
        assert len(out.token_ids) == 5
        assert engine.is_alive
        time.sleep(0.3)  # idle from here on
        cpu_before = _thread_cpu_s(loop)
        time.sleep(1.0)
        assert _thread_cpu_s(loop) - cpu_before < 0.05  # an idle loop sleeps on a condition variable
        assert snapshots[-1].keys() == EngineMetrics().to_dict().keys()  # the dict form of one EngineMetrics
        assert EngineMetrics.from_dict(snapshots[-1]).kv_blocks_total == engine.metrics().kv_blocks_total > 0
        gaps = [b["time"] - a["time"] for a, b in itertools.pairwise(snapshots)]
        assert len(gaps) >= 5 and min(gaps) > 0.15  # one snapshot every metrics_interval_s, never more often
        started = time.monotonic()
        engine.submit("Hi", SamplingParams(max_tokens=1, temperature=0.0)).result(30)
        assert time.monotonic() - started < 5.0
    finally:
        stop.set()
        engine.wake()
        loop.join(10)
    assert not loop.is_alive() and not engine.is_alive and engine.loop_error is None
    assert sum(steps) == 6  # every output went to on_step


def _thread_cpu_s(thread: threading.Thread) -> float:
    import psutil

    times = {t.id: t.user_time + t.system_time for t in psutil.Process().threads()}
    return times[thread.native_id]


class _Fatal(BaseException):
    """Something no step survives (as KeyboardInterrupt or SystemExit would be)."""


def test_a_dead_loop_is_recorded_and_fails_every_request(tiny_model_dirs: dict[str, Path], caplog: Any) -> None:
    llm = LLM(tiny_model_dirs["llama"], dtype="float32", kv_cache_bytes=4 << 20)  # start_loop=True
    try:
        engine = llm.engine
        assert engine.is_alive and engine.loop_error is None
        params = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)
        first = engine.submit("A long story", params)
        next(iter(first))  # streaming has begun

        def fatal() -> list[Any]:
            raise _Fatal("the loop cannot go on")

        with caplog.at_level(logging.CRITICAL, logger="engine"):
            engine.step = fatal  # type: ignore[method-assign]
            out = first.result(timeout=30)
        assert out.finish_reason == "error" and "the loop cannot go on" in (out.error or "")
        assert not engine.is_alive and engine.loop_error == "_Fatal: the loop cannot go on"
        assert "the engine loop stopped" in caplog.text
        with pytest.raises(RuntimeError, match="engine has stopped"):
            engine.submit("Anyone there?", params)
    finally:
        llm.close()


def test_a_looping_llm_loads_and_steps_on_its_own_thread(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    """With its loop on, ``LLM`` loads on the loop thread, so one thread runs all its torch work (see
    ``LLM._set_up_on_the_loop_thread``); a load that fails there fails in the caller, with the loader's message."""
    seen: list[str] = []
    llm = LLM(tiny_model_dirs["llama"], dtype="float32", kv_cache_bytes=8 << 20,
              progress=lambda _fraction, _stage: seen.append(threading.current_thread().name))
    try:
        assert set(seen) == {"hearth-engine"} and llm.engine.is_alive
        assert llm.engine._loop_thread is not threading.current_thread()
        out = llm.generate("Hello", SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))[0]
        assert len(out.token_ids) == 3
    finally:
        llm.close()
    with pytest.raises(ModelLoadError, match="No model found|not found|does not exist"):
        LLM(tmp_path / "missing")


def test_steps_run_on_the_heap_and_the_engine_trims_it_after_an_idle_while(tiny_llm: Any, monkeypatch: Any) -> None:
    """Each step's forward pass runs with glibc's mmap off (``engine.system.memory.step_heap``). The heap is trimmed
    by the idle wait once the engine has had no work for ``HEAP_IDLE_TRIM_S``, not by the steps, and only once."""
    from engine.core import llm_engine
    from engine.model import runner
    from engine.system import memory

    engine = tiny_llm.engine
    events: list[str] = []
    real_heap = memory.step_heap

    def heap() -> Any:
        events.append("step")
        return real_heap()

    monkeypatch.setattr(runner, "step_heap", heap)
    monkeypatch.setattr(llm_engine, "trim_heap", lambda: events.append(f"trim, work left: {engine.has_work()}"))
    monkeypatch.setattr(llm_engine, "HEAP_IDLE_TRIM_S", 3600.0)
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    handle = engine.submit("one", params)
    _drive(tiny_llm, [handle])
    assert len(handle.result(timeout=0).token_ids) == 3
    assert events == ["step", "step", "step"]
    engine.wait_for_work(0.0)
    assert events == ["step", "step", "step"]  # not yet
    monkeypatch.setattr(llm_engine, "HEAP_IDLE_TRIM_S", 0.0)
    engine.wait_for_work(0.0)
    engine.wait_for_work(0.0)
    assert events == ["step", "step", "step", "trim, work left: False"]


def test_finished_prefixes_keep_at_most_prefix_cache_bytes_of_the_pool(tiny_model_dirs: dict[str, Path]) -> None:
    """Past ``prefix_cache_bytes`` of blocks ever written, new requests reuse cached blocks instead of growing into
    the rest of the pool, and reply exactly as without the limit."""
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    prompts = [[(7 * i + j) % 200 + 3 for j in range(40)] for i in range(6)]  # with its reply, 2 full blocks cached
    replies, touched, block_bytes = {}, {}, 0
    for limit in (None, 6):
        extra = {} if limit is None else {"prefix_cache_bytes": limit * block_bytes}
        llm = LLM(tiny_model_dirs["llama"], dtype="float32", start_loop=False, kv_cache_bytes=4 << 20, **extra)
        try:
            bm = llm.engine.block_manager
            block_bytes = llm.engine.runner.kv.nbytes // bm.num_blocks
            assert bm.resident_blocks == (limit or bm.resident_blocks)
            replies[limit] = [llm.generate([p], params)[0].token_ids for p in prompts]
            touched[limit] = bm.num_touched_blocks
        finally:
            llm.close()
    assert replies[6] == replies[None]
    assert touched[None] > 6 * 2  # every prompt took blocks never written before
    assert touched[6] <= 6 + 3  # the limit, plus what one request held while it ran past it


def test_the_next_turn_copies_the_last_partial_block_and_replies_as_without_the_cache(
        tiny_model_dirs: dict[str, Path]) -> None:
    """A finished request's last block, never full, is kept: the next turn (its prompt, its reply, then more) copies
    those tokens' KV instead of computing them, and replies exactly as an engine without prefix caching does."""
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    prompt = [(5 * j) % 200 + 3 for j in range(21)]  # one full block of 16, then 5 tokens
    replies, hits = {}, {}
    for caching in (True, False):
        llm = LLM(tiny_model_dirs["llama"], dtype="float32", start_loop=False, enable_prefix_caching=caching)
        try:
            first = llm.generate([prompt], params)[0].token_ids
            bm = llm.engine.block_manager
            before = bm.num_prefix_hit_tokens
            turn = prompt + first + [9, 8, 7]
            replies[caching] = (first, llm.generate([turn], params)[0].token_ids)
            hits[caching] = bm.num_prefix_hit_tokens - before
        finally:
            llm.close()
    assert replies[True] == replies[False]
    # the first request computed its prompt and 5 of its 6 reply tokens: 26, one full block and 10 more
    assert hits[True] == 26 and hits[False] == 0
