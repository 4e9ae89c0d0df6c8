"""Loading models: real files on disk, tiny models built from configs, and the default model."""

from __future__ import annotations

import gc
import importlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from engine.api import EngineConfig, ModelLoadError, SamplingParams
from engine.core.llm_engine import LLMEngine
from engine.loading.default_model import source_gguf_path
from engine.loading.loader import LoadedModel, load_model
from engine.loading.safetensors_reader import read_safetensors_header
from engine.loading.validate import estimate_weights_bytes, inspect_model

log = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def _build_llama(out: Path, tokenizer_from: Path, dtype: torch.dtype, **sizes: int) -> Path:
    """Save a randomly initialised Llama with the default model's tokenizer into ``out``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = json.loads((tokenizer_from / "config.json").read_text())["vocab_size"]
    config = LlamaConfig(
        hidden_size=sizes.get("hidden_size", 64),
        intermediate_size=sizes.get("intermediate_size", 128),
        num_hidden_layers=sizes.get("num_hidden_layers", 2),
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model: Any = LlamaForCausalLM(config)
    model.to(dtype).save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (tokenizer_from / name).exists():
            shutil.copy(tokenizer_from / name, out / name)
    return out


@pytest.fixture(scope="module")
def tiny_src(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Path:
    """A 2-layer, 64-wide Llama folder (read-only; copy it before changing anything)."""
    return _build_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama", default_model_dir, torch.bfloat16)


@pytest.fixture()
def tiny(tmp_path: Path, tiny_src: Path) -> Path:
    """A private copy of the tiny model that a test may damage."""
    return Path(shutil.copytree(tiny_src, tmp_path / "tiny-llama"))


def _weights(folder: Path) -> Path:
    return folder / "model.safetensors"


def _rewrite_config(folder: Path, **changes: object) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


# --- good loads ------------------------------------------------------------------------------


def test_tiny_model_loads_on_cpu(tiny: Path) -> None:
    stages: list[tuple[float, str]] = []
    loaded = load_model(tiny, device="cpu", dtype="auto", progress=lambda f, s: stages.append((f, s)))
    assert isinstance(loaded, LoadedModel)
    assert loaded.device == torch.device("cpu")
    assert loaded.dtype is torch.bfloat16
    assert loaded.device_reason == "CPU requested"
    assert not loaded.model.training
    assert all(p.dtype is torch.bfloat16 and p.device.type == "cpu" for p in loaded.model.parameters())
    assert loaded.num_parameters == sum(p.numel() for p in loaded.model.parameters())
    assert loaded.weights_bytes == loaded.num_parameters * 2
    assert loaded.config.model_type == "llama"
    assert loaded.tokenizer("hello")["input_ids"]
    names = [s for _, s in stages]
    assert names[0] == "validate" and "read weights" in names and names[-1] == "quantize"
    fractions = [f for f, _ in stages]
    assert fractions == sorted(fractions) and 0.85 <= fractions[-1] <= 0.9


def test_tiny_model_loads_in_float32(tiny: Path) -> None:
    loaded = load_model(str(tiny), dtype="fp32")
    assert loaded.dtype is torch.float32
    assert next(loaded.model.parameters()).dtype is torch.float32


def test_inspect_and_estimate_read_headers_only(tiny: Path) -> None:
    info = inspect_model(tiny)
    assert info.format == "safetensors"
    assert info.model_type == "llama" and info.architecture == "LlamaForCausalLM"
    assert info.stored_dtype == "bf16"
    assert info.num_parameters is not None and info.num_parameters > 0
    assert estimate_weights_bytes(tiny, torch.float32) == info.num_parameters * 4
    assert estimate_weights_bytes(tiny, "bf16") == info.num_parameters * 2
    loaded = load_model(tiny)
    assert loaded.num_parameters == info.num_parameters


def test_inspect_gguf_without_loading() -> None:
    info = inspect_model(source_gguf_path())
    assert info.format == "gguf"
    assert info.model_type == "llama"
    assert info.stored_dtype == "Q4_1"
    assert info.num_parameters == 134_515_008


def test_an_ollama_blob_loads_like_its_gguf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, default_model_dir: Path
) -> None:
    """Ollama keeps a GGUF as ``blobs/sha256-<hex>``, without an extension: the loader knows it by its magic bytes,
    converts its config and tokenizer as for a .gguf, and the int4/int8 levels find its blocks through it.
    (Only the steps that see the file's name: dequantizing the weights reads them by their offsets alone, and
    takes far longer; ``test_native_loader.py`` loads the .gguf itself.)"""
    from engine.loading import native
    from engine.loading.default_model import GGUF_SHA256
    from engine.loading.gguf_weights import GgufWeights

    monkeypatch.setenv("HEARTH_DATA_DIR", str(tmp_path / "data"))  # the converted side files are cached there
    blob = tmp_path / "blobs" / f"sha256-{GGUF_SHA256}"
    blob.parent.mkdir()
    shutil.copyfile(source_gguf_path(), blob)
    gguf = inspect_model(source_gguf_path())
    assert inspect_model(blob) == replace(gguf, path=blob, weight_files=[blob])
    assert (gguf.format, gguf.stored_dtype) == ("gguf", "Q4_1")
    side = native.gguf_side_folder(blob)
    assert side.is_relative_to(tmp_path / "data")
    config = native.read_config(side)
    expected = json.loads((default_model_dir / "config.json").read_text())  # converted from the same file
    shared = set(config) & set(expected)
    assert {"model_type", "num_hidden_layers", "hidden_size", "vocab_size"} <= shared
    assert {k: config[k] for k in shared} == {k: expected[k] for k in shared}
    weights = GgufWeights(blob, native.make_config(config))
    assert weights.supported and weights.kind("model.layers.0.mlp.down_proj.weight") == "Q4_1"


def test_default_model_loads_offline_with_sockets_blocked(
    default_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_network(self: socket.socket, *args: object) -> None:
        raise OSError("network access attempted during a model load")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket.socket, "connect_ex", no_network)
    # Time the load, not the one-off import of transformers' tokenizer code.
    for module in ("transformers.tokenization_utils_tokenizers",):
        importlib.import_module(module)

    started = time.perf_counter()
    loaded = load_model("default")
    elapsed = time.perf_counter() - started
    log.info("default model loaded in %.2f s", elapsed)
    print(f"default model loaded in {elapsed:.2f} s")
    assert elapsed < 10
    assert loaded.path == default_model_dir
    assert loaded.num_parameters == 134_515_008
    assert loaded.dtype is torch.bfloat16
    # the default model is built natively (engine/loading/native.py), so it answers through the engine
    engine = LLMEngine(loaded.model, loaded.tokenizer, EngineConfig(), 64, torch.bfloat16, 1024, "bf16")
    handle = engine.submit(
        [{"role": "user", "content": "Name the capital city of France."}], SamplingParams(max_tokens=10, temperature=0)
    )
    while not handle.done():
        engine.step()
    assert "Paris" in handle.result().text


# --- bad inputs ------------------------------------------------------------------------------


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "nowhere")


def test_empty_name() -> None:
    with pytest.raises(ModelLoadError, match="No model given"):
        load_model("  ")


def test_folder_without_config(tiny: Path) -> None:
    (tiny / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(tiny)


def test_config_not_json(tiny: Path) -> None:
    (tiny / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        load_model(tiny)


def test_folder_without_tokenizer(tiny: Path) -> None:
    (tiny / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="no tokenizer files"):
        load_model(tiny)


def test_folder_without_weights(tiny: Path) -> None:
    _weights(tiny).unlink()
    with pytest.raises(ModelLoadError, match="has no weights"):
        load_model(tiny)


@pytest.mark.parametrize("model_type", ["gpt2", "bert", "mamba", "made_up_arch"])
def test_unsupported_architecture(tiny: Path, model_type: str) -> None:
    _rewrite_config(tiny, model_type=model_type)
    with pytest.raises(ModelLoadError, match=f"Unsupported architecture '{model_type}'"):
        load_model(tiny)


def test_sliding_window_attention_refused(tiny: Path) -> None:
    _rewrite_config(tiny, model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=128)
    with pytest.raises(ModelLoadError, match="sliding-window"):
        load_model(tiny)


def test_classifier_head_refused(tiny: Path) -> None:
    _rewrite_config(tiny, architectures=["LlamaForSequenceClassification"])
    with pytest.raises(ModelLoadError, match="not a text-generation model"):
        load_model(tiny)


def test_remote_code_refused(tiny: Path) -> None:
    _rewrite_config(tiny, auto_map={"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"})
    (tiny / "modeling_evil.py").write_text("raise SystemExit('remote code ran')\n")
    with pytest.raises(ModelLoadError, match="auto_map") as excinfo:
        load_model(tiny)
    assert "never runs code" in str(excinfo.value)


def test_truncated_safetensors(tiny: Path) -> None:
    weights = _weights(tiny)
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=r"model\.safetensors is truncated"):
        load_model(tiny)


def test_corrupt_safetensors_header(tiny: Path) -> None:
    weights = _weights(tiny)
    size = weights.stat().st_size
    weights.write_bytes(os.urandom(size))
    with pytest.raises(ModelLoadError, match=r"model\.safetensors is corrupt"):
        load_model(tiny)


def test_safetensors_header_with_bad_json(tiny: Path) -> None:
    weights = _weights(tiny)
    data = bytearray(weights.read_bytes())
    data[8:16] = b"\xff" * 8  # inside the JSON header
    weights.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="header is not valid JSON"):
        read_safetensors_header(weights)


def test_missing_shard_in_index(tiny: Path) -> None:
    index = {
        "metadata": {},
        "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"},
    }
    _weights(tiny).rename(tiny / "model-00001-of-00002.safetensors")
    (tiny / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match="model-00002-of-00002.safetensors"):
        load_model(tiny)


@pytest.mark.parametrize("keep_bytes", [1_000_000, 50_000_000])
def test_truncated_gguf(tmp_path: Path, keep_bytes: int) -> None:
    cut = tmp_path / "SmolLM2-cut.gguf"
    with source_gguf_path().open("rb") as src:
        cut.write_bytes(src.read(keep_bytes))
    with pytest.raises(ModelLoadError, match="truncated"):
        load_model(cut)


def test_not_a_gguf(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        load_model(fake)


def test_other_file_refused(tmp_path: Path) -> None:
    weird = tmp_path / "weights.onnx"
    weird.write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="not a .gguf"):
        load_model(weird)


def _to_pytorch_bin(folder: Path, state: object) -> None:
    """Replace the safetensors weights with a pickled ``pytorch_model.bin`` holding ``state``."""
    _weights(folder).unlink()
    torch.save(state, folder / "pytorch_model.bin")


def test_pytorch_bin_weights_load(tiny: Path) -> None:
    from safetensors.torch import load_file

    _to_pytorch_bin(tiny, load_file(_weights(tiny)))
    assert inspect_model(tiny).format == "pytorch"
    loaded = load_model(tiny)
    assert loaded.num_parameters > 0


class _Payload:
    """A pickle that creates a file when unpickled, standing in for malicious code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (Path.touch, (str(self.marker),))  # type: ignore[return-value]


