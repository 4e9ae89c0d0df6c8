"""Find the models already on disk: the Hugging Face cache, LM Studio, Ollama, GPT4All, Jan and added folders.

Each app keeps models in its own layout; :func:`model_locations` lists where to look and
:func:`discover_models` walks them (bounded depth, symlink loops skipped, hidden folders ignored)
and describes every model it meets from its headers (:mod:`engine.loading.describe`). Nothing is
loaded and nothing raises: a damaged file is listed with the reason.

``python -m engine.models [--json] [--home DIR] [--add DIR ...]`` prints the list.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from engine.api import HardwareInfo
from engine.loading import ollama
from engine.loading.describe import (
    SOURCES,
    SPLIT_GGUF,
    FoundModel,
    Source,
    describe_folder,
    describe_gguf,
    read_model_config,
    unreadable,
)
from engine.loading.gguf_reader import is_gguf_file, read_regular_text

logger = logging.getLogger("engine")

__all__ = ["FoundModel", "Location", "discover_models", "main", "model_locations"]

#: Entries looked at per location at most, so that adding a huge folder (or "/") cannot hang a scan.
MAX_ENTRIES = 50_000
_USER_DEPTH = 5
_SKIP_DIRS = {"node_modules", "__pycache__", "site-packages"}


@dataclass(slots=True, frozen=True)
class Location:
    """A folder to scan: ``kind`` says how its models are laid out."""

    source: Source
    root: Path
    kind: Literal["tree", "hf-cache", "ollama"] = "tree"
    max_depth: int = 4


# ---------------------------------------------------------------------------------------------
# Where each app keeps its models
# ---------------------------------------------------------------------------------------------


def model_locations(home: Path | None = None, extra_dirs: Sequence[Path] = ()) -> list[Location]:
    """The folders :func:`discover_models` scans, whether they exist or not.

    Args:
        home: The home folder to read. None means the user's own, and then ``HF_HOME``,
            ``HF_HUB_CACHE``, ``OLLAMA_MODELS`` and ``XDG_*`` are honoured as the apps do.
        extra_dirs: Folders (or single files) the user added.
    """
    use_env = home is None
    base = Path.home() if home is None else Path(home).expanduser()
    env: Mapping[str, str] = os.environ if use_env else {}
    data = [Path(env["XDG_DATA_HOME"])] if env.get("XDG_DATA_HOME") else []
    data += [base / ".local" / "share", base / "Library" / "Application Support"]
    found: list[Location] = [Location("huggingface", p, "hf-cache") for p in _hf_cache_dirs(base, env)]
    lmstudio = [base / ".lmstudio" / "models", base / ".cache" / "lm-studio" / "models"]
    for settings in (base / ".lmstudio" / "settings.json", base / ".cache" / "lm-studio" / "settings.json"):
        lmstudio += _json_folder(settings, "downloadsFolder")
    found += [Location("lmstudio", p) for p in lmstudio]
    found += [Location("ollama", p, "ollama") for p in ollama.models_dirs(base, use_env)]
    gpt4all = [d / "nomic.ai" / "GPT4All" for d in (*data, base / "AppData" / "Local")]
    for ini in (base / ".config" / "nomic.ai" / "GPT4All.ini", base / "AppData/Roaming/nomic.ai/GPT4All.ini"):
        gpt4all += _ini_folder(ini, "modelPath")
    found += [Location("gpt4all", p, max_depth=2) for p in gpt4all]
    jan_data = [d / "Jan" / "data" for d in (*data, base / "AppData" / "Roaming")]
    jan = [base / "jan" / "models"] + [d / sub for d in jan_data for sub in ("models", "llamacpp/models")]
    found += [Location("jan", p) for p in jan]
    found += [Location("user", Path(p).expanduser(), max_depth=_USER_DEPTH) for p in extra_dirs]
    unique: dict[tuple[str, str], Location] = {}
    for loc in found:
        unique.setdefault((loc.source, os.path.normpath(loc.root)), loc)
    return list(unique.values())


def _hf_cache_dirs(home: Path, env: Mapping[str, str]) -> list[Path]:
    """The hub cache as huggingface_hub finds it: HF_HUB_CACHE, then HF_HOME/hub, then ~/.cache."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(var):
            return [Path(env[var]).expanduser()]
    if env.get("HF_HOME"):
        return [Path(env["HF_HOME"]).expanduser() / "hub"]
    cache = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else home / ".cache"
    return [cache / "huggingface" / "hub"]


