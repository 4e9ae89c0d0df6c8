"""Python's cyclic garbage collector, run on the GUI thread only.

CPython runs a collection in whichever thread happens to allocate past the threshold. When that is a worker thread
(the model loader, the engine loop) and the garbage holds Qt wrappers in a reference cycle (a closed dialog, a
lambda connected to a widget), their C++ objects are destroyed outside the GUI thread, which can crash the process.
:class:`GuiGarbageCollector` turns automatic collection off and runs it from a timer on the GUI thread instead, by
the same thresholds, as PyQt applications such as calibre and pyqtgraph do. Reference counting still frees
everything that is not in a cycle at once.
"""

from __future__ import annotations

import gc

from PySide6.QtCore import QCoreApplication, QObject, QTimer, Slot

#: How often the GUI thread checks whether a collection is due.
INTERVAL_MS = 500


class GuiGarbageCollector(QObject):
    """While it lives, cyclic garbage is collected on its (the GUI) thread; automatic collection is off.

    It re-enables automatic collection when it is destroyed or the application quits.
    """

    def __init__(self, parent: QObject | None = None, interval_ms: int = INTERVAL_MS) -> None:
        super().__init__(parent)
        self._thresholds = gc.get_threshold()
        self._timer = QTimer(self)
        self._timer.setObjectName("gui-gc-timer")
        self._timer.timeout.connect(self.check)
        self._timer.start(interval_ms)
        self.num_collections = 0
        gc.disable()
        app = QCoreApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.stop)
        self.destroyed.connect(gc.enable)

    @Slot()
    def check(self) -> None:
        """Collect the oldest generation whose count passed its threshold, if any."""
        counts = gc.get_count()
        due = [gen for gen in range(3) if counts[gen] > self._thresholds[gen]]
        if due:
            gc.collect(due[-1])
            self.num_collections += 1

    @Slot()
    def stop(self) -> None:
        self._timer.stop()
        gc.enable()
