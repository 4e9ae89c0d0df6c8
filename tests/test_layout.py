"""Rules about the tree's shape that import-linter cannot express: module size, Qt in the data layer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: A module longer than this says why in its docstring, with a line starting "Long because".
MAX_MODULE_LINES = 450


def _modules(*packages: str) -> list[Path]:
    return sorted(p for pkg in packages for p in (ROOT / pkg).rglob("*.py"))


@pytest.mark.parametrize("path", _modules("engine", "app"), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_modules_stay_small_or_say_why(path: Path) -> None:
    num_lines = len(path.read_text().splitlines())
    if num_lines <= MAX_MODULE_LINES:
        return
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert "Long because" in doc, (
        f"{path.relative_to(ROOT)} has {num_lines} lines (limit {MAX_MODULE_LINES}): split it by role, or say in "
        "its docstring why it must be long ('Long because ...')"
    )


@pytest.mark.parametrize("path", _modules("app/data"), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_data_layer_imports_no_widgets(path: Path) -> None:
    """``app/data`` (storage, conversations, export, settings) may use QtCore, never QtWidgets or QtGui."""
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            assert not name.startswith(("PySide6.QtWidgets", "PySide6.QtGui", "pyqtgraph")), (
                f"{path.relative_to(ROOT)} imports {name}: widgets and painting belong in app/window or a pane"
            )


def test_the_contracts_module_stays_light() -> None:
    """``engine.api`` is imported by the app, the server and every fake: it must not pull in torch or Qt."""
    tree = ast.parse((ROOT / "engine" / "api.py").read_text())
    imported = {
        (node.module or "").split(".")[0] if isinstance(node, ast.ImportFrom) else alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert imported <= {"__future__", "collections", "dataclasses", "pathlib", "typing", "enum", "math"}, imported
