"""Fixtures of the document tests: a home folder for the index, and one process-wide WordLlama embedder; ``auto``
looks for embedding models in an empty home folder (``tests/conftest.py``) unless a test gives it one."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.docs import embedders, store


@pytest.fixture(scope="session", autouse=True)
def native_decode_step() -> None:
    """The document index needs no torch and no native build (overrides the suite-wide fixture)."""


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    """A real index database in a fresh home folder."""
    connection = store.connect(tmp_path / "home")
    yield connection
    connection.close()


@pytest.fixture(autouse=True)
def fresh_embedding_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test scans for embedding models again (the suite-wide fixture points the scan at an empty home)."""
    monkeypatch.setattr(embedders, "_found", None)
