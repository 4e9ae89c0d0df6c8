"""Where Hearth keeps its data on disk."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

DATA_DIR_ENV = "HEARTH_DATA_DIR"


def data_dir() -> Path:
    """Return Hearth's data folder.

    Returns:
        ``$HEARTH_DATA_DIR`` when set and non-empty, else the platform's per-user data folder for
        "Hearth" (e.g. ``~/.local/share/Hearth`` on Linux). The folder is not created.
    """
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        return Path(override).expanduser()
    return Path(platformdirs.user_data_dir("Hearth", appauthor=False))


def models_dir() -> Path:
    """Return the folder holding converted and downloaded models (``data_dir()/models``)."""
    return data_dir() / "models"
