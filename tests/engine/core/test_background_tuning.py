"""A first load does not wait on kernel measurement: shapes whose plans are not cached run untimed, the model
answers, and they are measured afterwards on a thread of their own, for the next load. That load's layers keep the
kernels they started with, so a greedy reply is the same before and after the measurement."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from engine import SamplingParams
from engine.model import autotune, kernel_timing, kernels
from engine.model.native import EXTENSION

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def _reply(llm: Any) -> list[int]:
    return list(llm.generate(PROMPT, GREEDY)[0].token_ids)


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The thread of every measurement (:func:`engine.model.autotune.measure`) made, in order."""
    threads: list[str] = []
    real = autotune.measure

    def spy(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(autotune, "measure", spy)
    return threads


@pytest.mark.parametrize("deterministic", [True, False])
def test_a_load_without_the_native_step_answers_before_any_kernel_is_measured(
    tiny_llm: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, measured: list[str], deterministic: bool
) -> None:
    monkeypatch.setenv("HEARTH_DATA_DIR", str(tmp_path / "data"))  # no plans cached yet
    monkeypatch.delenv("HEARTH_AUTOTUNE", raising=False)
    # a first start: the native extension is still being built in the background
    monkeypatch.setattr(EXTENSION, "ready", False)
    monkeypatch.setattr(EXTENSION, "problem", None)
    monkeypatch.setattr(EXTENSION, "start", lambda wait: "building")
    # and so its VNNI kernels are not offered (a verdict another test left for this process would offer them)
    monkeypatch.setattr(kernels, "vnni_problem", lambda: "the native extension is being built")
    stages: list[str] = []
    answered = threading.Event()  # the background measurement is held until the first reply is in
    real_init = kernel_timing.BackgroundTuning.__init__

    def held(self: Any, tuner: Any, busy: Any, poll_s: float = 0.05) -> None:
        real_init(self, tuner, lambda: not answered.is_set() or busy(), 0.01)

    monkeypatch.setattr(kernel_timing.BackgroundTuning, "__init__", held)
    llm = tiny_llm(quantization="int4", dtype="bfloat16", deterministic=deterministic, progress=lambda f, s: stages.append(s))
    # nothing timed while the user waits (deterministic mode still checks a lone kernel's row invariance at load:
    # with one candidate there is nothing to time, and the check decides its padding)
    assert measured == []
    assert not [s for s in stages if s.startswith("tune lm_head")], stages  # the head has several candidates
    runner = llm.engine.runner
    untimed = {(c.role, c.shape): c.plan for c in runner.kernel_choices}
    assert any("not measured yet" in plan.reason for plan in untimed.values())
    assert llm.tuning is not None  # the shapes left untimed are measured after the load
    first = _reply(llm)  # the model answers with its untimed plans
    assert measured == []
    answered.set()
    llm.tuning.join(120)
    assert not llm.tuning.running and llm.tuning.measured >= 1
    assert measured and all(name == "hearth-tune" for name in measured)  # on its own thread, after the answer
    # this load's layers keep their kernels: the same plans, the same greedy reply
    assert {(c.role, c.shape): c.plan for c in runner.kernel_choices} == untimed
    assert _reply(llm) == first
    # the next load finds every plan cached: nothing left to measure, nothing untimed (a plan timed too noisily to
    # trust is measured again by a load on a quiet machine: this one is taken as busy, so that it runs it)
    measured.clear()
    monkeypatch.setattr(autotune, "machine_quiet", lambda: False)
    again = tiny_llm(quantization="int4", dtype="bfloat16", deterministic=deterministic)
    assert again.tuning is None and measured == []
    assert not any("not measured yet" in c.plan.reason for c in again.engine.runner.kernel_choices)


def test_closing_the_model_stops_the_measurement_and_lets_go_of_the_candidates(
    tiny_llm: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HEARTH_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("HEARTH_AUTOTUNE", raising=False)
    busy = threading.Event()
    busy.set()
    llm = tiny_llm(quantization="int4", dtype="bfloat16")
    tuning = llm.tuning
    assert tuning is not None
    tuning._busy = busy.is_set  # the model stays wanted: the measurement waits
    llm.close()
    assert not tuning.running and tuning.tuner.pending == []


def test_a_measurement_waits_while_the_model_is_wanted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before each timed call the background thread looks at busy(): a reply never shares the cores with it."""
    wanted = threading.Event()
    wanted.set()
    calls: list[bool] = []

    class Tuner:
        def __init__(self) -> None:
            self.pending = [object()]

        def tune_pending(self, wait: Any) -> int:
            assert wait()
            calls.append(wanted.is_set())
            kernel_timing._checkpoint()  # a timed call
            calls.append(wanted.is_set())
            self.pending.clear()
            return 1

    background = kernel_timing.BackgroundTuning(Tuner(), wanted.is_set, poll_s=0.01)  # type: ignore[arg-type]
    background.start()
    threading.Timer(0.2, wanted.clear).start()
    background.join(10)
    assert calls == [False, False] and background.measured == 1
