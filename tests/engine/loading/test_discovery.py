"""Finding the models already on disk: the default model's real files laid out as each app keeps them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.api import HardwareInfo
from engine.loading.default_model import GGUF_SHA256, source_gguf_path
from engine.loading.discovery import FoundModel, discover_models, main

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
HF_REV = "0123456789abcdef0123456789abcdef01234567"
GGUF_NAME = "SmolLM2-135M-Instruct-Q4_1.gguf"


def _link(target: Path, link: Path) -> Path:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    return link


def _hf_repo(cache: Path, repo: str, files: dict[str, Path]) -> Path:
    """A hub-cache repo as huggingface_hub writes it: blobs, snapshot links into them, refs/main."""
    root = cache / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / HF_REV
    for i, (name, source) in enumerate(sorted(files.items())):
        blob = _link(source, root / "blobs" / f"{i:040x}")
        _link(Path("../../blobs") / blob.name, snapshot / name)
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(HF_REV)
    return snapshot


def _ollama_manifest(models: Path, parts: tuple[str, str, str, str], digest: str) -> None:
    manifest = models / "manifests" / Path(*parts)
    manifest.parent.mkdir(parents=True, exist_ok=True)
    layers = [
        {"mediaType": "application/vnd.ollama.image.model", "digest": digest, "size": 1},
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 1},
    ]
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))


def _write_gguf(path: Path, architecture: str) -> None:
    """A tiny valid GGUF (one F16 tensor, a two-token vocabulary) of another architecture."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_array("tokenizer.ggml.tokens", ["a", "b"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_tensor("token_embd.weight", np.zeros((2, 4), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Path:
    """A home folder holding the default model in every app's layout, plus some broken files."""
    home = tmp_path_factory.mktemp("home")
    gguf = source_gguf_path()
    folder_files = {p.name: p for p in default_model_dir.iterdir() if not p.name.startswith(".")}
    hub = home / ".cache" / "huggingface" / "hub"
    _hf_repo(hub, "HuggingFaceTB/SmolLM2-135M-Instruct", folder_files)
    _hf_repo(hub, "someone/SmolLM2-GGUF", {GGUF_NAME: gguf, "README.md": gguf.parent / "__init__.py"})
    _link(gguf, home / ".lmstudio" / "models" / "lmstudio-community" / "SmolLM2-GGUF" / GGUF_NAME)
    _link(gguf, home / ".cache" / "lm-studio" / "models" / "old" / "SmolLM2-GGUF" / GGUF_NAME)
    models = home / ".ollama" / "models"
    blob = models / "blobs" / f"sha256-{GGUF_SHA256}"
    blob.parent.mkdir(parents=True)
    os.link(gguf, blob)  # a hard link: the blob is a real file without an extension
    _ollama_manifest(models, ("registry.ollama.ai", "library", "smollm2", "135m"), f"sha256:{GGUF_SHA256}")
    _ollama_manifest(models, ("registry.ollama.ai", "someone", "tiny", "latest"), f"sha256:{GGUF_SHA256}")
    _ollama_manifest(models, ("registry.ollama.ai", "library", "gone", "latest"), "sha256:" + "f" * 64)
    _write_gguf(models / "blobs" / ("sha256-" + "c" * 64), "clip")
    _ollama_manifest(models, ("registry.ollama.ai", "library", "clippy", "latest"), "sha256:" + "c" * 64)
    gpt4all = home / ".local" / "share" / "nomic.ai" / "GPT4All"
    _link(gguf, gpt4all / "smollm2.Q4_1.gguf")
    (gpt4all / "truncated.gguf").write_bytes(gguf.read_bytes()[:4096])
    (gpt4all / "not-a-model.gguf").write_bytes(b"<html>404 Not Found</html>")
    _link(gguf, home / "jan" / "models" / "smollm2-135m" / "smollm2-135m.gguf")
    (home / "jan" / "models" / "smollm2-135m" / "model.json").write_text(json.dumps({"id": "smollm2-135m"}))
    _link(gguf, home / ".local" / "share" / "Jan" / "data" / "models" / "smollm2-new" / "model.gguf")
    return home


