"""The step loop: the one function that drives an engine, whoever runs it.

Two drivers call :func:`run_loop`: the engine's own thread (``LLMEngine.start_loop``, used by ``LLM`` and the
server) and the app's ``EngineLoop``, on the bridge's pool thread that loaded the model (``app/bridge/loop.py``).
The app's test fake engine implements the same :class:`Steppable` protocol, so the bridge drives it through this
loop too.

The loop
  * steps while there is work and hands each step's outputs to ``on_step``;
  * when idle, blocks in ``engine.wait_for_work`` (a condition variable, no polling) until a request, a cancel,
    ``engine.wake()`` or the next metrics tick;
  * publishes one metrics snapshot (``engine.metrics()``, an :class:`~engine.api.EngineMetrics`, in its
    ``to_dict()`` form) every ``metrics_interval_s`` to ``on_metrics``: the only producer of engine metrics;
  * survives a failing step: it logs, fails the engine's requests with ``finish_reason="error"``, and goes on;
  * if it dies anyway (a ``BaseException``, or failing requests fails too), records why in ``engine.loop_error``
    and ``engine.is_alive`` before it re-raises, so a server can answer 503 and the app can say so.

Stopping: set ``stop``, then call ``engine.wake()`` so an idle wait ends at once. No torch in here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from engine.api import EngineMetrics, StepOutput

log = logging.getLogger("engine")

#: Seconds between two metrics snapshots.
METRICS_INTERVAL_S = 1.0

StepCallback = Callable[[list[StepOutput]], None]
#: Takes :meth:`EngineMetrics.to_dict`'s form (``EngineMetrics.from_dict`` reads it back).
MetricsCallback = Callable[[dict[str, Any]], None]


class Steppable(Protocol):
    """What :func:`run_loop` needs of an engine (``LLMEngine``, or a test fake)."""

    #: True while a loop drives the engine.
    is_alive: bool
    #: Why the last loop over the engine died; None if it never did.
    loop_error: str | None

    def has_work(self) -> bool: ...

    def wait_for_work(self, timeout_s: float) -> bool: ...

    def wake(self) -> None: ...

    def step(self) -> list[StepOutput]: ...

    def metrics(self) -> EngineMetrics: ...

    def fail_all(self, message: str) -> list[StepOutput]: ...


def run_loop(
    engine: Steppable,
    stop: threading.Event,
    on_step: StepCallback | None = None,
    on_metrics: MetricsCallback | None = None,
    *,
    before_step: Callable[[], None] | None = None,
    metrics_interval_s: float = METRICS_INTERVAL_S,
) -> None:
    """Drive ``engine`` until ``stop`` is set (see the module docstring).

    Args:
        engine: the engine to step.
        stop: set it (then call ``engine.wake()``) to end the loop.
        on_step: called on this thread with the outputs of every step that produced some.
        on_metrics: called on this thread with a metrics snapshot (``EngineMetrics.to_dict()``) every
            ``metrics_interval_s``.
        before_step: called on this thread before every step and after every idle wait; a driver with its own
            command queue (the app's bridge) submits and cancels from here, and calls ``engine.wake()`` when it
            queues a command.
        metrics_interval_s: seconds between metrics snapshots.

    Raises:
        BaseException: whatever killed the loop, after recording it on ``engine``.
    """
    if metrics_interval_s <= 0:
        raise ValueError(f"metrics_interval_s must be positive, got {metrics_interval_s}")
    callbacks = _Callbacks(on_step, on_metrics, before_step)
    engine.loop_error = None
    engine.is_alive = True
    next_metrics = time.monotonic()
    try:
        while not stop.is_set():
            callbacks.before_step()
            now = time.monotonic()
            if now >= next_metrics:
                next_metrics = now + metrics_interval_s
                callbacks.publish_metrics(engine)
            if engine.has_work():
                callbacks.on_step(_step(engine))
            elif not stop.is_set():
                engine.wait_for_work(max(0.0, next_metrics - time.monotonic()))
    except BaseException as exc:
        engine.loop_error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        log.critical("the engine loop stopped: %s", engine.loop_error, exc_info=True)
        try:
            callbacks.on_step(engine.fail_all(f"The engine stopped: {engine.loop_error}"))
        except Exception:
            log.exception("failing the requests of a stopped engine failed")
        raise
    finally:
        engine.is_alive = False


def _step(engine: Steppable) -> list[StepOutput]:
    """One step; if it raises, its requests fail with ``finish_reason="error"`` and the loop goes on.

    ``LLMEngine.step`` already fails the requests of a batch that fails; what escapes it left the engine in a
    state where nobody knows which requests were involved, so all of them fail.
    """
    try:
        return engine.step()
    except Exception as exc:
        log.exception("engine step failed; failing its requests")
        return engine.fail_all(f"generation failed: {exc}")


class _Callbacks:
    """The driver's callbacks, each guarded: a failing callback is logged (once per kind), never fatal."""

    def __init__(
        self,
        on_step: StepCallback | None,
        on_metrics: MetricsCallback | None,
        before_step: Callable[[], None] | None,
    ) -> None:
        self._on_step = on_step
        self._on_metrics = on_metrics
        self._before_step = before_step
        self._failed: set[str] = set()

    def _report(self, kind: str) -> None:
        if kind not in self._failed:
            self._failed.add(kind)
            log.exception("engine loop: %s failed (further failures of it are not logged)", kind)

    def before_step(self) -> None:
        if self._before_step is not None:
            try:
                self._before_step()
            except Exception:  # noqa: BLE001 (logged by _report; the loop goes on)
                self._report("before_step")

    def on_step(self, outputs: list[StepOutput]) -> None:
        if outputs and self._on_step is not None:
            try:
                self._on_step(outputs)
            except Exception:  # noqa: BLE001 (logged by _report; the loop goes on)
                self._report("on_step")

    def publish_metrics(self, engine: Steppable) -> None:
        if self._on_metrics is None:
            return
        try:
            self._on_metrics(engine.metrics().to_dict())
        except Exception:  # noqa: BLE001 (logged by _report; the loop goes on)
            self._report("metrics")
