"""mcp.json: the shared mcpServers format, pasted configs, invalid entries in words, secrets kept private."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from engine.mcp.config import McpConfigError, load_config, parse_config, save_config

# As Claude Desktop's claude_desktop_config.json has it (its documentation's example, plus an HTTP server).
CLAUDE_DESKTOP = """{
  "mcpServers": {
    "filesystem": {
      "command": "npx",
      "args": ["-y", "@modelcontextprotocol/server-filesystem", "/Users/me/Desktop", "/Users/me/Downloads"]
    },
    "time": {"command": "uvx", "args": ["mcp-server-time", "--local-timezone=Asia/Tokyo"]},
    "github": {"command": "docker", "args": ["run", "-i", "--rm", "ghcr.io/github/github-mcp-server"],
               "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_secret"}},
    "remote": {"type": "http", "url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer tok"}},
    "cursor-style": {"url": "http://localhost:8000/mcp"},
    "off": {"command": "uvx", "args": ["mcp-server-fetch"], "disabled": true, "autoApprove": ["fetch"]}
  }
}"""


def test_a_pasted_claude_desktop_config_loads_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(CLAUDE_DESKTOP)
    config = load_config(path)
    assert config.problems == {}
    assert set(config.servers) == {"filesystem", "time", "github", "remote", "cursor-style", "off"}
    fs = config.servers["filesystem"]
    assert (fs.transport, fs.command, fs.args[0]) == ("stdio", "npx", "-y")
    assert config.servers["github"].env == {"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_secret"}
    remote = config.servers["remote"]
    assert (remote.transport, remote.url, remote.headers) == (
        "http", "https://mcp.example.com/mcp", {"Authorization": "Bearer tok"})
    assert config.servers["cursor-style"].transport == "http"
    assert not config.servers["off"].enabled and config.servers["time"].enabled
    # secrets never show in a repr (logs, tracebacks)
    assert "ghp_secret" not in repr(config) and "Bearer tok" not in repr(config)


def test_invalid_entries_are_reported_per_server_and_the_others_load() -> None:
    config = parse_config({"mcpServers": {
        "ok": {"command": "python", "args": ["-m", "x"]},
        "nothing": {"args": ["a"]},
        "empty": {"command": "  "},
        "badargs": {"command": "x", "args": "-m x"},
        "badenv": {"command": "x", "env": ["A=1"]},
        "both": {"command": "x", "url": "http://h/mcp"},
        "ftp": {"url": "ftp://h/mcp"},
        "sse": {"type": "sse", "url": "http://h/sse"},
        "weird": {"type": "carrier-pigeon", "command": "x"},
        "notanobject": "python server.py",
    }})
    assert list(config.servers) == ["ok"]
    p = config.problems
    assert "needs 'command'" in p["nothing"] and "non-empty string" in p["empty"]
    assert "'args' must be a list" in p["badargs"] and "'env' must be an object" in p["badenv"]
    assert "both 'command' and 'url'" in p["both"] and "http:// or https://" in p["ftp"]
    assert "SSE" in p["sse"] and "unknown type" in p["weird"] and "must be an object" in p["notanobject"]


def test_a_broken_file_says_where(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    assert load_config(path).servers == {}  # no file: no servers
    path.write_text('{"mcpServers": {"a": {"command": "x",}}}')
    with pytest.raises(McpConfigError, match="not valid JSON.*line 1"):
        load_config(path)
    with pytest.raises(McpConfigError, match="mcpServers"):
        parse_config({"mcpServers": ["a"]})


def test_saving_keeps_secrets_private_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    config = parse_config(json.loads(CLAUDE_DESKTOP))
    save_config(path, config)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = load_config(path)
    assert again.servers == config.servers
