"""What runs on the bridge's pool besides the engine loop: the job runnable and the workers' helpers.

Nothing here holds bridge state: :class:`Job` runs one bridge method, :class:`Threads` holds the stop switch of
the bridge's threads, and the functions import the engine, advise on quantization and start "Serve on localhost".
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QRunnable

from app import log
from app.bridge.protocols import BridgedLLM, EngineApi, ResourceSampler
from app.bridge.types import NativeBuild, QuantizationAdvice, ServerState
from engine.api import QUANTIZATION_LEVELS, ModelLoadError

if TYPE_CHECKING:
    from engine.serving.openai_app import ServerThread

#: Physical cores left to the GUI thread when the engine runs inside the app.
UI_RESERVED_CORES = 1


class Superseded(Exception):
    """Raised from the progress callback to abandon a load nobody waits for any more."""


def import_engine() -> EngineApi:
    """Import the engine (slow: torch). Called from pool threads only.

    The engine gets every physical core but one: the GUI thread must not compete with busy torch threads for
    a core, or painting stalls while a reply streams.
    """
    import engine
    from engine.loading import discovery, recommend, validate
    from engine.model.kernel_plans import cached_plans
    from engine.model.native import EXTENSION
    from engine.system import hardware, monitor

    hardware.configure_threads(reserve=UI_RESERVED_CORES)

    def native_build() -> NativeBuild:
        return NativeBuild(EXTENSION.state, EXTENSION.problem or "")

    return EngineApi(
        LLM=engine.LLM,  # mypy checks here that the real LLM is what the bridge takes it for
        detect_hardware=hardware.detect,
        recommend=recommend.recommend,
        estimate=recommend.estimate,
        Sampler=monitor.Sampler,
        inspect_model=validate.inspect_model,
        discover_models=discovery.discover_models,
        native_build=native_build,
        kernel_plans=lambda deterministic: cached_plans(deterministic=deterministic),
    )


class Job(QRunnable):
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


class Threads:
    """The stop switch of the bridge's work and its resource monitor thread, as plain Python objects.

    ``EngineBridge.shutdown`` calls :meth:`stop`; so does an engine loop that finds the bridge destroyed without
    ``shutdown()`` (a window deleted without being closed), from its own thread: no Qt object is needed for it.
    """

    def __init__(self) -> None:
        self.shutdown = threading.Event()
        self.lock = threading.Lock()
        self.sampler: ResourceSampler | None = None  # started with the engine API

    def stop(self) -> None:
        self.shutdown.set()
        with self.lock:
            sampler, self.sampler = self.sampler, None
        if sampler is not None:
            sampler.stop()


def quantization_advice(engine_api: Callable[[], EngineApi], spec: str, device: str, context_length: int | None = None,
                        num_chats: int = 1, deterministic: bool = True) -> QuantizationAdvice:
    """The recommended level for ``spec`` on ``device`` and the numbers for every level, with a KV cache of
    ``context_length`` tokens for each of ``num_chats`` chats (as the engine will size it) and the weights as the
    kernels this CPU's plan cache picks (``deterministic``: those of repeatable replies) hold them; an error in words.

    While the native extension is being built, or where it failed, the recommendation leaves out the "file" level
    (its block kernels are the extension's): a load never waits for the compiler."""
    advice = QuantizationAdvice(spec, device)
    try:
        # hardware=None: each call measures free memory itself (and knows whether torch can use a GPU)
        api = engine_api()
        block_kernels = api.native_build().state not in ("building", "failed")
        plans = api.kernel_plans(deterministic)
        advice.recommendation = api.recommend(spec, device=device, context_length=context_length,
                                              num_chats=num_chats, block_kernels=block_kernels, plans=plans)
        advice.estimates = {level: api.estimate(spec, level, device=device, context_length=context_length,
                                                num_chats=num_chats, plans=plans)
                            for level in QUANTIZATION_LEVELS if level != "auto"}
    except Exception as exc:  # noqa: BLE001 (a worker thread must report, not die)
        log.bridge.info("no quantization recommendation for %s: %s", spec, exc)
        advice.recommendation, advice.estimates = None, {}
        advice.error = str(exc) or type(exc).__name__
    return advice


#: Scheduling priority of "Serve on localhost" requests: API clients queue behind the user's own chats (0).
SERVER_PRIORITY = 5


def shown_model_name(spec: str, loaded_name: str) -> str:
    """The name a model loaded from ``spec`` is shown and served as: for an Ollama blob (``sha256-…``) the name of
    its tag (``llama3.2:1b``), as Ollama itself calls it; else the engine's name for it."""
    from pathlib import Path

    from engine.loading.ollama import manifest_name

    try:
        return manifest_name(Path(spec)) or loaded_name
    except (OSError, ValueError):
        return loaded_name


def start_local_server(llm: BridgedLLM, name: str, host: str, port: int,
                       api_key: str) -> tuple[ServerThread | None, ServerState]:
    """Serve ``llm``'s engine over the OpenAI API as model ``name``: the running ``ServerThread`` (or None) and its
    state."""
    from engine.serving.openai_app import ServerThread

    try:
        server = ServerThread(llm.engine, name, host, port, api_key or None, priority=SERVER_PRIORITY,
                              sampling_defaults=dict(llm.sampling_defaults))
        server.start()
    except OSError as exc:
        return None, ServerState(False, message=f"Could not listen on {host}:{port}: {exc.strerror or exc}.")
    log.bridge.info("serving on %s", server.url)
    return server, ServerState(True, url=server.url)


def unreadable_folder(folder: str) -> str:
    """Why an added folder cannot be scanned, in words ("" when it can be listed, or is a file)."""
    import os

    try:
        if not os.path.isdir(folder):
            os.stat(folder)  # a missing or unreachable path raises; a file is looked at by discovery itself
            return ""
        with os.scandir(folder) as entries:
            next(entries, None)
    except OSError as exc:
        return f"{folder}: {(exc.strerror or str(exc)).lower()}"
    return ""


def find_models(engine_api: Callable[[], EngineApi], extra_dirs: list[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """Every model on disk (``engine.loading.discovery.discover_models``) as JSON-ready dicts, and the added
    folders that could not be read (each "folder: why").

    A folder that cannot be read costs only its own models: it is left out of the scan, and if the scan still
    fails, each place is scanned on its own so that the others' models are listed.
    """
    from pathlib import Path

    problems = [why for why in map(unreadable_folder, extra_dirs) if why]
    readable = [d for d in extra_dirs if not unreadable_folder(d)]
    try:
        found = engine_api().discover_models(extra_dirs=[Path(d) for d in readable])
        return [model.to_json() for model in found], problems
    except Exception as exc:  # noqa: BLE001 (a worker thread must report, not die)
        log.bridge.warning("looking for models failed (%s); scanning each place on its own", exc)
    models: dict[tuple[str, str], dict[str, Any]] = {}
    for dirs in ([], *([d] for d in readable)):
        try:
            found = engine_api().discover_models(extra_dirs=[Path(d) for d in dirs])
        except Exception as exc:  # noqa: BLE001
            where = dirs[0] if dirs else "the usual model folders (Hugging Face, LM Studio, Ollama, GPT4All, Jan)"
            problems.append(f"{where}: {str(exc) or type(exc).__name__}")
            continue
        for model in found:
            data = model.to_json()
            models.setdefault((str(data.get("path")), str(data.get("name"))), data)
    return list(models.values()), problems


def precheck_model(engine_api: Callable[[], EngineApi], spec: str) -> str:
    """Why ``spec`` cannot be loaded, from its files alone ("" when it looks loadable): checked before the
    model in use is freed, so a mistyped path costs nothing."""
    if spec == "default":
        return ""
    try:
        engine_api().inspect_model(spec)
    except ModelLoadError as exc:
        return str(exc) or f"Could not load {spec}."
    return ""


def kv_cache_size(llm: BridgedLLM) -> int:
    """The bytes ``llm``'s engine set aside for its KV cache."""
    return llm.engine.runner.kv.nbytes
