"""The default model shipped inside a frozen (PyInstaller) app: ``default_model.bundled_dir``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from engine.loading import default_model
from engine.loading.default_model import GGUF_SHA256, MARKER_FILENAME, MODEL_NAME


def _fake_converted(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / MARKER_FILENAME).write_text(json.dumps({"source_sha256": GGUF_SHA256}))
    return folder


def test_not_frozen_uses_the_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HEARTH_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delattr(sys, "frozen", raising=False)
    assert default_model.bundled_dir() is None
    assert default_model.target_dir() == tmp_path / "data" / "models" / MODEL_NAME


def test_frozen_prefers_the_bundled_copy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bundled = _fake_converted(tmp_path / "bundle" / "models" / MODEL_NAME)
    monkeypatch.setenv("HEARTH_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path / "bundle"), raising=False)
    assert default_model.target_dir() == bundled
    assert default_model.is_converted()
    assert default_model.default_model_path() == bundled  # no conversion, nothing written
    assert not (tmp_path / "data").exists()


def test_frozen_without_a_complete_copy_falls_back(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "bundle" / "models" / MODEL_NAME).mkdir(parents=True)  # no marker: incomplete
    monkeypatch.setenv("HEARTH_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path / "bundle"), raising=False)
    assert default_model.bundled_dir() is None
    assert default_model.target_dir() == tmp_path / "data" / "models" / MODEL_NAME