def test_pickled_code_in_bin_weights_never_runs(tiny: Path, tmp_path: Path) -> None:
    marker = tmp_path / "code-ran"
    _to_pytorch_bin(tiny, {"model.embed_tokens.weight": _Payload(marker)})
    with pytest.raises(ModelLoadError, match="could run code") as excinfo:
        load_model(tiny)
    assert not marker.exists()
    assert excinfo.value.__context__ is None


def test_not_enough_memory(tiny: Path) -> None:
    with pytest.raises(ModelLoadError, match="Not enough memory") as excinfo:
        load_model(tiny, max_memory_bytes=1000)
    message = str(excinfo.value)
    assert "GB" in message and "0.00 GB" in message


@pytest.mark.parametrize(("field", "value"), [("dtype", "int3"), ("device", "tpu")])
def test_bad_options_raise_value_error(tiny: Path, field: str, value: str) -> None:
    with pytest.raises(ValueError, match=field):
        load_model(tiny, **{field: value})  # type: ignore[arg-type]


def _drop_tensor(folder: Path, name: str) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(_weights(folder))
    del tensors[name]
    save_file(tensors, _weights(folder), metadata={"format": "pt"})


def test_weights_not_matching_config(tiny: Path) -> None:
    _drop_tensor(tiny, "model.layers.1.mlp.down_proj.weight")
    with pytest.raises(ModelLoadError, match=r"1 weight\(s\) missing"):
        load_model(tiny)