@pytest.fixture(scope="module")
def extra(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Path:
    """A folder the user adds: a model folder, a split GGUF, an unsupported model and a symlink loop."""
    root = tmp_path_factory.mktemp("extra")
    _link(default_model_dir, root / "converted" / "smollm2-bf16")
    split = root / "split"
    _link(source_gguf_path(), split / "smol-00001-of-00002.gguf")
    _link(source_gguf_path(), split / "smol-00002-of-00002.gguf")
    bert = root / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    (bert / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    (root / "loop").symlink_to(root)
    (root / "project").mkdir()
    (root / "project" / "config.json").write_text(json.dumps({"editor": "vim"}))  # not a model
    return root


@pytest.fixture(scope="module")
def found(home: Path, extra: Path) -> dict[tuple[str, str], FoundModel]:
    models = discover_models(home, [extra], hardware=HARDWARE)
    return {(m.source, m.name): m for m in models}


def _check_default_gguf(model: FoundModel) -> None:
    assert (model.format, model.quantization, model.model_type) == ("gguf", "Q4_1", "llama")
    assert model.runnable, model.reason
    assert model.num_parameters == 134_515_008
    assert model.size_bytes == source_gguf_path().stat().st_size
    assert model.fits == "yes"
    assert model.context_length == 8192
    # the file's own Q4_1 blocks run at int4, whatever the file is called (an Ollama blob has no extension)
    assert model.recommended_level == "int4", model.fit_reason
    assert f"Q4_1 blocks in {model.path.name}" in model.fit_reason


def test_each_app_layout_is_found(found: dict[tuple[str, str], FoundModel]) -> None:
    folder = found["huggingface", "HuggingFaceTB/SmolLM2-135M-Instruct"]
    assert (folder.format, folder.quantization, folder.architecture) == (
        "safetensors",
        "BF16",
        "LlamaForCausalLM",
    )
    assert folder.runnable and folder.fits == "yes", folder.reason
    assert folder.path.name == HF_REV and folder.num_parameters == 134_515_008
    for key in [
        ("huggingface", f"someone/SmolLM2-GGUF/{GGUF_NAME}"),
        ("lmstudio", f"lmstudio-community/SmolLM2-GGUF/{GGUF_NAME}"),
        ("lmstudio", f"old/SmolLM2-GGUF/{GGUF_NAME}"),
        ("ollama", "smollm2:135m"),
        ("ollama", "someone/tiny:latest"),
        ("gpt4all", "smollm2.Q4_1.gguf"),
        ("jan", "smollm2-135m/smollm2-135m.gguf"),
        ("jan", "smollm2-new/model.gguf"),
    ]:
        assert key in found, sorted(found)
        _check_default_gguf(found[key])
    user = found["user", "converted/smollm2-bf16"]
    assert (user.format, user.quantization, user.runnable) == ("safetensors", "BF16", True)


def test_ollama_blob_without_extension(found: dict[tuple[str, str], FoundModel]) -> None:
    model = found["ollama", "smollm2:135m"]
    assert model.path.name == f"sha256-{GGUF_SHA256}" and model.path.suffix == ""
    missing = found["ollama", "gone:latest"]
    assert not missing.runnable and "ollama pull gone:latest" in missing.reason
    clip = found["ollama", "clippy:latest"]
    assert (clip.quantization, clip.model_type, clip.runnable) == ("F16", "clip", False)
    # the message names the blob itself
    assert f"Unsupported architecture 'clip' (clip) in {clip.path}." in clip.reason


def test_blobs_outside_ollama_are_known_by_their_magic_bytes(tmp_path: Path) -> None:
    """An extension-less GGUF added by hand, or imported by Jan from Ollama's store, is a GGUF like any other."""
    blobs = tmp_path / "blobs"
    added = _link(source_gguf_path(), blobs / f"sha256-{GGUF_SHA256}")
    imported = _link(source_gguf_path(), blobs / ("sha256-" + "d" * 64))
    notes = blobs / ("sha256-" + "e" * 64)
    notes.write_text("not a model")
    jan = tmp_path / "home" / "jan" / "models" / "from-ollama"
    jan.mkdir(parents=True)
    (jan / "model.json").write_text(json.dumps({"sources": [{"url": f"file://{imported}"}, {"url": str(notes)}]}))
    models = discover_models(tmp_path / "home", [added, notes], hardware=HARDWARE)
    assert [(m.source, m.name, m.path) for m in models] == [
        ("jan", "from-ollama", imported),
        ("user", added.name, added),
    ]
    for model in models:
        _check_default_gguf(model)


def test_broken_and_unsupported_models_say_why(found: dict[tuple[str, str], FoundModel]) -> None:
    truncated = found["gpt4all", "truncated.gguf"]
    assert not truncated.runnable and "truncated" in truncated.reason and truncated.fits is None
    assert "not a GGUF file" in found["gpt4all", "not-a-model.gguf"].reason
    bert = found["user", "bert"]
    # an encoder is listed as an embedding model (the document index runs those); this one lacks its tokenizer
    assert bert.kind == "embedding" and not bert.runnable and "no tokenizer.json or vocab.txt" in bert.reason
    split = found["user", "split/smol-00001-of-00002.gguf"]
    assert not split.runnable and "split into 2 files" in split.reason
    assert ("user", "split/smol-00002-of-00002.gguf") not in found
    assert not any(name.startswith(("loop/", "project")) for _source, name in found)


def test_environment_variables_are_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gguf = source_gguf_path()
    hub = tmp_path / "elsewhere" / "hub"
    _hf_repo(hub, "someone/SmolLM2-GGUF", {GGUF_NAME: gguf})
    ollama_models = tmp_path / "ollama-models"
    _link(gguf, ollama_models / "blobs" / f"sha256-{GGUF_SHA256}")
    _ollama_manifest(ollama_models, ("hf.co", "someone", "smol", "Q4_1"), f"sha256:{GGUF_SHA256}")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("OLLAMA_MODELS", str(ollama_models))
    for var in ("XDG_DATA_HOME", "XDG_CACHE_HOME", "USERPROFILE"):
        monkeypatch.delenv(var, raising=False)
    models = discover_models(hardware=HARDWARE)
    names = {(m.source, m.name) for m in models if m.path.is_relative_to(tmp_path)}
    assert names == {
        ("huggingface", f"someone/SmolLM2-GGUF/{GGUF_NAME}"),
        ("ollama", "hf.co/someone/smol:Q4_1"),
    }


def test_cli_json_and_home(home: Path, extra: Path, repo_root: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "engine.models", "--json", "--home", str(home), "--add", str(extra)],
        cwd=repo_root,
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) >= 14
    for row in rows:
        assert {"name", "path", "source", "format", "quantization", "runnable", "reason", "fits"} <= set(row)
    by_name = {row["name"]: row for row in rows}
    assert by_name["smollm2:135m"]["quantization"] == "Q4_1"
    assert by_name["smollm2:135m"]["path"].startswith(str(home))


def test_cli_table_and_empty_home(home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--home", str(home)]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split()[:3] == ["NAME", "SOURCE", "FORMAT"]
    assert "smollm2:135m" in table and "why:" in table and "Q4_1" in table
    assert main(["--home", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "No models found" in out and str(tmp_path / ".ollama" / "models") in out
