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

With "Models kept loaded" above 1 (:attr:`ModelLifecycle.keep`), a load parks the model in use instead of freeing
it, and :meth:`ModelLifecycle.activate` brings a parked one back at once (``app.bridge.kept_models``).

Long because the lock protocol of loading, parking, switching and unloading is one piece: each step changes the
same guarded state (the loop in use, the parked models, the generation), and split up it would be read in halves.
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
from app.bridge.kept_models import (
    Kept,
    Key,
    LoadedModelsSignals,
    memory_of_load,
    resident_bytes,
    rows,
    victims,
)
from app.bridge.loop import Cancel, Command, EngineLoop, Submit
from app.bridge.native_build import NativeBuildWatch
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
        #: "Models kept loaded" and "Unload idle models after" (None: never); set on the GUI thread.
        self.keep = 1
        self.idle_ttl_s: float | None = None
        #: Where the list of loaded models goes (the Models pane); no parent, like the bridge's signals.
        self.loaded_signals = LoadedModelsSignals()
        # Guarded by lock: the local model in use, the ones kept loaded beside it, and those being freed.
        self._active: Kept | None = None
        self._parked: list[Kept] = []
        self._evicting: list[BridgedLLM] = []
        #: Says when the native decode step a load started building is ready (the load does not wait for it).
        self._native_watch = NativeBuildWatch(signals.native_build_changed.emit, threads.shutdown)

    # -- any thread -------------------------------------------------------------------------------

    def next_generation(self) -> int:
        """A new generation for a load or connect that is about to start; older workers give up."""
        with self.lock:
            self._generation += 1
            return self._generation

    def retire_current_model(self) -> int:
        """Bump the generation and stop the running loop (once the bridge shuts down, the parked ones' too);
        returns the new generation."""
        with self.lock:
            self._generation += 1
            self._retire_locked()
            if self._shutdown.is_set():
                for kept in self._parked:
                    kept.loop.stop()
            return self._generation

    def activate(self, key: Key) -> ModelInfo | None:
        """Make the parked model ``key`` the one in use, at once, parking the one in use; its info, or None when
        ``key`` is not parked (then a load must run). GUI thread; :meth:`after_switch` then runs as a job."""
        with self.lock:
            kept = next((k for k in self._parked if k.key == key and not k.loop.error), None)
            if kept is None or self._shutdown.is_set():
                return None
            if (self.loop is not None or self._llm is not None) and not self._park_locked():
                return None  # the model in use cannot be kept (its loop died): a load frees it
            self._generation += 1  # a load under way gives up
            if self.remote is not None:
                self._retired_remotes.append(self.remote)
                self.remote = None
            self._parked.remove(kept)
            kept.loop.use_commands(self._commands)
            while not kept.commands.empty():  # its cancels, for the bridge's queue it now takes
                self._commands.put(kept.commands.get_nowait())
            kept.last_used = time.monotonic()
            self._active, self.loop, self._llm, self._llm_name = kept, kept.loop, kept.llm, kept.name
        log.bridge.info("switched to %s, kept loaded", kept.name)
        return kept.info

    def after_switch(self) -> None:
        """Disconnect a remote server left by :meth:`activate`, and list the loaded models."""
        self._close_remotes()
        self.emit_loaded()

    def route_cancel(self, request_id: str) -> bool:
        """Send a cancel to the parked model running ``request_id``; False when none is (the bridge's queue takes
        it)."""
        with self.lock:
            kept = next((k for k in self._parked if k.loop.has_request(request_id)), None)
            if kept is not None:
                kept.commands.put(Cancel(request_id))
                kept.loop.wake()
        return kept is not None

    def sweep(self) -> bool:
        """Unload the parked models past their idle time or over the count (as jobs: ``start_evict``), and list the
        loaded models; True when the model in use has been idle past its time (the bridge unloads it). GUI thread,
        about once a second."""
        now = time.monotonic()
        with self.lock:
            for kept in self._parked + ([self._active] if self._active is not None else []):
                if kept.is_busy():
                    kept.last_used = now
            chosen = victims(self._parked, self._active is not None, self.keep, self.idle_ttl_s, now)
            self._evict_locked(chosen)
            active = self._active
            expired = (active is not None and self.idle_ttl_s is not None and not active.is_busy()
                       and now - active.last_used >= self.idle_ttl_s)
        if chosen:
            threading.Thread(target=self._wait_evicted, args=(chosen,), name="hearth-evict", daemon=True).start()
        elif self._parked or self.idle_ttl_s is not None:
            self.emit_loaded()
        return expired

    def unload_parked(self, spec: str) -> bool:
        """Free the parked model ``spec`` now, replies and all; False when ``spec`` is not parked."""
        with self.lock:
            chosen = [k for k in self._parked if k.info.spec == spec]
            self._evict_locked(chosen)
        if chosen:
            threading.Thread(target=self._wait_evicted, args=(chosen,), name="hearth-evict", daemon=True).start()
        return bool(chosen)

    def has_parked(self) -> bool:
        with self.lock:
            return bool(self._parked)

    def emit_loaded(self) -> None:
        """Send the list of loaded models (``LoadedModelsSignals.changed``)."""
        with self.lock:
            models = rows(self._active, list(self._parked), self.idle_ttl_s, time.monotonic())
        if not self._shutdown.is_set():
            self.loaded_signals.changed.emit(models)

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
            others = [k.llm for k in self._parked] + self._evicting
            self._parked, self._evicting, self._active = [], [], None
        for model in ([llm] if llm is not None else []) + others:
            self._close(model)
        self._retired_loops.clear()

    # -- pool side --------------------------------------------------------------------------------

    def load_worker(self, generation: int, spec: str, device: str, dtype: str, settings: LoadSettings) -> None:
        """Load ``spec``, then run its engine loop on this same thread until the model is retired (one thread
        does all of a model's torch work)."""
        with self._load_lock:
            loop = self._load(generation, spec, device, dtype, settings)
        self.emit_loaded()
        if loop is not None:  # outside _load_lock: the next load or unload stops this loop and waits for it
            loop.run()

    def unload_worker(self, generation: int) -> None:
        with self._load_lock:
            self._teardown()
            if self._is_current(generation):
                self.fail_queued("The model was unloaded.")
                self._signals.model_unloaded.emit()
        self.emit_loaded()

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
        if not self._replace_current(generation, spec):
            return None

        def progress(fraction: float, stage: str) -> None:
            if not self._is_current(generation):
                raise Superseded
            self._signals.model_load_progress.emit(float(fraction), str(stage))

        started, rss_before = time.monotonic(), resident_bytes()
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
                         kv_cache_bytes=kv_cache_size(llm), context_length=settings.max_model_len,
                         settings=settings)
        with self.lock:  # from here on the caller runs the loop: a registered loop must run, or teardown waits
            is_current = generation == self._generation and not self._shutdown.is_set()
            if is_current:
                self._llm, self._llm_name = llm, name
                self.loop = loop = EngineLoop(llm, self._commands, self._signals, self._sentinel,
                                              self._threads.stop, release=lambda: self._release_model(llm))
                self._active = Kept((spec, device, dtype, repr(settings)), llm, loop, name, info,
                                    memory_of_load(rss_before, resident_bytes(), info))
        if not is_current:
            self._close(llm)
            return None
        self._signals.model_load_progress.emit(1.0, "Ready")
        self._signals.model_loaded.emit(info)
        self._native_watch.after_load(api.native_build)
        return loop

    def _load_failed(self, generation: int, message: str) -> None:
        if self._is_current(generation):
            self.fail_queued("The model failed to load.")
            self._signals.model_load_failed.emit(message)

    def _is_current(self, generation: int) -> bool:
        with self.lock:
            return generation == self._generation and not self._shutdown.is_set()

    def _replace_current(self, generation: int, spec: str = "") -> bool:
        """Retire the model in use for the load of ``generation`` and free it (with models kept loaded, park it
        unless it is ``spec`` itself, and free the idle ones over the count); False when that load is
        superseded."""
        with self.lock:
            if generation != self._generation or self._shutdown.is_set():
                return False
            if self._active is None or self._active.info.spec == spec or not self._park_locked():
                self._retire_locked()
            chosen = [k for k in self._parked if k.info.spec == spec and not k.is_busy()]
            others = [k for k in self._parked if k not in chosen]
            chosen += victims(others, bool(spec), self.keep, self.idle_ttl_s, time.monotonic())
            self._evict_locked(chosen)
        self._wait_evicted(chosen)
        self._teardown()
        return True

    def _park_locked(self) -> bool:
        """Keep the model in use loaded, on a queue of its own, when the setting keeps more than one (``lock``
        held); False when it cannot be kept."""
        kept = self._active
        if self.keep <= 1 or kept is None or self.loop is not kept.loop or kept.loop.error or self.remote:
            return False
        kept.loop.use_commands(kept.commands)
        kept.last_used = time.monotonic()
        self._parked.append(kept)
        self._active, self.loop, self._llm = None, None, None
        return True

    def _evict_locked(self, chosen: list[Kept]) -> None:
        """Stop the loops of the parked models ``chosen``; each frees its model on its own thread (``lock``
        held)."""
        for kept in chosen:
            self._parked.remove(kept)
            self._evicting.append(kept.llm)
            kept.loop.stop()
            log.bridge.info("unloading %s, kept loaded until now", kept.name)

    def _wait_evicted(self, chosen: list[Kept]) -> None:
        """Wait for the loops of evicted models, then free a model whose loop died of an error."""
        for kept in chosen:
            kept.loop.done.wait()
            with self.lock:
                still = kept.llm in self._evicting and not self._shutdown.is_set()
                if still:
                    self._evicting.remove(kept.llm)
            if still:
                self._close(kept.llm)
        if chosen:
            self.emit_loaded()

    def _retire_locked(self) -> None:
        """Stop the running loop and drop the remote (``lock`` held)."""
        if self.loop is not None:
            self.loop.stop()
            self._retired_loops.append(self.loop)
            self.loop = None
        self._active = None
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
            if self._shutdown.is_set():
                return
            if llm in self._evicting:  # a model kept loaded, unloaded
                self._evicting.remove(llm)
            elif self._llm is llm:
                self._llm = None
            else:
                return
        self._close(llm)

    @staticmethod
    def _close(llm: BridgedLLM) -> None:
        try:
            llm.close()
        except Exception:  # noqa: BLE001 (a worker thread must report, not die)
            log.bridge.exception("closing the model failed")
