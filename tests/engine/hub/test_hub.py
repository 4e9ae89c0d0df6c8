"""engine.hub against a hub running in the test (tests/engine/hub/hub_server.py) on 127.0.0.1.

The hub serves real files: the default model's GGUF, a split GGUF written here, and a safetensors folder laid
out as ``save_pretrained`` writes one (written here with numpy: transformers would add seconds to every run). ``huggingface_hub`` is pointed at it by its ``endpoint`` argument (and, for the command
line, by ``HF_ENDPOINT``).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import gguf
import numpy as np
import pytest
from huggingface_hub import constants
from safetensors.numpy import save_file

from engine.hub import DownloadCancelled, HubError, download_entry, download_file, list_files, search
from engine.hub import download as download_mod
from engine.hub.fit import FITS, SHORTER, TOO_LARGE, judge_fit
from engine.hub.search import parse_query
from engine.loading.default_model import source_gguf_path
from engine.loading.gguf_reader import gguf_config, read_gguf_header
from tests.engine.hub.hub_server import FakeHub, HubThread

GGUF_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SPLIT = ["SmolLM2-135M-Instruct.Q8_0-00001-of-00002.gguf", "SmolLM2-135M-Instruct.Q8_0-00002-of-00002.gguf"]
TINY_REPO = "hearth-test/tiny-llama"
GATED_REPO = "hearth-test/gated-model"
GIB = 1 << 30


def _split_part(path: Path, number: int, count: int, seed: int) -> Path:
    """One part of a split GGUF as llama.cpp's gguf-split writes it: the split keys and a share of tensors."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint16("split.no", number - 1)
    writer.add_uint16("split.count", count)
    writer.add_int32("split.tensors.count", count)
    # over one 10 MiB write of huggingface_hub's http_get, so a cut-off transfer leaves bytes on disk
    rows = np.random.default_rng(seed).standard_normal((1536, 2048)).astype(np.float32)
    writer.add_tensor(f"blk.{number - 1}.ffn_up.weight", rows)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _tiny_safetensors_folder(folder: Path) -> Path:
    """A two-layer Llama as ``save_pretrained`` lays it out (config.json, model.safetensors), random weights."""
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1024, "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "torch_dtype": "float32",
              "tie_word_embeddings": False}
    rng = np.random.default_rng(0)
    shapes = {"model.embed_tokens.weight": (1024, 64), "model.norm.weight": (64,), "lm_head.weight": (1024, 64)}
    for i in range(2):
        layer = f"model.layers.{i}"
        shapes |= {f"{layer}.self_attn.q_proj.weight": (64, 64), f"{layer}.self_attn.k_proj.weight": (32, 64),
                   f"{layer}.self_attn.v_proj.weight": (32, 64), f"{layer}.self_attn.o_proj.weight": (64, 64),
                   f"{layer}.mlp.gate_proj.weight": (128, 64), f"{layer}.mlp.up_proj.weight": (128, 64),
                   f"{layer}.mlp.down_proj.weight": (64, 128), f"{layer}.input_layernorm.weight": (64,),
                   f"{layer}.post_attention_layernorm.weight": (64,)}
    folder.mkdir(parents=True)
    save_file({k: rng.standard_normal(v).astype(np.float32) for k, v in shapes.items()},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    return folder


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubThread]:
    files = tmp_path_factory.mktemp("hub-files")
    fake = FakeHub()
    source = source_gguf_path()
    metadata, tensors = read_gguf_header(source)
    repo = fake.repo(GGUF_REPO, config=gguf_config(metadata, tensors), downloads=100,
                     gguf={"total": 134515008, "architecture": "llama", "context_length": 8192})
    repo.add(GGUF_FILE, source.read_bytes())
    for i, name in enumerate(SPLIT, start=1):
        repo.add(name, _split_part(files / name, i, len(SPLIT), seed=i).read_bytes())
    repo.add("README.md", b"# SmolLM2 135M Instruct, GGUF\n")
    tiny = _tiny_safetensors_folder(files / "tiny")
    small = fake.repo(TINY_REPO, downloads=5, config=json.loads((tiny / "config.json").read_text()))
    for path in sorted(tiny.iterdir()):
        small.add(path.name, path.read_bytes())
    gated = fake.repo(GATED_REPO, gated=True)
    gated.add("model.gguf", b"GGUF" + b"\0" * 1000)
    with HubThread(fake) as running:
        yield running


