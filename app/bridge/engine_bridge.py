"""The one place the app talks to the engine: ``EngineBridge``.

``app/bridge/`` is the only part of ``app`` that imports engine modules beyond ``engine.api``. The bridge lives
in the GUI thread and never blocks it:

* GUI -> engine: :meth:`EngineBridge.load_model`, :meth:`~EngineBridge.unload_model`,
  :meth:`~EngineBridge.submit` and :meth:`~EngineBridge.cancel` put a command on a ``queue.Queue`` or start a
  ``QRunnable`` on the bridge's own ``QThreadPool``, and return at once.
* Engine -> GUI: the runnables emit plain Python data through :class:`~app.bridge.signals.EngineSignals`, which
  the bridge owns. Signals cross threads as queued connections, so receivers run in the GUI thread;
  :meth:`EngineBridge._connect_engine` makes the bridge's own connections, ``MainWindow._connect_engine`` the
  panes'.

Two parts share the work. :class:`~app.bridge.model_lifecycle.ModelLifecycle` decides which model serves the chats
(loading, connecting to a remote server, unloading, "Serve on localhost"), with the generation/lock protocol that
keeps at most one model alive; its workers run as jobs on the pool. The bridge keeps the requests: it routes each
to the local model's command queue or to the remote server, and turns a remote server's replies into signals.
A loaded model's load job goes on as :class:`~app.bridge.loop.EngineLoop`, which runs the engine's own step loop
(``engine.core.loop.run_loop``) while the model is loaded and frees it when stopped: every torch op of a model
(load, warm-up, steps, close) runs on that one thread, as under the engine's own loop thread
(``LLM._set_up_on_the_loop_thread``), since a second thread doing torch work keeps a second OpenMP team on the
cores. The engine batches concurrent requests itself, so one loop serves every conversation. Stopping is a
``threading.Event``: :meth:`EngineBridge.shutdown` (called when the window closes) sets it and then waits for the
pool with ``QThreadPool.waitForDone()``. A bridge destroyed without ``shutdown()`` (a window deleted without being
closed) still stops its threads first.

A prompt's path: ``Composer.send_requested`` -> ``ChatPane._on_send_requested`` -> ``ChatPane.send`` ->
``ReplyController.submit`` -> ``EngineBridge.submit`` (queue) -> ``EngineLoop._handle`` -> ``LLMEngine.submit`` ...
``LLMEngine.step()`` -> ``EngineLoop._on_step`` -> ``EngineSignals.token_delta`` ->
``ReplyController._on_token_delta`` -> ``ReplyController.reply_changed`` -> ``ChatPane`` -> ``MessageView``.

Long because it is the app's one engine API: every call the panes make (models, the ones kept loaded, requests,
tools, background jobs) is a short method here, and the state they share (the pool, the lock, the model in use)
lives on the one object.
"""

from __future__ import annotations

import dataclasses
import itertools
import queue
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QThreadPool, QTimer, SignalInstance, Slot

from app import log
from app.bridge.jobs import Job, Threads, find_models, import_engine, quantization_advice
from app.bridge.kept_models import MAX_KEPT, LoadedModelsSignals, model_key
from app.bridge.loop import Cancel, Command, Submit
from app.bridge.model_folders import watched_model_folders
from app.bridge.model_lifecycle import ModelLifecycle
from app.bridge.protocols import EngineApi
from app.bridge.remote_backend import RemoteBackend, RemoteEvents
from app.bridge.signals import EngineSignals
from app.bridge.types import DEFAULT_MODEL_SPEC, LoadSettings, ModelInfo, RequestInfo, engine_metrics_in
from engine.api import EngineMetrics, SamplingParams
from engine.core.context import ContextOverflowError, approximate_tokens, fit_messages
from engine.core.loop import METRICS_INTERVAL_S

if TYPE_CHECKING:  # the MCP SDK loads with the first chat that uses tools
    from app.bridge.tool_runs import ToolRun, ToolRunSpec