def _json_folder(path: Path, key: str) -> list[Path]:
    """A folder named in an app's JSON settings file, if it names one."""
    try:
        value = json.loads(read_regular_text(path)).get(key)
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return []
    return [Path(value).expanduser()] if isinstance(value, str) and value else []


def _ini_folder(path: Path, key: str) -> list[Path]:
    """A folder named as ``key=...`` in an app's INI settings file, if it names one."""
    try:
        lines = read_regular_text(path, errors="replace").splitlines()
    except OSError:
        return []
    values = [line.split("=", 1)[1].strip() for line in lines if line.strip().startswith(f"{key}=")]
    return [Path(values[0]).expanduser()] if values and values[0] else []


# ---------------------------------------------------------------------------------------------
# Walking
# ---------------------------------------------------------------------------------------------


def _walk(root: Path, max_depth: int) -> Iterator[tuple[str, Path]]:
    """Yield ("gguf", file) and ("folder", model folder) below ``root``, each folder once.

    Folders are followed through symlinks but visited once each (by device and inode), so link loops
    end; hidden folders are skipped; at most :data:`MAX_ENTRIES` entries are looked at. A file given as
    ``root`` is a GGUF by its name or its magic bytes (an Ollama blob added by hand); files inside folders
    by their ``.gguf`` name only, so that a scan opens no other file (and a blob store added as a folder
    does not list each blob a second time beside its Ollama tag).
    """
    if _is_file(root):
        if root.suffix.lower() == ".gguf" or is_gguf_file(root):
            yield "gguf", root
        return
    seen: set[tuple[int, int]] = set()
    stack = [(root, 0)]
    entries_left = MAX_ENTRIES
    while stack:
        folder, depth = stack.pop()
        try:
            stat = folder.stat()
            if (stat.st_dev, stat.st_ino) in seen:
                continue
            seen.add((stat.st_dev, stat.st_ino))
            with os.scandir(folder) as scan:
                entries = sorted(scan, key=lambda e: e.name)
        except OSError:
            continue
        entries_left -= len(entries)
        if entries_left < 0:
            logger.warning("model scan of %s stopped after %d entries", root, MAX_ENTRIES)
            return
        names = {e.name for e in entries}
        if "config.json" in names and _has_weights_or_nothing(names) and read_model_config(folder):
            yield "folder", folder
        subdirs: list[Path] = []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if _is_dir(entry):
                if depth < max_depth and entry.name not in _SKIP_DIRS:
                    subdirs.append(Path(entry.path))
            elif entry.name.lower().endswith(".gguf") and not _is_later_part(entry.name):
                yield "gguf", Path(entry.path)
        stack.extend((d, depth + 1) for d in reversed(subdirs))


def _is_file(path: Path) -> bool:
    """Whether ``path`` is a file; False where it cannot be looked at (inside an unreadable folder, a name too
    long, a link loop), which ``Path.is_file`` raises for."""
    try:
        return path.is_file()
    except OSError:
        return False


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _is_later_part(name: str) -> bool:
    """Whether ``name`` is part 2 or later of a split GGUF (the first part stands for the whole)."""
    split = SPLIT_GGUF.search(name)
    return split is not None and int(split.group(1)) > 1


