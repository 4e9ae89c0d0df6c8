"""Kernel choice by measurement: the plan logic on fake timings, per-bucket dispatch, the on-disk cache, plans too
noisy to cache, and ``python -m engine info --retune``."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.model import autotune, kernel_timing
from engine.model.autotune import Tuner, choose
from engine.model.kernel_timing import BUCKETS, Measurement, bucket_index
from engine.model.plan_cache import CACHE_FILENAME, Plan, PlanCache
from engine.model.tuned_linear import TunedLinear


def _always(name: str, beside: str) -> bool:
    return True


def _never(name: str, beside: str) -> bool:
    return False


def test_buckets_cover_every_row_count() -> None:
    assert [bucket_index(r) for r in (1, 2, 4, 5, 16, 17, 4096)] == [0, 1, 1, 2, 2, 3, 3]
    assert [bucket_index(r) for r in BUCKETS] == [0, 1, 2, 3]


def test_one_kernel_when_it_wins_everywhere() -> None:
    plan = choose({"int4": [10, 20, 50, 100], "dense": [30, 40, 60, 110]}, "int4", _always)
    assert plan.kernels == ("int4",) * 4
    assert plan.used == ["int4"]


def test_a_second_kernel_takes_the_buckets_where_it_pays() -> None:
    """The measured case of an AVX512_BF16 CPU: int4 wins a GEMV, bf16 dense wins batched rows."""
    timings = {"int4": [18, 31, 106, 413], "dense": [42, 48, 78, 215]}
    plan = choose(timings, "int4", _always)
    assert plan.kernels == ("int4", "int4", "dense", "dense")
    assert "dense for 5-16, 17+ rows" in plan.reason
    # without memory for a second kernel, the one with the least total slowdown runs everything
    alone = choose(timings, "int4", _never)
    assert len(alone.used) == 1
    assert "not kept" in alone.reason


def test_small_gains_and_ties_keep_one_kernel_and_prefer_the_stored_one() -> None:
    plan = choose({"dense": [100, 100, 100, 100], "fp16_packed": [95, 95, 95, 95]}, "dense", _always)
    assert plan.used == ["fp16_packed"]  # faster everywhere, though by less than MIN_GAIN: no second kernel
    tie = choose({"dense": [50, 50, 50, 50], "fp16_packed": [50, 50, 50, 50]}, "dense", _always)
    assert tie.used == ["dense"]


class _Fake:
    def __init__(self, value: float, nbytes: int = 100, input_dtype: torch.dtype | None = None) -> None:
        self.value, self._nbytes, self.calls = value, nbytes, 0
        if input_dtype is not None:
            self.input_dtype = input_dtype
        self.seen: list[torch.dtype] = []

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.seen.append(x.dtype)
        return torch.full((x.shape[0], 2), self.value, dtype=x.dtype)

    @property
    def nbytes(self) -> int:
        return self._nbytes


def test_tuned_linear_dispatches_by_rows_and_casts_for_its_kernel() -> None:
    small, big = _Fake(1.0), _Fake(2.0, input_dtype=torch.float32)
    plan = choose({"small": [1, 1, 9, 9], "big": [9, 9, 1, 1]}, "small", _always)
    layer = TunedLinear({"small": small, "big": big}, plan, shared=frozenset({"big"}))
    x1, x20 = torch.ones(1, 4, dtype=torch.bfloat16), torch.ones(20, 4, dtype=torch.bfloat16)
    assert float(layer(x1)[0, 0]) == 1.0
    out = layer(x20)
    assert float(out[0, 0]) == 2.0 and out.dtype == torch.bfloat16
    assert big.seen == [torch.float32]
    assert layer.nbytes == 100  # the shared kernel costs nothing


def test_plans_are_cached_per_machine_and_shape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = {"int4": [10.0, 20.0, 300.0, 900.0], "dense": [30.0, 35.0, 50.0, 100.0]}
    measured: list[str] = []

    def fake_time(kernel: _Fake, rows: int, in_features: int, dtype: torch.dtype) -> list[float]:
        name = "int4" if kernel.value == 4 else "dense"
        measured.append(name)
        return [fake[name][BUCKETS.index(rows)]] * kernel_timing._REPEATS  # steady: every call alike

    monkeypatch.setattr(kernel_timing, "time_kernel", fake_time)
    cache = PlanCache(tmp_path / "autotune.json")
    kernels = {"int4": _Fake(4), "dense": _Fake(16)}
    tuner = Tuner(torch.bfloat16, cache, extra_budget=10_000, layers=30)
    plan = tuner.plan_for("qkv", (8, 4), kernels, "int4", frozenset())
    assert plan.kernels == ("int4", "int4", "dense", "dense") and not plan.cached and plan.noise == 0
    assert len(measured) == 8 * kernel_timing._ROUNDS  # 2 kernels x 4 buckets, per round
    assert tuner.plan_for("qkv", (8, 4), kernels, "int4", frozenset()) is plan  # once per shape and role
    assert tuner.budget == 10_000 - 100 * 30  # the second kernel is held by every layer
    # a later load reads the plan back without measuring
    again = Tuner(torch.bfloat16, PlanCache(tmp_path / "autotune.json"), extra_budget=10_000, layers=30)
    cached = again.plan_for("qkv", (8, 4), kernels, "int4", frozenset())
    assert cached.cached and cached.kernels == plan.kernels and len(measured) == 8 * kernel_timing._ROUNDS
    # too little memory for 30 dense copies: one kernel
    poor = Tuner(torch.bfloat16, None, extra_budget=100, layers=30)
    assert len(poor.plan_for("qkv", (8, 4), kernels, "int4", frozenset()).used) == 1


class _CountsRows(_Fake):
    """Each row's output depends on how many rows share the call (not row-invariant)."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return super().__call__(x) + x.shape[0]


