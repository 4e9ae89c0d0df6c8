"""Admission, token budget, chunked prefill, priorities, preemption and the batching window, without a model."""

from __future__ import annotations

from engine.api import EngineConfig, SamplingParams
from engine.core.block_manager import BlockManager
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence


def _scheduler(num_blocks: int = 64, **cfg: object) -> Scheduler:
    config = EngineConfig(block_size=4, **cfg)  # type: ignore[arg-type]
    return Scheduler(config, BlockManager(num_blocks, 4))


def _seq(n: int, rid: str, priority: int = 0) -> Sequence:
    return Sequence(rid, list(range(1, n + 1)), SamplingParams(), priority=priority)


def _decode(sched: Scheduler) -> None:
    """Pretend the model ran: advance counts and append one sampled token to finished prefills."""
    batch = sched.schedule()
    sched.postprocess(batch)
    for seq in batch.seqs:
        if seq.num_computed_tokens == len(seq.token_ids):
            seq.token_ids.append(7)


def test_long_prompt_is_chunked_and_does_not_stall_running_streams() -> None:
    sched = _scheduler(max_num_batched_tokens=32, max_wait_ms=0)
    short = _seq(5, "short")
    sched.add(short)
    _decode(sched)
    sched.add(_seq(100, "long"))
    batch = sched.schedule()
    by_id = {s.request_id: n for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True)}
    assert by_id["short"] == 1
    assert by_id["long"] == 31
    assert batch.num_prefill_tokens == 31
    assert batch.num_decode_tokens == 1


def test_lower_priority_value_is_admitted_first() -> None:
    sched = _scheduler(max_batch_size=1, max_wait_ms=0)
    sched.add(_seq(4, "background", priority=5))
    sched.add(_seq(4, "chat", priority=0))
    batch = sched.schedule()
    assert [s.request_id for s in batch.seqs] == ["chat"]


def test_preemption_frees_blocks_and_requeues() -> None:
    sched = _scheduler(num_blocks=5, max_wait_ms=0)  # 4 usable blocks of 4 tokens
    a, b = _seq(7, "a"), _seq(7, "b")
    sched.add(a)
    sched.add(b)
    _decode(sched)  # both admitted and prefilled: 2 blocks each, 8 tokens each now
    assert sched.num_running == 2
    _decode(sched)  # token 8 fits in the second block; 9 tokens now
    _decode(sched)  # token 9 of each needs a third block: b, the later arrival, is preempted
    assert sched.num_preemptions >= 1
    assert b in sched.waiting and b.block_table == [] and b.num_computed_tokens == 0


def _arrive_after(sched: Scheduler, seconds: float, rid: str) -> None:
    """An arrival ``seconds`` after the one before (the last arrival's time moved back instead of sleeping)."""
    if sched._last_arrival is not None:
        sched._last_arrival -= seconds
    sched.add(_seq(3, rid))


def test_batch_window_adapts_to_arrival_rate() -> None:
    sched = _scheduler(max_wait_ms=50)
    assert sched.batch_window_s() == 0.0  # a lone request is not held back
    for i in range(4):
        sched.add(_seq(3, f"burst{i}"))  # arrivals microseconds apart
    assert sched.batch_window_s() == 0.05
    for i in range(6):
        _arrive_after(sched, 1.0, f"slow{i}")  # one at a time: waiting would only add latency
    assert sched.batch_window_s() == 0.0


def test_a_pause_between_bursts_keeps_the_window_for_the_next_burst() -> None:
    """Eight clients that send at once, then pause for seconds, then send at once again: the first of the next
    burst waits for the others (a moving average of the gaps let each pause close the window)."""
    sched = _scheduler(max_wait_ms=5, max_batch_size=8)
    for burst in range(3):
        _arrive_after(sched, 5.0, f"b{burst}-0")
        if burst:
            assert sched.batch_window_s() == 0.005  # the first of this burst waits
        for i in range(1, 8):
            sched.add(_seq(3, f"b{burst}-{i}"))
        sched.waiting.clear()
    assert sched.batch_window_s() == 0.005


def test_full_batch_is_admitted_without_waiting() -> None:
    sched = _scheduler(max_wait_ms=1000, max_batch_size=2)
    sched.add(_seq(3, "a"))
    sched.add(_seq(3, "b"))
    assert sched.admission_delay_s() == 0.0
    assert len(sched.schedule()) == 2