def _has_weights_or_nothing(names: set[str]) -> bool:
    """A config.json folder is a model unless its only weights are GGUF files (those are listed alone)."""
    lowered = [n.lower() for n in names]
    has_weights = any(n.endswith((".safetensors", ".bin", ".pt", ".pth")) for n in lowered)
    return has_weights or not any(n.endswith(".gguf") for n in lowered)


def _name(root: Path, path: Path, label: str = "") -> str:
    """``label/relative/path`` (the label alone, or the folder name, for the root itself; an Ollama blob added by
    hand is called by its tag's name)."""
    rel = path.relative_to(root).as_posix() if path != root else ""
    if not rel:
        return label or ollama.manifest_name(root) or root.name
    return f"{label}/{rel}" if label else rel


def _candidates(loc: Location) -> Iterator[tuple[str, Path, str]]:
    """(kind, path, name) of everything at ``loc`` that looks like a model; kind is "gguf" or "folder"."""
    if loc.kind == "hf-cache":
        yield from _hf_candidates(loc.root)
    elif loc.kind == "ollama":
        for tag in ollama.list_models(loc.root):
            yield ("gguf" if not tag.problem else "broken:" + tag.problem), tag.blob, tag.name
    else:
        for kind, path in _walk(loc.root, loc.max_depth):
            yield kind, path, _name(loc.root, path)
        if loc.source == "jan":
            yield from _jan_imports(loc.root)


def _hf_candidates(cache: Path) -> Iterator[tuple[str, Path, str]]:
    """Every snapshot of every ``models--ORG--NAME`` repo; the one ``refs/main`` names is called ORG/NAME."""
    try:
        repos = sorted(p for p in cache.glob("models--*") if p.is_dir())
    except OSError:
        return
    for repo in repos:
        label = repo.name.removeprefix("models--").replace("--", "/")
        try:
            snapshots = sorted(p for p in (repo / "snapshots").iterdir() if p.is_dir())
        except OSError:
            continue
        try:
            main = read_regular_text(repo / "refs" / "main").strip()
        except OSError:
            main = ""
        for snap in snapshots:
            tag = label if snap.name == main or len(snapshots) == 1 else f"{label}@{snap.name[:8]}"
            for kind, path in _walk(snap, 3):
                yield kind, path, _name(snap, path, tag)


def _jan_imports(root: Path) -> Iterator[tuple[str, Path, str]]:
    """GGUF files outside ``root`` that older Jan versions imported by reference from ``<id>/model.json``."""
    for model_json in sorted(root.glob("*/model.json")):
        try:
            sources = json.loads(read_regular_text(model_json)).get("sources") or []
        except (OSError, UnicodeDecodeError, ValueError, AttributeError):
            continue
        for item in sources if isinstance(sources, list) else []:
            url = str(item.get("url", "")) if isinstance(item, dict) else ""
            local = Path(url.removeprefix("file://"))
            inside = local.resolve().is_relative_to(model_json.parent.resolve())
            if not local.is_absolute() or inside or not local.is_file():
                continue
            if local.suffix.lower() == ".gguf" or is_gguf_file(local):  # by its magic: a blob has no extension
                yield "gguf", local, model_json.parent.name


# ---------------------------------------------------------------------------------------------
# Discovery
# ---------------------------------------------------------------------------------------------