def test_deterministic_plans_run_one_row_invariant_kernel_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kernel_timing, "time_kernel", lambda kernel, rows, in_features, dtype: [1.0] * kernel_timing._REPEATS)
    kernels = {"fast": _CountsRows(1.0), "steady": _Fake(2.0)}
    tuner = Tuner(torch.bfloat16, PlanCache(tmp_path / "autotune.json"), 10_000, 30, deterministic=True)
    plan = tuner.plan_for("qkv", (8, 4), kernels, "fast", frozenset())
    assert plan.kernels == ("steady",) * 4 and "fast not row-invariant" in plan.reason
    again = Tuner(torch.bfloat16, PlanCache(tmp_path / "autotune.json"), 10_000, 30, deterministic=True)
    assert again.plan_for("qkv", (8, 4), kernels, "fast", frozenset()).cached
    # the usual plans are cached apart: they may keep the faster kernel
    usual = Tuner(torch.bfloat16, PlanCache(tmp_path / "autotune.json"), 10_000, 30)
    assert not usual.plan_for("qkv", (8, 4), kernels, "fast", frozenset()).cached


def _probing(monkeypatch: pytest.MonkeyPatch, base: dict[str, list[float]], invariant: set[str]) -> list[str]:
    """Fake timings per kernel (its name is ``list(base)[value]``) and invariance; returns the kernels probed."""
    probed: list[str] = []

    def fake_time(kernel: _Fake, rows: int, in_features: int, dtype: torch.dtype) -> list[float]:
        return [base[list(base)[int(getattr(kernel, "kernel", kernel).value)]][BUCKETS.index(rows)]] * 2

    def fake_multiple(kernel: _Fake, in_features: int, dtype: torch.dtype) -> int | None:
        probed.append(name := list(base)[int(kernel.value)])
        return 1 if name in invariant else None

    monkeypatch.setattr(kernel_timing, "time_kernel", fake_time)
    monkeypatch.setattr(autotune, "row_multiple", fake_multiple)
    return probed


def _deterministic_plan(kernels: dict[str, _Fake]) -> Plan:
    tuner = Tuner(torch.bfloat16, None, 10_000, 30, deterministic=True)
    return tuner.plan_for("lm_head", (8, 4), kernels, "int8", frozenset())  # type: ignore[arg-type]


