"""One folder that cannot be read does not empty the Models list: the models found elsewhere are listed, with a
note naming the folder and why."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import pytest

from app.bridge.jobs import find_models
from app.bridge.protocols import EngineApi


def unreadable_folders(tmp_path: Path) -> list[Path]:
    """Folders no scan can read: a name longer than the system allows (an OSError for root too), and a folder
    without read permission where the tests do not run as root."""
    folders = [tmp_path / ("x" * 300)]
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0)
        folders.append(locked)
    return folders


@pytest.fixture
def real_discovery(tmp_path: Path) -> Any:
    """The engine's own ``discover_models``, on an empty home so that only the added folders count."""
    from engine.loading.discovery import discover_models
    from engine.system.hardware import detect

    home = tmp_path / "home"
    home.mkdir()
    api = EngineApi(LLM=None, detect_hardware=None, recommend=None, estimate=None, Sampler=None,  # type: ignore[arg-type]
                    inspect_model=None, discover_models=functools.partial(discover_models, home=home,  # type: ignore[arg-type]
                                                                          hardware=detect()))
    return lambda: api


def test_an_unreadable_folder_leaves_the_others_models_listed(tmp_path: Path, real_discovery: Any) -> None:
    good = tmp_path / "good"
    good.mkdir()
    (good / "tiny.gguf").write_bytes(b"GGUF" + b"\0" * 60)  # damaged, but listed with its reason
    bad = unreadable_folders(tmp_path)
    try:
        models, problems = find_models(real_discovery, [str(bad[0]), str(good), *map(str, bad[1:])])
    finally:
        for folder in bad[1:]:
            folder.chmod(0o700)
    assert [Path(m["path"]).name for m in models] == ["tiny.gguf"]
    assert len(problems) == len(bad)
    assert problems[0].startswith(str(bad[0])) and "too long" in problems[0]


def test_the_models_view_notes_the_folders_it_could_not_read(qtbot: Any, window: Any, tmp_path: Path) -> None:
    bad = tmp_path / ("y" * 300)
    view = window.models_view
    with qtbot.wait_signal(window.bridge.signals.models_discovered, timeout=10_000) as found:
        view.add_folder(str(bad))
    assert found.args[0]  # the usual places' models are still listed
    assert view._tree.topLevelItemCount() == len(found.args[0])
    assert "could not be read" in view.unreadable_text and str(bad)[:50] in view.unreadable_text
    with qtbot.wait_signal(window.bridge.signals.models_discovered, timeout=10_000):
        view.set_folders([])
        view.refresh()
    assert view.unreadable_text == ""