def discover_models(
    home: Path | None = None, extra_dirs: Sequence[Path] = (), hardware: HardwareInfo | None = None
) -> list[FoundModel]:
    """List every model on disk, described from its headers, with the fit verdict for this machine.

    Args:
        home: The home folder to read; None means the user's own (environment variables honoured).
        extra_dirs: Folders the user added (source "user"), scanned a few levels deep.
        hardware: The machine to judge fit for; detected once when None.

    Returns:
        The models, by source (Hugging Face, LM Studio, Ollama, GPT4All, Jan, added folders) and
        name. A path reached twice (say, an added folder inside the HF cache) appears once, under
        the first source; each Ollama tag appears, even when tags share a blob.
    """
    if hardware is None:
        from engine.system.hardware import detect

        hardware = detect()
    models: list[FoundModel] = []
    seen: set[tuple[str, str]] = set()
    for loc in model_locations(home, extra_dirs):
        try:
            for kind, path, name in _candidates(loc):
                # the folder resolved, the entry itself not: overlapping roots meet, links from two apps stay two
                where = os.path.join(os.path.realpath(path.parent), path.name)
                key = (where, name if loc.source == "ollama" else "")
                if key in seen:
                    continue
                seen.add(key)
                models.append(_describe(kind, path, name, loc.source, hardware))
        except (OSError, RecursionError) as exc:  # one folder that cannot be read must not empty the list
            logger.warning("model scan of %s stopped: %s", loc.root, exc)
    order = {source: i for i, source in enumerate(SOURCES)}
    return sorted(models, key=lambda m: (order[m.source], m.name.lower(), str(m.path)))


def _describe(kind: str, path: Path, name: str, source: Source, hardware: HardwareInfo) -> FoundModel:
    """Describe one candidate; any unexpected failure becomes the model's reason, never an exception."""
    fmt = "safetensors" if kind == "folder" else "gguf"
    if kind.startswith("broken:"):
        return unreadable(name, path, source, fmt, kind.removeprefix("broken:"))
    try:
        if kind == "folder":
            return describe_folder(path, name, source, hardware)
        return describe_gguf(path, name, source, hardware)
    except Exception as exc:  # noqa: BLE001 -- one odd file must not end the scan
        logger.warning("could not describe %s: %s", path, exc)
        return unreadable(name, path, source, fmt, f"Could not read it ({type(exc).__name__}: {exc}).")


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"


def _params(count: int | None) -> str:
    if not count:
        return "?"
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if count >= scale:
            return f"{count / scale:.1f}{suffix}" if count < 10 * scale else f"{count / scale:.0f}{suffix}"
    return str(count)


def format_table(models: Sequence[FoundModel]) -> str:
    """A plain-text table: one row per model, and a ``why:`` line under each one Hearth cannot run."""
    header = ("NAME", "SOURCE", "FORMAT", "ARCH", "PARAMS", "QUANT", "SIZE", "FITS", "KIND")
    rows = [
        (
            m.name if len(m.name) <= 60 else m.name[:28] + "…" + m.name[-31:],
            m.source,
            m.format,
            m.model_type or m.architecture or "?",
            _params(m.num_parameters),
            m.quantization or "?",
            _gib(m.size_bytes),
            ("-" if m.kind == "embedding" else m.fits or "?") if m.runnable else "can't run",
            m.kind,
        )
        for m in models
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(header, widths, strict=True)).rstrip()]
    for model, row in zip(models, rows, strict=True):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if not model.runnable:
            lines.append(f"    why: {model.reason}")
    runnable = sum(m.runnable for m in models)
    lines.append(f"{len(models)} model(s), {runnable} Hearth can run.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m engine.models``: print the models found on disk; exit 0 even when there are none."""
    parser = argparse.ArgumentParser(
        prog="python -m engine.models",
        description="List the models already on disk (Hugging Face cache, LM Studio, Ollama, GPT4All, Jan).",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per model, one per line")
    parser.add_argument("--home", type=Path, help="read this home folder instead of your own")
    parser.add_argument("--add", type=Path, nargs="+", action="extend", default=[], metavar="DIR",
                        help="also scan these folders (or .gguf files)")  # fmt: skip
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    for folder in args.add:
        if not folder.exists():
            print(f"warning: {folder} does not exist", file=sys.stderr)
    models = discover_models(args.home, args.add)
    if args.json:
        for model in models:
            print(json.dumps(model.to_json()))
    elif models:
        print(format_table(models))
    if not models:
        where = [f"  {loc.source}: {loc.root}" for loc in model_locations(args.home, args.add)]
        print(
            "No models found. Looked in:\n" + "\n".join(where), file=sys.stderr if args.json else sys.stdout
        )
    return 0