def test_a_candidate_that_cannot_outrank_an_invariant_one_is_not_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Probing the lm_head's slow candidates costs more than timing them: the candidates are timed, then probed
    fastest first. Once "nibbles" is found invariant, "int8" and "dense" (slower) and "close" (ahead by a hair at
    one row, far behind elsewhere) cannot outrank it whatever the others: they are not probed."""
    base = {
        "int8": [10.0, 20.0, 100.0, 400.0],
        "dense": [12.0, 40.0, 200.0, 800.0],
        "close": [9.99, 40.0, 200.0, 800.0],
        "nibbles": [12.0, 10.0, 105.0, 420.0],
    }
    kernels = {name: _Fake(float(i)) for i, name in enumerate(base)}
    probed = _probing(monkeypatch, base, invariant=set(base))
    plan = _deterministic_plan(kernels)
    assert plan.kernels == ("nibbles",) * 4 and probed == ["nibbles"] and set(plan.timings_us) == {"nibbles"}
    assert all(f"{name} not probed (slower than nibbles overall)" in plan.reason for name in ("int8", "dense", "close"))
    # the fastest is not invariant: the next one is probed, then only those that might outrank it
    probed = _probing(monkeypatch, {**base, "nibbles": [1.0] * 4}, invariant={"int8", "dense", "close"})
    plan = _deterministic_plan(kernels)
    assert probed == ["nibbles", "int8"] and plan.kernels == ("int8",) * 4
    assert "nibbles not row-invariant" in plan.reason and "close not probed (slower than int8" in plan.reason
    # "nibbles" ranks after the invariant "int8" among all candidates, but might outrank it without "fast" (which
    # holds the best call at 4 rows): it is probed, and it wins among the invariant ones
    base = {"int8": [10.0, 20.0, 10.0, 10.0], "nibbles": [8.0, 22.0, 10.5, 10.5], "fast": [50.0, 10.0, 50.0, 50.0]}
    kernels = {name: _Fake(float(i)) for i, name in enumerate(base)}
    probed = _probing(monkeypatch, base, invariant={"int8", "nibbles"})
    plan = _deterministic_plan(kernels)
    assert probed == ["int8", "nibbles"] and plan.kernels == ("nibbles",) * 4
    assert "fast not probed (slower than int8 overall)" in plan.reason


def test_a_candidate_that_ties_an_invariant_one_is_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tie goes to the preferred kernel: a candidate no slower than an invariant one might be chosen."""
    probed = _probing(monkeypatch, {"dense": [5.0] * 4, "int8": [5.0] * 4}, invariant={"dense", "int8"})
    kernels = {"dense": _Fake(0.0), "int8": _Fake(1.0)}
    plan = Tuner(torch.bfloat16, None, 10_000, 30, deterministic=True).plan_for(
        "lm_head", (8, 4), kernels, "dense", frozenset()
    )
    assert sorted(probed) == ["dense", "int8"] and plan.kernels == ("dense",) * 4


def test_untimed_deterministic_plans_probe_the_preferred_kernel_first_and_stop_at_an_invariant_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    probed = _probing(monkeypatch, {"a": [1.0] * 4, "b": [1.0] * 4, "c": [1.0] * 4}, invariant={"a", "c"})
    kernels = {"a": _Fake(0.0), "b": _Fake(1.0), "c": _Fake(2.0)}
    tuner = Tuner(torch.bfloat16, None, 10_000, 30, deterministic=True, timed=False)
    assert tuner.plan_for("qkv", (8, 4), kernels, "c", frozenset()).kernels == ("c",) * 4 and probed == ["c"]
    probed.clear()
    tuner = Tuner(torch.bfloat16, None, 10_000, 30, deterministic=True, timed=False)
    assert tuner.plan_for("o", (8, 4), kernels, "b", frozenset()).kernels == ("a",) * 4 and probed == ["b", "a"]


def test_noise_is_how_far_the_median_call_is_from_the_best() -> None:
    quiet = Measurement({"a": [10.0, 20.0], "b": [5.0, 5.0]}, {"a": [11.0, 21.0], "b": [5.0, 5.0]})
    assert quiet.noise == pytest.approx(0.1)
    assert Measurement({"a": [10.0, 20.0]}, {"a": [11.0, 60.0]}).noise == pytest.approx(2.0)


def test_a_near_tie_measured_with_little_noise_is_trusted_whichever_kernel_wins() -> None:
    measured = Measurement({"dense": [100.0] * 4, "fp16": [99.0] * 4}, {"dense": [101.0] * 4, "fp16": [104.0] * 4})
    by_median = choose(measured.median, "dense", _always).kernels
    plan = autotune.judge(choose(measured.best, "dense", _always), measured, by_median)
    assert plan.used == ["fp16"] and by_median == ("dense",) * 4
    assert plan.trusted and plan.noise == pytest.approx(0.0505, abs=1e-3)


