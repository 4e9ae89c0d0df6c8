"""The Model pane says what each stage of a load does (``app/model/load_stage.py``)."""

from __future__ import annotations

import pytest

from app.model.load_stage import load_stage_text


@pytest.mark.parametrize(
    ("stage", "fraction", "text"),
    [
        ("verify", 0.01, "Verifying the model file…"),
        ("convert 3/272", 0.3, "Converting… 3/272"),
        ("read weights", 0.6, "Reading the weights…"),
        ("quantize", 0.9, "Building the layers…"),
        ("quantize 3/30", 0.904, "Building the layers… 3/30"),
        ("block kernels still building: loading int4", 0.0, "Block kernels still building: loading int4…"),
        ("tune lm_head 49152x576", 0.92, "Tuning kernels… lm_head 49152x576"),
        ("warm up", 0.95, "Warming up…"),
        ("Starting", 0.0, "Starting…"),
        ("ready", 1.0, "Ready"),
    ],
)
def test_the_pane_says_what_each_stage_does(stage: str, fraction: float, text: str) -> None:
    assert load_stage_text(stage, fraction) == text
