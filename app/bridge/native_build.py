"""``NativeBuildWatch``: tells the GUI while the engine builds its native decode step, and how the build ended.

The engine compiles the step once per machine, in the background, the first time a model asks for it (see
``engine/model/native.py``); the model answers meanwhile without it. A load ends long before such a build, so the
bridge looks once the model is loaded: while the build goes on it emits ``native_build_changed`` with a
"building" :class:`~app.bridge.types.NativeBuild`, then, from a thread that looks again every
:data:`POLL_INTERVAL_S`, the outcome ("ready", or "failed" with the reason). A build already over when a model loads
says nothing: a machine that built its step once never hears of it again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from app import log
from app.bridge.types import NativeBuild

#: How often the watch looks at a build under way.
POLL_INTERVAL_S = 0.5


class NativeBuildWatch:
    """At most one watching thread at a time, whatever the number of loads during one build.

    Args:
        emit: sends a :class:`NativeBuild` to the GUI (``EngineSignals.native_build_changed.emit``).
        stop: the bridge's shutdown switch; the thread ends when it is set.
    """

    def __init__(self, emit: Callable[[NativeBuild], None], stop: threading.Event) -> None:
        self._emit = emit
        self._stop = stop
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def after_load(self, read: Callable[[], NativeBuild]) -> None:
        """A model has loaded: if the build is under way, say so now and its outcome when it ends. Any thread."""
        try:
            build = read()
        except Exception:  # noqa: BLE001 (the model is loaded; only this line is lost)
            log.bridge.exception("reading the native build's state failed")
            return
        if build.state != "building" or self._stop.is_set():
            return
        self._emit(build)
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return  # the thread already watching says how it ends
            self._thread = threading.Thread(target=self._watch, args=(read,), name="hearth-native-watch",
                                            daemon=True)
            self._thread.start()

    def _watch(self, read: Callable[[], NativeBuild]) -> None:
        while not self._stop.wait(POLL_INTERVAL_S):
            try:
                build = read()
            except Exception:  # noqa: BLE001 (a worker thread must report, not die)
                log.bridge.exception("reading the native build's state failed")
                return
            if build.state != "building":
                log.bridge.info("native decode step: %s %s", build.state, build.problem)
                self._emit(build)
                return
