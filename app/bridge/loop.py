"""``EngineLoop``: runs the engine's own step loop for the app.

It calls :func:`engine.core.loop.run_loop`, the same function the engine's thread runs under the server, on the
bridge's pool thread that loaded the model (the load job goes on as the loop: see ``EngineBridge._load_worker``),
so every torch op of a model runs on one thread. Before each step it takes the bridge's commands (:class:`Submit`,
:class:`Cancel`) off a ``queue.Queue`` and hands them to the engine; after each step it emits plain Python data
through :class:`~app.bridge.signals.EngineSignals`: text deltas, finished and failed requests, and (from the
loop's metrics tick) one metrics snapshot a second. It never touches a widget.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import shiboken6
from PySide6.QtCore import QObject

from app import log
from app.bridge.protocols import BridgedLLM, RequestHandle
from app.bridge.signals import EngineSignals
from app.bridge.types import RequestInfo
from engine.api import SamplingParams, StepOutput
from engine.core.loop import run_loop

#: If the engine does not report a cancelled request as finished within this time, the bridge does.
CANCEL_GRACE_S = 2.0


@dataclass(slots=True)
class Submit:
    """Start a reply: ``messages`` (or a plain prompt) with ``params`` (SamplingParams or its keywords)."""

    request_id: str
    conversation_id: str
    messages: list[dict[str, str]] | str
    params: Mapping[str, Any] | SamplingParams | None
    #: What the engine drops from a chat longer than the context (``engine.core.context``); None rejects it.
    overflow: str | None = None


@dataclass(slots=True)
class Cancel:
    """Stop a reply; it finishes with "abort"."""

    request_id: str


Command = Submit | Cancel


class EngineLoop:
    """Runs the engine's step loop over one loaded model until :meth:`stop`.

    :meth:`run` is called on the thread that loaded the model, which also frees it once stopped (``release``).
    With OpenMP, each thread that runs torch's parallel work keeps its own team of workers: a model loaded on one
    thread and stepped on another leaves two teams competing for the cores, which slows every step (the engine's
    own loop thread avoids the same, ``LLM._set_up_on_the_loop_thread``).

    Args:
        llm: the loaded ``LLM`` (or the test fake); its ``engine`` is what the loop steps.
        commands: the bridge's command queue; :meth:`wake` after putting one there.
        signals: where the loop emits; it keeps a reference, so the object outlives the loop.
        sentinel: a child of the bridge. Once it is deleted, the bridge is gone without ``shutdown()`` (its
            window was deleted, not closed): the loop calls ``on_orphaned`` and stops, before the bridge's pool
            waits for it. Checked before every step and after every idle wait (at most a second).
        on_orphaned: stops the bridge's other threads; called on the loop's thread.
        release: called on the loop's thread once a loop asked to :meth:`stop` has ended, before :attr:`done`:
            the bridge frees the model there. A loop that died of an error leaves its model to whoever retires it.
    """

    def __init__(self, llm: BridgedLLM, commands: queue.Queue[Command], signals: EngineSignals, sentinel: QObject,
                 on_orphaned: Callable[[], None], release: Callable[[], None] | None = None) -> None:
        self.stop_event = threading.Event()
        self.done = threading.Event()
        #: Why the loop died ("" while it runs or after a plain stop).
        self.error = ""
        self._engine = llm.engine
        self._commands = commands
        self._signals = signals
        self._sentinel = sentinel
        self._on_orphaned = on_orphaned
        self._release = release
        self._handles: dict[str, RequestHandle] = {}  # bridge request id -> engine handle
        self._bridge_ids: dict[str, str] = {}  # engine request id -> bridge request id
        self._conversations: dict[str, str] = {}  # bridge request id -> conversation id
        self._cancel_deadlines: dict[str, float] = {}

    def stop(self) -> None:
        """Ask the loop to end; it finishes its current step first. Any thread."""
        self.stop_event.set()
        self._engine.wake()

    def wake(self) -> None:
        """A command is waiting on the queue: end the loop's idle wait. Any thread."""
        self._engine.wake()

    def use_commands(self, commands: queue.Queue[Command]) -> None:
        """Take commands from ``commands`` from the next step on (a model kept loaded but not in use has a queue
        of its own: ``app.bridge.kept_models``). Any thread, under the lifecycle's lock."""
        self._commands = commands
        self._engine.wake()

    def has_request(self, request_id: str) -> bool:
        """Whether the reply ``request_id`` runs here. Any thread."""
        return request_id in self._handles

    def is_busy(self) -> bool:
        """Whether replies are running: the loop's own, or a tools reply's submitted straight to the engine. Any
        thread."""
        return bool(self._handles) or self._engine.has_work()

    def run(self) -> None:
        """Step the engine until :meth:`stop`, on the calling thread; :attr:`done` is set when it returns."""
        try:
            run_loop(self._engine, self.stop_event, self._on_step, self._signals.metrics_updated.emit,
                     before_step=self._before_step)
        except BaseException as exc:  # noqa: BLE001 (run_loop logged it; a pool thread must report, not raise)
            self.error = str(self._engine.loop_error or exc)
            self._signals.error.emit(f"The engine stopped unexpectedly ({self.error}). Reload the model.")
        finally:
            self._drop_all("The model was unloaded before the reply finished." if not self.error
                           else f"The engine stopped unexpectedly ({self.error}).")
            try:
                if self.stop_event.is_set() and self._release is not None:
                    self._release()
            finally:
                self.done.set()

    # -- loop thread ------------------------------------------------------------------------------

    def _before_step(self) -> None:
        if not shiboken6.isValid(self._sentinel):
            log.bridge.warning("the engine bridge was destroyed without shutdown(); stopping the engine loop")
            self.stop_event.set()
            self._on_orphaned()
            return
        while not self.stop_event.is_set():
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            self._handle(command)
        self._expire_cancels()

    def _handle(self, command: Command) -> None:
        if isinstance(command, Cancel):
            handle = self._handles.get(command.request_id)
            if handle is not None and command.request_id not in self._cancel_deadlines:
                handle.cancel()
                self._cancel_deadlines[command.request_id] = time.monotonic() + CANCEL_GRACE_S
            return
        rid = command.request_id
        try:
            params = command.params
            if not isinstance(params, SamplingParams):
                params = SamplingParams(**dict(params or {}))
            handle = self._engine.submit(command.messages, params, overflow=command.overflow)
        # Bad sampling values, a full queue, a prompt that is too long, ...
        except Exception as exc:  # noqa: BLE001 (a worker thread must report, not die)
            log.bridge.warning("request %s rejected: %s", rid, exc)
            self._signals.request_failed.emit(rid, str(exc) or type(exc).__name__)
            return
        self._handles[rid] = handle
        self._bridge_ids[handle.request_id] = rid
        self._conversations[rid] = command.conversation_id
        log.bridge.debug("request %s submitted as %s", rid, handle.request_id)
        if handle.num_dropped_messages:
            self._signals.context_fitted.emit(rid, handle.num_dropped_messages)

    def _on_step(self, outputs: list[StepOutput]) -> None:
        for out in outputs:
            rid = self._bridge_ids.get(out.request_id)
            if rid is None:
                continue
            if out.delta_text:
                self._signals.token_delta.emit(rid, out.delta_text)
            if out.finished:
                self._finish(rid, out)

    def _finish(self, rid: str, out: StepOutput | None) -> None:
        handle = self._handles.pop(rid)
        self._bridge_ids.pop(handle.request_id, None)
        self._cancel_deadlines.pop(rid, None)
        conversation = self._conversations.pop(rid, "")
        if out is not None and out.finish_reason == "error":
            log.bridge.warning("request %s failed: %s", rid, out.error)
            self._signals.request_failed.emit(rid, out.error or "The reply could not be generated.")
            return
        reason = out.finish_reason if out is not None else "abort"
        metrics = dict(out.metrics or {}) if out is not None else {}
        log.bridge.debug("request %s finished: %s", rid, reason)
        self._signals.request_finished.emit(rid, RequestInfo(rid, conversation, reason, metrics))

    def _expire_cancels(self) -> None:
        now = time.monotonic()
        for rid, deadline in list(self._cancel_deadlines.items()):
            if now >= deadline:
                log.bridge.warning("engine did not confirm cancel of %s; dropping it", rid)
                self._finish(rid, None)

    def _drop_all(self, message: str) -> None:
        for rid, handle in list(self._handles.items()):
            try:
                handle.cancel()
            except Exception:  # noqa: BLE001 (a worker thread must report, not die)
                log.bridge.exception("cancelling %s failed", rid)
            self._signals.request_failed.emit(rid, message)
        self._handles.clear()
        self._bridge_ids.clear()
        self._conversations.clear()
        self._cancel_deadlines.clear()
