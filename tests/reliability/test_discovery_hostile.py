"""The Models scan survives what a disk can hold: FIFOs named like model files and config.json, folders it may not
read, names too long to look at, and symlink loops. A folder that cannot be read is skipped, never the whole list.

Each scan runs in a daemon thread joined with a timeout, so a FIFO that blocks an open() fails the test instead of
hanging it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.api import HardwareInfo
from engine.loading.discovery import discover_models

TIMEOUT_S = 20.0
HARDWARE = HardwareInfo("test CPU", 4, 8, True, False, False, False, 16 * 10**9, 8 * 10**9)
needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX-only")
is_root = hasattr(os, "geteuid") and os.geteuid() == 0


def _within(fn: Callable[[], Any]) -> Any:
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as exc:  # noqa: BLE001 -- handed to the test
            box.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(TIMEOUT_S)
    assert box, f"the scan was still running after {TIMEOUT_S} s"
    return box[0]


@contextlib.contextmanager
def _released(fifos: list[Path]) -> Iterator[None]:
    """Open each FIFO's write end on the way out, so that a reader stuck in open() (a regression) is let go."""
    try:
        yield
    finally:
        for fifo in fifos:
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def _gguf(path: Path) -> Path:
    """A tiny valid GGUF file."""
    import gguf
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_array("tokenizer.ggml.tokens", ["a", "b"])
    writer.add_tensor("token_embd.weight", np.zeros((2, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _scan(home: Path, *extra: Path) -> list[str]:
    found = _within(lambda: discover_models(home, list(extra), HARDWARE))
    assert not isinstance(found, BaseException), f"the scan raised {found!r}"
    return [m.name for m in found]


@pytest.fixture
def good(tmp_path: Path) -> Path:
    folder = tmp_path / "good"
    _gguf(folder / "model.gguf")
    return folder


def test_a_folder_added_whose_name_is_too_long_to_look_at_leaves_the_others_listed(tmp_path: Path, good: Path) -> None:
    """Fails for root too: the name, not a permission, is what cannot be looked at."""
    assert _scan(tmp_path / "home", good, tmp_path / ("x" * 300)) == ["model.gguf"]


@pytest.mark.skipif(is_root or not hasattr(os, "geteuid"), reason="root reads any folder: chmod cannot lock it")
def test_an_unreadable_folder_leaves_the_others_listed(tmp_path: Path, good: Path) -> None:
    locked = tmp_path / "locked"
    _gguf(locked / "inner" / "hidden.gguf")
    _gguf(good / "sub" / "more.gguf")
    (good / "closed").mkdir()
    _gguf(good / "closed" / "secret.gguf")
    for folder in (locked, good / "closed"):
        folder.chmod(0)
    try:
        names = _scan(tmp_path / "home", locked / "inner", good, locked)
    finally:
        for folder in (locked, good / "closed"):
            folder.chmod(0o755)
    assert names == ["model.gguf", "sub/more.gguf"]


@pytest.mark.skipif(is_root or not hasattr(os, "geteuid"), reason="root reads any folder: chmod cannot lock it")
def test_an_unreadable_app_folder_in_the_home_leaves_the_others_listed(tmp_path: Path, good: Path) -> None:
    home = tmp_path / "home"
    for app in (".lmstudio", ".ollama", ".cache"):
        (home / app).mkdir(parents=True)
        (home / app).chmod(0)
    try:
        names = _scan(home, good)
    finally:
        for app in (".lmstudio", ".ollama", ".cache"):
            (home / app).chmod(0o755)
    assert names == ["model.gguf"]


def test_symlink_loops_end_and_leave_the_others_listed(tmp_path: Path, good: Path) -> None:
    loops = tmp_path / "loops"
    (loops / "inner").mkdir(parents=True)
    (loops / "self").symlink_to(loops / "self")  # a link to itself, added as a folder too
    (loops / "inner" / "up").symlink_to(loops)  # a folder loop through the parent
    (loops / "inner" / "loop.gguf").symlink_to(loops / "inner" / "loop.gguf")
    (loops / "hf").mkdir()
    (loops / "hf" / "config.json").symlink_to(loops / "hf" / "config.json")
    (loops / "hf" / "model.safetensors").write_bytes(b"")
    home = tmp_path / "home"
    home.mkdir()
    (home / ".lmstudio").symlink_to(home / ".lmstudio")
    (home / ".ollama").symlink_to(home)
    found = _within(lambda: discover_models(home, [good, loops, loops / "self"], HARDWARE))
    assert not isinstance(found, BaseException), found
    by_name = {m.name: m for m in found}
    assert set(by_name) == {"model.gguf", "inner/loop.gguf"}
    assert not by_name["inner/loop.gguf"].runnable and "symbolic links" in by_name["inner/loop.gguf"].reason


@needs_fifo
def test_fifos_named_like_model_files_and_configs_are_passed_over(tmp_path: Path, good: Path) -> None:
    trap = tmp_path / "trap"
    (trap / "hf").mkdir(parents=True)
    (trap / "hf" / "model.safetensors").write_bytes(b"")
    fifos = [trap / "hf" / "config.json", trap / "model.gguf", trap / "hf" / "tokenizer.json"]
    home = tmp_path / "home"
    (home / ".lmstudio").mkdir(parents=True)
    (home / ".config" / "nomic.ai").mkdir(parents=True)
    fifos += [home / ".lmstudio" / "settings.json", home / ".config" / "nomic.ai" / "GPT4All.ini"]
    for fifo in fifos:
        os.mkfifo(fifo)
    with _released(fifos):
        found = _within(lambda: discover_models(home, [trap, good], HARDWARE))
    assert not isinstance(found, BaseException), found
    assert sorted(m.path.parent.name for m in found) == ["good", "trap"]  # the FIFO config.json: no folder model
    trapped = next(m for m in found if m.path.parent.name == "trap")
    assert not trapped.runnable and "not a regular file" in trapped.reason
