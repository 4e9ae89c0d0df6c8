"""The machine's bounds for a GGUF file's decode steps (``engine/tools/machine_bounds.py``) and the native int8
probe they use (``torch.ops.hearth.int8_peak_gmacs``, ``engine/model/csrc/vnni.cpp``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from gguf import GGUFReader

from engine.model import native
from engine.tools import machine_bounds
from engine.tools.make_gguf import write_gguf
from engine.tools.timings import Timings


@pytest.fixture(scope="module")
def kernels() -> None:
    problem = native.EXTENSION.start(wait=True)
    if problem is not None:
        pytest.skip(f"no native kernels here: {problem}")


@pytest.fixture(scope="module")
def untied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bounds") / "llama-8b-1layer-Q4_K_M.gguf"  # its own output matrix, as 8B has
    write_gguf(path, "llama-8b", "Q4_K_M", layers=1, vocab=512)
    return path


def _matrices(path: Path) -> list[tuple[str, int, int]]:
    """(name, bytes, elements) of every 2-D tensor, read by gguf's own reader."""
    return [(t.name, int(t.n_bytes), int(t.n_elements)) for t in GGUFReader(str(path)).tensors if len(t.shape) == 2]


def test_a_step_reads_every_matrix_but_the_embedding_unless_the_embedding_is_the_head(
    tmp_path: Path, untied: Path
) -> None:
    tied = tmp_path / "tiny-Q4_0.gguf"
    write_gguf(tied, "tiny", "Q4_0", vocab=512)
    tied_matrices = _matrices(tied)
    assert "output.weight" not in {name for name, _, _ in tied_matrices}
    assert machine_bounds.file_work(tied) == (sum(b for _, b, _ in tied_matrices), sum(e for _, _, e in tied_matrices))

    read = [(name, b, e) for name, b, e in _matrices(untied) if name != "token_embd.weight"]
    assert "output.weight" in {name for name, _, _ in read}
    assert machine_bounds.file_work(untied) == (sum(b for _, b, _ in read), sum(e for _, _, e in read))


def test_the_int8_probe_measures_a_rate_where_the_build_has_vnni(kernels: None) -> None:
    peak = torch.ops.hearth.int8_peak_gmacs(10_000)
    assert (peak > 0) == bool(torch.ops.hearth.vnni_available())
    # the chains really run: two 512-bit VPDPBUSD per cycle at 6 GHz would be 768 GMAC/s a thread, and a loop the
    # compiler had left out would report far more (a busy machine only lowers the rate, so no lower bound)
    assert peak / torch.get_num_threads() < 800


def test_the_floors_are_the_bytes_at_the_read_rate_and_the_multiplies_at_the_int8_rate(
    kernels: None, untied: Path
) -> None:
    row = machine_bounds.bounds(untied, [1, 8, 64])
    nbytes, macs = machine_bounds.file_work(untied)
    assert (row["bytes_per_token"], row["macs_per_token"]) == (nbytes, macs)
    read, int8 = row["read_gb_s"], row["int8_gmac_s"]
    assert read > 0 and row["read_floor_ms"] == pytest.approx(nbytes / read / 1e6, rel=0.05)  # read_gb_s is rounded
    if not torch.ops.hearth.vnni_available():
        assert int8 is None and row["int8_floor_ms"] is None
        return
    floors = row["int8_floor_ms"]
    for rows in (1, 8, 64):
        assert floors[str(rows)] == pytest.approx(rows * macs / int8 / 1e6, rel=0.01, abs=0.001)
    assert floors["1"] < floors["8"] < floors["64"]


def _row(system: str, streams: int, gap_s: float) -> dict[str, object]:
    """A bench row (engine/tools/timings.py) of ``streams`` streams whose tokens come ``gap_s`` apart."""
    timings = Timings(starts=[0.0] * streams, token_times=[[0.1 + gap_s * i for i in range(8)]] * streams, wall_s=1.0)
    return timings.row(system, streams)


def test_a_runs_share_ceiling_is_its_one_stream_time_between_tokens_over_the_int8_floor(
    kernels: None, untied: Path
) -> None:
    results = {("hearth", 1): _row("hearth", 1, 0.004), ("llama_server", 1): _row("llama_server", 1, 0.005),
               ("hearth", 8): _row("hearth", 8, 0.006)}
    row = machine_bounds.bounds_row(untied, [1, 8], results)
    floors = row["int8_floor_ms"]
    if floors is None:  # a build without VNNI has no int8 rate to bound the share with
        assert "share_ceiling" not in row
        return
    assert row["share_ceiling"] == {"8": round(min(1.0, 4.0 / floors["8"]), 2)}
    # without our one-stream row there is nothing to bound
    assert "share_ceiling" not in machine_bounds.bounds_row(untied, [1, 8], {("hearth", 8): results[("hearth", 8)]})


def test_the_command_prints_one_json_object(kernels: None, untied: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert machine_bounds.main([str(untied), "--rows", "1,4"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["system"] == "machine_bounds" and report["gguf"] == untied.name
    assert report["threads"] == torch.get_num_threads() and report["read_floor_ms"] > 0
    assert report["int8_floor_ms"] is None or set(report["int8_floor_ms"]) == {"1", "4"}


def test_a_file_that_is_not_a_gguf_gets_its_reason_not_a_traceback(kernels: None, tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(10))
    with pytest.raises(SystemExit, match="broken.gguf"):
        machine_bounds.main([str(broken)])
    with pytest.raises(SystemExit, match="missing.gguf"):
        machine_bounds.main([str(tmp_path / "missing.gguf")])