#: The pool's threads. A loaded model's loop holds one (its load job's) for the model's lifetime; the other two serve
#: the jobs. No job needs a running loop's thread: the loop runs outside the lifecycle's load lock and ends on its
#: stop event, which a later load or unload sets before it waits, so neither is starved.
MAX_THREADS = 3
#: Every bridge's pool, until its ``shutdown()``. A pool is no child of its bridge: its destructor waits for its
#: threads while holding the GIL, so if it died with a bridge deleted unclosed, a running loop could never end.
_POOLS: set[QThreadPool] = set()


class EngineBridge(QObject):
    """Owns the engine, its worker threads and :class:`EngineSignals`.

    Every public method returns at once and must be called from the GUI thread.

    Args:
        parent: the owning QObject (usually the main window).
        api: the engine's functions (:class:`~app.bridge.protocols.EngineApi`); tests pass a fake. ``None``
            imports ``engine`` on first use, in a pool thread.
    """

    def __init__(self, parent: QObject | None = None, *, api: EngineApi | None = None) -> None:
        super().__init__(parent)
        # No parent: the loops keep it alive as long as they may emit, whatever happens to the bridge.
        self.signals = EngineSignals()
        self._api = api
        self._pool = QThreadPool()
        self._pool.setMaxThreadCount(MAX_THREADS)
        self._pool.setObjectName("engine-pool")
        _POOLS.add(self._pool)
        self._commands: queue.Queue[Command] = queue.Queue()
        self._ids = itertools.count(1)
        self._threads = Threads()
        self._shutdown = self._threads.shutdown
        self._lock = self._threads.lock
        self._jobs: list[Job] = []
        # Destroyed with the bridge; a loop that finds it gone stops (see EngineLoop).
        self._sentinel = QObject(self)
        self._sentinel.setObjectName("engine-bridge-sentinel")
        #: Requests sent to a remote server -> their conversation.
        self._remote_conversations: dict[str, str] = {}
        self._models = ModelLifecycle(self.signals, self._threads, self._commands, self._sentinel,
                                      self._engine_api, self._remote_events(), self._send_remote)
        #: The loaded models kept beside the one in use (``app.bridge.kept_models``), for the Models pane.
        self.loaded_models: LoadedModelsSignals = self._models.loaded_signals
        self._sweep_timer = QTimer(self)
        self._sweep_timer.setInterval(1000)
        self._sweep_timer.timeout.connect(self._sweep_kept)
        # GUI-thread state, updated by our own slots.
        self._model_info: ModelInfo | None = None
        self._is_loading = False
        #: What to drop from a chat longer than the context (``LoadSettings.overflow``), and that context.
        self._overflow = LoadSettings().overflow
        self._context_length = LoadSettings().max_model_len
        self._last_metrics: EngineMetrics | None = None
        #: Replies running through the MCP tool loop (``app.bridge.tool_runs``), each on a thread of its own.
        self._tool_runs: dict[str, ToolRun] = {}
        self._connect_engine()

    def _connect_engine(self) -> None:
        """Every connection the bridge itself makes to engine events."""
        self.signals.model_loaded.connect(self._on_model_loaded)
        self.signals.model_load_failed.connect(self._on_model_load_failed)
        self.signals.metrics_updated.connect(self._on_metrics_updated)

    # -- GUI-thread state -------------------------------------------------------------------------

    @property
    def model_info(self) -> ModelInfo | None:
        """The loaded model, or None."""
        return self._model_info

    @property
    def is_loading(self) -> bool:
        return self._is_loading

    @property
    def last_metrics(self) -> EngineMetrics | None:
        """The engine's figures in the latest ``metrics_updated`` snapshot that had them (None before the first):
        the engine loop's, or a remote server's."""
        return self._last_metrics

    @property
    def pool(self) -> QThreadPool:
        return self._pool

    @property
    def remote(self) -> RemoteBackend | None:
        """The remote backend in use, or None while the local engine serves the chats."""
        with self._lock:
            return self._models.remote

    @Slot(object)
    def _on_model_loaded(self, info: ModelInfo) -> None:
        self._model_info = info
        self._is_loading = False
        log.bridge.info("model %s loaded on %s (%s) in %.1f s", info.model_name, info.device,
                        info.dtype, info.load_s)

    @Slot(str)
    def _on_model_load_failed(self, message: str) -> None:
        if not self._models.has_model():  # a failure before the old model was freed keeps it
            self._model_info = None
        self._is_loading = False
        log.bridge.warning("model load failed: %s", message)

    @Slot(object)
    def _on_metrics_updated(self, snapshot: dict[str, Any]) -> None:
        metrics = engine_metrics_in(snapshot)
        if metrics is not None:  # not a resource sample alone
            self._last_metrics = metrics

    # -- the model: GUI -> lifecycle jobs -----------------------------------------------------------

    def load_model(self, spec: str, device: str = "auto", dtype: str = "auto",
                   settings: LoadSettings | None = None) -> None:
        """Load ``spec`` in the background, in place of the current model (if any).

        Emits ``model_load_progress`` and then ``model_loaded`` or ``model_load_failed``. The model's files are
        checked first: one that cannot load (a mistyped path) fails at once and the current model stays in use,
        served as before. Otherwise the current model is freed; requests submitted from then on wait for the new
        one.
        """
        if self._shutdown.is_set():
            return
        spec = spec.strip() or DEFAULT_MODEL_SPEC
        load_settings = settings or LoadSettings()
        self._overflow = load_settings.overflow
        self._context_length = load_settings.max_model_len
        if self._models.keep > 1 and self._switch_to_kept(model_key(spec, device, dtype, load_settings)):
            return
        generation = self._models.next_generation()
        self._is_loading = True
        if self._models.keep <= 1:  # kept loaded, the model in use goes on with its tools replies
            self._abandon_tool_runs("The model was unloaded before the reply finished.")
        log.bridge.info("loading %s (device=%s, dtype=%s, %s)", spec, device, dtype, load_settings)
        self._start_job("load", lambda: self._models.load_worker(generation, spec, device, dtype, load_settings))

    def _switch_to_kept(self, key: tuple[str, str, str, str]) -> bool:
        """Make a model kept loaded the one in use, with no load: ``model_loaded`` follows from the event loop."""
        info = self._models.activate(key)
        if info is None:
            return False
        info = dataclasses.replace(info, load_s=0.0)
        self._model_info, self._is_loading = info, False
        self._start_job("switch", self._models.after_switch)

        def announce() -> None:
            self.signals.model_load_progress.emit(1.0, "Ready")
            self.signals.model_loaded.emit(info)

        QTimer.singleShot(0, self, announce)
        return True

    def set_models_kept(self, count: int, idle_unload_s: float | None = None) -> None:
        """Keep up to ``count`` models loaded (1: loading another frees the one in use), each unloaded once idle
        for ``idle_unload_s`` seconds (None: never). Idle models over the count are unloaded, least recently used
        first; a model with replies running never is."""
        if not 1 <= count <= MAX_KEPT:
            raise ValueError(f"models kept loaded must be 1 to {MAX_KEPT}, got {count}")
        if idle_unload_s is not None and idle_unload_s < 0:
            raise ValueError(f"the idle time before unloading must not be negative, got {idle_unload_s}")
        self._models.keep, self._models.idle_ttl_s = count, idle_unload_s
        # Each kept model's loop holds a pool thread for as long as it is loaded.
        self._pool.setMaxThreadCount(MAX_THREADS + count - 1)
        if count > 1 or idle_unload_s is not None:
            self._sweep_timer.start()
        self._sweep_kept()

    def unload_loaded(self, spec: str) -> None:
        """Free the loaded model ``spec``: the one in use as :meth:`unload_model` does, a kept one at once."""
        info = self._model_info
        if info is not None and info.spec == spec and self._models.local_llm() is not None:
            self.unload_model()
        elif not self._models.unload_parked(spec):
            log.bridge.info("%s is not loaded; nothing to unload", spec)

    @Slot()
    def _sweep_kept(self) -> None:
        if self._shutdown.is_set():
            self._sweep_timer.stop()
            return
        if self._models.sweep() and not self._is_loading:
            log.bridge.info("unloading the model in use: idle for %s s", self._models.idle_ttl_s)
            self.unload_model()
        if self._models.keep <= 1 and self._models.idle_ttl_s is None and not self._models.has_parked():
            self._sweep_timer.stop()

    def unload_model(self) -> None:
        """Free the model in the background; in-flight requests fail, ``model_unloaded`` follows."""
        if self._shutdown.is_set():
            return
        generation = self._models.retire_current_model()
        self._model_info = None
        self._is_loading = False
        self._abandon_tool_runs("The model was unloaded before the reply finished.")
        log.bridge.info("unloading the model")
        self._start_job("unload", lambda: self._models.unload_worker(generation))

    def connect_remote(self, base_url: str, api_key: str = "", model: str = "") -> None:
        """Use a remote OpenAI-compatible server instead of the local engine.

        Lists the server's models (``remote_models_listed``) and picks ``model`` (or the first one); only then
        frees the local model and emits ``model_loaded`` with ``device == REMOTE_DEVICE``. A server that cannot
        be reached gives ``model_load_failed`` with the reason in plain words, and the model in use stays.
        ``unload_model`` disconnects.
        """
        if self._shutdown.is_set():
            return
        generation = self._models.next_generation()
        self._is_loading = True
        log.bridge.info("connecting to %s (model %r)", base_url, model)
        self._start_job("connect", lambda: self._models.remote_worker(generation, base_url, api_key, model))

    def start_server(self, port: int = 8000, api_key: str = "", host: str = "127.0.0.1") -> None:
        """Serve the loaded local model over the OpenAI API; ``server_state_changed`` reports."""
        if not self._shutdown.is_set():
            self._start_job("start-server", lambda: self._models.start_server_worker(host, port, api_key))

    def stop_server(self) -> None:
        """Stop serving; ``server_state_changed`` follows."""
        if not self._shutdown.is_set():
            self._start_job("stop-server", lambda: self._models.stop_server_worker(""))

    # -- requests ---------------------------------------------------------------------------------

    def submit(self, conversation_id: str, messages: list[dict[str, str]] | str,
               params: Mapping[str, Any] | SamplingParams | None = None) -> str:
        """Queue a chat request and return its request id.

        ``params`` holds ``SamplingParams`` keyword arguments (or is a ``SamplingParams``). Bad
        values arrive as ``request_failed``. Without a model (and no load under way) the request
        fails at once, asynchronously.
        """
        request_id = f"r{next(self._ids)}"
        if self._model_info is None and not self._is_loading:
            self._fail_soon(request_id, "No model is loaded. Load a model first.")
            return request_id
        command = Submit(request_id, conversation_id, messages, params, self._overflow)
        with self._lock:  # a remote that connects meanwhile takes over the queue under this lock
            remote, loop = self._models.remote, self._models.loop
            if loop is not None and loop.error:
                self._fail_soon(request_id, f"The engine stopped ({loop.error}). Reload the model.")
                return request_id
            if remote is None:
                self._commands.put(command)
                if loop is not None:
                    loop.wake()
        if remote is not None:
            if isinstance(messages, list):
                try:  # the server's tokenizer is not at hand: fit by an estimate of the length
                    wanted = params.get("max_tokens", 512) if isinstance(params, Mapping) \
                        else params.max_tokens if params is not None else 512
                    budget = self._context_length - min(int(wanted or 512), self._context_length // 2)
                    command.messages = fit_messages(messages, budget, approximate_tokens, self._overflow,
                                                    context_length=self._context_length)
                except ContextOverflowError as exc:
                    self._fail_soon(request_id, str(exc))
                    return request_id
                if (dropped := len(messages) - len(command.messages)) > 0:
                    QTimer.singleShot(0, self, lambda: self.signals.context_fitted.emit(request_id, dropped))
            self._send_remote(remote, command)
        return request_id

    def submit_tools(self, conversation_id: str, messages: list[dict[str, str]],
                     params: Mapping[str, Any] | SamplingParams | None, spec: ToolRunSpec) -> str:
        """Answer ``messages`` through the MCP tool loop with ``spec``'s tools, on a thread of its own; returns the
        request id. It reports as :meth:`submit` does, with ``tool_step`` for each call (``app.bridge.tool_runs``).
        Tools need the local engine: without a loaded local model the request fails at once, in words."""
        from app.bridge.tool_runs import ToolRun

        request_id = f"r{next(self._ids)}"
        llm = None if self._shutdown.is_set() else self._models.local_llm()
        if llm is None:
            self._fail_soon(request_id, "Tools run with a model loaded in Hearth, not a remote server: load one "
                            "first (or turn Tools off for this chat)." if not self._is_loading
                            else "Wait for the model to finish loading, then send again.")
            return request_id
        try:
            sampling = params if isinstance(params, SamplingParams) else SamplingParams(**dict(params or {}))
        except (TypeError, ValueError) as exc:
            self._fail_soon(request_id, str(exc))
            return request_id
        self._tool_runs = {rid: run for rid, run in self._tool_runs.items() if run.thread.is_alive()}
        run = ToolRun(request_id, conversation_id, llm, list(messages), sampling, spec, self.signals, self._overflow)
        self._tool_runs[request_id] = run
        run.start()
        return request_id

    def measure_tools(self, key: object, spec: ToolRunSpec) -> None:
        """Start ``spec``'s servers and count their tools' prompt tokens, on a thread of its own; emits
        ``tools_measured(key, ToolsMeasure)``."""
        from app.bridge.tool_runs import measure

        llm = self._models.local_llm()

        def work() -> None:
            try:
                result = measure(spec, llm)
            except Exception:  # noqa: BLE001 (a worker thread must report, not die)
                log.bridge.exception("measuring the tools failed")
                return
            if not self._shutdown.is_set():
                self.signals.tools_measured.emit(key, result)

        threading.Thread(target=work, name="hearth-tools-measure", daemon=True).start()

    def _abandon_tool_runs(self, message: str) -> None:
        """End every tools reply now (its model is going away): failed with ``message``."""
        runs, self._tool_runs = list(self._tool_runs.values()), {}
        for run in runs:
            run.spec.deny_all()
            run.abandon(message)

    def cancel(self, request_id: str) -> None:
        """Ask the engine to stop a request; it finishes with finish_reason "abort"."""
        run = self._tool_runs.get(request_id)
        if run is not None:
            run.cancel()
            run.spec.deny_all()
            return
        if self._models.route_cancel(request_id):  # a reply of a model kept loaded, not the one in use
            return
        with self._lock:
            remote, loop = self._models.remote, self._models.loop
            if remote is None:
                self._commands.put(Cancel(request_id))
                if loop is not None:
                    loop.wake()
        if remote is not None:
            remote.cancel(request_id)

    def tokenizer(self) -> Callable[[list[dict[str, str]] | str], list[int]] | None:
        """The local model's ``tokenize`` (text, or messages through its chat template), or None while no local model
        serves the chats. Any thread; the chat's context meter calls it off the GUI thread."""
        llm = self._models.local_llm()
        return None if llm is None else llm.engine.tokenize

    def set_overflow_policy(self, policy: str) -> None:
        """What to drop from chats longer than the context from now on (``LoadSettings.overflow``)."""
        self._overflow = LoadSettings(overflow=policy).overflow

    def _fail_soon(self, request_id: str, message: str) -> None:
        """Emit ``request_failed`` from the event loop, after ``submit`` has returned the id."""
        QTimer.singleShot(0, self, lambda: self.signals.request_failed.emit(request_id, message))

    def _send_remote(self, remote: RemoteBackend, command: Submit) -> None:
        """Send a request to the remote server; any thread."""
        self._remote_conversations[command.request_id] = command.conversation_id
        remote.submit(command.request_id, command.messages, command.params)

    def _remote_events(self) -> RemoteEvents:
        def finished(rid: str, reason: str | None, metrics: dict[str, Any]) -> None:
            conversation = self._remote_conversations.pop(rid, "")
            self.signals.request_finished.emit(rid, RequestInfo(rid, conversation, reason, metrics))

        def failed(rid: str, message: str) -> None:
            self._remote_conversations.pop(rid, None)
            self.signals.request_failed.emit(rid, message)

        return RemoteEvents(token_delta=self.signals.token_delta.emit, request_finished=finished,
                            request_failed=failed)

    # -- other background work --------------------------------------------------------------------

    def discover_models(self, extra_dirs: list[str]) -> None:
        """Look for the models on disk (and in ``extra_dirs``) in the background; emits
        ``model_folders_unreadable``, then ``models_discovered``, then ``model_folders_scanned``."""
        if not self._shutdown.is_set():
            dirs = list(extra_dirs)
            self._start_job("discover", lambda: self._discover(dirs))

    def _discover(self, extra_dirs: list[str]) -> None:
        self._emit_found(*find_models(self._engine_api, extra_dirs))
        self._emit_unless_shut(self.signals.model_folders_scanned, watched_model_folders(extra_dirs))

    def recommend_quantization(self, spec: str, device: str = "auto", settings: LoadSettings | None = None) -> None:
        """Estimate, in the background, which quantization ``spec`` should load at on ``device`` and what each
        level needs, with the KV cache ``settings`` will give it (context length x concurrent chats); emits
        ``recommendation_ready`` with a :class:`QuantizationAdvice`."""
        if not self._shutdown.is_set():
            spec = spec.strip() or DEFAULT_MODEL_SPEC
            load_settings = settings or LoadSettings()
            self._start_job("recommend", lambda: self._emit_unless_shut(
                self.signals.recommendation_ready,
                quantization_advice(self._engine_api, spec, device, load_settings.max_model_len,
                                    load_settings.max_batch_size, load_settings.deterministic)))

    def detect_hardware(self) -> None:
        """Detect CPU/GPU/RAM in the background; emits ``hardware_detected``."""
        if not self._shutdown.is_set():
            self._start_job("detect-hardware", self._detect_hardware_worker)

    def shutdown(self) -> None:
        """Stop all work, wait for the pool and free the model. Blocks; call it once, on exit."""
        if self._shutdown.is_set():
            return
        log.bridge.info("shutting down")
        self._abandon_tool_runs("Hearth is closing.")
        self._threads.stop()  # the resource monitor
        self._sweep_timer.stop()
        self._models.retire_current_model()
        self._pool.waitForDone()
        _POOLS.discard(self._pool)
        self._models.close()
        self._jobs.clear()
        self._model_info = None
        self._is_loading = False

    # -- pool side --------------------------------------------------------------------------------

    def _start_job(self, name: str, fn: Callable[[], None]) -> None:
        self._jobs = [job for job in self._jobs if not job.done.is_set()]
        job = Job(name, fn)
        self._jobs.append(job)
        self._pool.start(job)

    def _emit_found(self, models: list[dict[str, Any]], unreadable: list[str]) -> None:
        """The models found, after the folders that could not be read (so a view shows both together)."""
        self._emit_unless_shut(self.signals.model_folders_unreadable, unreadable)
        self._emit_unless_shut(self.signals.models_discovered, models)

    def _emit_unless_shut(self, signal: SignalInstance, value: object) -> None:
        if not self._shutdown.is_set():
            signal.emit(value)

    def _engine_api(self) -> EngineApi:
        if self._api is None:
            self._api = import_engine()
        self._start_sampler(self._api)
        return self._api

    def _start_sampler(self, api: EngineApi) -> None:
        """Start the resource monitor once; its samples (memory, CPU, GPUs, and a remote server's figures while
        one is in use) go out as ``metrics_updated``, about once a second, model or not. The local engine's
        metrics come from its loop alone (:class:`EngineLoop`)."""
        with self._lock:
            if self._threads.sampler is not None or self._shutdown.is_set():
                return
            sampler = api.Sampler(METRICS_INTERVAL_S, metrics_source=self._engine_metrics,
                                  on_sample=self.signals.metrics_updated.emit)
            self._threads.sampler = sampler
            sampler.start()

    def _engine_metrics(self) -> EngineMetrics | None:
        """A remote server's figures, or None: the local engine's come from its loop, not from here. Sampler
        thread."""
        remote = self.remote
        return remote.snapshot() if remote is not None else None

    def _detect_hardware_worker(self) -> None:
        try:
            info = self._engine_api().detect_hardware()
        except Exception:  # noqa: BLE001 (a worker thread must report, not die)
            log.bridge.exception("hardware detection failed")
            info = None
        if not self._shutdown.is_set():
            self.signals.hardware_detected.emit(info)
