"""``python -m engine.bench --loads N`` (``engine/tools/bench_loads.py``): a file's first load and a warm start, each
in a process of its own, judged against the load-time and memory targets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.tools import bench, bench_loads
from engine.tools.make_gguf import write_gguf


def test_a_first_load_and_a_warm_start_are_timed_in_their_own_processes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "tiny-Q4_0.gguf"
    write_gguf(model, "tiny", "Q4_0", vocab=512)
    assert bench.main(["--model", str(model), "--level", "file", "--loads", "2"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    first, warm, verdict = rows
    assert (first["kind"], warm["kind"]) == ("first", "warm")
    for row in (first, warm):
        assert row["level"] == "file"
        assert 0 < row["load_s"] < row["ready_s"] and 0 < row["import_s"]
        assert row["rss_mib"] > 50  # torch alone is more
    file_mib = model.stat().st_size / 2**20
    assert verdict["rss_limit_mib"] == round(file_mib + bench_loads.RSS_ALLOWANCE_MIB, 1)
    assert verdict["first_load_s"] == first["load_s"] and verdict["warm_load_s_max"] == warm["load_s"]
    assert verdict["first_load_met"] == (first["load_s"] <= bench_loads.FIRST_LOAD_TARGET_S)
    assert verdict["warm_start_met"] == (warm["load_s"] <= bench_loads.WARM_START_TARGET_S)
    assert verdict["rss_met"] == (max(first["rss_mib"], warm["rss_mib"]) <= verdict["rss_limit_mib"])


def test_a_load_that_fails_says_why(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 12)
    with pytest.raises(RuntimeError, match="the load failed"):
        bench_loads.run_once(str(broken), "auto", tmp_path / "data")