class _Timings:
    """Fake call times of the int4 (value 4) and dense (16) kernels: during the first ``busy_rounds`` rounds,
    the calls of the kernels in ``slowed`` run ``factor`` times slower."""

    def __init__(self, busy_rounds: int = 0, factor: float = 1.0, slowed: tuple[int, ...] = (4, 16)) -> None:
        self.base = {4: [10.0, 20.0, 300.0, 900.0], 16: [30.0, 35.0, 50.0, 100.0]}
        self.busy_rounds, self.factor, self.slowed, self.calls = busy_rounds, factor, slowed, 0

    def __call__(self, kernel: Any, rows: int, in_features: int, dtype: torch.dtype) -> list[float]:
        value = int(getattr(kernel, "kernel", kernel).value)  # a deterministic plan times PaddedRows(kernel)
        busy = self.calls // 8 < self.busy_rounds and value in self.slowed  # 2 kernels x 4 buckets per round
        self.calls += 1
        return [self.base[value][BUCKETS.index(rows)] * (self.factor if busy else 1.0)] * 5


def _plan(path: Path) -> Plan:
    kernels = {"int4": _Fake(4), "dense": _Fake(16)}
    return Tuner(torch.bfloat16, PlanCache(path), 10_000, 30).plan_for("qkv", (8, 4), kernels, "int4", frozenset())


