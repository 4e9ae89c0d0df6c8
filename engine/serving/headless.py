"""The server with no window: every model on disk by name (``python -m engine.serve --models-dir DIR``, the
bundle's ``hearth serve``), its log in the data folder, and ``hearth service install|uninstall|status``, which
manages a systemd user unit on Linux.

Nothing here imports Qt: the headless server must run on a machine without a display.
"""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.serving.pool import Entry, entry_aliases

logger = logging.getLogger(__name__)

#: The log's size before it rotates, and the old logs kept.
LOG_BYTES, LOG_BACKUPS = 5 << 20, 3
UNIT_NAME = "hearth.service"


def disk_catalog(models_dirs: Sequence[Path], home: Path | None = None) -> list[Entry]:
    """The runnable models discovery finds (the usual apps' folders under ``home`` and ``models_dirs``), chat and
    embedding models, and the default model when it is installed; each name once, the first found kept."""
    from engine.loading.default_model import source_gguf_path
    from engine.loading.discovery import discover_models

    entries: dict[str, Entry] = {}
    try:
        default = source_gguf_path()
        entries["default"] = Entry("default", "default", default.stat().st_size, ("SmolLM2-135M-Instruct",))
    except Exception as exc:  # noqa: BLE001 -- no default model installed: the others still serve
        logger.info("the default model is not served: %s", exc)
    for found in discover_models(home, extra_dirs=list(models_dirs)):
        if found.runnable and found.name not in entries:
            entries[found.name] = Entry(found.name, str(found.path), found.size_bytes,
                                        entry_aliases(found.name, Path(found.path)), found.kind, found.model_type)
    return list(entries.values())


def embedding_entries(folders: Sequence[Path]) -> list[Entry]:
    """The embedding model folders named on the command line (``--embedding-model``) as the pool's entries.

    Raises:
        ValueError: a folder that holds no embedding model Hearth runs (the reason in words).
        FileNotFoundError: a folder that does not exist.
    """
    from engine.api import ModelLoadError
    from engine.loading.embedding_model import read_embedding_spec
    from engine.serving.embeddings import folder_size, served_name

    entries = []
    for folder in folders:
        path = Path(folder).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"no embedding model at {folder}")
        try:
            spec = read_embedding_spec(path)
        except ModelLoadError as exc:
            raise ValueError(str(exc)) from exc
        name = served_name(path.resolve())
        entries.append(Entry(name, str(path.resolve()), folder_size(path), (f"{name}:latest", str(folder)),
                             "embedding", spec.model_type))
    return entries


def log_to_data_folder(level: str, folder: Path | None = None) -> Path:
    """Send the server's log to ``logs/server.log`` in the data folder as well as to stderr, rotated at
    :data:`LOG_BYTES` with :data:`LOG_BACKUPS` old files kept. Returns the log's path."""
    from engine.system.paths import data_dir, ensure_private_dir

    logs = ensure_private_dir((folder or data_dir()) / "logs")
    path = logs / "server.log"
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=LOG_BYTES, backupCount=LOG_BACKUPS,
                                                   encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level.upper())
    return path


# -- the systemd user unit -----------------------------------------------------------------------------------------
def unit_path(config_home: Path | None = None) -> Path:
    """Where the user unit lives: ``$XDG_CONFIG_HOME/systemd/user/hearth.service``."""
    base = config_home or Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "systemd" / "user" / UNIT_NAME


def unit_text(command: Sequence[str]) -> str:
    """The unit that runs ``command`` (the serve command line) for this user, restarted when it fails."""
    return (
        "[Unit]\nDescription=Hearth model server (OpenAI and Ollama APIs)\nAfter=network.target\n\n"
        f"[Service]\nExecStart={shlex.join(command)}\nRestart=on-failure\nRestartSec=5\n"
        "Environment=PYTHONUNBUFFERED=1\n\n[Install]\nWantedBy=default.target\n"
    )


def serve_command(serve_args: Sequence[str]) -> list[str]:
    """The command line that starts the headless server with ``serve_args``: the bundle's own executable with
    ``serve``, or this Python with ``-m engine.serve``."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "serve", *serve_args]
    return [sys.executable, "-m", "engine.serve", *serve_args]


def _systemctl(*args: str) -> subprocess.CompletedProcess[str] | None:
    exe = shutil.which("systemctl")
    if exe is None:
        return None
    return subprocess.run([exe, "--user", *args], capture_output=True, text=True, check=False, timeout=30)


def service(action: str, serve_args: Sequence[str], config_home: Path | None = None) -> int:
    """``install`` writes the unit and enables and starts it, ``uninstall`` stops it and removes it, ``status``
    says whether it is installed and running. Prints what it did; returns 0 on success, 1 on failure."""
    if sys.platform != "linux":
        print("error: hearth service manages a systemd user unit, which only Linux has.", file=sys.stderr)
        return 1
    path = unit_path(config_home)
    if action == "install":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(unit_text(serve_command(serve_args)), encoding="utf-8")
        print(f"wrote {path}")
        return _run_steps(("daemon-reload",), ("enable", "--now", UNIT_NAME))
    if action == "uninstall":
        steps = _run_steps(("disable", "--now", UNIT_NAME)) if path.exists() else 0
        path.unlink(missing_ok=True)
        print(f"removed {path}")
        _run_steps(("daemon-reload",))
        return steps
    installed = path.exists()
    result = _systemctl("is-active", UNIT_NAME) if installed else None
    state = "not installed" if not installed else (result.stdout.strip() if result else "unknown (no systemctl)")
    print(f"{UNIT_NAME}: {state}" + (f" ({path})" if installed else ""))
    return 0


def _run_steps(*steps: tuple[str, ...]) -> int:
    for step in steps:
        result = _systemctl(*step)
        if result is None:
            print("note: systemctl was not found; the unit is written but not started.", file=sys.stderr)
            return 0
        if result.returncode != 0:
            print(f"error: systemctl --user {' '.join(step)} failed: {result.stderr.strip() or result.stdout}",
                  file=sys.stderr)
            return 1
    return 0


def bundle_main(argv: Sequence[str]) -> int:
    """The bundle's headless commands: ``hearth serve [serve flags]`` and ``hearth service ACTION [serve flags]``."""
    from engine.serving.cli import main as serve_main

    if argv and argv[0] == "serve":
        return serve_main(list(argv[1:]))
    parser = argparse.ArgumentParser(prog="hearth service", description=service.__doc__)
    parser.add_argument("action", choices=("install", "uninstall", "status"))
    args, rest = parser.parse_known_args(list(argv[1:]))
    return service(args.action, rest or ["--models-dir", str(_default_models_dir())])


def _default_models_dir() -> Path:
    from engine.system.paths import models_dir

    return models_dir()


def pool_options(args: Any) -> dict[str, Any]:
    """The ``ModelPool`` settings the serve flags ask for (``--keep-alive``, ``--max-loaded-models``,
    ``--memory-budget-mb``; the budget defaults to 80% of the memory available at start)."""
    from engine.serving.pool import parse_keep_alive

    budget = args.memory_budget_mb * 2**20
    if not budget:
        import psutil

        budget = int(psutil.virtual_memory().available * 0.8)
    return {"keep_alive_s": parse_keep_alive(args.keep_alive), "max_loaded": args.max_loaded_models,
            "budget_bytes": budget}
