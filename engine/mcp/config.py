"""``mcp.json``: the MCP servers a user configured, in the ``mcpServers`` format Claude Desktop, Cursor and LM
Studio share, so a pasted file loads unchanged.

A stdio server has ``command`` (and ``args``, ``env``, ``cwd``); a Streamable HTTP server has ``url`` (and
``headers``). ``disabled: true`` (Claude Desktop, Cline) or ``enabled: false`` turns a server off; keys other
programs add (``autoApprove``, ``alwaysAllow``, ``timeout``, ...) are ignored. VS Code's ``servers`` key is read
as well. An invalid entry is left out and reported in words under its name; the others load. ``env`` and
``headers`` hold secrets: they never appear in a repr, and the file is written 0600.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

FILE_NAME = "mcp.json"
_HTTP_TYPES = {"http", "streamable-http", "streamable_http", "streamableHttp", "streamablehttp"}
_STDIO_TYPES = {"stdio", "local"}


class McpConfigError(ValueError):
    """The file as a whole cannot be read (not JSON, or not an object); the message says where and why."""


@dataclass(frozen=True)
class ServerConfig:
    name: str
    transport: Literal["stdio", "http"]
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict, repr=False)
    cwd: str | None = None
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    enabled: bool = True

    def as_json(self) -> dict[str, Any]:
        """The entry as ``mcp.json`` writes it."""
        if self.transport == "http":
            out: dict[str, Any] = {"type": "http", "url": self.url}
            if self.headers:
                out["headers"] = dict(self.headers)
        else:
            out = {"command": self.command, "args": list(self.args)}
            if self.env:
                out["env"] = dict(self.env)
            if self.cwd:
                out["cwd"] = self.cwd
        if not self.enabled:
            out["disabled"] = True
        return out


@dataclass
class McpConfig:
    servers: dict[str, ServerConfig] = field(default_factory=dict)
    #: server name → what is wrong with its entry, in words (the entry is left out of ``servers``)
    problems: dict[str, str] = field(default_factory=dict)


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str | int | float) for v in value):
        raise ValueError(f"'{what}' must be a list of strings")
    return tuple(str(v) for v in value)


def _string_map(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ValueError(f"'{what}' must be an object of names to strings")  # noqa: TRY004 -- a problem in words
    out = {}
    for key, item in value.items():
        if not isinstance(item, str | int | float | bool):
            raise ValueError(f"'{what}.{key}' must be a string")  # noqa: TRY004 -- a problem in words
        out[str(key)] = str(item).lower() if isinstance(item, bool) else str(item)
    return out


def parse_server(name: str, entry: Any) -> ServerConfig:
    """One ``mcpServers`` entry; ValueError says in words what is wrong with it."""
    if not isinstance(entry, dict):
        raise ValueError(  # noqa: TRY004 -- a problem in words, as for every entry
            "the entry must be an object with 'command' (a program to start) or 'url'")
    kind = str(entry.get("type", entry.get("transport", ""))).strip()
    enabled = not entry.get("disabled", False) and entry.get("enabled", True) is not False
    if kind == "sse":
        raise ValueError("the SSE transport is not supported; use the server's Streamable HTTP address "
                         "(type 'http')")
    if kind and kind not in _HTTP_TYPES | _STDIO_TYPES:
        raise ValueError(f"unknown type {kind!r}: use 'stdio' (with 'command') or 'http' (with 'url')")
    has_url, has_command = "url" in entry or "serverUrl" in entry, "command" in entry
    if has_url and has_command:
        raise ValueError("the entry has both 'command' and 'url'; keep one")
    if kind in _HTTP_TYPES or (has_url and not kind):
        url = entry.get("url", entry.get("serverUrl"))
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError("'url' must be an http:// or https:// address")
        headers = _string_map(entry.get("headers", {}), "headers")
        return ServerConfig(name, "http", url=url, headers=headers, enabled=enabled)
    if not has_command:
        raise ValueError("the entry needs 'command' (a program to start) or 'url' (a Streamable HTTP address)")
    command = entry["command"]
    if not isinstance(command, str) or not command.strip():
        raise ValueError("'command' must be a non-empty string")
    args = _strings(entry.get("args", []), "args")
    env = _string_map(entry.get("env", {}) or {}, "env")
    cwd = entry.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise ValueError("'cwd' must be a folder path")
    return ServerConfig(name, "stdio", command=command.strip(), args=args, env=env, cwd=cwd, enabled=enabled)


def parse_config(data: Any) -> McpConfig:
    """A decoded ``mcp.json``: its valid servers, and a problem in words for each invalid one."""
    if not isinstance(data, dict):
        raise McpConfigError("mcp.json must be a JSON object with an \"mcpServers\" object")
    servers = data.get("mcpServers", data.get("servers", {}))
    if servers is None:
        servers = {}
    if not isinstance(servers, dict):
        raise McpConfigError("\"mcpServers\" must be an object of server names to entries")
    config = McpConfig()
    for name, entry in servers.items():
        if not str(name).strip():
            config.problems[str(name)] = "a server needs a name"
            continue
        try:
            config.servers[str(name)] = parse_server(str(name), entry)
        except ValueError as exc:
            config.problems[str(name)] = str(exc)
    return config


def load_config(path: Path) -> McpConfig:
    """``path`` read as ``mcp.json``; a missing file is an empty configuration."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return McpConfig()
    except OSError as exc:
        raise McpConfigError(f"{path} cannot be read ({exc.strerror or exc})") from exc
    if not text.strip():
        return McpConfig()
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise McpConfigError(f"{path} is not valid JSON: {exc}") from exc
    return parse_config(data)


def save_config(path: Path, config: McpConfig) -> None:
    """``config`` written to ``path`` as ``mcp.json``, readable by its owner only (it may hold secrets)."""
    data = {"mcpServers": {name: s.as_json() for name, s in config.servers.items()}}
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
