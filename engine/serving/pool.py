"""Several models behind one server: loaded by name on first use, kept within a memory budget, unloaded when idle.

A request naming a model that is not loaded loads it (just in time) and waits for the load; requests naming a
loaded model go straight to its engine. Loads run one at a time on a worker thread, so the event loop keeps
serving the models already loaded, and each load's memory is measured (the process's resident size before and
after) rather than guessed. Before a load, idle models are unloaded least recently used first until the new one
fits the budget and the count limit; a model with requests running is never unloaded, and when the new one cannot
fit beside those, the request gets a 503 that says what is loaded and why.

Embedding models are entries too (``kind`` "embedding"): the load function returns their embedder, loaded, kept
and unloaded like the chat models and counted in the same budget; the embeddings routes take them with
``acquire(name, kind="embedding")``, and a chat request naming one gets a 400 that says where to send it.

Each loaded model stays for its keep-alive after its last request ends (the server's ``--keep-alive``, or Ollama's
``keep_alive`` of the request): a negative one keeps it loaded, 0 unloads it as soon as it is idle.

Everything here runs on the server's event loop except the loads and unloads themselves (worker threads), so the
pool's state needs no lock beyond the one that keeps loads one at a time.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.serving.async_engine import AsyncLLMEngine
from engine.serving.ollama_api import OllamaAPI
from engine.serving.openai_app import DEFAULT_REQUEST_TIMEOUT_S, OpenAIServer
from engine.serving.protocol import APIError

logger = logging.getLogger(__name__)

#: Ollama's default keep-alive: five minutes.
DEFAULT_KEEP_ALIVE_S = 300.0
#: How often the pool looks for models whose keep-alive has run out, at most.
REAP_INTERVAL_S = 0.5
#: The memory a model not yet loaded is expected to take, over its files' size (weights, KV cache, buffers).
LOAD_ESTIMATE_FACTOR = 1.3
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_keep_alive(value: object) -> float | None:
    """Seconds a model stays loaded after its last request; None for ever.

    Takes what Ollama takes: a number of seconds, or a Go duration such as ``"5m"``, ``"1h30m"`` or ``"-1"``. A
    negative value means for ever.

    Raises:
        ValueError: anything else, in words.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):  # one error type: the route's 400
        raise ValueError(  # noqa: TRY004
            f"keep_alive must be a number of seconds or a duration such as '5m', not {value!r:.40}")
    if isinstance(value, str):
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        body = text.lstrip("+-")
        try:
            seconds = float(body)
        except ValueError:
            parts = _DURATION.findall(body)
            if not body or "".join(n + u for n, u in parts) != body:
                raise ValueError(f"keep_alive must be a number of seconds or a duration such as '5m', "
                                 f"not {value!r:.40}") from None
            seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
        seconds *= sign
    else:
        seconds = float(value)
    if not math.isfinite(seconds):
        raise ValueError(f"keep_alive must be finite, not {value!r:.40}")
    return None if seconds < 0 else seconds


@dataclass(frozen=True)
class Entry:
    """A model the server can load: its name, where it is (``"default"`` for the default model), its files' size,
    the other names a request may use for it, whether it is a chat or an embedding model, and its type."""

    name: str
    path: str
    size_bytes: int = 0
    aliases: tuple[str, ...] = ()
    kind: str = "chat"  # or "embedding"
    family: str = ""  # the model type ("llama", "bert", "qwen3"...), for Ollama's details

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


def entry_aliases(name: str, path: Path) -> tuple[str, ...]:
    """The other names a request may use: the name without ``:latest``, the file or folder name, and the file's
    name without ``.gguf``."""
    out = [name.removesuffix(":latest"), path.name]
    if path.suffix.lower() == ".gguf":
        out.append(path.stem)
    return tuple(dict.fromkeys(a for a in out if a and a != name))


@dataclass(eq=False)
class LoadedModel:
    """One model in memory, with its servers (none for an embedding model) and what keeps it there."""

    entry: Entry
    llm: Any  # an LLM, or an embedding model's embedder
    server: OpenAIServer | None
    ollama: OllamaAPI | None
    memory_bytes: int
    keep_alive_s: float | None
    loaded_at: float
    last_used: float
    active: int = 0
    expires_at: float | None = field(default=None)

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def chat(self) -> tuple[OpenAIServer, OllamaAPI]:
        """The model's OpenAI and Ollama servers (a chat model's; ``acquire`` gives no other to chat routes)."""
        if self.server is None or self.ollama is None:
            raise APIError(400, f"'{self.name}' is an embedding model; use /v1/embeddings (or /api/embed) for it.",
                           param="model", code="embedding_model")
        return self.server, self.ollama


