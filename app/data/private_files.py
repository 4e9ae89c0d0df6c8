"""Hearth's data folder and the files in it are readable by their owner only: conversations and preferences are
private, on a machine other people use too.

No Qt here. Folders Hearth creates are 0700 and files 0600, whatever the umask; a folder or file that exists
already keeps the permissions its owner gave it.
"""

from __future__ import annotations

import os
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def make_private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) as 0700 if it is missing; returns ``path``.

    Only the folders created here are made private: a parent that exists (the home folder) is left alone.
    """
    path = Path(path)
    missing: list[Path] = []
    folder = path
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=DIR_MODE)
        except FileExistsError:  # made meanwhile (another Hearth starting)
            continue
        os.chmod(folder, DIR_MODE)  # mkdir's mode passes through the umask
    return path


def create_private(path: Path) -> None:
    """Create ``path``'s folder (0700) and an empty file (0600) if they are missing.

    SQLite gives a database's -wal and -shm files the database file's permissions, and Qt keeps a settings
    file's permissions when it rewrites it.
    """
    path = Path(path)
    make_private_dir(path.parent)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, FILE_MODE)  # os.open's mode passes through the umask
    finally:
        os.close(fd)