@pytest.fixture(autouse=True)
def online(monkeypatch: pytest.MonkeyPatch, hub: HubThread) -> None:
    """The suite may run with HF_HUB_OFFLINE=1; these tests talk to the local hub only."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", "")
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", "/nonexistent/token")
    hub.hub.corrupt.clear()
    hub.hub.drop_once.clear()
    hub.hub.requests.clear()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- search -----------------------------------------------------------------------------------------


def test_search_by_keyword_name_and_link(hub: HubThread) -> None:
    hits = search("smollm2", endpoint=hub.endpoint)
    assert [h.repo_id for h in hits] == [GGUF_REPO]
    assert [h.repo_id for h in search("hearth-test", endpoint=hub.endpoint)] == [TINY_REPO, GATED_REPO]
    assert search(TINY_REPO, endpoint=hub.endpoint)[0].repo_id == TINY_REPO
    link = f"{hub.endpoint}/{GGUF_REPO}/blob/main/{GGUF_FILE}"
    assert search(link, endpoint=hub.endpoint)[0].repo_id == GGUF_REPO
    assert search(GATED_REPO, endpoint=hub.endpoint)[0].gated
    assert parse_query("https://huggingface.co/org/name/tree/main") == ("repo", "org/name")
    assert parse_query("llama 3 8b") == ("keyword", "llama 3 8b")
    with pytest.raises(HubError, match="not a Hugging Face link"):
        parse_query("https://example.com/org/name")


def test_search_of_a_missing_repo_says_so(hub: HubThread) -> None:
    with pytest.raises(HubError, match="No model repository 'nobody/nothing'"):
        search("nobody/nothing", endpoint=hub.endpoint)


def test_no_network_is_said_in_words() -> None:
    unreachable = "Hugging Face cannot be reached: .*everything else works offline"
    with socket_port() as port, pytest.raises(HubError, match=unreachable):  # a port nothing listens on
        search("smollm2", endpoint=f"http://127.0.0.1:{port}")


class socket_port:
    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return int(self.sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def test_offline_mode_is_said_in_words(monkeypatch: pytest.MonkeyPatch, hub: HubThread, tmp_path: Path) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubError, match="cannot be reached: offline mode is on"):
        download_file(GGUF_REPO, GGUF_FILE, dest=tmp_path, endpoint=hub.endpoint)


# -- files and fit ------------------------------------------------------------------------------------


def test_files_are_grouped_with_sizes_fit_and_a_recommendation(hub: HubThread) -> None:
    repo = list_files(GGUF_REPO, endpoint=hub.endpoint, available_bytes=8 * GIB)
    by_name = {e.name: e for e in repo.entries}
    assert set(by_name) == {GGUF_FILE, "SmolLM2-135M-Instruct.Q8_0.gguf (2 of 2 parts)"}
    single, split = by_name[GGUF_FILE], by_name["SmolLM2-135M-Instruct.Q8_0.gguf (2 of 2 parts)"]
    assert (single.format, single.quant, single.size_bytes) == ("gguf", "Q4_1", source_gguf_path().stat().st_size)
    assert single.sha256 == {GGUF_FILE: _sha(source_gguf_path())}
    assert split.files == tuple(SPLIT) and split.quant == "Q8_0"
    assert split.size_bytes == sum(len(hub.hub.repos[GGUF_REPO].files[p].data) for p in SPLIT)
    assert repo.context == 4096 and repo.num_parameters
    assert all(e.fit is not None and e.fit.label == FITS for e in repo.entries)
    assert repo.recommended is not None and repo.recommended.why
    tiny = list_files(TINY_REPO, endpoint=hub.endpoint, available_bytes=8 * GIB)
    assert [(e.format, e.name) for e in tiny.entries] == [("safetensors", "(repository root)")]
    assert {"config.json", "model.safetensors"} <= set(tiny.entries[0].files)


def test_fit_labels_follow_memory_and_context(hub: HubThread) -> None:
    per_token = 2 * 30 * 3 * 64 * 4  # SmolLM2-135M: 30 layers, 3 KV heads of 64, fp32 on a CPU
    weights = source_gguf_path().stat().st_size
    assert judge_fit(weights, per_token, 4096, 8 * GIB).label == FITS
    short_memory = int((600_000_000 + weights + per_token * 2048) / 0.95)
    short = judge_fit(weights, per_token, 4096, short_memory)
    assert short.label == SHORTER and 1792 <= short.context <= 2048 and "fits with" in short.reason
    assert judge_fit(weights, per_token, 4096, 600 * 2**20).label == TOO_LARGE
    listed = list_files(GGUF_REPO, endpoint=hub.endpoint, available_bytes=short_memory)
    labels = {e.quant: e.fit.label for e in listed.entries if e.fit}
    assert labels["Q4_1"] == SHORTER
    assert listed.recommended is not None and "nothing fits" in listed.recommended.why
    assert all(e.fit and e.fit.label == TOO_LARGE
               for e in list_files(GGUF_REPO, endpoint=hub.endpoint, available_bytes=GIB // 2).entries)


# -- downloads ----------------------------------------------------------------------------------------


def test_download_into_the_hf_cache_with_progress_is_found_by_discovery(hub: HubThread, tmp_path: Path) -> None:
    from engine.loading.discovery import discover_models
    from tests.engine.loading.test_discovery import HARDWARE

    cache = tmp_path / "home" / ".cache" / "huggingface" / "hub"
    seen: list[Any] = []
    path = download_file(GGUF_REPO, GGUF_FILE, cache_dir=cache, endpoint=hub.endpoint, on_progress=seen.append)
    repo = hub.hub.repos[GGUF_REPO]
    assert path == cache / f"models--{GGUF_REPO.replace('/', '--')}" / "snapshots" / repo.sha / GGUF_FILE
    assert path.is_symlink() and _sha(path) == repo.files[GGUF_FILE].sha256
    assert (path.parent.parent.parent / "refs" / "main").read_text() == repo.sha
    stages = [p.stage for p in seen]
    assert stages[0] == "download" and "verify" in stages and stages[-1] == "done"
    downloading = [p for p in seen if p.stage == "download"]
    assert downloading[-1].done_bytes == downloading[-1].total_bytes == path.stat().st_size
    assert all(p.speed_bps >= 0 for p in downloading) and downloading[-1].eta_s == 0
    readme = download_file(GGUF_REPO, "README.md", cache_dir=cache, endpoint=hub.endpoint)
    assert readme.read_bytes().startswith(b"# SmolLM2")
    found = {m.name: m for m in discover_models(home=tmp_path / "home", hardware=HARDWARE)}
    assert f"{GGUF_REPO}/{GGUF_FILE}" in found and found[f"{GGUF_REPO}/{GGUF_FILE}"].runnable


def test_a_dropped_connection_resumes_with_a_range_request(hub: HubThread, tmp_path: Path) -> None:
    data = hub.hub.repos[GGUF_REPO].files[SPLIT[0]]
    hub.hub.drop_once.add(data.sha256)
    path = download_file(GGUF_REPO, SPLIT[0], dest=tmp_path, endpoint=hub.endpoint)
    assert path.read_bytes() == data.data
    ranges = hub.hub.ranges_seen(data.sha256)
    assert ranges[0] is None and len(ranges) == 2 and ranges[1] is not None
    assert 0 < int(ranges[1].removeprefix("bytes=").rstrip("-")) < len(data.data)


def test_a_cancelled_download_resumes_after_a_restart(hub: HubThread, tmp_path: Path) -> None:
    cancel = threading.Event()
    with pytest.raises(DownloadCancelled, match="resumes"):
        download_file(GGUF_REPO, SPLIT[0], dest=tmp_path, endpoint=hub.endpoint, cancel=cancel,
                      on_progress=lambda p: cancel.set())
    data = hub.hub.repos[GGUF_REPO].files[SPLIT[0]]
    partial = tmp_path / (SPLIT[0] + ".incomplete")
    kept = partial.stat().st_size
    assert 0 < kept < len(data.data) and not (tmp_path / SPLIT[0]).exists()
    hub.hub.requests.clear()
    path = download_file(GGUF_REPO, SPLIT[0], dest=tmp_path, endpoint=hub.endpoint)
    assert hub.hub.ranges_seen("/cdn/") == [f"bytes={kept}-"]
    assert path.read_bytes() == data.data and not partial.exists()


def test_a_corrupted_byte_is_caught_and_the_file_removed(hub: HubThread, tmp_path: Path) -> None:
    data = hub.hub.repos[GGUF_REPO].files[SPLIT[1]]
    hub.hub.corrupt.add(data.sha256)
    with pytest.raises(HubError, match=f"arrived damaged: .*hub says {data.sha256}.*removed"):
        download_file(GGUF_REPO, SPLIT[1], dest=tmp_path, endpoint=hub.endpoint)
    assert list(tmp_path.iterdir()) in ([], [tmp_path / (SPLIT[1] + ".incomplete.lock")])


def test_a_missing_file_is_a_clear_404(hub: HubThread, tmp_path: Path) -> None:
    with pytest.raises(HubError, match="has no file 'nope.gguf'"):
        download_file(GGUF_REPO, "nope.gguf", dest=tmp_path, endpoint=hub.endpoint)
    with pytest.raises(HubError, match="No model repository 'nobody/nothing'"):
        download_file("nobody/nothing", "x.gguf", dest=tmp_path, endpoint=hub.endpoint)


def test_a_gated_repo_says_how_to_get_access(hub: HubThread, tmp_path: Path) -> None:
    with pytest.raises(HubError, match=f"{GATED_REPO} is a gated repository: accept its terms .* log in"):
        download_file(GATED_REPO, "model.gguf", dest=tmp_path, endpoint=hub.endpoint)
    assert ("HEAD", f"/{GATED_REPO}/resolve/main/model.gguf", None) in hub.hub.requests


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB tmpfs where this user may mount one; skipped elsewhere."""
    where = tmp_path / "small"
    where.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def test_a_full_disk_is_refused_before_downloading(hub: HubThread, small_disk: Path) -> None:
    with pytest.raises(HubError, match="The disk is full: .* needs 0.09 GiB more"):
        download_file(GGUF_REPO, GGUF_FILE, dest=small_disk, endpoint=hub.endpoint)
    assert not (small_disk / GGUF_FILE).exists()


