"""Caches of work on a model file are named by its content (``engine/loading/content_key.py``): a copy of the file
under another folder and name converts nothing; a changed file is converted again."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from engine.loading import native
from engine.loading.content_key import HEAD_BYTES, content_key


@pytest.fixture(autouse=True)
def _data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEARTH_DATA_DIR", str(tmp_path / "data"))


def _file(path: Path, size: int, seed: int = 1) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes((i * 31 + seed) % 251 for i in range(size)))
    return path


@pytest.mark.parametrize("size", [0, 10, HEAD_BYTES, HEAD_BYTES + 1, 3 * HEAD_BYTES + 12345])
def test_a_copy_has_the_same_key_and_a_change_another(tmp_path: Path, size: int) -> None:
    original = _file(tmp_path / "a" / "model.gguf", size)
    copy = tmp_path / "b" / "sha256-0123abcd"
    copy.parent.mkdir()
    shutil.copyfile(original, copy)
    os.utime(copy, (1, 1))  # another mtime, as a copy or a download has
    assert content_key(copy) == content_key(original)
    longer = _file(tmp_path / "c" / "model.gguf", size + 1)
    assert content_key(longer) != content_key(original)
    if size:
        changed = bytearray(original.read_bytes())
        changed[0] ^= 1  # the header
        (tmp_path / "d").mkdir()
        (tmp_path / "d" / "model.gguf").write_bytes(bytes(changed))
        assert content_key(tmp_path / "d" / "model.gguf") != content_key(original)
    if size > HEAD_BYTES:
        changed = bytearray(original.read_bytes())
        changed[-1] ^= 1  # the last block is always sampled
        (tmp_path / "e").mkdir()
        (tmp_path / "e" / "model.gguf").write_bytes(bytes(changed))
        assert content_key(tmp_path / "e" / "model.gguf") != content_key(original)


def test_a_copied_gguf_converts_its_config_and_tokenizer_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.loading import gguf_convert

    calls: list[Path] = []

    def fake(path: Path, out: Path) -> None:
        calls.append(path)
        for name in ("config.json", "tokenizer_config.json"):
            (out / name).write_text("{}")

    monkeypatch.setattr(gguf_convert, "write_side_files", fake)
    lm_studio = _file(tmp_path / "lmstudio" / "org" / "model-Q4_0.gguf", 2 * HEAD_BYTES)
    ollama = tmp_path / "ollama" / "blobs" / "sha256-b179c9523d0e"
    ollama.parent.mkdir(parents=True)
    shutil.copyfile(lm_studio, ollama)
    first = native.gguf_side_folder(lm_studio)
    assert calls == [lm_studio]
    assert native.gguf_side_folder(ollama) == first  # the same content: the same converted files
    assert calls == [lm_studio]
    other = _file(tmp_path / "other" / "model-Q4_0.gguf", 2 * HEAD_BYTES, seed=7)
    assert native.gguf_side_folder(other) != first
    assert calls == [lm_studio, other]