def test_a_plan_too_noisy_to_separate_the_candidates_runs_and_is_measured_again_on_a_quiet_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Two rounds of three ran while the cores were busy, slowing the dense kernel: its median calls would
    choose int4 for 5-16 rows. The best calls still choose this load's plan; it is cached as provisional, run by
    later loads on a busy machine, and measured again by the first load on a quiet one."""
    monkeypatch.setattr(kernel_timing, "time_kernel", _Timings(busy_rounds=2, factor=6.0, slowed=(16,)))
    monkeypatch.setattr(autotune, "machine_quiet", lambda: False)
    path = tmp_path / "autotune.json"
    with caplog.at_level(logging.INFO, logger="engine"):
        plan = _plan(path)
    assert plan.kernels == ("int4", "int4", "dense", "dense") and not plan.trusted  # used for this load
    assert plan.noise == pytest.approx(5.0) and plan.noise > autotune.MAX_NOISE
    assert "provisional, too noisy to separate the candidates" in caplog.text and "500%" in caplog.text
    # a busy machine runs the provisional plan rather than measure again
    busy = _Timings()
    monkeypatch.setattr(kernel_timing, "time_kernel", busy)
    reused = _plan(path)
    assert reused.cached and not reused.trusted and reused.kernels == plan.kernels and busy.calls == 0
    # a quiet one measures again; its plan is trusted, cached, and read back by the load after
    monkeypatch.setattr(autotune, "machine_quiet", lambda: True)
    again = _plan(path)
    assert not again.cached and again.trusted and again.noise == 0 and busy.calls == 8 * kernel_timing._ROUNDS
    third = _plan(path)
    assert third.cached and third.trusted and third.kernels == again.kernels and third.noise == 0
    assert busy.calls == 8 * kernel_timing._ROUNDS  # read back, nothing measured


def test_a_shape_measured_too_noisily_every_time_is_measured_again_only_so_often(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(autotune, "machine_quiet", lambda: True)
    path = tmp_path / "autotune.json"
    loads = []
    for _ in range(autotune.MAX_REMEASURES + 3):
        timings = _Timings(busy_rounds=2, factor=6.0, slowed=(16,))
        monkeypatch.setattr(kernel_timing, "time_kernel", timings)
        plan = _plan(path)
        loads.append(timings.calls > 0)
        assert not plan.trusted and plan.kernels == ("int4", "int4", "dense", "dense")
    # the first load, then MAX_REMEASURES more; later loads run the last provisional plan
    assert loads == [True] * (1 + autotune.MAX_REMEASURES) + [False] * 2
    assert PlanCache(path).get(next(iter(json.loads(path.read_text())))) == plan


def test_noise_that_cannot_change_the_plan_does_not_stop_caching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every kernel slowed alike for most of the measurement: the median calls choose the same plan
    monkeypatch.setattr(kernel_timing, "time_kernel", _Timings(busy_rounds=2, factor=6.0))
    plan = _plan(tmp_path / "busy.json")
    assert plan.noise == pytest.approx(5.0) and plan.trusted and _plan(tmp_path / "busy.json").cached
    # one disturbed round of three: the median call is a quiet one
    monkeypatch.setattr(kernel_timing, "time_kernel", _Timings(busy_rounds=1, factor=6.0, slowed=(16,)))
    assert _plan(tmp_path / "once.json").noise == 0 and _plan(tmp_path / "once.json").cached


class _Sleeps(_Fake):
    """A kernel whose every call takes ``seconds``."""

    def __init__(self, seconds: float) -> None:
        super().__init__(1.0)
        self.seconds = seconds

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return super().__call__(x)


def test_long_calls_are_warmed_up_and_timed_fewer_times(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel_timing, "_evict_caches", lambda: None)
    monkeypatch.setattr(kernel_timing, "_WARMUP_BUDGET_S", 0.01)
    monkeypatch.setattr(kernel_timing, "_REPEAT_BUDGET_S", 0.03)
    quick = _Fake(1.0)
    kernel_timing.warm_up(quick, 4, 8, torch.float32)
    assert quick.calls == kernel_timing._WARMUP
    assert len(kernel_timing.time_kernel(quick, 4, 8, torch.float32)) == kernel_timing._REPEATS
    slow = _Sleeps(0.02)  # past the warm-up budget in one call, the timed budget in two
    kernel_timing.warm_up(slow, 4, 8, torch.float32)
    times = kernel_timing.time_kernel(slow, 4, 8, torch.float32)
    assert slow.calls == 1 + 2 and len(times) == 2 and min(times) >= 20_000
    slower = _Sleeps(0.04)
    assert len(kernel_timing.time_kernel(slower, 4, 8, torch.float32)) == 1 and slower.calls == 1


def test_a_long_warm_up_call_is_kept_as_the_first_rounds_timed_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """At 64 rows the warm-up call takes the whole timing budget: it is the first round's sample, and only the
    later rounds time calls there."""
    long_us = kernel_timing._REPEAT_BUDGET_S * 1e6 * 2
    monkeypatch.setattr(kernel_timing, "warm_up", lambda kernel, rows, in_features, dtype: long_us if rows == 64 else 5.0)
    timed: list[int] = []

    def fake_time(kernel: _Fake, rows: int, in_features: int, dtype: torch.dtype) -> list[float]:
        timed.append(rows)
        return [long_us / 2]

    monkeypatch.setattr(kernel_timing, "time_kernel", fake_time)
    measured = autotune.measure({"a": _Fake(1.0)}, 8, torch.float32)
    assert timed.count(64) == kernel_timing._ROUNDS - 1 and timed.count(16) == kernel_timing._ROUNDS
    assert measured.best["a"][3] == long_us / 2 and measured.median["a"][3] == long_us / 2


def test_weights_twice_the_cache_are_timed_without_flushing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    flushes: list[None] = []
    monkeypatch.setattr(kernel_timing, "_evict_caches", lambda: flushes.append(None))
    monkeypatch.setattr(kernel_timing, "_cache_bytes", lambda: 1000)
    assert len(kernel_timing.time_kernel(_Fake(1.0, nbytes=1999), 4, 8, torch.float32)) == len(flushes) > 0
    flushes.clear()
    assert kernel_timing.time_kernel(_Fake(1.0, nbytes=2000), 4, 8, torch.float32) and not flushes


def test_only_the_first_round_warms_up(monkeypatch: pytest.MonkeyPatch) -> None:
    warmed: list[tuple[str, int]] = []
    monkeypatch.setattr(kernel_timing, "warm_up", lambda kernel, rows, in_features, dtype: warmed.append((kernel, rows)))
    monkeypatch.setattr(kernel_timing, "time_kernel", lambda kernel, rows, in_features, dtype: [1.0])
    autotune.measure({"a": "ka", "b": "kb"}, 8, torch.float32)  # type: ignore[dict-item]
    assert warmed == [(k, rows) for k in ("ka", "kb") for rows in BUCKETS]


def test_a_kernel_far_slower_on_long_calls_is_timed_there_only_in_the_first_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At 64 rows "far" takes 5x the fastest kernel's 20 ms: timed there once. "near" (2x) is timed every round,
    and so are "far" and "tiny" at 16 rows (5x, but of microseconds); the plan still takes the fastest kernel."""
    base = {"fast": [5.0, 10.0, 40.0, 20_000.0], "near": [6.0, 11.0, 45.0, 40_000.0], "far": [9.0, 12.0, 200.0, 1e5]}
    base["tiny"] = [25.0, 50.0, 200.0, 30_000.0]
    kernels = {name: _Fake(float(i)) for i, name in enumerate(base)}
    calls: dict[tuple[str, int], int] = {}

    def fake_time(kernel: _Fake, rows: int, in_features: int, dtype: torch.dtype) -> list[float]:
        name = list(base)[int(kernel.value)]
        calls[(name, rows)] = calls.get((name, rows), 0) + 1
        return [base[name][BUCKETS.index(rows)]] * 2

    monkeypatch.setattr(kernel_timing, "time_kernel", fake_time)
    measured = autotune.measure(kernels, 8, torch.bfloat16)
    assert calls.pop(("far", 64)) == 1 and set(calls.values()) == {kernel_timing._ROUNDS}
    assert measured.best["far"] == base["far"] and measured.noise == 0
    assert choose(measured.best, "near", _always).kernels == ("fast",) * 4


