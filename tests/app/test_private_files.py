"""The data folder is created 0700 and the settings and database files 0600, on every path that creates them,
whatever the umask: checked with real files and os.stat."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.data.private_files import create_private, make_private_dir
from app.data.settings import Settings
from app.data.storage import Storage


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture(params=[0o022, 0o000], ids=["umask 022", "umask 000"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def test_settings_alone_create_a_private_folder_and_file(tmp_path: Path, umask: int) -> None:
    data_dir = tmp_path / "new" / "Hearth"
    settings = Settings(data_dir)  # no database and no model conversion on this path
    settings.theme = "dark"
    settings.sync()
    assert mode(data_dir) == 0o700 and mode(tmp_path / "new") == 0o700
    assert mode(data_dir / "settings.ini") == 0o600
    assert "dark" in (data_dir / "settings.ini").read_text()
    (data_dir / "settings.ini").unlink()  # removed while Hearth runs: written again, still private
    settings.theme = "light"
    settings.sync()
    assert mode(data_dir / "settings.ini") == 0o600


def test_the_database_and_its_journal_are_private(tmp_path: Path, umask: int) -> None:
    data_dir = tmp_path / "Hearth"
    with Storage(data_dir / "hearth.db") as storage:
        storage.create_conversation("private")
        assert mode(data_dir) == 0o700
        for name in ("hearth.db", "hearth.db-wal", "hearth.db-shm"):
            assert mode(data_dir / name) == 0o600, name


def test_the_window_creates_a_private_data_folder(qtbot: Any, open_window: Any, tmp_path: Path, umask: int) -> None:
    data_dir = tmp_path / "fresh" / "Hearth"
    window = open_window(data_dir)
    window.save_settings()
    assert mode(data_dir) == 0o700
    assert mode(data_dir / "settings.ini") == 0o600 and mode(data_dir / "hearth.db") == 0o600


def test_existing_folders_and_files_keep_their_permissions(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    (shared / "settings.ini").write_text("")
    os.chmod(shared / "settings.ini", 0o640)
    make_private_dir(shared)
    create_private(shared / "settings.ini")
    assert mode(shared) == 0o755 and mode(shared / "settings.ini") == 0o640
