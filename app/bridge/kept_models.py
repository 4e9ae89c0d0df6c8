"""Models kept loaded beside the one in use ("Models kept loaded", "Unload idle models after").

With the setting at 1 (the default) the app keeps one model, as it always has: loading another frees it first. At
2 or more, loading another *parks* the model in use: its :class:`~app.bridge.loop.EngineLoop` goes on running on
its own thread with a command queue of its own, finishing the replies it has and taking cancels, and loading it
again makes it the one in use at once, with no load job (``ModelLifecycle.activate``). The policy is the headless
server's (``engine.serving.pool.ModelPool``): least recently used first, an idle time-to-live, and never a model
with requests running.

Plain data and pure functions, except :class:`LoadedModelsSignals` (what the Models pane listens to).
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.bridge.loop import Command, EngineLoop
from app.bridge.protocols import BridgedLLM
from app.bridge.types import LoadSettings, ModelInfo

#: The most models the setting allows to keep loaded.
MAX_KEPT = 4

#: What identifies a loaded model: loading the same spec with other choices loads it afresh.
Key = tuple[str, str, str, str]


def model_key(spec: str, device: str, dtype: str, settings: LoadSettings) -> Key:
    return (spec, device, dtype, repr(settings))  # LoadSettings is not hashable; its repr names every field


@dataclass(eq=False)
class Kept:
    """A loaded local model and its running loop."""

    key: Key
    llm: BridgedLLM
    loop: EngineLoop
    name: str
    info: ModelInfo
    #: What the load took: the process's resident size after it less before it (on a GPU, or when other work
    #: made that unclear, the weights and KV cache the engine reports).
    memory_bytes: int
    last_used: float = field(default_factory=time.monotonic)
    #: The loop's queue while parked (the bridge's queue while in use).
    commands: queue.Queue[Command] = field(default_factory=queue.Queue)

    def is_busy(self) -> bool:
        """Requests running or waiting: a reply, a tools reply, a cancel."""
        return self.loop.is_busy() or not self.commands.empty()


@dataclass(frozen=True)
class LoadedModel:
    """One row of the Models pane's "Loaded models" list."""

    spec: str
    name: str
    memory_bytes: int
    is_active: bool
    is_busy: bool
    #: Seconds until it is unloaded for being idle; None: it stays (no time-to-live, or busy).
    unloads_in_s: float | None


class LoadedModelsSignals(QObject):
    """``changed(list[LoadedModel])``: the loaded local models, the one in use first; sent after each load,
    switch and unload, and once a second while a time-to-live counts down."""

    changed = Signal(list)


def memory_of_load(rss_before: int, rss_after: int, info: ModelInfo) -> int:
    """The memory a load took: the resident-size difference on the CPU, else the engine's own figures."""
    reported = info.weights_bytes + info.kv_cache_bytes
    if info.device == "cpu" and rss_after > rss_before:
        return rss_after - rss_before
    return reported


def resident_bytes() -> int:
    """The process's resident size (0 where it cannot be read)."""
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:  # noqa: BLE001 (memory shown as unknown rather than failing a load)
        return 0


def victims(parked: list[Kept], has_active: bool, keep: int, ttl_s: float | None, now: float) -> list[Kept]:
    """The parked models to unload now: idle ones past their time-to-live, then the least recently used idle ones
    while more than ``keep`` models are loaded (counting the one in use). Busy ones never."""
    chosen = [k for k in parked if ttl_s is not None and not k.is_busy() and now - k.last_used >= ttl_s]
    rest = sorted((k for k in parked if k not in chosen), key=lambda k: k.last_used)
    over = len(rest) + int(has_active) - keep
    for kept in rest:
        if over <= 0:
            break
        if not kept.is_busy():
            chosen.append(kept)
            over -= 1
    return chosen


def rows(active: Kept | None, parked: list[Kept], ttl_s: float | None, now: float) -> list[LoadedModel]:
    """The list the Models pane shows."""
    out = []
    for kept in ([active] if active is not None else []) + sorted(parked, key=lambda k: -k.last_used):
        busy = kept.is_busy()
        left: float | None = None
        if ttl_s is not None and not busy:
            left = max(0.0, kept.last_used + ttl_s - now)
        out.append(LoadedModel(kept.info.spec, kept.name, kept.memory_bytes, kept is active, busy, left))
    return out


def describe(models: list[LoadedModel]) -> list[dict[str, Any]]:
    """For the log."""
    return [{"name": m.name, "memory": m.memory_bytes, "active": m.is_active} for m in models]
