"""Fixtures shared by the whole suite."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The converted default model, in the real user data dir (converted once per machine).

    ``make test`` converts it beforehand through ``python -m engine.default_model``; otherwise the
    first test that needs it pays for the conversion (~40 s).
    """
    from engine.loading.default_model import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root (the working directory for ``python -m`` subprocesses)."""
    return REPO_ROOT


@pytest.fixture(scope="session", autouse=True)
def native_decode_step() -> None:
    """Build (or load) the native decode step before any engine starts, so that no test sees it appear mid-run.

    The first build on a machine takes some seconds; later sessions load it from the data dir.
    """
    import torch

    from engine.model.native import EXTENSION, native_problem

    if native_problem(torch.device("cpu"), torch.float32) is None:
        EXTENSION.start(wait=True)
