"""Crafted model files that once hung the loader or the Models scan end in a ModelLoadError (or a skipped entry)
within seconds: a tensor header with 300000 dimensions, a layer count of 10^6 or 2^31, and FIFOs named like a
model's files.

Each check runs in a daemon thread joined with a timeout, so a regression fails the test instead of hanging it.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.api import HardwareInfo, ModelLoadError
from engine.loading.discovery import discover_models
from engine.loading.gguf_reader import read_gguf_header
from engine.loading.validate import inspect_model

TIMEOUT_S = 10.0
ROOT = Path(__file__).resolve().parents[2]
HARDWARE = HardwareInfo(
    cpu_model="test CPU",
    physical_cores=4,
    logical_cores=8,
    avx2=True,
    avx512=False,
    avx512_bf16=False,
    amx=False,
    ram_total_bytes=16 * 10**9,
    ram_available_bytes=8 * 10**9,
)

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX-only")


def _within(fn: Callable[[], Any], timeout: float = TIMEOUT_S) -> Any:
    """``fn()``'s result or exception (returned, not raised), failing the test if it runs past ``timeout``."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 -- handed to the test to inspect
            box["value"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"still running after {timeout} s"
    return box["value"]


@contextlib.contextmanager
def _released(fifos: list[Path]) -> Iterator[None]:
    """Open each FIFO's write end on the way out, so that a reader stuck in open() (a regression) is let go."""
    try:
        yield
    finally:
        for fifo in fifos:
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def _gguf_string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _many_dims_gguf(path: Path, n_dims: int) -> Path:
    """A GGUF whose one tensor claims ``n_dims`` dimensions, each 2^64 - 1 (their product grows quadratically)."""
    header = b"GGUF" + struct.pack("<IQQ", 3, 1, 0)
    tensor = _gguf_string("token_embd.weight") + struct.pack("<I", n_dims) + b"\xff" * 8 * n_dims
    path.write_bytes(header + tensor + struct.pack("<IQ", 0, 0) + b"\0" * 64)
    return path


def _llama_gguf(path: Path, block_count: int) -> Path:
    """A small llama GGUF with two layers' tensors whose metadata claims ``block_count`` layers."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(block_count)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_context_length(64)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "c", "d"])
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(8, dtype=np.float32))
    for i in range(2):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(8, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", np.zeros((8, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _llama_folder(folder: Path, num_hidden_layers: int) -> Path:
    """A safetensors llama folder with one layer's tensors whose config claims ``num_hidden_layers`` layers."""
    from safetensors.numpy import save_file

    folder.mkdir()
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "vocab_size": 4,
        "max_position_embeddings": 64,
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text("{}")
    tensors = {
        "model.embed_tokens.weight": np.zeros((4, 8), dtype=np.float32),
        "model.norm.weight": np.ones(8, dtype=np.float32),
        "model.layers.0.input_layernorm.weight": np.ones(8, dtype=np.float32),
        "model.layers.0.self_attn.q_proj.weight": np.zeros((8, 8), dtype=np.float32),
    }
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


# --- the header reader ----------------------------------------------------------------------------------------


def _in_subprocess(code: str, *args: str) -> str:
    """``code``'s stdout, run in a fresh interpreter that is killed after the timeout (a thread could not be
    joined: the quadratic product held the GIL)."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, *args], cwd=ROOT, check=False, capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail("still running after 60 s")
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_tensor_with_300000_dimensions_is_refused_at_once(tmp_path: Path) -> None:
    path = _many_dims_gguf(tmp_path / "dims.gguf", 300_000)
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from engine.api import ModelLoadError\n"
        "from engine.loading.gguf_reader import read_gguf_header\n"
        "start = time.monotonic()\n"
        "try:\n"
        "    read_gguf_header(Path(sys.argv[1]))\n"
        "except ModelLoadError as exc:\n"
        "    print(f'{time.monotonic() - start:.3f} {exc}')\n"
    )
    out = _in_subprocess(code, str(path))
    assert "300000 dimensions" in out and "at most 4" in out, out
    assert float(out.split()[0]) < TIMEOUT_S


def test_the_models_scan_lists_a_many_dimensions_file_with_its_reason(tmp_path: Path) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    _many_dims_gguf(folder / "dims.gguf", 300_000)
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from engine.api import HardwareInfo\n"
        "from engine.loading.discovery import discover_models\n"
        "hw = HardwareInfo('cpu', 1, 1, False, False, False, False, 2**33, 2**33)\n"
        "for m in discover_models(Path(sys.argv[1]), [Path(sys.argv[2])], hw):\n"
        "    print(m.path.name, m.runnable, m.reason)\n"
    )
    out = _in_subprocess(code, str(tmp_path / "home"), str(folder))
    assert out.startswith("dims.gguf False") and "dimensions" in out, out


@pytest.mark.parametrize(
    ("field", "value"),
    [("tensor count", 2**62), ("metadata count", 2**62)],
)
def test_counts_larger_than_the_file_are_refused_before_any_loop(tmp_path: Path, field: str, value: int) -> None:
    counts = (value, 0) if field == "tensor count" else (0, value)
    path = tmp_path / "counts.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, *counts) + b"\0" * 64)
    result = _within(lambda: read_gguf_header(path))
    assert isinstance(result, ModelLoadError), result
    assert "claims" in str(result)


def test_a_huge_array_of_strings_is_refused_before_any_loop(tmp_path: Path) -> None:
    kv = _gguf_string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2**40)
    path = tmp_path / "array.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + kv + b"\0" * 64)
    result = _within(lambda: read_gguf_header(path))
    assert isinstance(result, ModelLoadError), result
    assert "array items" in str(result)


def test_a_safetensors_shape_with_300000_dimensions_is_refused_at_once(tmp_path: Path) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [2**40] * 300_000, "data_offsets": [0, 4]}}).encode()
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from engine.api import ModelLoadError\n"
        "from engine.loading.safetensors_reader import read_safetensors_header\n"
        "try:\n"
        "    read_safetensors_header(Path(sys.argv[1]))\n"
        "except ModelLoadError as exc:\n"
        "    print(exc)\n"
    )
    assert "malformed" in _in_subprocess(code, str(path))


# --- layer counts ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layers", [10**6, 2**31])
def test_a_gguf_claiming_more_layers_than_it_holds_is_refused(tmp_path: Path, layers: int) -> None:
    path = _llama_gguf(tmp_path / "layers.gguf", layers)
    result = _within(lambda: inspect_model(path))
    assert isinstance(result, ModelLoadError), result
    assert f"claims {layers} layers" in str(result)


def test_a_gguf_with_its_real_layer_count_passes(tmp_path: Path) -> None:
    path = _llama_gguf(tmp_path / "ok.gguf", 2)
    assert inspect_model(path).format == "gguf"


@pytest.mark.parametrize("layers", [10**6, 2**31])
def test_a_folder_claiming_more_layers_than_it_holds_is_refused(tmp_path: Path, layers: int) -> None:
    folder = _llama_folder(tmp_path / "model", layers)
    result = _within(lambda: inspect_model(folder))
    assert isinstance(result, ModelLoadError), result
    assert f"claims {layers} layers" in str(result)


@pytest.mark.parametrize("value", [0, -3, 2.5, "many", True])
def test_a_layer_count_that_is_not_a_positive_whole_number_is_refused(tmp_path: Path, value: Any) -> None:
    folder = _llama_folder(tmp_path / "model", 1)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": value}))
    with pytest.raises(ModelLoadError, match="num_hidden_layers"):
        inspect_model(folder)


def test_the_native_build_refuses_missing_layers_before_building_them(tmp_path: Path) -> None:
    import torch

    from engine.loading import native

    config = native.make_config(
        {"model_type": "llama", "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 10**6,
         "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 4}
    )  # fmt: skip
    state = {"model.layers.0.input_layernorm.weight": torch.ones(8)}
    result = _within(lambda: native.build(config, state, torch.float32, tmp_path))
    assert isinstance(result, ModelLoadError), result
    assert "claims 1000000 layers" in str(result)


# --- FIFOs named like model files -----------------------------------------------------------------------------


@needs_fifo
def test_the_models_scan_skips_fifos_named_like_model_files(tmp_path: Path) -> None:
    folder = tmp_path / "models"
    (folder / "hf").mkdir(parents=True)
    fifos = [folder / "hf" / "config.json", folder / "model.gguf"]
    for fifo in fifos:
        os.mkfifo(fifo)
    (folder / "hf" / "model.safetensors").write_bytes(b"")
    with _released(fifos):
        found = _within(lambda: discover_models(tmp_path / "home", [folder], HARDWARE))
    assert not isinstance(found, BaseException), found
    assert [m.path.name for m in found] == ["model.gguf"]  # the folder's config.json is not read, so not listed
    assert not found[0].runnable and "not a regular file" in found[0].reason


@needs_fifo
@pytest.mark.parametrize("name", ["model.gguf", "config.json", "tokenizer.json"])
def test_the_loader_refuses_fifos_named_like_model_files(tmp_path: Path, name: str) -> None:
    folder = _llama_folder(tmp_path / "model", 1)
    target = folder / name
    target.unlink(missing_ok=True)
    os.mkfifo(target)
    with _released([target]):
        result = _within(lambda: inspect_model(target if name.endswith(".gguf") else folder))
    assert isinstance(result, ModelLoadError), result


@needs_fifo
def test_a_fifo_settings_file_does_not_block_the_scan(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".lmstudio").mkdir(parents=True)
    fifos = [home / ".lmstudio" / "settings.json"]
    os.mkfifo(fifos[0])
    with _released(fifos):
        found = _within(lambda: discover_models(home, (), HARDWARE))
    assert found == []


@needs_fifo
def test_the_native_loader_reads_no_fifo_config(tmp_path: Path) -> None:
    from engine.loading import native

    folder = _llama_folder(tmp_path / "model", 1)
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")
    with _released([folder / "config.json"]):
        result = _within(lambda: native.read_config(folder))
    assert isinstance(result, OSError) and "not a regular file" in str(result), result
