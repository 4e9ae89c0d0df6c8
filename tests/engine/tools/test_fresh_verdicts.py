"""``engine.bench --fresh-verdicts``: forgetting this machine's timed kernel choices before a run."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.model import layer_spec, plan_cache
from engine.tools import fresh_verdicts


def test_fresh_verdicts_forget_the_plans_and_verdicts_and_wait_for_a_quiet_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both caches are deleted (other files in the data folder stay), and the wait ends as soon as the machine looks
    quiet: here after two busy readings."""
    monkeypatch.setenv("HEARTH_DATA_DIR", str(tmp_path))
    for name in (plan_cache.CACHE_FILENAME, layer_spec.CACHE_FILENAME, "settings.json"):
        (tmp_path / name).write_text("{}")
    readings = iter([False, False, True, True])
    monkeypatch.setattr(fresh_verdicts, "machine_quiet", lambda: next(readings))
    monkeypatch.setattr(fresh_verdicts.time, "sleep", lambda s: None)
    row = fresh_verdicts.forget_verdicts(quiet_wait_s=60.0)
    assert sorted(Path(p).name for p in row["removed"]) == sorted([plan_cache.CACHE_FILENAME, layer_spec.CACHE_FILENAME])
    assert [p.name for p in tmp_path.iterdir()] == ["settings.json"]
    assert row["quiet"] is True and row["system"] == "fresh_verdicts"


def test_fresh_verdicts_stop_waiting_after_the_allowance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine that never looks quiet costs at most the allowance, and the row says it was not quiet."""
    monkeypatch.setenv("HEARTH_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(fresh_verdicts, "machine_quiet", lambda: False)
    clock = iter(range(0, 1000, 5))
    monkeypatch.setattr(fresh_verdicts.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(fresh_verdicts.time, "sleep", lambda s: None)
    row = fresh_verdicts.forget_verdicts(quiet_wait_s=20.0)
    assert row["removed"] == [] and row["quiet"] is False and 20.0 <= row["waited_s"] <= 30.0
