"""The adaptive concurrency controller: fast back-off, slow growth, memory pressure, and priority for the chat."""

from __future__ import annotations

import itertools
import time

from engine.api import EngineConfig, EngineMetrics, SamplingParams
from engine.core.block_manager import BlockManager
from engine.core.controller import ConcurrencyController, StepReport, p90
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from tests.engine.conftest import TinyLLM


def _report(now: float, itl: float | None, alone: bool = False, running: int = 8, waiting: int = 4,
            kv_free: float = 0.5, memory: float | None = 0.3) -> StepReport:
    return StepReport(now, running, waiting, itl, alone, kv_free, memory)


def test_it_backs_off_by_half_when_the_chat_slows_and_grows_back_one_at_a_time() -> None:
    c = ConcurrencyController(max_limit=16, max_token_budget=512, grow_interval_s=1.0, decide_interval_s=0.1)
    t = 0.0
    for _ in range(5):  # solo figure: 20 ms between tokens
        t += 0.02
        c.observe(_report(t, 0.02, alone=True, running=1, waiting=0))
    assert c.solo_itl_s is not None and abs(c.solo_itl_s - 0.02) < 1e-9
    for _ in range(5):  # crowded: 60 ms, three times solo
        t += 0.06
        c.observe(_report(t, 0.06, running=16))
    assert c.limit == 8 and c.token_budget == 256 and c.window_scale == 0.0
    assert c.adjustments_total == 1
    for _ in range(5):  # still missing on the new setting's own samples: halve again
        t += 0.06
        c.observe(_report(t, 0.06, running=8))
    assert c.limit == 4 and c.adjustments_total == 2
    for _ in range(200):  # back within target, the batch full and a queue: grow slowly
        t += 0.03
        c.observe(_report(t, 0.03, running=c.limit, waiting=5))
    assert 4 < c.limit <= 16
    assert c.limit - 4 <= int(200 * 0.03 / 1.0) + 1, "one step of growth per grow interval at most"
    assert c.metrics(EngineMetrics()).concurrency_limit == c.limit
    c.observe(_report(t + 1, None, running=0, waiting=0))  # idle: back to full size
    assert (c.limit, c.token_budget, c.window_scale) == (16, 512, 1.0)


def test_among_equals_only_memory_backs_off() -> None:
    """Sixteen streams of one priority: batching them is the point, so slower tokens are no reason to shrink."""
    c = ConcurrencyController(max_limit=16, max_token_budget=512, decide_interval_s=0.0)
    c.observe(_report(0.0, 0.02, alone=True, running=1, waiting=0))
    for i in range(10):
        report = _report(0.1 * (i + 1), 0.08, running=16)
        report.top_outranks = False
        c.observe(report)
    assert c.limit == 16 and c.adjustments_total == 0


def test_memory_pressure_backs_off_even_when_latency_is_fine() -> None:
    c = ConcurrencyController(max_limit=16, max_token_budget=512, decide_interval_s=0.0)
    c.observe(_report(1.0, None, running=12, kv_free=0.01, waiting=3))
    assert c.limit == 6
    c2 = ConcurrencyController(max_limit=16, max_token_budget=512, decide_interval_s=0.0)
    c2.observe(_report(1.0, None, running=10, memory=0.97))
    assert c2.limit == 5


def test_p90_is_nearest_rank() -> None:
    assert p90([]) == 0.0
    assert p90([float(i) for i in range(1, 11)]) == 9.0


def test_a_waiting_chat_preempts_the_least_urgent_running_request() -> None:
    bm = BlockManager(num_blocks=64, block_size=16)
    sched = Scheduler(EngineConfig(max_batch_size=2, max_wait_ms=0), bm)
    params = SamplingParams(max_tokens=4)
    server = [Sequence(f"s{i}", [1, 2, 3], params, priority=5) for i in range(2)]
    for seq in server:
        sched.add(seq)
    sched.postprocess(sched.schedule())
    assert {s.request_id for s in sched.running} == {"s0", "s1"}
    chat = Sequence("chat", [4, 5, 6], params, priority=0)
    sched.add(chat)
    batch = sched.schedule()
    assert "chat" in [s.request_id for s in batch.seqs]
    assert sched.num_preemptions == 1 and len(sched.running) == 2


def test_the_chat_keeps_its_pace_with_24_server_requests_in_flight(tiny_llm: TinyLLM) -> None:
    """Benchmark-style: reports the chat's p90 time between tokens; asserts only that nothing is lost."""
    llm = tiny_llm(start_loop=True, kv_cache_bytes=16 << 20, max_batch_size=16)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    solo = llm.engine.submit([7, 8, 9], params, priority=0).result(timeout=60)
    server = [llm.engine.submit([10 + i, 11, 12, 13], params, priority=5) for i in range(24)]
    time.sleep(0.05)
    stamps: list[float] = []
    chat = llm.engine.submit([7, 8, 9], params, priority=0, on_output=lambda _o: stamps.append(time.monotonic()))
    out = chat.result(timeout=120)
    assert out.token_ids == solo.token_ids
    assert all(h.result(timeout=120).finish_reason == "length" for h in server), "no server request is lost"
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    m = llm.metrics()
    print(f"chat p90 ITL {1000 * p90(gaps):.1f} ms; concurrency limit {m.concurrency_limit}, "
          f"{m.controller_adjustments_total} adjustments")
    assert m.kv_blocks_used == 0
