"""A load names its stages, in order, each with its own progress: the layers built, counted ("quantize 3/30"), each
shape's kernels tuned (the longest wait of a first load on a CPU), the warm-up; a later load finds the plans cached and
tunes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


def _stages(tiny_llm: Any, tmp_path: Path) -> list[tuple[float, str]]:
    seen: list[tuple[float, str]] = []
    tiny_llm(quantization="int4", deterministic=True, progress=lambda f, s: seen.append((f, s)))
    return seen


def test_the_stages_come_named_and_in_order(tiny_llm: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEARTH_DATA_DIR", str(tmp_path / "data"))  # no plans cached yet
    monkeypatch.setenv("HEARTH_AUTOTUNE", "load")  # measured as the layers are built (the default measures later)
    seen = _stages(tiny_llm, tmp_path)
    names = [s for _, s in seen]
    assert [f for f, _ in seen] == sorted(f for f, _ in seen)  # the bar never goes back
    tuned = [s for s in names if s.startswith("tune ")]
    assert tuned and any("lm_head" in s for s in tuned)  # each measured shape named ("tune lm_head 64x32")
    order = ["validate", "read weights", "quantize", tuned[0], "warm up", "ready"]
    firsts = [names.index(n) for n in order]
    assert firsts == sorted(firsts), names
    again = [s for _, s in _stages(tiny_llm, tmp_path)]
    assert not [s for s in again if s.startswith("tune ")], again  # the plans are cached: nothing to tune


@pytest.mark.parametrize("family", ["llama", "gemma"])  # the fused decoder, the HF modules
def test_the_layers_built_are_counted(tiny_llm: Any, family: str) -> None:
    seen: list[tuple[float, str]] = []
    llm = tiny_llm(family, quantization="int8", progress=lambda f, s: seen.append((f, s)))
    total = int(llm.engine.runner.config.num_hidden_layers)
    assert total > 1
    names = [s for _, s in seen]
    counted = [(f, s) for f, s in seen if s.startswith("quantize ")]
    assert [s for _, s in counted] == [f"quantize {i}/{total}" for i in range(1, total + 1)]
    fractions = [f for f, _ in counted]
    assert fractions == sorted(set(fractions)) and 0.9 < fractions[0] and fractions[-1] < 0.95  # each layer moves it
    assert [f for f, _ in seen] == sorted(f for f, _ in seen)
    assert names.index("quantize") < names.index(counted[0][1]) < names.index(counted[-1][1]) < names.index("warm up")
