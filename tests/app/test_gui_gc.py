"""The GUI-thread garbage collector (app/gui_gc.py)."""

from __future__ import annotations

import gc
import threading
import traceback
import weakref
from typing import Any

from PySide6.QtWidgets import QDialog

from app import gui_gc
from app.gui_gc import GuiGarbageCollector


def _make_collection_due() -> None:
    """Allocate cyclic garbage until the youngest generation's count is past its threshold.

    The count is allocations less deallocations, so whatever else is freed meanwhile (the widgets an earlier test
    left to ``deleteLater``, freed as the events are processed) lowers it again; a fixed amount of junk is not enough.
    """
    while gc.get_count()[0] <= gc.get_threshold()[0]:
        item: list[Any] = []
        item.append(item)


def test_cycles_are_collected_by_the_gui_thread_timer_and_collection_is_restored(qtbot: Any) -> None:
    collector = GuiGarbageCollector(interval_ms=10)
    freed_by: list[tuple[str, list[tuple[str, str]]]] = []

    def note(_ref: Any) -> None:  # runs where the dialog is freed: which thread, under which calls
        stack = [(frame.filename, frame.name) for frame in traceback.extract_stack()]
        freed_by.append((threading.current_thread().name, stack))

    try:
        assert not gc.isenabled()
        dialog = QDialog()
        dialog.cycle = dialog  # type: ignore[attr-defined]  # a widget only the cyclic collector can free
        alive = weakref.ref(dialog, note)
        del dialog

        def freed() -> bool:
            if alive() is None:
                return True
            # keep a collection due: each timer collection of the youngest generation also counts towards the
            # older ones, so the dialog is freed even if a collection by someone else has already moved it there
            _make_collection_due()
            return False

        qtbot.wait_until(freed, timeout=5000)
        assert collector.num_collections > 0
        assert len(freed_by) == 1
        thread, stack = freed_by[0]
        assert thread == threading.main_thread().name
        assert (gui_gc.__file__, "check") in stack  # by the timer's collection, not by any other
    finally:
        collector.stop()
        collector.deleteLater()
    assert gc.isenabled()
