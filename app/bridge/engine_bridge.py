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

Jobs run on the pool (:meth:`EngineBridge._load_worker`, also unloading, connecting to a remote server and
hardware detection). The load job, once its model is ready, goes on as :class:`~app.bridge.loop.EngineLoop`,
which runs the engine's own step loop (``engine.core.loop.run_loop``) while the model is loaded and frees it when
stopped: every torch op of a model (load, warm-up, steps, close) runs on that one thread, as under the engine's
own loop thread (``LLM._set_up_on_the_loop_thread``), since a second thread doing torch work keeps a second
OpenMP team on the cores. The engine batches concurrent requests itself, so one loop serves every conversation.
Stopping is a ``threading.Event``: :meth:`EngineBridge.shutdown` (called when the window closes) sets it and then
waits for the pool with ``QThreadPool.waitForDone()``. A bridge destroyed without ``shutdown()`` (a window deleted
without being closed) still stops its threads first.

A prompt's path: ``Composer.send_requested`` -> ``ChatPane._on_send_requested`` -> ``ChatPane.send`` ->
``ReplyController.submit`` -> ``EngineBridge.submit`` (queue) -> ``EngineLoop._handle`` -> ``LLMEngine.submit`` ...
``LLMEngine.step()`` -> ``EngineLoop._on_step`` -> ``EngineSignals.token_delta`` ->
``ReplyController._on_token_delta`` -> ``ReplyController.reply_changed`` -> ``ChatPane`` -> ``MessageView``.

Long because ``EngineBridge`` is the app's whole engine API (a local model, a remote server, serving on
localhost, the models on disk), and the generation/lock protocol that keeps at most one model alive reads
best in one class. The loop, the signals, the data types and the pool helpers live beside it.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from PySide6.QtCore import QObject, QThreadPool, QTimer, Slot

from app import log
from app.bridge.jobs import (
    Job,
    Superseded,
    Threads,
    find_models,
    import_engine,
    kv_cache_size,
    precheck_model,
    quantization_advice,
    start_local_server,
)
from app.bridge.loop import Cancel, Command, EngineLoop, Submit
from app.bridge.remote_backend import RemoteBackend, RemoteError, RemoteEvents, api_root, fetch_models
from app.bridge.signals import EngineSignals
from app.bridge.types import (
    DEFAULT_MODEL_SPEC,
    REMOTE_DEVICE,
    LoadSettings,
    ModelInfo,
    RequestInfo,
    ServerState,
)
from engine.core.context import ContextOverflowError, approximate_tokens, fit_messages
from engine.core.loop import METRICS_INTERVAL_S

#: The pool's threads. A loaded model's loop holds one (its load job's) for the model's lifetime; the other two serve
#: the jobs. No job needs a running loop's thread: the loop runs outside ``_load_lock`` and ends on its stop event,
#: which a later load or unload sets before it waits, so neither is starved.
MAX_THREADS = 3
#: Every bridge's pool, until its ``shutdown()``. A pool is no child of its bridge: its destructor waits for its
#: threads while holding the GIL, so if it died with a bridge deleted unclosed, a running loop could never end.
_POOLS: set[QThreadPool] = set()


