"""WordLlama's files in the PyInstaller bundle: engine/docs/embedders.py finds them under ``sys._MEIPASS``, where
packaging/hearth.spec puts them, and the self-test's document search (engine/tools/self_test.py) runs on them."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.docs import embedders
from engine.docs.embedders import WordLlamaEmbedder, _wordllama_root, wordllama_files
from engine.tools.self_test import check_document_search


def _frozen(monkeypatch: pytest.MonkeyPatch, bundle: Path) -> None:
    """Look as a PyInstaller bundle unpacked at ``bundle`` does, with no embedder loaded yet."""
    monkeypatch.setattr(embedders, "_cache", {})
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(bundle), raising=False)


def _fake_bundle(tmp_path: Path) -> Path:
    """The bundle's layout (``_internal/wordllama/weights/...``) with the installed wheel's real files copied in."""
    bundle = tmp_path / "_internal"
    installed = _wordllama_root()
    for path in wordllama_files():
        target = bundle / "wordllama" / path.relative_to(installed)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return bundle


def test_the_frozen_lookup_finds_the_bundles_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    installed = WordLlamaEmbedder()
    bundle = _fake_bundle(tmp_path)
    _frozen(monkeypatch, bundle)
    weights, tokenizer = wordllama_files()
    assert weights == bundle / "wordllama" / "weights" / "l2_supercat_256.safetensors"
    assert tokenizer.parent == bundle / "wordllama" / "tokenizers"
    frozen = WordLlamaEmbedder()
    texts = ["Jupiter is the largest planet.", "Knead the dough."]
    np.testing.assert_array_equal(frozen.embed(texts), installed.embed(texts))


def test_a_bundle_without_the_files_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a bundle only the bundle's copy counts (the build machine's wheel is not there at run time), and the
    self-test fails naming what is missing."""
    _frozen(monkeypatch, tmp_path / "_internal")
    with pytest.raises(FileNotFoundError, match="wordllama's weights or tokenizer are missing"):
        wordllama_files()
    with pytest.raises(ValueError, match="wordllama"):
        check_document_search()


def test_the_self_tests_document_search_uses_wordllama(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _frozen(monkeypatch, _fake_bundle(tmp_path))
    line = check_document_search()
    assert line.startswith("document search: embedder wordllama (")
    assert "found planets.txt" in line