class ModelPool:
    """The models a server may serve, and the ones loaded now.

    Args:
        catalog: returns the models on disk (called again when a request names one it does not know, at most
            every ``rescan_s``).
        load: loads an entry and returns an ``LLM`` whose loop is running; it runs on a worker thread.
        budget_bytes: the memory the loaded models may take together (0: no limit).
        max_loaded: the most models loaded at once (0: no limit).
        keep_alive_s: how long a model stays after its last request (None: for ever).
        default_name: the model a request that names none gets.
        measure: the process's resident bytes now (the load's memory is the difference across it).
    """

    def __init__(self, catalog: Callable[[], Sequence[Entry]], load: Callable[[Entry], Any], *,
                 budget_bytes: int = 0, max_loaded: int = 0, keep_alive_s: float | None = DEFAULT_KEEP_ALIVE_S,
                 default_name: str | None = None, measure: Callable[[], int] | None = None,
                 clock: Callable[[], float] = time.monotonic, rescan_s: float = 2.0,
                 request_timeout_s: float | None = DEFAULT_REQUEST_TIMEOUT_S) -> None:
        self._catalog_fn, self._load_fn = catalog, load
        self.budget_bytes, self.max_loaded, self.keep_alive_s = budget_bytes, max_loaded, keep_alive_s
        self.default_name, self._clock, self._rescan_s = default_name, clock, rescan_s
        self.request_timeout_s = request_timeout_s
        self._measure = measure or _resident_bytes
        self._entries: list[Entry] = []
        self._scanned_at = -math.inf
        self._loaded: dict[str, LoadedModel] = {}
        self._load_lock = asyncio.Lock()
        self._reaper: asyncio.Task[None] | None = None
        self.loads = self.unloads = 0

    # -- the catalog -----------------------------------------------------------------------------------------------
    def entries(self, rescan: bool = False) -> list[Entry]:
        """The models on disk (rescanned when asked and the last scan is older than ``rescan_s``)."""
        if (rescan and self._clock() - self._scanned_at >= self._rescan_s) or self._scanned_at == -math.inf:
            self._entries = list(self._catalog_fn())
            self._scanned_at = self._clock()
        return self._entries

    def _find(self, name: str) -> Entry | None:
        for entry in self.entries():
            if name in entry.names:
                return entry
        return None

    def resolve(self, name: str | None) -> Entry:
        """The entry a request's model name means: an exact name or alias, else None's default.

        Raises:
            APIError: 404 naming the models there are.
        """
        if name is None or name == "":
            if self.default_name is None:
                raise APIError(400, "Name a model: this server serves several.", param="model")
            name = self.default_name
        entry = self._find(name)
        if entry is None:
            self.entries(rescan=True)
            entry = self._find(name)
        if entry is None:
            known = ", ".join(e.name for e in self.entries()[:20]) or "none"
            raise APIError(404, f"The model '{name:.200}' is not on this machine; models here: {known}.",
                           param="model", code="model_not_found")
        return entry

    def _wrong_kind(self, entry: Entry) -> APIError:
        if entry.kind == "embedding":
            return APIError(400, f"'{entry.name}' is an embedding model; use /v1/embeddings (or Ollama's /api/embed) "
                            "for it.", param="model", code="embedding_model")
        embedders = ", ".join(e.name for e in self.entries() if e.kind == "embedding") or "none"
        return APIError(400, f"'{entry.name}' is a chat model, not an embedding model; embedding models here: "
                        f"{embedders}.", param="model", code="not_an_embedding_model")

    # -- loaded models ---------------------------------------------------------------------------------------------
    def loaded(self) -> list[LoadedModel]:
        """The loaded models, most recently used first."""
        return sorted(self._loaded.values(), key=lambda m: m.last_used, reverse=True)

    @asynccontextmanager
    async def lease(self, name: str | None, keep_alive_s: object = ..., kind: str = "chat"
                    ) -> AsyncIterator[LoadedModel]:
        """The model ``name`` means, loaded, held for the ``async with`` body; ``keep_alive_s`` (seconds or None)
        replaces the server's for the time after this request."""
        model = await self.acquire(name, kind)
        try:
            yield model
        finally:
            self.release(model, keep_alive_s)

    async def acquire(self, name: str | None, kind: str = "chat") -> LoadedModel:
        """Load ``name``'s model if it is not loaded, count one more request on it and return it; pair with
        :meth:`release`.

        Raises:
            APIError: 404 for a name no model has; 400 when the model is not of ``kind`` ("chat" or "embedding"),
                saying which route takes it; 503 when it cannot fit now.
        """
        self._start_reaper()
        entry = self.resolve(name)
        if entry.kind != kind:
            raise self._wrong_kind(entry)
        while True:
            model = self._loaded.get(entry.name)
            if model is not None:
                model.active += 1
                model.last_used, model.expires_at = self._clock(), None
                return model
            async with self._load_lock:
                if entry.name not in self._loaded:
                    await self._make_room(entry)
                    self._loaded[entry.name] = await self._load(entry)

    def release(self, model: LoadedModel, keep_alive_s: object = ...) -> None:
        """One request on ``model`` ended; ``keep_alive_s`` (seconds or None, ``...``: the server's) sets how
        long it stays once idle."""
        model.active -= 1
        model.last_used = self._clock()
        if keep_alive_s is not ...:
            model.keep_alive_s = keep_alive_s  # type: ignore[assignment]
        if model.active == 0:
            ttl = model.keep_alive_s
            model.expires_at = None if ttl is None else model.last_used + ttl
            if ttl == 0:
                asyncio.get_running_loop().create_task(self._unload_if_idle(model))

    async def unload(self, name: str | None) -> bool:
        """Unload ``name``'s model once its running requests end; False when it was not loaded."""
        model = self._loaded.get(self.resolve(name).name)
        if model is None:
            return False
        model.keep_alive_s, model.expires_at = 0.0, self._clock()
        if model.active == 0:
            await self._unload_if_idle(model)
        return True

    async def close(self) -> None:
        """Unload every model (the server is stopping)."""
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        for model in list(self._loaded.values()):
            await self._drop(model)

    def close_now(self) -> None:
        """Unload every model from outside the event loop (after the server stopped)."""
        for model in list(self._loaded.values()):
            self._loaded.pop(model.name, None)
            _close(model.llm)

    # -- inside ----------------------------------------------------------------------------------------------------
    def _estimate(self, entry: Entry) -> int:
        return int(entry.size_bytes * LOAD_ESTIMATE_FACTOR)

    def _used(self) -> int:
        return sum(m.memory_bytes for m in self._loaded.values())

    def _fits(self, need: int) -> bool:
        count_ok = not self.max_loaded or len(self._loaded) < self.max_loaded
        memory_ok = not self.budget_bytes or self._used() + need <= self.budget_bytes
        return count_ok and memory_ok

    async def _make_room(self, entry: Entry) -> None:
        """Unload idle models, least recently used first, until ``entry`` fits; 503 when it cannot."""
        need = self._estimate(entry)
        if self.budget_bytes and need > self.budget_bytes:
            raise APIError(503, f"The model '{entry.name}' needs about {_gib(need)} and the server's memory budget "
                           f"is {_gib(self.budget_bytes)}; raise --memory-budget-mb or use a smaller file.",
                           "server_error", code="model_too_large")
        for model in sorted(self._loaded.values(), key=lambda m: m.last_used):
            if self._fits(need):
                return
            if model.active == 0:
                logger.info("unloading %s to make room for %s", model.name, entry.name)
                await self._drop(model)
        if not self._fits(need):
            busy = "; ".join(f"{m.name} ({_gib(m.memory_bytes)}, {m.active} request(s) running)"
                             for m in self.loaded())
            limit = (f"at most {self.max_loaded} model(s) at once" if self.max_loaded and
                     len(self._loaded) >= self.max_loaded else f"a memory budget of {_gib(self.budget_bytes)}")
            raise APIError(503, f"Cannot load '{entry.name}' (about {_gib(need)}) now: the server keeps {limit}, "
                           f"and the loaded models are all in use: {busy}. Try again when their requests end.",
                           "server_error", code="model_busy", headers={"Retry-After": "5"})

    async def _load(self, entry: Entry) -> LoadedModel:
        logger.info("loading %s from %s", entry.name, entry.path)
        before = self._measure()
        start = self._clock()
        try:
            llm = await asyncio.to_thread(self._load_fn, entry)
        except (OSError, ValueError, TypeError, RuntimeError, MemoryError) as exc:
            raise APIError(500 if not isinstance(exc, MemoryError) else 503,
                           f"The model '{entry.name}' could not be loaded: {exc}", "server_error",
                           code="model_load_failed") from exc
        memory = max(self._measure() - before, 0) or self._estimate(entry)
        server: OpenAIServer | None = None
        if entry.kind == "chat":
            server = OpenAIServer(AsyncLLMEngine(llm), entry.name, entry.aliases,
                                  request_timeout_s=self.request_timeout_s,
                                  sampling_defaults=getattr(llm, "sampling_defaults", None))
        now = self._clock()
        self.loads += 1
        logger.info("loaded %s in %.2f s (%s)", entry.name, now - start, _gib(memory))
        return LoadedModel(entry, llm, server, OllamaAPI(server) if server is not None else None, memory,
                           self.keep_alive_s, now, now)

    async def _unload_if_idle(self, model: LoadedModel) -> None:
        if model.active == 0 and self._loaded.get(model.name) is model:
            await self._drop(model)

    async def _drop(self, model: LoadedModel) -> None:
        if self._loaded.get(model.name) is model:
            del self._loaded[model.name]
            self.unloads += 1
            start = self._clock()
            await asyncio.to_thread(_close, model.llm)
            logger.info("unloaded %s in %.2f s", model.name, self._clock() - start)

    def _start_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(self._reap())

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(REAP_INTERVAL_S)
            now = self._clock()
            for model in list(self._loaded.values()):
                if model.active == 0 and model.expires_at is not None and model.expires_at <= now:
                    await self._unload_if_idle(model)


def _close(llm: Any) -> None:
    """Close an engine; an embedder has nothing to close (its memory goes with the last reference)."""
    close = getattr(llm, "close", None)
    if close is not None:
        close()


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB" if size >= 2**28 else f"{size / 2**20:.0f} MiB"


def _resident_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)