class EngineBridge(QObject):
    """Owns the engine, its worker threads and :class:`EngineSignals`.

    Every public method returns at once and must be called from the GUI thread.

    Args:
        parent: the owning QObject (usually the main window).
        api: an object with ``LLM``, ``SamplingParams``, ``ModelLoadError`` and ``hardware`` like the
            ``engine`` package; tests pass a fake. ``None`` imports ``engine`` on first use, in a
            pool thread.
    """

    def __init__(self, parent: QObject | None = None, *, api: Any = None) -> None:
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
        # Destroyed with the bridge; a loop that finds it gone stops (see EngineLoop).
        self._sentinel = QObject(self)
        self._sentinel.setObjectName("engine-bridge-sentinel")
        # Shared with pool threads, guarded by _lock.
        self._lock = self._threads.lock
        self._generation = 0
        self._llm: Any = None
        self._loop: EngineLoop | None = None
        self._retired_loops: list[EngineLoop] = []
        # Serializes loads and unloads so at most one model is in memory.
        self._load_lock = threading.Lock()
        self._jobs: list[Job] = []
        # A remote server instead of the local engine (guarded by _lock), and the requests sent to it.
        self._remote: RemoteBackend | None = None
        self._retired_remotes: list[RemoteBackend] = []
        self._remote_conversations: dict[str, str] = {}
        self._server: Any = None  # engine.serving.openai_app.ServerThread while "Serve on localhost" runs
        # GUI-thread state, updated by our own slots.
        self._model_info: ModelInfo | None = None
        self._is_loading = False
        #: What to drop from a chat longer than the context (``LoadSettings.overflow``), and that context.
        self._overflow = LoadSettings().overflow
        self._context_length = LoadSettings().max_model_len
        self._last_metrics: dict[str, Any] = {}
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
    def last_metrics(self) -> dict[str, Any]:
        """The latest ``metrics_updated`` snapshot with engine figures (``num_running``, ...; empty before the
        first): the engine loop's, or a remote server's."""
        return self._last_metrics

    @property
    def pool(self) -> QThreadPool:
        return self._pool

    @Slot(object)
    def _on_model_loaded(self, info: ModelInfo) -> None:
        self._model_info = info
        self._is_loading = False
        log.bridge.info("model %s loaded on %s (%s) in %.1f s", info.model_name, info.device,
                        info.dtype, info.load_s)

    @Slot(str)
    def _on_model_load_failed(self, message: str) -> None:
        with self._lock:
            kept = self._llm is not None or self._remote is not None
        if not kept:  # a failure before the old model was freed keeps it
            self._model_info = None
        self._is_loading = False
        log.bridge.warning("model load failed: %s", message)

    @Slot(object)
    def _on_metrics_updated(self, snapshot: dict[str, Any]) -> None:
        if "num_running" in snapshot:  # not a resource sample alone
            self._last_metrics = snapshot

    # -- GUI -> engine ----------------------------------------------------------------------------

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
        settings = settings or LoadSettings()
        self._overflow = settings.overflow
        self._context_length = settings.max_model_len
        with self._lock:
            self._generation += 1
            generation = self._generation
        self._is_loading = True
        log.bridge.info("loading %s (device=%s, dtype=%s, %s)", spec, device, dtype, settings)
        self._start_job("load", lambda: self._load_worker(generation, spec, device, dtype, settings))

    def unload_model(self) -> None:
        """Free the model in the background; in-flight requests fail, ``model_unloaded`` follows."""
        if self._shutdown.is_set():
            return
        generation = self._retire_current_model()
        self._model_info = None
        self._is_loading = False
        log.bridge.info("unloading the model")
        self._start_job("unload", lambda: self._unload_worker(generation))

    def submit(self, conversation_id: str, messages: list[dict[str, str]] | str,
               params: Mapping[str, Any] | Any = None) -> str:
        """Queue a chat request and return its request id.

        ``params`` holds ``SamplingParams`` keyword arguments (or is a ``SamplingParams``). Bad
        values arrive as ``request_failed``. Without a model (and no load under way) the request
        fails at once, asynchronously.
        """
        request_id = f"r{next(self._ids)}"
        if self._model_info is None and not self._is_loading:
            self._fail_soon(request_id, "No model is loaded. Load a model first.")
            return request_id
        with self._lock:  # a remote that connects meanwhile takes over the queue under this lock
            remote, loop = self._remote, self._loop
            if loop is not None and loop.error:
                self._fail_soon(request_id, f"The engine stopped ({loop.error}). Reload the model.")
                return request_id
            if remote is None:
                self._commands.put(Submit(request_id, conversation_id, messages, params, self._overflow))
                if loop is not None:
                    loop.wake()
        if remote is not None:
            if isinstance(messages, list):
                try:  # the server's tokenizer is not at hand: fit by an estimate of the length
                    wanted = params.get("max_tokens", 512) if isinstance(params, Mapping) else 512
                    budget = self._context_length - min(int(wanted or 512), self._context_length // 2)
                    messages = fit_messages(messages, budget, approximate_tokens, self._overflow)
                except ContextOverflowError as exc:
                    self._fail_soon(request_id, str(exc))
                    return request_id
            self._remote_conversations[request_id] = conversation_id
            remote.submit(request_id, messages, params)
        return request_id

    def set_overflow_policy(self, policy: str) -> None:
        """What to drop from chats longer than the context from now on (``LoadSettings.overflow``)."""
        self._overflow = LoadSettings(overflow=policy).overflow

    def discover_models(self, extra_dirs: list[str]) -> None:
        """Look for the models on disk (and in ``extra_dirs``) in the background; emits ``models_discovered``."""
        if not self._shutdown.is_set():
            dirs = list(extra_dirs)
            self._start_job("discover", lambda: self._emit_unless_shut(
                self.signals.models_discovered, find_models(self._engine_api, dirs)))

    def _emit_unless_shut(self, signal: Any, value: Any) -> None:
        if not self._shutdown.is_set():
            signal.emit(value)

    def cancel(self, request_id: str) -> None:
        """Ask the engine to stop a request; it finishes with finish_reason "abort"."""
        with self._lock:
            remote, loop = self._remote, self._loop
            if remote is None:
                self._commands.put(Cancel(request_id))
                if loop is not None:
                    loop.wake()
        if remote is not None:
            remote.cancel(request_id)

    def _fail_soon(self, request_id: str, message: str) -> None:
        """Emit ``request_failed`` from the event loop, after ``submit`` has returned the id."""
        QTimer.singleShot(0, self, lambda: self.signals.request_failed.emit(request_id, message))

    # -- remote server and "Serve on localhost" ------------------------------------------------------

    def connect_remote(self, base_url: str, api_key: str = "", model: str = "") -> None:
        """Use a remote OpenAI-compatible server instead of the local engine.

        Lists the server's models (``remote_models_listed``) and picks ``model`` (or the first one); only then
        frees the local model and emits ``model_loaded`` with ``device == REMOTE_DEVICE``. A server that cannot
        be reached gives ``model_load_failed`` with the reason in plain words, and the model in use stays.
        ``unload_model`` disconnects.
        """
        if self._shutdown.is_set():
            return
        with self._lock:
            self._generation += 1
            generation = self._generation
        self._is_loading = True
        log.bridge.info("connecting to %s (model %r)", base_url, model)
        self._start_job("connect", lambda: self._remote_worker(generation, base_url, api_key, model))

    def start_server(self, port: int = 8000, api_key: str = "", host: str = "127.0.0.1") -> None:
        """Serve the loaded local model over the OpenAI API; ``server_state_changed`` reports."""
        if not self._shutdown.is_set():
            self._start_job("start-server", lambda: self._start_server_worker(host, port, api_key))

    def stop_server(self) -> None:
        """Stop serving; ``server_state_changed`` follows."""
        if not self._shutdown.is_set():
            self._start_job("stop-server", lambda: self._stop_server_worker(""))

    @property
    def remote(self) -> RemoteBackend | None:
        """The remote backend in use, or None while the local engine serves the chats."""
        with self._lock:
            return self._remote

    def _remote_events(self) -> RemoteEvents:
        def finished(rid: str, reason: str | None, metrics: dict[str, Any]) -> None:
            conversation = self._remote_conversations.pop(rid, "")
            self.signals.request_finished.emit(rid, RequestInfo(rid, conversation, reason, metrics))

        def failed(rid: str, message: str) -> None:
            self._remote_conversations.pop(rid, None)
            self.signals.request_failed.emit(rid, message)

        return RemoteEvents(token_delta=self.signals.token_delta.emit, request_finished=finished,
                            request_failed=failed)

    def _remote_worker(self, generation: int, base_url: str, api_key: str, model: str) -> None:
        with self._load_lock:
            if not self._is_current(generation):
                return
            started = time.monotonic()
            try:
                url = api_root(base_url)
                models = fetch_models(url, api_key)
                if not models:
                    raise RemoteError(f"The server at {url} offers no models.")
                if model and model not in models:
                    raise RemoteError(f"The server at {url} has no model '{model}'; it offers: "
                                      + ", ".join(models) + ".")
            except RemoteError as exc:
                self._load_failed(generation, str(exc))
                return
            if not self._replace_current(generation):
                return
            self.signals.remote_models_listed.emit(models)
            backend = RemoteBackend(url, api_key, model or models[0], self._remote_events())
            with self._lock:
                is_current = generation == self._generation and not self._shutdown.is_set()
                if is_current:
                    self._remote = backend
                    queued = self._take_queued()
            if not is_current:
                backend.close()
                return
            for command in queued:  # requests sent while connecting
                if isinstance(command, Submit):
                    self._remote_conversations[command.request_id] = command.conversation_id
                    backend.submit(command.request_id, command.messages, command.params)
            host = url.split("://", 1)[-1].removesuffix("/v1")
            self.signals.model_load_progress.emit(1.0, "Connected")
            self.signals.model_loaded.emit(ModelInfo(
                spec=url, model_name=backend.model, device=REMOTE_DEVICE, dtype=host,
                device_reason=f"Replies come from {url}.", weights_bytes=0,
                load_s=time.monotonic() - started))

    def _take_queued(self) -> list[Command]:
        commands = []
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands

    def _start_server_worker(self, host: str, port: int, api_key: str) -> None:
        self._stop_server_worker("")
        with self._lock:
            llm = self._llm
        if llm is None:
            self.signals.server_state_changed.emit(ServerState(False, message="Load a local model first."))
            return
        server, state = start_local_server(llm, host, port, api_key)
        if server is not None:
            with self._lock:
                self._server = server
        self.signals.server_state_changed.emit(state)

    def _stop_server_worker(self, message: str) -> None:
        with self._lock:
            server, self._server = self._server, None
        if server is None:
            return
        server.stop()
        log.bridge.info("stopped serving on %s", server.url)
        self.signals.server_state_changed.emit(ServerState(False, message=message))

    def recommend_quantization(self, spec: str, device: str = "auto", settings: LoadSettings | None = None) -> None:
        """Estimate, in the background, which quantization ``spec`` should load at on ``device`` and what each
        level needs, with the KV cache ``settings`` will give it (context length x concurrent chats); emits
        ``recommendation_ready`` with a :class:`QuantizationAdvice`."""
        if not self._shutdown.is_set():
            spec = spec.strip() or DEFAULT_MODEL_SPEC
            settings = settings or LoadSettings()
            self._start_job("recommend", lambda: self._recommend_worker(spec, device, settings))

    def detect_hardware(self) -> None:
        """Detect CPU/GPU/RAM in the background; emits ``hardware_detected``."""
        if not self._shutdown.is_set():
            self._start_job("detect-hardware", self._detect_hardware_worker)

    def shutdown(self) -> None:
        """Stop all work, wait for the pool and free the model. Blocks; call it once, on exit."""
        if self._shutdown.is_set():
            return
        log.bridge.info("shutting down")
        self._threads.stop()  # the resource monitor
        self._retire_current_model()
        self._pool.waitForDone()
        _POOLS.discard(self._pool)
        self._stop_server_worker("Hearth is closing.")
        self._close_remotes()
        with self._lock:
            llm, self._llm = self._llm, None
        if llm is not None:
            self._close(llm)
        self._jobs.clear()
        self._retired_loops.clear()
        self._model_info = None
        self._is_loading = False

    # -- pool side --------------------------------------------------------------------------------

    def _start_job(self, name: str, fn: Callable[[], None]) -> None:
        self._jobs = [job for job in self._jobs if not job.done.is_set()]
        job = Job(name, fn)
        self._jobs.append(job)
        self._pool.start(job)

    def _replace_current(self, generation: int) -> bool:
        """Retire the model in use for the load of ``generation`` and free it; False when that load is
        superseded. Pool threads only."""
        with self._lock:
            if generation != self._generation or self._shutdown.is_set():
                return False
            self._retire_locked()
        self._teardown()
        return True

    def _retire_current_model(self) -> int:
        """Bump the generation and stop the running loop; returns the new generation."""
        with self._lock:
            self._generation += 1
            self._retire_locked()
            return self._generation

    def _retire_locked(self) -> None:
        """Stop the running loop and drop the remote (``_lock`` held)."""
        if self._loop is not None:
            self._loop.stop()
            self._retired_loops.append(self._loop)
            self._loop = None
        if self._remote is not None:
            self._retired_remotes.append(self._remote)
            self._remote = None

    def _is_current(self, generation: int) -> bool:
        with self._lock:
            return generation == self._generation and not self._shutdown.is_set()

    def _engine_api(self) -> Any:
        if self._api is None:
            self._api = import_engine()
        self._start_sampler()
        return self._api

    def _start_sampler(self) -> None:
        """Start the resource monitor once; its samples (memory, CPU, GPUs, and a remote server's figures while
        one is in use) go out as ``metrics_updated``, about once a second, model or not. The local engine's
        metrics come from its loop alone (:class:`EngineLoop`)."""
        sampler_type = getattr(self._api, "Sampler", None)
        with self._lock:
            if sampler_type is None or self._threads.sampler is not None or self._shutdown.is_set():
                return
            sampler = sampler_type(METRICS_INTERVAL_S, metrics_source=self._engine_metrics,
                                   on_sample=self.signals.metrics_updated.emit)
            self._threads.sampler = sampler
            sampler.start()

    def _engine_metrics(self) -> dict[str, Any] | None:
        """A remote server's figures, or None: the local engine's come from its loop, not from here. Sampler
        thread."""
        with self._lock:
            remote = self._remote
        return remote.snapshot() if remote is not None else None

    def _teardown(self) -> None:
        """Stop serving, disconnect retired remotes, wait for stopped loops (each frees its model on its own
        thread, :meth:`_release_model`), then free a model still held (one whose loop died of an error). Pool
        threads only."""
        self._stop_server_worker("The model was unloaded.")
        self._close_remotes()
        with self._lock:
            loops, self._retired_loops = self._retired_loops, []
        for loop in loops:
            loop.done.wait()
        with self._lock:
            llm, self._llm = self._llm, None
        if llm is not None:
            self._close(llm)

    def _close_remotes(self) -> None:
        with self._lock:
            remotes, self._retired_remotes = self._retired_remotes, []
        for remote in remotes:
            remote.close()

    def _release_model(self, llm: Any) -> None:
        """Free ``llm`` unless it has been taken already: its stopped loop's thread, the one that loaded it.

        Not once the bridge shuts down: :meth:`shutdown` frees the model on the GUI thread, as closing collects
        garbage (``gc.collect``), which off the GUI thread could destroy a closing window's Qt objects; a bridge
        deleted without ``shutdown()`` leaves it to the process's end."""
        with self._lock:
            if self._llm is not llm or self._shutdown.is_set():
                return
            self._llm = None
        self._close(llm)

    @staticmethod
    def _close(llm: Any) -> None:
        try:
            llm.close()
        except Exception:  # noqa: BLE001 (a worker thread must report, not die)
            log.bridge.exception("closing the model failed")

    def _fail_queued(self, message: str) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, Submit):
                self.signals.request_failed.emit(command.request_id, message)

    def _load_worker(self, generation: int, spec: str, device: str, dtype: str,
                     settings: LoadSettings) -> None:
        """Load ``spec``, then run its engine loop on this same thread until the model is retired (see the module
        docstring: one thread does all of a model's torch work)."""
        with self._load_lock:
            loop = self._load(generation, spec, device, dtype, settings)
        if loop is not None:  # outside _load_lock: the next load or unload stops this loop and waits for it
            loop.run()

    def _load(self, generation: int, spec: str, device: str, dtype: str,
              settings: LoadSettings) -> EngineLoop | None:
        """The loaded model's loop, not yet running; None when the load failed or was superseded. ``_load_lock``
        held."""
        if not self._is_current(generation):
            return None
        try:
            problem = precheck_model(self._engine_api, spec)
        except Exception as exc:  # noqa: BLE001 (a worker thread must report, not die)
            log.bridge.exception("importing the engine failed")
            problem = f"The inference engine could not be started: {exc}"
        if problem:
            self._load_failed(generation, problem)
            return None
        if not self._replace_current(generation):
            return None

        def progress(fraction: float, stage: str) -> None:
            if not self._is_current(generation):
                raise Superseded
            self.signals.model_load_progress.emit(float(fraction), str(stage))

        started = time.monotonic()
        try:
            api = self._engine_api()
        except Exception as exc:  # noqa: BLE001 (a worker thread must report, not die)
            log.bridge.exception("importing the engine failed")
            self._load_failed(generation, f"The inference engine could not be started: {exc}")
            return None
        self.signals.model_load_progress.emit(0.0, "Starting")
        try:
            llm = api.LLM(spec, device=device, dtype=dtype, quantization=settings.quantization,
                          max_batch_size=settings.max_batch_size, max_model_len=settings.max_model_len,
                          max_wait_ms=settings.max_wait_ms, kv_cache_bytes=settings.kv_cache_bytes,
                          deterministic=settings.deterministic, speculative=settings.speculative,
                          progress=progress, start_loop=False)
        except Superseded:
            log.bridge.info("load of %s abandoned", spec)
            return None
        except api.ModelLoadError as exc:
            self._load_failed(generation, str(exc) or f"Could not load {spec}.")
            return None
        except Exception as exc:  # noqa: BLE001 (a worker thread must report, not die)
            if isinstance(exc.__cause__ or exc.__context__, Superseded):
                return None
            log.bridge.exception("loading %s failed", spec)
            self._load_failed(generation, f"Could not load {spec}: {type(exc).__name__}: {exc}")
            return None
        info = ModelInfo(spec=spec, model_name=str(getattr(llm, "model_name", spec)),
                         device=str(llm.device), dtype=str(llm.dtype),
                         device_reason=str(getattr(llm, "device_reason", "")),
                         weights_bytes=int(getattr(llm, "weights_bytes", 0) or 0),
                         load_s=time.monotonic() - started,
                         quantization=str(getattr(llm, "quantization", "") or ""),
                         sampling_defaults=dict(getattr(llm, "sampling_defaults", {}) or {}),
                         kv_cache_bytes=kv_cache_size(llm), context_length=settings.max_model_len)
        with self._lock:  # from here on the caller runs the loop: a registered loop must run, or teardown waits
            is_current = generation == self._generation and not self._shutdown.is_set()
            if is_current:
                self._llm = llm
                self._loop = loop = EngineLoop(llm, self._commands, self.signals, self._sentinel,
                                               self._threads.stop, release=lambda: self._release_model(llm))
        if not is_current:
            self._close(llm)
            return None
        self.signals.model_load_progress.emit(1.0, "Ready")
        self.signals.model_loaded.emit(info)
        return loop

    def _load_failed(self, generation: int, message: str) -> None:
        if self._is_current(generation):
            self._fail_queued("The model failed to load.")
            self.signals.model_load_failed.emit(message)

    def _unload_worker(self, generation: int) -> None:
        with self._load_lock:
            self._teardown()
            if self._is_current(generation):
                self._fail_queued("The model was unloaded.")
                self.signals.model_unloaded.emit()

    def _recommend_worker(self, spec: str, device: str, settings: LoadSettings) -> None:
        advice = quantization_advice(self._engine_api, spec, device, settings.max_model_len,
                                     settings.max_batch_size)
        if not self._shutdown.is_set():
            self.signals.recommendation_ready.emit(advice)

    def _detect_hardware_worker(self) -> None:
        try:
            info = self._engine_api().detect_hardware()
        except Exception:  # noqa: BLE001 (a worker thread must report, not die)
            log.bridge.exception("hardware detection failed")
            info = None
        if not self._shutdown.is_set():
            self.signals.hardware_detected.emit(info)
