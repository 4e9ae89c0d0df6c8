"""The one place the app talks to the engine.

``EngineBridge`` is the only ``app`` module that imports ``engine``. It lives in the GUI thread
and never blocks it:

* GUI -> engine: :meth:`EngineBridge.load_model`, :meth:`~EngineBridge.unload_model`,
  :meth:`~EngineBridge.submit` and :meth:`~EngineBridge.cancel` put a command on a
  ``queue.Queue`` or start a ``QRunnable`` on the bridge's own ``QThreadPool`` and return at once.
* Engine -> GUI: the runnables emit plain Python data through :class:`EngineSignals`, which the
  bridge owns. Signals cross threads as queued connections, so receivers run in the GUI thread.

Two kinds of runnable share the pool: a loader (:meth:`EngineBridge._load_worker`, also used for
unloading and hardware detection) and :class:`_EngineLoop`, which drives ``llm.engine.step()``
while a model is loaded. The engine batches concurrent requests itself, so one loop serves every
conversation. Stopping is a ``threading.Event``; :meth:`EngineBridge.shutdown` sets it and then
waits for the pool with ``QThreadPool.waitForDone()``.

A prompt's path: ``ChatPane`` -> ``MainWindow._on_send_requested`` -> ``EngineBridge.submit``
(queue) -> ``_EngineLoop._handle`` -> ``llm.engine.submit`` ... ``llm.engine.step()`` ->
``EngineSignals.token_delta`` -> ``ChatPane._on_token_delta`` -> ``MessageView``.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QObject, QRunnable, QThreadPool, QTimer, Signal, Slot

from app import log
from app.bridge.remote_backend import RemoteBackend, RemoteError, RemoteEvents, api_root, fetch_models
from engine.api import QUANTIZATION_LEVELS

#: ``ModelInfo.device`` of a remote server's model.
REMOTE_DEVICE = "remote server"
#: The model spec the engine resolves to its bundled default model.
DEFAULT_MODEL_SPEC = "default"
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")

#: How long the engine loop sleeps on its command queue when the engine is idle.
IDLE_WAIT_S = 0.05
#: How often the engine loop emits ``metrics_updated``.
METRICS_INTERVAL_S = 1.0
#: If the engine does not report a cancelled request as finished within this time, the bridge does.
CANCEL_GRACE_S = 2.0
MAX_THREADS = 3
#: Physical cores left to the GUI thread when the engine runs inside the app.
UI_RESERVED_CORES = 1


@dataclass(slots=True)
class LoadSettings:
    """Engine settings that take effect on the next model load."""

    max_batch_size: int = 16
    max_wait_ms: float = 5.0
    #: KV-cache budget in MiB; 0 lets the engine size it from free memory.
    kv_cache_mb: int = 0
    #: One of ``QUANTIZATION_LEVELS``; "auto" lets the engine pick from free memory.
    quantization: str = "auto"

    def __post_init__(self) -> None:
        if self.quantization not in QUANTIZATION_LEVELS:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATION_LEVELS)}, "
                             f"got {self.quantization!r}")
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {self.max_batch_size}")
        if self.max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must not be negative, got {self.max_wait_ms}")
        if self.kv_cache_mb < 0:
            raise ValueError(f"kv_cache_mb must not be negative, got {self.kv_cache_mb}")

    @property
    def kv_cache_bytes(self) -> int | None:
        return self.kv_cache_mb * 1024 * 1024 if self.kv_cache_mb else None


@dataclass(slots=True)
class ModelInfo:
    """What ``model_loaded`` carries: the loaded model and where it runs."""

    spec: str
    model_name: str
    device: str
    dtype: str
    device_reason: str
    weights_bytes: int
    load_s: float
    #: The quantization level the model was loaded at ("fp32", "bf16", "fp16", "int8", "int4"; "" if unknown).
    quantization: str = ""


@dataclass(slots=True)
class QuantizationAdvice:
    """What ``recommendation_ready`` carries: the recommended level for a model, and the numbers for each level."""

    spec: str
    device: str
    #: ``engine.loading.recommend.Recommendation`` for the best level, or None if the model could not be inspected.
    recommendation: Any = None
    #: Level ("fp32", "bf16", "fp16", "int8", "int4") -> its ``Recommendation`` (``fits`` says if it fits).
    estimates: dict[str, Any] = field(default_factory=dict)
    #: Why there is no recommendation, in plain words ("" when there is one).
    error: str = ""


@dataclass(slots=True)
class ServerState:
    """What ``server_state_changed`` carries: whether "Serve on localhost" is serving, and where."""

    is_running: bool
    url: str = ""
    #: Why it is not running (empty after a plain stop).
    message: str = ""


@dataclass(slots=True)
class RequestInfo:
    """What ``request_finished`` carries."""

    request_id: str
    conversation_id: str
    finish_reason: str | None
    #: ttft_s, e2e_s, num_prompt_tokens, num_generated_tokens, tok_s (may be empty).
    metrics: dict[str, Any] = field(default_factory=dict)


class EngineSignals(QObject):
    """Engine -> GUI events. Emitted from pool threads; receivers run in the GUI thread.

    Signals:
        token_delta(request_id, text): new text of a streaming reply.
        request_finished(request_id, RequestInfo): a reply ended (stop, length or abort).
        request_failed(request_id, message): a request could not run or was dropped.
        model_load_progress(fraction, stage): loader progress, 0..1.
        model_loaded(ModelInfo): a model is ready for requests.
        model_load_failed(message): loading failed; the message is meant for the user.
        model_unloaded(): the model was freed after ``unload_model``.
        metrics_updated(dict): an engine metrics snapshot, about once a second.
        hardware_detected(HardwareInfo | None): result of ``detect_hardware``.
        error(message): an unexpected engine error.
        remote_models_listed(list[str]): the models a remote server offers, after ``connect_remote``.
        server_state_changed(ServerState): "Serve on localhost" started, stopped or failed.
        recommendation_ready(QuantizationAdvice): result of ``recommend_quantization``.
    """

    token_delta = Signal(str, str)
    request_finished = Signal(str, object)
    request_failed = Signal(str, str)
    model_load_progress = Signal(float, str)
    model_loaded = Signal(object)
    model_load_failed = Signal(str)
    model_unloaded = Signal()
    metrics_updated = Signal(object)
    hardware_detected = Signal(object)
    error = Signal(str)
    remote_models_listed = Signal(object)
    server_state_changed = Signal(object)
    recommendation_ready = Signal(object)


@dataclass(slots=True)
class _Submit:
    request_id: str
    conversation_id: str
    messages: list[dict[str, str]] | str
    params: Mapping[str, Any] | Any


@dataclass(slots=True)
class _Cancel:
    request_id: str


class _Superseded(Exception):
    """Raised from the progress callback to abandon a load nobody waits for any more."""


def _import_engine() -> types.SimpleNamespace:
    """Import the engine (slow: torch). Called from pool threads only.

    The engine gets every physical core but one: the GUI thread must not compete with busy torch threads for
    a core, or painting stalls while a reply streams (measured on 2 cores: >100 ms gaps with 2 torch threads).
    """
    import engine
    from engine.loading import recommend
    from engine.system import hardware, monitor

    hardware.configure_threads(reserve=UI_RESERVED_CORES)

    return types.SimpleNamespace(
        LLM=engine.LLM,
        SamplingParams=engine.SamplingParams,
        ModelLoadError=engine.ModelLoadError,
        detect_hardware=hardware.detect,
        recommend=recommend.recommend,
        estimate=recommend.estimate,
        Sampler=monitor.Sampler,
    )


class _Job(QRunnable):
    """Runs one bridge method on the pool and logs anything it raises."""

    def __init__(self, name: str, fn: Callable[[], None]) -> None:
        super().__init__()
        self.setAutoDelete(False)  # the bridge keeps the Python reference
        self.name = name
        self.done = threading.Event()
        self._fn = fn

    def run(self) -> None:
        try:
            self._fn()
        except Exception:  # noqa: BLE001 (a worker thread must report, not die)
            log.bridge.exception("%s failed", self.name)
        finally:
            self.done.set()


class _EngineLoop(QRunnable):
    """Drives ``llm.engine.step()`` until stopped; one per loaded model.

    Commands arrive on the bridge's queue. While the engine has work the loop steps it and
    drains the queue between steps; when idle it blocks on the queue for ``IDLE_WAIT_S`` so a new
    request starts at once (the queue, not ``engine.wait_for_work``, is where our requests arrive).
    """

    def __init__(self, llm: Any, api: Any, commands: queue.Queue[Any], signals: EngineSignals) -> None:
        super().__init__()
        self.setAutoDelete(False)
        self.stop_event = threading.Event()
        self.done = threading.Event()
        self._llm = llm
        self._api = api
        self._commands = commands
        self._signals = signals
        self._handles: dict[str, Any] = {}  # bridge request id -> engine handle
        self._bridge_ids: dict[str, str] = {}  # engine request id -> bridge request id
        self._conversations: dict[str, str] = {}  # bridge request id -> conversation id
        self._cancel_deadlines: dict[str, float] = {}
        self._metrics_failed = False

    def stop(self) -> None:
        self.stop_event.set()

    def run(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # noqa: BLE001 (a worker thread must report, not die)
            log.bridge.exception("engine loop crashed")
            self._signals.error.emit(f"The engine stopped unexpectedly: {exc}")
        finally:
            self._drop_all("The model was unloaded before the reply finished.")
            self.done.set()

    def _loop(self) -> None:
        engine = self._llm.engine
        next_metrics = 0.0
        while not self.stop_event.is_set():
            self._drain(engine)
            if engine.has_work():
                self._emit(engine.step())
            else:
                try:
                    command = self._commands.get(timeout=IDLE_WAIT_S)
                except queue.Empty:
                    pass
                else:
                    self._handle(engine, command)
            self._expire_cancels()
            now = time.monotonic()
            if now >= next_metrics:
                next_metrics = now + METRICS_INTERVAL_S
                self._emit_metrics()

    def _drain(self, engine: Any) -> None:
        while not self.stop_event.is_set():
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            self._handle(engine, command)

    def _handle(self, engine: Any, command: _Submit | _Cancel) -> None:
        if isinstance(command, _Cancel):
            handle = self._handles.get(command.request_id)
            if handle is not None and command.request_id not in self._cancel_deadlines:
                handle.cancel()
                self._cancel_deadlines[command.request_id] = time.monotonic() + CANCEL_GRACE_S
            return
        rid = command.request_id
        try:
            params = command.params
            if params is None or isinstance(params, Mapping):
                params = self._api.SamplingParams(**dict(params or {}))
            handle = engine.submit(command.messages, params)
        # Bad sampling values, a full queue, a prompt that is too long, ...
        except Exception as exc:  # noqa: BLE001 (a worker thread must report, not die)
            log.bridge.warning("request %s rejected: %s", rid, exc)
            self._signals.request_failed.emit(rid, str(exc) or type(exc).__name__)
            return
        self._handles[rid] = handle
        self._bridge_ids[handle.request_id] = rid
        self._conversations[rid] = command.conversation_id
        log.bridge.debug("request %s submitted as %s", rid, handle.request_id)

    def _emit(self, outputs: list[Any]) -> None:
        for out in outputs:
            rid = self._bridge_ids.get(out.request_id)
            if rid is None:
                continue
            if out.delta_text:
                self._signals.token_delta.emit(rid, out.delta_text)
            if out.finished:
                self._finish(rid, out.finish_reason, dict(out.metrics or {}))

    def _finish(self, rid: str, finish_reason: str | None, metrics: dict[str, Any]) -> None:
        handle = self._handles.pop(rid)
        self._bridge_ids.pop(handle.request_id, None)
        self._cancel_deadlines.pop(rid, None)
        info = RequestInfo(rid, self._conversations.pop(rid, ""), finish_reason, metrics)
        log.bridge.debug("request %s finished: %s", rid, finish_reason)
        self._signals.request_finished.emit(rid, info)

    def _expire_cancels(self) -> None:
        now = time.monotonic()
        for rid, deadline in list(self._cancel_deadlines.items()):
            if now >= deadline:
                log.bridge.warning("engine did not confirm cancel of %s; dropping it", rid)
                self._finish(rid, "abort", {})

    def _emit_metrics(self) -> None:
        try:
            snapshot = dict(self._llm.metrics())
        except Exception:  # noqa: BLE001 (a worker thread must report, not die)
            if not self._metrics_failed:
                log.bridge.exception("llm.metrics() failed")
                self._metrics_failed = True
            return
        snapshot["time"] = time.time()
        self._signals.metrics_updated.emit(snapshot)

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
        self.signals = EngineSignals(self)
        self._api = api
        self._pool = QThreadPool(self)
        self._pool.setMaxThreadCount(MAX_THREADS)
        self._pool.setObjectName("engine-pool")
        self._commands: queue.Queue[_Submit | _Cancel] = queue.Queue()
        self._ids = itertools.count(1)
        self._shutdown = threading.Event()
        # Shared with pool threads, guarded by _lock.
        self._lock = threading.Lock()
        self._generation = 0
        self._llm: Any = None
        self._loop: _EngineLoop | None = None
        self._retired_loops: list[_EngineLoop] = []
        # Serializes loads and unloads so at most one model is in memory.
        self._load_lock = threading.Lock()
        self._jobs: list[_Job] = []
        self._sampler: Any = None  # engine.system.monitor.Sampler, started with the engine API
        # A remote server instead of the local engine (guarded by _lock), and the requests sent to it.
        self._remote: RemoteBackend | None = None
        self._retired_remotes: list[RemoteBackend] = []
        self._remote_conversations: dict[str, str] = {}
        self._server: Any = None  # engine.serving.openai_app.ServerThread while "Serve on localhost" runs
        # GUI-thread state, updated by our own slots.
        self._model_info: ModelInfo | None = None
        self._is_loading = False
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
        """The latest ``metrics_updated`` snapshot (empty before the first)."""
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
        self._model_info = None
        self._is_loading = False
        log.bridge.warning("model load failed: %s", message)

    @Slot(object)
    def _on_metrics_updated(self, snapshot: dict[str, Any]) -> None:
        self._last_metrics = snapshot

    # -- GUI -> engine ----------------------------------------------------------------------------

    def load_model(self, spec: str, device: str = "auto", dtype: str = "auto",
                   settings: LoadSettings | None = None) -> None:
        """Unload the current model (if any) and load ``spec`` in the background.

        Emits ``model_load_progress`` and then ``model_loaded`` or ``model_load_failed``. Requests
        submitted while loading wait for the new model.
        """
        if self._shutdown.is_set():
            return
        spec = spec.strip() or DEFAULT_MODEL_SPEC
        settings = settings or LoadSettings()
        generation = self._retire_current_model()
        self._model_info = None
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
            QTimer.singleShot(0, self, lambda: self.signals.request_failed.emit(
                request_id, "No model is loaded. Load a model first."))
            return request_id
        with self._lock:  # a remote that connects meanwhile takes over the queue under this lock
            remote = self._remote
            if remote is None:
                self._commands.put(_Submit(request_id, conversation_id, messages, params))
        if remote is not None:
            self._remote_conversations[request_id] = conversation_id
            remote.submit(request_id, messages, params)
        return request_id

    def cancel(self, request_id: str) -> None:
        """Ask the engine to stop a request; it finishes with finish_reason "abort"."""
        with self._lock:
            remote = self._remote
            if remote is None:
                self._commands.put(_Cancel(request_id))
        if remote is not None:
            remote.cancel(request_id)

    # -- remote server and "Serve on localhost" ------------------------------------------------------

    def connect_remote(self, base_url: str, api_key: str = "", model: str = "") -> None:
        """Use a remote OpenAI-compatible server instead of the local engine.

        Frees the local model, lists the server's models (``remote_models_listed``) and picks ``model``
        (or the first one); then emits ``model_loaded`` with ``device == REMOTE_DEVICE``, or
        ``model_load_failed`` with the reason in plain words. ``unload_model`` disconnects.
        """
        if self._shutdown.is_set():
            return
        generation = self._retire_current_model()
        self._model_info = None
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
            self._teardown()
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
                if isinstance(command, _Submit):
                    self._remote_conversations[command.request_id] = command.conversation_id
                    backend.submit(command.request_id, command.messages, command.params)
            host = url.split("://", 1)[-1].removesuffix("/v1")
            self.signals.model_load_progress.emit(1.0, "Connected")
            self.signals.model_loaded.emit(ModelInfo(
                spec=url, model_name=backend.model, device=REMOTE_DEVICE, dtype=host,
                device_reason=f"Replies come from {url}.", weights_bytes=0,
                load_s=time.monotonic() - started))

    def _take_queued(self) -> list[_Submit | _Cancel]:
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
        try:
            from engine.serving.openai_app import ServerThread

            server = ServerThread(llm.engine, str(getattr(llm, "model_name", "default")), host, port,
                                  api_key or None)
            server.start()
        except OSError as exc:
            message = f"Could not listen on {host}:{port}: {exc.strerror or exc}."
            self.signals.server_state_changed.emit(ServerState(False, message=message))
            return
        with self._lock:
            self._server = server
        log.bridge.info("serving on %s", server.url)
        self.signals.server_state_changed.emit(ServerState(True, url=server.url))

    def _stop_server_worker(self, message: str) -> None:
        with self._lock:
            server, self._server = self._server, None
        if server is None:
            return
        server.stop()
        log.bridge.info("stopped serving on %s", server.url)
        self.signals.server_state_changed.emit(ServerState(False, message=message))

    def recommend_quantization(self, spec: str, device: str = "auto") -> None:
        """Estimate, in the background, which quantization ``spec`` should load at on ``device`` and what each
        level needs; emits ``recommendation_ready`` with a :class:`QuantizationAdvice`."""
        if not self._shutdown.is_set():
            spec = spec.strip() or DEFAULT_MODEL_SPEC
            self._start_job("recommend", lambda: self._recommend_worker(spec, device))

    def detect_hardware(self) -> None:
        """Detect CPU/GPU/RAM in the background; emits ``hardware_detected``."""
        if not self._shutdown.is_set():
            self._start_job("detect-hardware", self._detect_hardware_worker)

    def shutdown(self) -> None:
        """Stop all work, wait for the pool and free the model. Blocks; call it once, on exit."""
        if self._shutdown.is_set():
            return
        log.bridge.info("shutting down")
        self._shutdown.set()
        with self._lock:
            sampler, self._sampler = self._sampler, None
        if sampler is not None:
            sampler.stop()
        self._retire_current_model()
        self._pool.waitForDone()
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
        job = _Job(name, fn)
        self._jobs.append(job)
        self._pool.start(job)

    def _retire_current_model(self) -> int:
        """Bump the generation and stop the running loop; returns the new generation."""
        with self._lock:
            self._generation += 1
            if self._loop is not None:
                self._loop.stop()
                self._retired_loops.append(self._loop)
                self._loop = None
            if self._remote is not None:
                self._retired_remotes.append(self._remote)
                self._remote = None
            return self._generation

    def _is_current(self, generation: int) -> bool:
        with self._lock:
            return generation == self._generation and not self._shutdown.is_set()

    def _engine_api(self) -> Any:
        if self._api is None:
            self._api = _import_engine()
        self._start_sampler()
        return self._api

    def _start_sampler(self) -> None:
        """Start the resource monitor once; its samples (memory, GPUs and the loaded model's
        metrics) go out as ``metrics_updated``, about once a second, model or not."""
        sampler_type = getattr(self._api, "Sampler", None)
        with self._lock:
            if sampler_type is None or self._sampler is not None or self._shutdown.is_set():
                return
            self._sampler = sampler_type(METRICS_INTERVAL_S, metrics_source=self._engine_metrics,
                                         on_sample=self.signals.metrics_updated.emit)
            self._sampler.start()

    def _engine_metrics(self) -> dict[str, Any] | None:
        """The loaded model's metrics (or the remote server's figures), or None; on the sampler's thread."""
        with self._lock:
            llm, remote = self._llm, self._remote
        if remote is not None:
            return remote.snapshot()
        return llm.metrics() if llm is not None else None

    def _teardown(self) -> None:
        """Stop serving, disconnect retired remotes, wait for stopped loops, then free the model they ran.
        Pool threads only."""
        self._stop_server_worker("The model was unloaded.")
        self._close_remotes()
        with self._lock:
            loops, self._retired_loops = self._retired_loops, []
        for loop in loops:
            if self._pool.tryTake(loop):  # queued but never started
                loop.done.set()
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
            if isinstance(command, _Submit):
                self.signals.request_failed.emit(command.request_id, message)

    def _load_worker(self, generation: int, spec: str, device: str, dtype: str,
                     settings: LoadSettings) -> None:
        with self._load_lock:
            if not self._is_current(generation):
                return
            self._teardown()

            def progress(fraction: float, stage: str) -> None:
                if not self._is_current(generation):
                    raise _Superseded
                self.signals.model_load_progress.emit(float(fraction), str(stage))

            started = time.monotonic()
            try:
                api = self._engine_api()
            except Exception as exc:  # noqa: BLE001 (a worker thread must report, not die)
                log.bridge.exception("importing the engine failed")
                self._load_failed(generation, f"The inference engine could not be started: {exc}")
                return
            self.signals.model_load_progress.emit(0.0, "Starting")
            try:
                llm = api.LLM(spec, device=device, dtype=dtype, quantization=settings.quantization,
                              max_batch_size=settings.max_batch_size,
                              max_wait_ms=settings.max_wait_ms, kv_cache_bytes=settings.kv_cache_bytes,
                              progress=progress, start_loop=False)
            except _Superseded:
                log.bridge.info("load of %s abandoned", spec)
                return
            except api.ModelLoadError as exc:
                self._load_failed(generation, str(exc) or f"Could not load {spec}.")
                return
            except Exception as exc:  # noqa: BLE001 (a worker thread must report, not die)
                if isinstance(exc.__cause__ or exc.__context__, _Superseded):
                    return
                log.bridge.exception("loading %s failed", spec)
                self._load_failed(generation, f"Could not load {spec}: {type(exc).__name__}: {exc}")
                return
            with self._lock:
                is_current = generation == self._generation and not self._shutdown.is_set()
                if is_current:
                    self._llm = llm
                    self._loop = _EngineLoop(llm, api, self._commands, self.signals)
                    loop = self._loop
            if not is_current:
                self._close(llm)
                return
            info = ModelInfo(spec=spec, model_name=str(getattr(llm, "model_name", spec)),
                             device=str(llm.device), dtype=str(llm.dtype),
                             device_reason=str(getattr(llm, "device_reason", "")),
                             weights_bytes=int(getattr(llm, "weights_bytes", 0) or 0),
                             load_s=time.monotonic() - started,
                             quantization=str(getattr(llm, "quantization", "") or ""))
            self.signals.model_load_progress.emit(1.0, "Ready")
            self._pool.start(loop)
            self.signals.model_loaded.emit(info)

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

    def _recommend_worker(self, spec: str, device: str) -> None:
        advice = QuantizationAdvice(spec, device)
        try:
            # hardware=None: each call measures free memory itself (and knows whether torch can use a GPU)
            api = self._engine_api()
            advice.recommendation = api.recommend(spec, device=device)
            advice.estimates = {level: api.estimate(spec, level, device=device)
                                for level in QUANTIZATION_LEVELS if level != "auto"}
        except Exception as exc:  # noqa: BLE001 (a worker thread must report, not die)
            log.bridge.info("no quantization recommendation for %s: %s", spec, exc)
            advice.recommendation, advice.estimates = None, {}
            advice.error = str(exc) or type(exc).__name__
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
