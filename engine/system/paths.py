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


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) readable by this user only (0700); an existing folder is left as the
    user set it. Returns ``path``."""
    path = Path(path)
    if not path.exists():
        path.mkdir(parents=True, mode=0o700)
    return path


def models_dir() -> Path:
    """Return the folder holding converted and downloaded models (``data_dir()/models``)."""
    return data_dir() / "models"


def cache_dir() -> Path:
    """Return the folder for files Hearth can rebuild (converted GGUF configs and tokenizers): ``data_dir()/cache``."""
    return data_dir() / "cache"


def build_cache_dir() -> Path:
    """Return the folder for machine-wide build artifacts (the native decode step's compiled library).

    Shared by every data dir (the app's and the tests' temporary ones too): a build is named by a hash of all it
    depends on. The platform's per-user cache folder for "Hearth" (e.g. ``~/.cache/Hearth`` on Linux).
    """
    return Path(platformdirs.user_cache_dir("Hearth", appauthor=False))

