"""The native loader (``engine/loading/native.py``): GGUF and safetensors without transformers' modeling code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine.api import ModelLoadError
from engine.core.llm_engine import _eos_ids
from engine.loading import native
from engine.loading.default_model import (
    GGUF_FILENAME,
    GGUF_SHA256,
    MARKER_FILENAME,
    MODEL_NAME,
    source_gguf_path,
)
from engine.loading.loader import load_model
from engine.loading.validate import resolve_path

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEARTH_DATA_DIR", str(tmp_path / "data"))


def _side_files(folder: Path, default_model_dir: Path) -> None:
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (folder / name).write_bytes((default_model_dir / name).read_bytes())


def test_gguf_loads_natively_with_the_dequantized_weights(default_model_dir: Path, tmp_path: Path) -> None:
    gguf = tmp_path / GGUF_FILENAME
    os.symlink(source_gguf_path(), gguf)
    loaded = load_model(str(gguf), dtype="float32")
    assert isinstance(loaded.model, native.NativeCausalLM)
    assert (tmp_path / "data" / "cache" / "gguf").is_dir()  # config and tokenizer converted once, cached
    reference = load_file(str(default_model_dir / "model.safetensors"))  # transformers' own dequantization (bf16)
    params = dict(loaded.model.named_parameters())
    assert set(reference) <= set(params)
    for name, expected in reference.items():
        got = params[name].detach()
        assert got.shape == expected.shape, name
        # the same blocks, dequantized in the same operations: the very bf16 values (a near tie stays put)
        assert torch.equal(got.to(torch.bfloat16), expected), name
    assert loaded.model.lm_head.weight is loaded.model.model.embed_tokens.weight  # tied, not copied
    ids = loaded.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)["input_ids"]
    assert ids[-4:] == [1, 520, 9531, 198]  # "<|im_start|>assistant\n"


def test_a_gguf_beside_its_converted_files_converts_nothing(default_model_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "bundle"
    folder.mkdir()
    gguf = folder / GGUF_FILENAME
    os.symlink(source_gguf_path(), gguf)
    _side_files(folder, default_model_dir)
    assert native.gguf_side_folder(gguf) != folder  # no marker naming the GGUF: not trusted as its side files
    (folder / MARKER_FILENAME).write_text(json.dumps({"source_sha256": GGUF_SHA256, "gguf": GGUF_FILENAME}))
    assert native.gguf_side_folder(gguf) == folder


def test_truncated_gguf_is_refused_before_loading(tmp_path: Path) -> None:
    data = source_gguf_path().read_bytes()
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="broken.gguf"):
        load_model(str(broken))


def test_missing_tensor_is_a_load_error(default_model_dir: Path) -> None:
    config = native.make_config(native.read_config(default_model_dir))
    state = load_file(str(default_model_dir / "model.safetensors"))
    del state["model.layers.3.mlp.down_proj.weight"]
    with pytest.raises(ModelLoadError, match=r"missing \(e\.g\. model\.layers\.3\.mlp\.down_proj\.weight\)"):
        native.build(config, state, torch.bfloat16, default_model_dir)


def test_default_model_loads_without_transformers_modeling_code(default_model_dir: Path) -> None:
    """Importing transformers' Llama config/modeling code costs seconds of every start; the fused types skip it."""
    code = (
        "import sys; from engine.loading.loader import load_model; load_model('default'); "
        "print(sorted(m for m in ('transformers.models.llama.modeling_llama', "
        "'transformers.models.llama.configuration_llama', 'torch.distributed.tensor') if m in sys.modules))"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HEARTH_DATA_DIR": str(default_model_dir.parent.parent)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_bundle_runs_its_shipped_gguf(
    default_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The layout packaging/hearth.spec writes: models/<name>/ holds the GGUF, its side files and a marker."""
    folder = tmp_path / "bundle" / "models" / MODEL_NAME
    folder.mkdir(parents=True)
    os.symlink(source_gguf_path(), folder / GGUF_FILENAME)
    _side_files(folder, default_model_dir)
    marker = {"source_sha256": GGUF_SHA256, "gguf": GGUF_FILENAME}
    (folder / MARKER_FILENAME).write_text(json.dumps(marker))
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path / "bundle"), raising=False)
    assert resolve_path("default", None) == folder / GGUF_FILENAME
    loaded = load_model("default")
    assert loaded.path == folder / GGUF_FILENAME
    assert isinstance(loaded.model, native.NativeCausalLM)
    assert not (tmp_path / "data").exists()  # nothing converted, nothing cached


def test_generation_config_end_ids_are_kept(default_model_dir: Path, tmp_path: Path) -> None:
    """Models such as Llama 3 end turns on ids only their generation_config.json lists; the engine reads them there."""
    folder = tmp_path / "model"
    folder.mkdir()
    _side_files(folder, default_model_dir)
    os.symlink(default_model_dir / "model.safetensors", folder / "model.safetensors")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    model, tokenizer, _config = native.load(folder, "safetensors", torch.bfloat16)
    assert _eos_ids(model, tokenizer) == {2, 7}
