"""``ModelLifecycle``: which model serves the chats, and switching it (load, connect, unload, serve, shut down).

The :class:`~app.bridge.engine_bridge.EngineBridge` owns one and runs its ``*_worker`` methods as jobs on its pool;
the bridge itself keeps the requests (submit, cancel, the replies' streams). Nothing here is a QObject: the workers
report through the bridge's :class:`~app.bridge.signals.EngineSignals`.

At most one model is alive. Each load, connect or unload takes a new *generation* (under ``lock``); a worker whose
generation is no longer current gives up, and a progress callback of a superseded load raises
:class:`~app.bridge.jobs.Superseded`. ``_load_lock`` serializes the workers that replace a model, so the old one is
freed (:meth:`_teardown`) before the next is read into memory. A loaded model's loop (:class:`EngineLoop`) runs on
its load job's thread, outside ``_load_lock``: a later load or unload stops it and waits for it, and the loop's
thread frees its own model (:meth:`_release_model`), since every torch op of a model runs on that one thread.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject

from app import log
from app.bridge.jobs import (
    Superseded,
    Threads,
    kv_cache_size,
    precheck_model,
    shown_model_name,
    start_local_server,
)
from app.bridge.loop import Command, EngineLoop, Submit
from app.bridge.protocols import BridgedLLM, EngineApi
from app.bridge.remote_backend import RemoteBackend, RemoteError, RemoteEvents, api_root, fetch_models
from app.bridge.signals import EngineSignals
from app.bridge.types import REMOTE_DEVICE, LoadSettings, ModelInfo, ServerState
from engine.api import ModelLoadError

if TYPE_CHECKING:
    from engine.serving.openai_app import ServerThread


class ModelLifecycle:
    """The model in use (a local one with its loop, or a remote server) and "Serve on localhost".

    The attributes :attr:`loop` and :attr:`remote` are guarded by :attr:`lock` (the bridge's ``Threads.lock``):
    the bridge reads them under it to route a request, so a model that arrives meanwhile takes over the command
    queue atomically.

    Args:
        signals: where the workers report.
        threads: the bridge's stop switch and lock.
        commands: the bridge's command queue; the loop of the model in use takes it.
        sentinel: a child of the bridge, handed to each loop (see :class:`EngineLoop`).
        engine_api: the engine's functions; imported on first call, on a pool thread.
        remote_events: where a remote server's replies go.
        send_remote: sends a request queued while connecting to the new remote server.
    """

    def __init__(self, signals: EngineSignals, threads: Threads, commands: queue.Queue[Command], sentinel: QObject,
                 engine_api: Callable[[], EngineApi], remote_events: RemoteEvents,
                 send_remote: Callable[[RemoteBackend, Submit], None]) -> None:
        self._signals = signals
        self._threads = threads
        self._shutdown = threads.shutdown
        self.lock = threads.lock
        self._commands = commands
        self._sentinel = sentinel
        self._engine_api = engine_api
        self._remote_events = remote_events
        self._send_remote = send_remote
        # Guarded by lock.
        self._generation = 0
        self._llm: BridgedLLM | None = None
        self._llm_name = ""  # what the running model is shown and served as (an Ollama blob: its tag's name)
        self.loop: EngineLoop | None = None
        self._retired_loops: list[EngineLoop] = []
        #: A remote server instead of the local engine.
        self.remote: RemoteBackend | None = None
        self._retired_remotes: list[RemoteBackend] = []
        self._server: ServerThread | None = None
        # Serializes loads and unloads so at most one model is in memory.
        self._load_lock = threading.Lock()

    # -- any thread -------------------------------------------------------------------------------

    def next_generation(self) -> int:
        """A new generation for a load or connect that is about to start; older workers give up."""
        with self.lock:
            self._generation += 1
            return self._generation

    def retire_current_model(self) -> int:
        """Bump the generation and stop the running loop; returns the new generation."""
        with self.lock:
            self._generation += 1
            self._retire_locked()
            return self._generation

    def local_llm(self) -> BridgedLLM | None:
        """The loaded local model (None while a remote server serves the chats, or none is loaded)."""
        with self.lock:
            return self._llm if self.remote is None else None

    def has_model(self) -> bool:
        """Whether a local model or a remote server is in use."""
        with self.lock:
            return self._llm is not None or self.remote is not None

    def close(self) -> None:
        """Stop serving, disconnect and free the model; once the pool is done (``EngineBridge.shutdown``)."""
        self.stop_server_worker("Hearth is closing.")
        self._close_remotes()
        with self.lock:
            llm, self._llm = self._llm, None
        if llm is not None:
            self._close(llm)
        self._retired_loops.clear()

    # -- pool side --------------------------------------------------------------------------------

    def load_worker(self, generation: int, spec: str, device: str, dtype: str, settings: LoadSettings) -> None:
        """Load ``spec``, then run its engine loop on this same thread until the model is retired (one thread
        does all of a model's torch work)."""
        with self._load_lock:
            loop = self._load(generation, spec, device, dtype, settings)
        if loop is not None:  # outside _load_lock: the next load or unload stops this loop and waits for it
            loop.run()

    def unload_worker(self, generation: int) -> None:
        with self._load_lock:
            self._teardown()
            if self._is_current(generation):
                self.fail_queued("The model was unloaded.")
                self._signals.model_unloaded.emit()

    def remote_worker(self, generation: int, base_url: str, api_key: str, model: str) -> None:
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
            self._signals.remote_models_listed.emit(models)
            backend = RemoteBackend(url, api_key, model or models[0], self._remote_events)
            with self.lock:
                is_current = generation == self._generation and not self._shutdown.is_set()
                if is_current:
                    self.remote = backend
                    queued = self._take_queued()
            if not is_current:
                backend.close()
                return
            for command in queued:  # requests sent while connecting
                if isinstance(command, Submit):
                    self._send_remote(backend, command)
            host = url.split("://", 1)[-1].removesuffix("/v1")
            self._signals.model_load_progress.emit(1.0, "Connected")
            self._signals.model_loaded.emit(ModelInfo(
                spec=url, model_name=backend.model, device=REMOTE_DEVICE, dtype=host,
                device_reason=f"Replies come from {url}.", weights_bytes=0,
                load_s=time.monotonic() - started))

    def start_server_worker(self, host: str, port: int, api_key: str) -> None:
        self.stop_server_worker("")
        with self.lock:
            llm, name = self._llm, self._llm_name
        if llm is None:
            self._signals.server_state_changed.emit(ServerState(False, message="Load a local model first."))
            return
        server, state = start_local_server(llm, name or llm.model_name, host, port, api_key)
        if server is not None:
            with self.lock:
                self._server = server
        self._signals.server_state_changed.emit(state)

    def stop_server_worker(self, message: str) -> None:
        with self.lock:
            server, self._server = self._server, None
        if server is None:
            return
        server.stop()
        log.bridge.info("stopped serving on %s", server.url)
        self._signals.server_state_changed.emit(ServerState(False, message=message))

    def fail_queued(self, message: str) -> None:
        """Fail every request waiting on the command queue."""
        for command in self._take_queued():
            if isinstance(command, Submit):
                self._signals.request_failed.emit(command.request_id, message)

    def _take_queued(self) -> list[Command]:
        commands = []
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands

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
            self._signals.model_load_progress.emit(float(fraction), str(stage))

        started = time.monotonic()
        try:
            api = self._engine_api()
        except Exception as exc:  # noqa: BLE001 (a worker thread must report, not die)
            log.bridge.exception("importing the engine failed")
            self._load_failed(generation, f"The inference engine could not be started: {exc}")
            return None
        self._signals.model_load_progress.emit(0.0, "Starting")
        try:
            llm = api.LLM(spec, device=device, dtype=dtype, quantization=settings.quantization,
                          max_batch_size=settings.max_batch_size, max_model_len=settings.max_model_len,
                          max_wait_ms=settings.max_wait_ms, kv_cache_bytes=settings.kv_cache_bytes,
                          deterministic=settings.deterministic, speculative=settings.speculative,
                          progress=progress, start_loop=False)
        except Superseded:
            log.bridge.info("load of %s abandoned", spec)
            return None
        except ModelLoadError as exc:
            self._load_failed(generation, str(exc) or f"Could not load {spec}.")
            return None
        except Exception as exc:  # noqa: BLE001 (a worker thread must report, not die)
            if isinstance(exc.__cause__ or exc.__context__, Superseded):
                return None
            log.bridge.exception("loading %s failed", spec)
            self._load_failed(generation, f"Could not load {spec}: {type(exc).__name__}: {exc}")
            return None
        name = shown_model_name(spec, llm.model_name)
        info = ModelInfo(spec=spec, model_name=name, device=llm.device, dtype=llm.dtype,
                         device_reason=llm.device_reason, weights_bytes=llm.weights_bytes,
                         load_s=time.monotonic() - started, quantization=llm.quantization,
                         sampling_defaults=dict(llm.sampling_defaults),
                         kv_cache_bytes=kv_cache_size(llm), context_length=settings.max_model_len)
        with self.lock:  # from here on the caller runs the loop: a registered loop must run, or teardown waits
            is_current = generation == self._generation and not self._shutdown.is_set()
            if is_current:
                self._llm, self._llm_name = llm, name
                self.loop = loop = EngineLoop(llm, self._commands, self._signals, self._sentinel,
                                              self._threads.stop, release=lambda: self._release_model(llm))
        if not is_current:
            self._close(llm)
            return None
        self._signals.model_load_progress.emit(1.0, "Ready")
        self._signals.model_loaded.emit(info)
        return loop

    def _load_failed(self, generation: int, message: str) -> None:
        if self._is_current(generation):
            self.fail_queued("The model failed to load.")
            self._signals.model_load_failed.emit(message)

    def _is_current(self, generation: int) -> bool:
        with self.lock:
            return generation == self._generation and not self._shutdown.is_set()

    def _replace_current(self, generation: int) -> bool:
        """Retire the model in use for the load of ``generation`` and free it; False when that load is
        superseded."""
        with self.lock:
            if generation != self._generation or self._shutdown.is_set():
                return False
            self._retire_locked()
        self._teardown()
        return True

    def _retire_locked(self) -> None:
        """Stop the running loop and drop the remote (``lock`` held)."""
        if self.loop is not None:
            self.loop.stop()
            self._retired_loops.append(self.loop)
            self.loop = None
        if self.remote is not None:
            self._retired_remotes.append(self.remote)
            self.remote = None

    def _teardown(self) -> None:
        """Stop serving, disconnect retired remotes, wait for stopped loops (each frees its model on its own
        thread, :meth:`_release_model`), then free a model still held (one whose loop died of an error)."""
        self.stop_server_worker("The model was unloaded.")
        self._close_remotes()
        with self.lock:
            loops, self._retired_loops = self._retired_loops, []
        for loop in loops:
            loop.done.wait()
        with self.lock:
            llm, self._llm = self._llm, None
        if llm is not None:
            self._close(llm)

    def _close_remotes(self) -> None:
        with self.lock:
            remotes, self._retired_remotes = self._retired_remotes, []
        for remote in remotes:
            remote.close()

    def _release_model(self, llm: BridgedLLM) -> None:
        """Free ``llm`` unless it has been taken already: its stopped loop's thread, the one that loaded it.

        Not once the bridge shuts down: :meth:`close` frees the model on the GUI thread, as closing collects
        garbage (``gc.collect``), which off the GUI thread could destroy a closing window's Qt objects; a bridge
        deleted without ``shutdown()`` leaves it to the process's end."""
        with self.lock:
            if self._llm is not llm or self._shutdown.is_set():
                return
            self._llm = None
        self._close(llm)

    @staticmethod
    def _close(llm: BridgedLLM) -> None:
        try:
            llm.close()
        except Exception:  # noqa: BLE001 (a worker thread must report, not die)
            log.bridge.exception("closing the model failed")
