"""Fixtures of the model tests: the native extension's ops."""

from __future__ import annotations

import pytest
import torch

from engine.model import native


@pytest.fixture(scope="module")
def hearth() -> object:
    """``torch.ops.hearth`` with the native extension loaded (built first if this machine has none); skips where it
    cannot be."""
    problem = native.EXTENSION.start(wait=True)
    if problem is not None:
        pytest.skip(problem)
    return torch.ops.hearth
