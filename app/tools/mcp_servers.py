"""The MCP servers of the data folder's ``mcp.json`` as the app shows them: the entries, each one's state in
words, and changes saved through :mod:`engine.mcp.config` (the file stays 0600: ``env`` may hold secrets).

No widgets. Each server that is started gets an :class:`~engine.mcp.host.McpHost` of its own, so that editing
or removing one never restarts the others. Starting and stopping run on Python threads (a Python callable handed
to ``QThreadPool.start`` once crashed this app); states come back through :attr:`McpServers.state_changed`, on
the GUI thread. A start that fails stops its host: the page shows why, and the user starts it again.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QTimer, Signal, Slot

from app import log
from engine.mcp.config import FILE_NAME, McpConfig, McpConfigError, ServerConfig, load_config, save_config

if TYPE_CHECKING:
    from engine.mcp.host import McpHost, ServerStatus

#: how often a running host's state is read again (a crash after "ready" shows without a click)
REFRESH_MS = 1000


@dataclass(frozen=True)
class ServerView:
    """One server as the page lists it: ``state`` is "disabled", "not started", "starting", "ready" or
    "failed"; ``text`` says it in words; ``detail`` holds the error and stderr's last lines."""

    name: str
    state: str
    text: str
    tools: tuple[tuple[str, str], ...] = ()  # (name, description)
    detail: str = ""


def describe(status: ServerStatus) -> ServerView:
    """A host's status in words."""
    tools = tuple((t.name, t.description) for t in status.tools)
    if status.state == "ready":
        count = len(tools)
        return ServerView(status.name, "ready", f"Ready, {count} tool{'' if count == 1 else 's'}", tools)
    if status.state == "starting":
        return ServerView(status.name, "starting", "Starting…")
    if status.state == "failed" or status.error:
        detail = status.error
        if status.stderr_tail:
            detail += "\n\nIts last lines on stderr:\n" + "\n".join(status.stderr_tail)
        return ServerView(status.name, "failed", f"Failed: {status.error or 'it stopped'}", detail=detail)
    return ServerView(status.name, "not started", "Not started")


