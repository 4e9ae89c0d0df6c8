"""``python -m engine.tools.bench_weight_pass FILE`` (``engine/tools/bench_weight_pass.py``): one decode step's
matmuls over a GGUF file's own weights, against the machine's read rate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.model import native
from engine.tools import bench_weight_pass
from engine.tools.make_gguf import write_gguf


@pytest.fixture(scope="module")
def kernels() -> None:
    problem = native.EXTENSION.start(wait=True)
    if problem is not None:
        pytest.skip(f"no native kernels here: {problem}")


@pytest.mark.parametrize("mix", ["Q4_K_M", "Q8_0"])
def test_a_step_multiplies_every_matmul_weight_in_the_files_bytes(kernels: None, tmp_path: Path, mix: str) -> None:
    from gguf import GGUFReader

    model = tmp_path / f"tiny-{mix}.gguf"
    write_gguf(model, "tiny", mix, vocab=512)
    weights = bench_weight_pass.step_weights(model)
    reader = GGUFReader(str(model))
    names = {t.name for t in reader.tensors}
    matmuls = [t for t in reader.tensors if len(t.shape) == 2 and t.tensor_type.name in bench_weight_pass.KINDS
               and not (t.name == "token_embd.weight" and "output.weight" in names)]
    assert len(weights) == len(matmuls) > 0
    rng = torch.Generator().manual_seed(0)
    for (blocks, kind, k), t in zip(weights, matmuls, strict=True):
        assert blocks.numel() == t.n_bytes and k == int(t.shape[0])
        file_kind = bench_weight_pass.KINDS[t.tensor_type.name]
        raw = torch.from_numpy(t.data.copy())
        x = torch.randn(3, k, generator=rng)
        # the grouped bytes give the file order's product (to fp32 rounding: the grouped tiles order their sums
        # per block as the file-order tiles do not)
        assert torch.allclose(torch.ops.hearth.gguf_mm(x, blocks, kind), torch.ops.hearth.gguf_mm(x, raw, file_kind),
                              rtol=1e-4, atol=1e-4)


def test_the_report_times_each_row_count_against_the_read_rate(
    kernels: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "tiny-Q4_0.gguf"
    write_gguf(model, "tiny", "Q4_0", vocab=512)
    assert bench_weight_pass.main([str(model), "--rows", "1,4", "--repeats", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["file"] == model.name and report["tensors"] > 0 and report["weight_mb"] > 0
    one, four = report["rows"]
    assert (one["m"], four["m"]) == (1, 4)
    for row in (one, four):
        assert row["pass_ms"] > 0 and row["read_ms"] > 0 and row["weight_gb_s"] > 0 and row["read_gb_s"] > 0
    assert one["rows_cost"] == 1.0 and four["rows_cost"] == round(four["pass_ms"] / one["pass_ms"], 2)