def test_a_disk_that_fills_while_writing_keeps_the_part_for_later(
    hub: HubThread, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written = {"bytes": 0}

    class FillingFile:
        """The partial file, whose OS write fails with ENOSPC after 11 MiB (as a full disk's does)."""

        def __init__(self, real: Any) -> None:
            self.real = real

        def write(self, chunk: bytes) -> int:
            if written["bytes"] + len(chunk) > 11 << 20:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            written["bytes"] += len(chunk)
            return int(self.real.write(chunk))

        def __getattr__(self, name: str) -> Any:
            return getattr(self.real, name)

        def __enter__(self) -> Self:
            return self

        def __exit__(self, *exc: object) -> None:
            self.real.close()

    monkeypatch.setattr(download_mod, "_open_partial", lambda path: FillingFile(path.open("ab")))
    with pytest.raises(HubError, match="The disk is full: .*resumes from there"):
        download_file(GGUF_REPO, SPLIT[1], dest=tmp_path, endpoint=hub.endpoint)
    assert (tmp_path / (SPLIT[1] + ".incomplete")).stat().st_size == written["bytes"] > 0
    monkeypatch.undo()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    path = download_file(GGUF_REPO, SPLIT[1], dest=tmp_path, endpoint=hub.endpoint)
    assert path.read_bytes() == hub.hub.repos[GGUF_REPO].files[SPLIT[1]].data
    assert hub.hub.ranges_seen("/cdn/")[-1] == f"bytes={written['bytes']}-"


def test_a_split_gguf_entry_downloads_whole_and_is_listed_once(hub: HubThread, tmp_path: Path) -> None:
    from engine.loading.discovery import discover_models
    from tests.engine.loading.test_discovery import HARDWARE

    cache = tmp_path / "home" / ".cache" / "huggingface" / "hub"
    entry = next(e for e in list_files(GGUF_REPO, endpoint=hub.endpoint).entries if len(e.files) == 2)
    paths = download_entry(GGUF_REPO, entry, cache_dir=cache, endpoint=hub.endpoint)
    assert [p.name for p in paths] == SPLIT and len({p.parent for p in paths}) == 1
    names = [m.name for m in discover_models(home=tmp_path / "home", hardware=HARDWARE)]
    assert names == [f"{GGUF_REPO}/{SPLIT[0]}"]


def test_two_downloads_at_once(hub: HubThread, tmp_path: Path) -> None:
    results: dict[str, Path] = {}
    errors: list[BaseException] = []

    def get(key: str, filename: str) -> None:
        try:
            results[key] = download_file(GGUF_REPO, filename, cache_dir=tmp_path, endpoint=hub.endpoint)
        except BaseException as exc:  # noqa: BLE001 -- reported by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=get, args=(k, f)) for k, f in
               (("a", SPLIT[0]), ("b", SPLIT[1]), ("a again", SPLIT[0]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    files = hub.hub.repos[GGUF_REPO].files
    assert results["a"] == results["a again"]
    for key, name in (("a", SPLIT[0]), ("b", SPLIT[1])):
        assert results[key].read_bytes() == files[name].data


def test_the_command_line_prints_a_table(
    hub: HubThread, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from engine.hub.cli import main

    monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)  # what HF_ENDPOINT set before the import does
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    assert main(["files", GGUF_REPO, "--context", "2048"]) == 0
    out = capsys.readouterr().out
    assert "judged at 2048 tokens" in out and "recommended: " in out
    assert any(line.startswith("* gguf") for line in out.splitlines())
    assert main(["search", "hearth-test"]) == 0
    assert "hearth-test/gated-model" in capsys.readouterr().out
    assert main(["download", GATED_REPO, "model.gguf"]) == 1
    assert "gated repository" in capsys.readouterr().err


def test_the_command_line_uses_hf_endpoint(hub: HubThread, tmp_path: Path) -> None:
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HUB_OFFLINE": "0", "HF_HUB_CACHE": str(tmp_path / "c")}
    run = [sys.executable, "-m", "engine.hub"]
    cwd = Path(__file__).resolve().parents[3]
    found = subprocess.run([*run, "files", GGUF_REPO, "--json"], env=env, cwd=cwd, capture_output=True, text=True, check=False)
    assert found.returncode == 0, found.stderr
    assert '"quant": "Q4_1"' in found.stdout
    got = subprocess.run([*run, "download", GGUF_REPO, "README.md", SPLIT[0], "--dest", str(tmp_path / "d")],
                         env=env, cwd=cwd, capture_output=True, text=True, check=False)
    assert got.returncode == 0, got.stderr
    assert (tmp_path / "d" / "README.md").read_bytes().startswith(b"# SmolLM2")
    assert got.stdout.split() == [str(tmp_path / "d" / name) for name in ("README.md", *SPLIT)]  # every part