def _invalid_entries(path: Path, config: McpConfig) -> dict[str, Any]:
    """The raw entries the file holds under the names of ``config.problems``."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        servers = data.get("mcpServers", data.get("servers", {}))
        return {name: servers[name] for name in config.problems if name in servers}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


class McpServers(QObject):
    """``mcp.json`` and the servers started from it; see the module docstring.

    Signals:
        state_changed(str): a server's :meth:`view` changed (its name).
        config_changed(): the list of servers changed (added, edited, removed, enabled or disabled).
    """

    state_changed = Signal(str)
    config_changed = Signal()
    _started = Signal(str, int, object)  # name, generation, ServerStatus (from a worker thread)

    def __init__(self, data_dir: Path, parent: QObject | None = None, *, start_timeout_s: float = 60.0) -> None:
        super().__init__(parent)
        self.path = Path(data_dir) / FILE_NAME
        self.start_timeout_s = start_timeout_s
        self.config = McpConfig()
        self.load_error = ""
        self._lock = threading.Lock()
        self._hosts: dict[str, McpHost] = {}
        self._views: dict[str, ServerView] = {}
        self._generation: dict[str, int] = {}
        self._closing: list[threading.Thread] = []
        self._invalid: dict[str, Any] = {}  # the raw entries of config.problems, written back unchanged
        self._started.connect(self._on_started)
        self._timer = QTimer(self)
        self._timer.setInterval(REFRESH_MS)
        self._timer.timeout.connect(self._on_refresh)
        self._timer.start()
        self.reload()

    # --- the file -------------------------------------------------------------------------------------------------
    def reload(self) -> None:
        """Read ``mcp.json`` again; a file that cannot be read leaves no servers and says why in ``load_error``."""
        try:
            self.config, self.load_error = load_config(self.path), ""
        except McpConfigError as exc:
            self.config, self.load_error = McpConfig(), str(exc)
        self._invalid = _invalid_entries(self.path, self.config) if self.config.problems else {}
        self.config_changed.emit()

    def put(self, server: ServerConfig, old_name: str | None = None) -> None:
        """Add ``server``, or replace ``old_name`` with it (in place, so the file keeps its order); saved at once."""
        servers = dict(self.config.servers)
        if old_name is not None and old_name in servers:
            servers = {(server.name if n == old_name else n): (server if n == old_name else s)
                       for n, s in servers.items()}
            self._stop(old_name)
        else:
            servers[server.name] = server
        self._stop(server.name)
        self._save(servers)

    def remove(self, name: str) -> None:
        self._stop(name)
        self.config.problems.pop(name, None)
        self._invalid.pop(name, None)
        self._save({n: s for n, s in self.config.servers.items() if n != name})

    def set_enabled(self, name: str, enabled: bool) -> None:
        server = self.config.servers.get(name)
        if server is None or server.enabled == enabled:
            return
        self._stop(name)
        self._save({n: (replace(s, enabled=enabled) if n == name else s) for n, s in self.config.servers.items()})

    def _save(self, servers: dict[str, ServerConfig]) -> None:
        config = McpConfig(servers, dict(self.config.problems))
        save_config(self.path, config)
        if self._invalid:  # entries Hearth cannot load stay in the file, for the user to fix
            data = json.loads(self.path.read_text(encoding="utf-8"))
            data["mcpServers"].update(self._invalid)
            fd = os.open(self.path, os.O_WRONLY | os.O_TRUNC)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=2)
        self.config, self.load_error = config, ""
        self.config_changed.emit()

    # --- states ---------------------------------------------------------------------------------------------------
    def view(self, name: str) -> ServerView:
        """What the page shows for ``name``."""
        server = self.config.servers.get(name)
        if server is None:
            problem = self.config.problems.get(name, "not in mcp.json")
            return ServerView(name, "invalid", f"Invalid entry: {problem}", detail=problem)
        if not server.enabled:
            return ServerView(name, "disabled", "Disabled")
        return self._views.get(name, ServerView(name, "not started", "Not started"))

    def start(self, name: str) -> None:
        """Start ``name`` (again, if it ran) on a thread of its own; :attr:`state_changed` follows."""
        server = self.config.servers.get(name)
        if server is None or not server.enabled:
            return
        self._stop(name)
        generation = self._generation[name]
        self._views[name] = ServerView(name, "starting", "Starting…")
        self.state_changed.emit(name)
        thread = threading.Thread(target=self._run_start, args=(server, generation), name=f"hearth-mcp-{name}",
                                  daemon=True)
        thread.start()

    def _run_start(self, server: ServerConfig, generation: int) -> None:
        from engine.mcp.host import McpHost, ServerStatus  # the SDK loads when a server first starts

        name = server.name
        try:
            host = McpHost(McpConfig({name: server}), start_timeout_s=self.start_timeout_s)
        except Exception as exc:  # noqa: BLE001 -- every failure is shown as the server's state
            self._started.emit(name, generation, ServerStatus(name, "failed", True, error=str(exc)))
            return
        with self._lock:
            if self._generation.get(name) != generation:  # edited, removed or restarted meanwhile
                self._close_later(host)
                return
            self._hosts[name] = host
        try:
            status = host.start(name).result(self.start_timeout_s + 10)
        except Exception as exc:  # noqa: BLE001 -- a host closed under it, or a start that never settled
            status = ServerStatus(name, "failed", True, error=str(exc) or type(exc).__name__)
        if status.state != "ready":
            with self._lock:
                if self._hosts.get(name) is host:
                    del self._hosts[name]
            self._close_later(host)
        self._started.emit(name, generation, status)

    @Slot(str, int, object)
    def _on_started(self, name: str, generation: int, status: ServerStatus) -> None:
        if self._generation.get(name) != generation:
            return
        self._views[name] = describe(status)
        log.ui.info("MCP server %s: %s", name, self._views[name].text)
        self.state_changed.emit(name)

    @Slot()
    def _on_refresh(self) -> None:
        with self._lock:
            hosts = list(self._hosts.items())
        for name, host in hosts:
            statuses = host.status(name)
            view = describe(statuses[0]) if statuses else None
            if view is not None and view != self._views.get(name) and view.state != "not started":
                self._views[name] = view
                self.state_changed.emit(name)

    def _stop(self, name: str) -> None:
        """Forget ``name``'s state and stop its host, if any (off this thread: stopping may wait for a process)."""
        with self._lock:
            self._generation[name] = self._generation.get(name, 0) + 1
            host = self._hosts.pop(name, None)
        self._views.pop(name, None)
        if host is not None:
            self._close_later(host)

    def _close_later(self, host: McpHost) -> None:
        thread = threading.Thread(target=host.close, name="hearth-mcp-close", daemon=True)
        self._closing.append(thread)
        thread.start()

    def close(self) -> None:
        """Stop every server (on threads of their own); :meth:`wait_closed` waits for them."""
        self._timer.stop()
        for name in {*self._hosts, *self._generation, *self.config.servers}:
            self._stop(name)

    def wait_closed(self, timeout_s: float = 15.0) -> bool:
        for thread in self._closing:
            thread.join(timeout_s)
        return not any(t.is_alive() for t in self._closing)
