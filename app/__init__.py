"""Hearth's desktop app (PySide6). ``create_window()`` builds the main window; ``python -m app`` runs it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from app import qtfix

qtfix.apply()

if TYPE_CHECKING:
    from app.engine_bridge import EngineBridge
    from app.main_window import MainWindow

__all__ = ["create_window"]


def create_window(data_dir: str | Path | None = None, *, bridge: EngineBridge | None = None) -> MainWindow:
    """Build and return the main window without running the event loop.

    A ``QApplication`` must exist already (``main()`` creates one; tests get pytest-qt's).

    Args:
        data_dir: where Hearth keeps its data; None means the platform's per-user folder.
        bridge: the engine bridge to use; None creates one on the real engine. Tests pass one
            built on a fake engine.
    """
    from app.main_window import MainWindow

    return MainWindow(data_dir=Path(data_dir) if data_dir is not None else None, bridge=bridge)
