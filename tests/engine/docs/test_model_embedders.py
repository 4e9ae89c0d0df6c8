"""Embedding models on disk as the document index's embedder: named by path, picked by ``auto`` before WordLlama,
recorded by the collection (indexed again when it changes), marked by model discovery, timed by the bench."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.docs import embedders
from engine.docs.indexer import index_collection
from engine.docs.search import search
from engine.loading.discovery import discover_models
from tests.engine.embedding_models import build_tiny_embedder

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A home folder whose Hugging Face cache holds a tiny bge-style encoder and a Qwen3-Embedding-style decoder,
    and a chat model (a qwen3 without pooling files), laid out as huggingface_hub stores them."""
    home = tmp_path_factory.mktemp("home")
    hub = home / ".cache" / "huggingface" / "hub"
    out = {"home": home}
    for key, model_type, pooling in (
        ("bge", "bert", "cls"),
        ("qwen-embed", "qwen3", "last"),
        ("chat", "qwen3", None),
    ):
        snapshot = hub / f"models--tiny--{key}" / "snapshots" / "0123abc"
        snapshot.mkdir(parents=True)
        out[key], _ = build_tiny_embedder(model_type, snapshot, pooling)
    return out


def _docs(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    docs.mkdir(exist_ok=True)
    (docs / "boats.md").write_text("# Boats\n\nThe boat is in the harbour shed.\n")
    (docs / "tower.txt").write_text("The lighthouse tower lamp was oiled at night.\n")
    return docs


def _dims(conn: sqlite3.Connection) -> set[int]:
    return {len(r[0]) // 4 for r in conn.execute("SELECT vector FROM chunks")}


def test_discovery_marks_embedding_models(tiny_models: dict[str, Path]) -> None:
    found = {m.name: m for m in discover_models(tiny_models["home"])}
    kinds = {name.split("/")[-1]: m.kind for name, m in found.items()}
    assert kinds == {"bge": "embedding", "qwen-embed": "embedding", "chat": "chat"}, found
    assert found["tiny/bge"].runnable and found["tiny/qwen-embed"].runnable and not found["tiny/bge"].reason
    listed = subprocess.run(
        [sys.executable, "-m", "engine.models", "--home", str(tiny_models["home"]), "--json"],
        check=True, cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert sorted((r["name"].split("/")[-1], r["kind"]) for r in rows) == [
        ("bge", "embedding"), ("chat", "chat"), ("qwen-embed", "embedding"),
    ]  # fmt: skip


def test_a_model_path_indexes_and_searches_with_that_model(
    tmp_path: Path, conn: sqlite3.Connection, tiny_models: dict[str, Path]
) -> None:
    docs = _docs(tmp_path)
    report = index_collection(conn, "c", [docs], embedder=str(tiny_models["bge"]))
    assert report.embedder == str(tiny_models["bge"].resolve())
    assert (
        "bert encoder, 32 dimensions, cls pooling" in report.embedder_reason
        and "as asked" in report.embedder_reason
    )
    assert _dims(conn) == {32}
    model = embedders.load_embedder(report.embedder)
    assert model is not None
    [row] = conn.execute(
        "SELECT vector FROM chunks c JOIN files f ON f.id = c.file_id WHERE f.path LIKE '%boats.md'"
    )
    stored = np.frombuffer(row[0], dtype=np.float32)
    text = conn.execute("SELECT text FROM chunks WHERE vector = ?", (row[0],)).fetchone()[0]
    np.testing.assert_allclose(stored, model.embed([text])[0], atol=1e-6)  # the model's own vector was stored
    [hit] = search(conn, "c", text, top_k=1, mode="vector")
    assert Path(hit.file).name == "boats.md" and hit.score == pytest.approx(1.0, abs=1e-5)


def test_auto_prefers_an_embedding_model_on_disk_and_the_collection_follows_its_embedder(
    tmp_path: Path, conn: sqlite3.Connection, tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = _docs(tmp_path)
    first = index_collection(conn, "c", [docs], embedder="wordllama")
    assert _dims(conn) == {256}
    monkeypatch.setattr(embedders, "search_home", tiny_models["home"])
    found = embedders.find_embedding_models()
    assert (
        sorted(f.path.name for f in found) == ["0123abc"] * 2
        and found[0].num_parameters <= found[1].num_parameters
    )
    smallest = str(found[0].path.resolve())
    assert {smallest, str(found[1].path.resolve())} == {
        str(tiny_models[k].resolve()) for k in ("bge", "qwen-embed")
    }
    choice = embedders.choose_embedder("auto")
    assert choice.name == smallest  # the smaller of the two embedders, never the chat model
    assert "an embedding model on disk (huggingface, the smallest of 2 found)" in choice.reason
    again = index_collection(conn, "c", embedder="auto")  # an existing collection keeps its embedder
    assert again.embedder == first.embedder == "wordllama" and again.unchanged == 2
    assert "the collection's embedder" in again.embedder_reason
    moved = index_collection(
        conn, "c", embedder=str(tiny_models["qwen-embed"])
    )  # another embedder: all again
    assert len(moved.indexed) == 2 and _dims(conn) == {32}
    assert "qwen3 decoder, 32 dimensions, last pooling" in moved.embedder_reason

    gone = tmp_path / "copy"
    shutil.copytree(tiny_models["bge"], gone)
    index_collection(conn, "c", embedder=str(gone))
    shutil.rmtree(gone)
    embedders._cache.pop(str(gone.resolve()), None)  # a fresh process: the folder is no longer there
    after = index_collection(conn, "c", embedder="auto")
    assert "cannot load" in after.embedder_reason and after.embedder == smallest
    assert len(after.indexed) == 2 and _dims(conn) == {32}


def test_auto_skips_models_too_large_for_a_cpu(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedders, "search_home", tiny_models["home"])
    monkeypatch.setattr(embedders, "MAX_AUTO_PARAMETERS", 10)
    choice = embedders.choose_embedder("auto")
    assert choice.name == "wordllama" and "too large to index with on a CPU" in choice.reason


def test_cli_index_with_a_model_path_and_bench_reports_chunks_per_second(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    docs = _docs(tmp_path)
    home = str(tmp_path / "home")
    indexed = subprocess.run(
        [sys.executable, "-m", "engine.docs", "index", str(docs), "--collection", "c", "--home", home,
         "--embedder", str(tiny_models["qwen-embed"])],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert indexed.returncode == 0, indexed.stderr
    assert "qwen3 decoder" in indexed.stdout and "2 indexed" in indexed.stdout
    bench = subprocess.run(
        [sys.executable, "-m", "engine.docs", "bench", "--pages", "0", "--chunks", "0", "--embed-chunks", "12",
         "--embedder", str(tiny_models["bge"])],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert bench.returncode == 0, bench.stderr
    result = json.loads(bench.stdout[bench.stdout.index("{\n") :])["embed"]
    assert result["chunks"] == 12 and result["chunks_per_s"] > 0
    if "skipped" in result["sentence_transformers"]:
        assert "sentence-transformers comparison skipped" in bench.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "engine.docs", "index", str(docs), "--collection", "d", "--home", home,
         "--embedder", str(tiny_models["chat"])],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "chat model, not an embedding model" in bad.stderr


def test_the_models_table_has_a_kind_column(
    tiny_models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from engine.loading.discovery import main

    assert main(["--home", str(tiny_models["home"])]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-1] == "KIND"
    kinds = {
        line.split()[0].split("/")[-1]: line.split()[-1] for line in lines[1:] if line.startswith("tiny/")
    }
    assert kinds == {"bge": "embedding", "qwen-embed": "embedding", "chat": "chat"}


def test_nomic_folders_and_gguf_encoders_are_found_and_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A nomic-embed-text folder as the hub holds it (in the Hugging Face cache) and a nomic-bert GGUF (an added
    folder) are embedding models that discovery lists as runnable, and ``--embedder FILE.gguf`` indexes with one."""
    from engine.loading.discovery import main
    from tests.engine.embedding_models import nomic_original_config, write_gguf

    home = tmp_path / "home"
    snapshot = home / ".cache" / "huggingface" / "hub" / "models--tiny--nomic" / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    folder, model = build_tiny_embedder("nomic_bert", snapshot, "mean")
    (folder / "config.json").write_text(json.dumps(nomic_original_config(model.config)))
    (tmp_path / "models").mkdir()
    gguf = write_gguf(folder, model, tmp_path / "models" / "nomic-embed.Q8_0.gguf", quantized=True)
    found = {m.path.name: m for m in discover_models(home, [tmp_path / "models"])}
    assert {n: (m.kind, m.runnable, m.model_type) for n, m in found.items()} == {
        "0123abc": ("embedding", True, "nomic_bert"),
        "nomic-embed.Q8_0.gguf": ("embedding", True, "nomic-bert"),
    }, {n: m.reason for n, m in found.items()}
    assert main(["--home", str(home), "--add", str(tmp_path / "models")]) == 0
    table = capsys.readouterr().out
    assert "can't run" not in table and table.count("embedding") == 2
    docs = _docs(tmp_path)
    indexed = subprocess.run(
        [sys.executable, "-m", "engine.docs", "index", str(docs), "--collection", "c", "--home", str(home),
         "--embedder", str(gguf)],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert indexed.returncode == 0, indexed.stderr
    assert (
        "nomic_bert encoder, GGUF, 32 dimensions, mean pooling" in indexed.stdout
        and "2 indexed" in indexed.stdout
    )
    choice = embedders.choose_embedder(str(gguf))
    assert choice.embedder is not None and choice.name == str(gguf.resolve())
    hub = embedders.choose_embedder(str(folder))
    assert hub.embedder is not None and "nomic_bert encoder, 32 dimensions" in hub.reason