def _small_vocab_llama(out: Path, dtype: torch.dtype, **sizes: Any) -> Path:
    """A Llama with a 256-word word-level tokenizer: cheap to load, so loops stay fast."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        num_attention_heads=4, num_key_value_heads=2, vocab_size=256, max_position_embeddings=512, **sizes
    )
    torch.manual_seed(0)
    model: Any = LlamaForCausalLM(config)
    model.to(dtype).save_pretrained(out)
    vocab = {"<unk>": 0, **{f"w{i}": i for i in range(1, 256)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>"})
    )
    return out


def test_failed_loads_do_not_leak(tmp_path: Path) -> None:
    # ~16M parameters stored as float32 and loaded as bf16, so every load really allocates ~32 MB
    # (20 leaked models would add ~640 MB); the failure -- a tensor missing from the checkpoint --
    # is only found after all the weights were read.
    folder = _small_vocab_llama(
        tmp_path / "medium", torch.float32, hidden_size=512, intermediate_size=2048, num_hidden_layers=4
    )
    _drop_tensor(folder, "model.layers.3.mlp.down_proj.weight")
    process = psutil.Process()

    def fail_once() -> None:
        with pytest.raises(ModelLoadError, match="missing"):
            load_model(folder, dtype="bf16")

    def live_tensors() -> int:
        gc.collect()
        return sum(issubclass(type(o), torch.Tensor) for o in gc.get_objects())

    for _ in range(3):  # warm-up: first-use imports, caches and allocator arenas
        fail_once()
    tensors_before = live_tensors()
    # Park the test process's own objects outside the collector, so the loader's gc.collect() after
    # each failure only walks what the load created (the same work, minus pytest's heap).
    gc.freeze()
    try:
        start = process.memory_info().rss
        for _ in range(20):
            fail_once()
        grown = process.memory_info().rss - start
    finally:
        gc.unfreeze()
    log.info("RSS grew by %.1f MB over 20 failed loads", grown / 2**20)
    print(f"RSS grew by {grown / 2**20:.1f} MB over 20 failed loads")
    assert live_tensors() == tensors_before
    assert grown < 50 * 2**20


# --- command line ----------------------------------------------------------------------------


def _run_cli(repo_root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(repo_root)}
    return subprocess.run(
        [sys.executable, "-m", "engine", *args],
        check=False,
        cwd=repo_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_info_default(repo_root: Path, default_model_dir: Path) -> None:
    result = _run_cli(repo_root, "info", "default", "--device", "cpu")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "LlamaForCausalLM" in out
    assert "134,515,008" in out
    assert "bfloat16" in out
    assert "cpu (CPU requested)" in out
    assert "269,030,016 bytes" in out


def test_cli_bad_model_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from engine.__main__ import main

    assert main(["info", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_cli_without_command_prints_usage(capsys: pytest.CaptureFixture[str]) -> None:
    from engine.__main__ import main

    assert main([]) == 2
    assert "usage" in capsys.readouterr().err


def test_cli_unknown_command_prints_usage(capsys: pytest.CaptureFixture[str]) -> None:
    from engine.__main__ import main

    with pytest.raises(SystemExit) as excinfo:
        main(["frobnicate"])
    assert excinfo.value.code == 2
    assert "usage" in capsys.readouterr().err
