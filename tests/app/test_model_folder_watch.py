"""The Models list follows its folders: a model copied into a scanned folder (or a folder inside it) shows, and one
deleted goes, without a click (issue 31).

The window runs on the fake engine with the real discovery of models reading the test's home; the model is a small
random-weight GGUF (``engine.tools.make_gguf``), as in test_discover.py.
"""

from __future__ import annotations

import dataclasses
import functools
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.bridge.model_folders import MAX_WATCHED_FOLDERS, watched_model_folders
from app.model.models_view import COLUMNS, ModelsView
from engine.tools.make_gguf import write_gguf
from tests.app.fake_engine import FakeLLM, fake_hardware, make_fake_api

TIMEOUT_S = 10.0


@pytest.fixture
def window(qtbot: Any, tmp_path: Path) -> Iterator[Any]:
    """The main window on the fake engine, its Models list found by the real discovery in an empty home."""
    from app import create_window
    from app.bridge.engine_bridge import EngineBridge
    from engine.loading.discovery import discover_models

    home = tmp_path / "home"
    home.mkdir()
    FakeLLM.instances.clear()
    api = dataclasses.replace(make_fake_api(load_delay_s=0.05),
                              discover_models=functools.partial(discover_models, home=home, hardware=fake_hardware()))
    win = create_window(data_dir=tmp_path / "data", bridge=EngineBridge(api=api))
    qtbot.add_widget(win)
    win.show()
    qtbot.wait_exposed(win)
    yield win
    FakeLLM.instances.clear()


def names(view: ModelsView) -> list[str]:
    tree = view._tree
    return [item.text(0) for item in map(tree.topLevelItem, range(tree.topLevelItemCount())) if item is not None]


def wait_for(qtbot: Any, condition: Callable[[], bool], what: str) -> None:
    """Let the event loop run, 50 ms at a time, until ``condition`` holds."""
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"waited {TIMEOUT_S} s for {what}"
        qtbot.wait(50)


def test_models_copied_in_or_deleted_update_the_list_by_themselves(qtbot: Any, window: Any, tmp_path: Path) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    view = window.models_view
    view.add_folder(str(folder))
    wait_for(qtbot, lambda: str(folder) in view.watched_folders, "the added folder to be watched")
    wait_for(qtbot, lambda: names(view) == [], "the first scan")
    write_gguf(folder / "tiny-chat.gguf", "tiny", "Q8_0", seed=3, vocab=2048)
    wait_for(qtbot, lambda: names(view) == ["tiny-chat.gguf"], "the copied model")
    item = view._tree.topLevelItem(0)
    assert item is not None and item.text(len(COLUMNS) - 1) == "Yes"  # a model Hearth runs, described
    # a model in a folder of its own, made after the scan (LM Studio's <owner>/<name>/ layout)
    nested = folder / "hearth-test" / "Tiny-GGUF"
    nested.mkdir(parents=True)
    write_gguf(nested / "tiny.Q8_0.gguf", "tiny", "Q8_0", seed=4, vocab=2048)
    wait_for(qtbot, lambda: names(view) == ["hearth-test/Tiny-GGUF/tiny.Q8_0.gguf", "tiny-chat.gguf"],
             "the model in a new folder")
    (folder / "tiny-chat.gguf").unlink()
    wait_for(qtbot, lambda: names(view) == ["hearth-test/Tiny-GGUF/tiny.Q8_0.gguf"], "the deleted model to go")
    shutil.rmtree(folder / "hearth-test")
    wait_for(qtbot, lambda: names(view) == [], "the deleted folder's model to go")


def test_the_watched_folders_are_the_scanned_places_and_their_model_folders(tmp_path: Path) -> None:
    home = tmp_path / "home"
    lmstudio = home / ".lmstudio" / "models"
    (lmstudio / "owner" / "name" / "deeper").mkdir(parents=True)
    (lmstudio / ".hidden").mkdir()
    hub = home / ".cache" / "huggingface" / "hub"
    snapshot = hub / "models--org--name" / "snapshots" / "abc"
    (snapshot / "deeper").mkdir(parents=True)
    single = tmp_path / "one.gguf"
    single.write_bytes(b"GGUF")
    watched = watched_model_folders([str(single), str(tmp_path / "missing")], home=home)
    # the places that exist, in the scan's order (a file added by itself watched as a file), then their folders
    assert watched[:3] == [str(hub), str(lmstudio), str(single)]
    assert watched[3:] == [str(hub / "models--org--name"), str(lmstudio / "owner"),
                           str(hub / "models--org--name" / "snapshots"), str(lmstudio / "owner" / "name"),
                           str(snapshot)]


def test_a_huge_tree_is_watched_only_in_part(tmp_path: Path) -> None:
    added = tmp_path / "added"
    for i in range(MAX_WATCHED_FOLDERS + 10):
        (added / f"{i:04}" / "sub").mkdir(parents=True)
    watched = watched_model_folders([str(added)], home=tmp_path / "home")
    assert len(watched) == MAX_WATCHED_FOLDERS
    assert watched[:2] == [str(added), str(added / "0000")]  # shallow folders first
    assert not any(path.endswith("sub") for path in watched)
