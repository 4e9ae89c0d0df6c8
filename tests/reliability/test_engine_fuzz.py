"""A seeded fuzz of the engine's request lifecycle: it ends with every block free, empty queues and a live loop.

The engine runs on its own loop thread (as under the server) with a KV pool so small that preemption is certain.
A seeded random stream of at least 500 operations submits (random priorities, lengths, greedy and sampled, some
with seeds), cancels in-flight requests, and waits for some to finish. Afterwards nothing may be left behind.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import LLM
from engine.api import CapacityError, SamplingParams
from tests.engine.conftest import build_tiny_model

NUM_OPERATIONS = 600
#: KV pool of the fuzzed engine: 10 blocks of 16 tokens for the tiny llama (2 layers, 2 KV heads of 16, fp32).
BLOCK_BYTES = 2 * 2 * 2 * 16 * 4 * 16
FINAL_DRAIN_S = 120.0


@pytest.fixture(scope="module")
def fuzz_llm(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Iterator[Any]:
    folder = build_tiny_model("llama", tmp_path_factory.mktemp("fuzz") / "llama", default_model_dir, seed=3)
    llm = LLM(folder, dtype="float32", kv_cache_bytes=11 * BLOCK_BYTES, max_batch_size=6, max_waiting=64)
    yield llm
    llm.close()


def _random_params(rng: random.Random) -> SamplingParams:
    if rng.random() < 0.5:
        return SamplingParams(max_tokens=rng.randint(1, 24), temperature=0.0, ignore_eos=rng.random() < 0.7)
    return SamplingParams(
        max_tokens=rng.randint(1, 24),
        temperature=rng.choice([1e-9, 0.3, 0.8, 1.5, 100.0]),
        top_p=rng.choice([1.0, 0.9, 0.5]),
        top_k=rng.choice([0, 1, 5, 50]),
        repetition_penalty=rng.choice([1.0, 1.3, 0.01, 100.0]),
        seed=rng.choice([None, 0, 2**64 - 1, rng.randrange(2**64)]),
        ignore_eos=rng.random() < 0.5,
    )


def test_random_submit_cancel_and_preemption_leave_nothing_behind(fuzz_llm: Any) -> None:
    rng = random.Random(20261130)
    engine = fuzz_llm.engine
    handles: list[Any] = []
    counts = {"submitted": 0, "cancelled": 0, "refused": 0, "waited": 0}
    for _ in range(NUM_OPERATIONS):
        op = rng.random()
        live = [h for h in handles if not h.done()]
        if op < 0.55:
            prompt = [rng.randrange(10, 400) for _ in range(rng.randint(1, 60))]
            try:
                handles.append(engine.submit(prompt, _random_params(rng), priority=rng.randint(-2, 3)))
                counts["submitted"] += 1
            except CapacityError:
                counts["refused"] += 1
        elif op < 0.8 and live:
            rng.choice(live).cancel()
            counts["cancelled"] += 1
        elif live:
            rng.choice(live).result(timeout=30)
            counts["waited"] += 1
        else:
            time.sleep(0.001)
    deadline = time.monotonic() + FINAL_DRAIN_S
    for handle in handles:
        handle.result(timeout=max(0.1, deadline - time.monotonic()))
    assert counts["submitted"] > 200 and counts["cancelled"] > 50, counts
    finish_reasons = {h.result(timeout=0).finish_reason for h in handles}
    assert finish_reasons <= {"stop", "length", "abort"}, finish_reasons
    assert {"length", "abort"} <= finish_reasons
    # the loop thread settles its counters after delivering the last output
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        m = fuzz_llm.metrics()
        if m.kv_blocks_used == 0 and m.num_running == 0 and m.num_waiting == 0:
            break
        time.sleep(0.01)
    m = fuzz_llm.metrics()
    assert (m.kv_blocks_used, m.num_running, m.num_waiting) == (0, 0, 0), m
    assert m.num_preemptions > 0, "the pool was meant to be small enough to force preemption"
    # the loop is alive: a new request still completes
    out = engine.submit([5, 6, 7], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)).result(timeout=30)
    assert len(out.token_ids) == 3
