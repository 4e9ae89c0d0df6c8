"""``python -m engine.mcp``: the MCP host for scripts and checks, with no Qt.

- ``list [--config FILE] [--json]`` starts each configured server and prints its state and tools;
- ``call SERVER TOOL [--args JSON] [--config FILE] [--timeout S]`` prints the result (exit status 1 when it is an
  error).

``--config`` defaults to the data folder's ``mcp.json``. Calls run without asking: the command line is the user's
own request.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine.mcp.config import FILE_NAME, McpConfigError, load_config
from engine.mcp.host import McpHost
from engine.system.paths import data_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.mcp", description="Hearth's MCP host")
    sub = parser.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("list", help="start each configured server; print its state and tools")
    ls.add_argument("--json", action="store_true")
    call = sub.add_parser("call", help="call one tool and print its result")
    call.add_argument("server")
    call.add_argument("tool")
    call.add_argument("--args", default="{}", help="the arguments, a JSON object")
    call.add_argument("--timeout", type=float, default=30.0)
    for p in (ls, call):
        p.add_argument("--config", type=Path, default=None, help=f"mcp.json (default: the data folder's {FILE_NAME})")
    opts = parser.parse_args(argv)
    try:
        config = load_config(opts.config or data_dir() / FILE_NAME)
    except McpConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    for name, problem in config.problems.items():
        print(f"{name}: left out: {problem}", file=sys.stderr)
    with McpHost(config, call_timeout_s=getattr(opts, "timeout", 30.0)) as host:
        if opts.command == "list":
            return _list(host, opts.json)
        try:
            args = json.loads(opts.args)
        except ValueError as exc:
            print(f"--args is not valid JSON: {exc}", file=sys.stderr)
            return 2
        if not isinstance(args, dict) or opts.server not in config.servers:
            print("--args must be a JSON object" if not isinstance(args, dict) else
                  f"no server named {opts.server!r} in the configuration", file=sys.stderr)
            return 2
        result = host.call_tool(opts.server, opts.tool, args).result(opts.timeout + host.start_timeout_s + 10)
        print(result.text)
        return 1 if result.is_error else 0


def _list(host: McpHost, as_json: bool) -> int:
    futures = [host.start(s.name) for s in host.status()]
    statuses = [f.result(host.start_timeout_s + 10) for f in futures]
    if as_json:
        print(json.dumps([{"name": s.name, "state": s.state, "enabled": s.enabled, "error": s.error,
                           "stderr_tail": list(s.stderr_tail),
                           "tools": [{"name": t.name, "description": t.description, "inputSchema": t.input_schema}
                                     for t in s.tools]} for s in statuses], indent=2))
    else:
        for s in statuses:
            print(f"{s.name}: {s.state}" + (f" ({s.error})" if s.error else ""))
            for t in s.tools:
                print(f"  {t.name}: {t.description.splitlines()[0] if t.description else ''}")
            for line in s.stderr_tail if s.state == "failed" else ():
                print(f"  stderr: {line}")
    return 0 if all(s.state == "ready" or not s.enabled for s in statuses) else 1


if __name__ == "__main__":
    sys.exit(main())
