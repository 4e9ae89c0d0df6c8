"""Hearth's desktop app (PySide6). ``create_window()`` builds the main window; ``python -m app`` runs it."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from app import qtfix

# Idle OpenMP threads sleep instead of spinning, so torch's workers don't take the GUI thread's core
# between engine steps. Set before torch is first imported (the bridge imports it lazily).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The engine thread runs Python between torch ops; with the default 5 ms switch interval the GUI thread waits
# up to 5 ms for the GIL each time it hands it over, and a repaint hands it over many times (the convoy effect).
sys.setswitchinterval(0.001)

qtfix.apply()

if TYPE_CHECKING:
    from app.bridge.engine_bridge import EngineBridge
    from app.window.main_window import MainWindow

__all__ = ["create_window"]


def create_window(data_dir: str | Path | None = None, *, bridge: EngineBridge | None = None) -> MainWindow:
    """Build and return the main window without running the event loop.

    A ``QApplication`` must exist already (``main()`` creates one; tests get pytest-qt's).

    Args:
        data_dir: where Hearth keeps its data; None means the platform's per-user folder.
        bridge: the engine bridge to use; None creates one on the real engine. Tests pass one
            built on a fake engine.
    """
    from app import wheel_guard
    from app.window.main_window import MainWindow

    wheel_guard.install()
    return MainWindow(data_dir=Path(data_dir) if data_dir is not None else None, bridge=bridge)