def test_the_machine_is_quiet_when_its_load_is_under_half_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel_timing.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(kernel_timing.os, "getloadavg", lambda: (3.0, 1.0, 1.0))
    assert kernel_timing.machine_quiet()
    monkeypatch.setattr(kernel_timing.os, "getloadavg", lambda: (4.5, 1.0, 1.0))
    assert not kernel_timing.machine_quiet()


def test_retune_removes_this_machines_plans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], default_model_dir: Path
) -> None:
    from engine.__main__ import main

    monkeypatch.setenv("HEARTH_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(kernel_timing, "time_kernel", _Timings())
    path = tmp_path / CACHE_FILENAME
    _plan(path)
    Tuner(torch.bfloat16, PlanCache(), 10_000, 30, deterministic=True).plan_for(
        "qkv", (8, 4), {"int4": _Fake(4), "dense": _Fake(16)}, "int4", frozenset()
    )
    other = "v5|Another CPU|torch 2.0|4 threads|qkv|8x4|bfloat16|dense,int4"
    path.write_text(json.dumps({**json.loads(path.read_text()), other: {"kernels": ["dense"] * 4}}))

    assert main(["info", str(default_model_dir), "--quantization", "off", "--retune"]) == 0
    out = capsys.readouterr().out
    assert "removed 2 kernel plans" in out and str(path) in out
    assert list(json.loads(path.read_text())) == [other]  # another machine's plans stay
    assert not _plan(path).cached


def test_a_cached_plan_builds_only_the_kernels_it_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A later load reads the plan before building: the candidates it does not run (the lm_head's packed copies cost
    seconds on a 1B model) are never built."""
    from engine.model import kernels as kernels_module
    from engine.model.kernels import KernelBuilder

    built: list[str] = []
    monkeypatch.setattr(kernels_module, "fbgemm_fp16_available", lambda: True)
    monkeypatch.setattr(kernels_module, "PackedFp16Linear", lambda w, b: built.append("fp16_packed") or _Fake(2))
    monkeypatch.setattr(kernels_module, "DenseLinear", lambda w, b: built.append("dense") or _Fake(1))
    cache = PlanCache(tmp_path / "autotune.json")
    weight = torch.zeros(8, 4)
    key = PlanCache.key("o", (8, 4), torch.bfloat16, ["dense", "fp16_packed"])
    cache.put(key, Plan(("fp16_packed",) * len(BUCKETS), {}, "fp16_packed is fastest"))
    tuner = Tuner(torch.bfloat16, PlanCache(tmp_path / "autotune.json"), extra_budget=0, layers=2)
    builder = KernelBuilder(None, torch.bfloat16, torch.device("cpu"), "auto", None, tuner)
    first = builder("o", ["o"], weight, None)
    second = builder("o", ["o"], weight, None)
    assert built == ["fp16_packed", "fp16_packed"]  # one per layer, and no dense copy
    assert isinstance(first, TunedLinear) and first.plan.cached and second.plan is first.plan
    assert [c.role for c in tuner.choices] == ["o"]
    # with no plan cached, a load that measures later builds only the kernel it runs; the measurement the others
    fresh_tuner = Tuner(torch.bfloat16, PlanCache(tmp_path / "other.json"), 0, 2, defer=True)
    fresh = KernelBuilder(None, torch.bfloat16, torch.device("cpu"), "auto", None, fresh_tuner)
    built.clear()
    fresh("o", ["o"], weight, None)
    fresh("o", ["o"], weight, None)
    assert built == ["dense", "dense"] and len(fresh_tuner.pending) == 1
    monkeypatch.setattr(kernel_timing, "time_kernel", lambda kernel, rows, k, dtype: [float(kernel.value)])
    assert fresh_tuner.tune_pending() == 1
    assert built == ["dense", "dense", "fp16_packed"]
    assert PlanCache(tmp_path / "other.json").get(key) is not None  # for the next load
