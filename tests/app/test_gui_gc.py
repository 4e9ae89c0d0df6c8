"""The GUI-thread garbage collector (app/gui_gc.py)."""

from __future__ import annotations

import gc
import weakref
from typing import Any

from PySide6.QtWidgets import QDialog

from app.gui_gc import GuiGarbageCollector


def test_cycles_are_collected_by_the_gui_thread_timer_and_collection_is_restored(qtbot: Any) -> None:
    collector = GuiGarbageCollector(interval_ms=10)
    try:
        assert not gc.isenabled()
        dialog = QDialog()
        dialog.cycle = dialog  # type: ignore[attr-defined]  # a widget only the cyclic collector can free
        alive = weakref.ref(dialog)
        del dialog
        junk = []
        for _ in range(gc.get_threshold()[0] + 10):  # past the youngest generation's threshold
            item: list[Any] = []
            item.append(item)
            junk.append(item)
        del junk
        qtbot.wait_until(lambda: alive() is None, timeout=2000)  # freed by the timer, on this thread
        assert collector.num_collections > 0
    finally:
        collector.stop()
        collector.deleteLater()
    assert gc.isenabled()
