"""Work-arounds for bugs in the Qt binding we ship.

PySide6 6.12.0: ``SignalInstance.emit()`` returns ``True`` without taking a reference to it, so
every emit drops one reference to ``True``. On Python >= 3.12 ``True`` is immortal and nothing
happens; on 3.10/3.11 the count reaches zero after a few thousand emits and CPython aborts with
"Fatal Python error: bool_dealloc". A streaming chat emits once per token, so that is minutes.
Methods returning ``void`` (``QTimer.setInterval``, ``QPainter.drawLine``, ...) do the same to
``None``: "Fatal Python error: none_dealloc" once enough of them ran, which a plotting library
such as pyqtgraph reaches within minutes.

:func:`apply` measures whether the running binding has these bugs and, if so, gives ``True``
(and ``None``) a reference count so large that the lost references can never drain it (what
3.12's immortal objects do). It changes nothing when the bugs are absent.
"""

from __future__ import annotations

import ctypes
import sys

from PySide6.QtCore import QObject, Signal

_IMMORTAL_REFS = 1 << 40
_applied = False


class _Probe(QObject):
    fired = Signal()


def emit_steals_true() -> bool:
    """Return True if ``Signal.emit()`` of this binding drops a reference to ``True``."""
    probe = _Probe()
    before = sys.getrefcount(True)
    for _ in range(8):
        probe.fired.emit()
    return sys.getrefcount(True) < before - 4


def void_call_steals_none() -> bool:
    """Return True if calling a ``void`` Qt method of this binding drops a reference to ``None``."""
    probe = _Probe()
    before = sys.getrefcount(None)
    for _ in range(8):
        probe.setObjectName("probe")
    return sys.getrefcount(None) < before - 4


def _make_immortal(obj: object) -> None:
    refcnt = ctypes.c_ssize_t.from_address(id(obj))  # ob_refcnt is the first field of PyObject
    refcnt.value += _IMMORTAL_REFS


def apply() -> bool:
    """Apply the work-arounds once if needed; returns whether one is in effect."""
    global _applied
    if _applied:
        return True
    if sys.version_info >= (3, 12) or sys.implementation.name != "cpython":
        return False
    for obj, is_stolen in ((True, emit_steals_true), (None, void_call_steals_none)):
        if is_stolen():
            _make_immortal(obj)
            _applied = True
    return _applied
