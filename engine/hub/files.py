"""A repository's files as a user chooses among them: one entry per thing to download, with its size and fit.

GGUF files are one entry each, except the parts of a split file (``name-00001-of-00003.gguf`` ...), which are one
entry together. A folder holding ``.safetensors`` weights and a ``config.json`` is one entry with every file of
that folder the engine reads (other weight formats left out). Each entry carries its quant, its size (from the
hub's tree listing), its LFS sha256s and a :class:`~engine.hub.fit.Fit`; one entry is marked recommended, with why.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

from huggingface_hub import HfApi
from huggingface_hub.hf_api import RepoFile

from engine.architectures import count_parameters
from engine.hub.errors import hub_errors
from engine.hub.fit import FITS, SHORTER, Fit, available_memory, judge_fit, kv_per_token

__all__ = ["FileEntry", "RepoFiles", "group_files", "list_files", "quant_of"]

SPLIT_PART = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])(I?Q\d_K_[SMLX]L?|I?Q\d_K|IQ\d_[A-Z]+|Q\d_\d|TQ\d_\d|BF16|F16|F32|FP16|FP32)(?![A-Za-z0-9])",
    re.IGNORECASE,
)
_OTHER_WEIGHTS = (".gguf", ".bin", ".pt", ".pth", ".onnx", ".onnx_data", ".h5", ".msgpack", ".ckpt", ".tflite")
#: When it fits, this quant is the usual pick: most of the full model's quality at about a third of its size.
PREFERRED_QUANT = "Q4_K_M"
DEFAULT_CONTEXT = 4096


@dataclass(slots=True)
class FileEntry:
    """One choice: a GGUF file (all parts of a split one) or a safetensors folder."""

    name: str
    format: str  # "gguf" or "safetensors"
    quant: str
    files: tuple[str, ...]
    size_bytes: int
    sha256: dict[str, str] = field(default_factory=dict)  # repo path -> the hub's LFS sha256
    fit: Fit | None = None
    recommended: bool = False
    why: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "format": self.format, "quant": self.quant, "files": list(self.files),
            "size_bytes": self.size_bytes, "sha256": self.sha256, "fit": self.fit.to_json() if self.fit else None,
            "recommended": self.recommended, "why": self.why,
        }


@dataclass(slots=True)
class RepoFiles:
    """A repository's entries, grouped by format then quant, with what the fit was judged against."""

    repo_id: str
    revision: str | None
    gated: bool
    context: int
    available_bytes: int
    num_parameters: int | None
    entries: list[FileEntry]

    @property
    def recommended(self) -> FileEntry | None:
        return next((e for e in self.entries if e.recommended), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "repo_id": self.repo_id, "revision": self.revision, "gated": self.gated, "context": self.context,
            "available_bytes": self.available_bytes, "num_parameters": self.num_parameters,
            "entries": [e.to_json() for e in self.entries],
        }


def quant_of(filename: str) -> str:
    """The quant a GGUF file name states (``Q4_K_M``, ``IQ3_XS``, ``F16`` ...), upper case; "?" when none."""
    found = _QUANT.findall(posixpath.basename(filename))
    return found[-1].upper() if found else "?"


def group_files(files: list[RepoFile], config: dict[str, Any] | None = None) -> list[FileEntry]:
    """Entries from a tree listing: GGUF files (split parts together) and safetensors folders."""
    by_path = {f.path: f for f in files}
    entries: list[FileEntry] = []
    splits: dict[tuple[str, str], list[RepoFile]] = {}
    for f in files:
        if not f.path.lower().endswith(".gguf"):
            continue
        split = SPLIT_PART.search(f.path)
        if split:
            splits.setdefault((f.path[: split.start()], split.group(2)), []).append(f)
        else:
            entries.append(_entry(posixpath.basename(f.path), "gguf", quant_of(f.path), [f]))
    for (stem, count), parts in splits.items():
        parts.sort(key=lambda p: p.path)
        name = f"{posixpath.basename(stem)}.gguf ({len(parts)} of {int(count)} parts)"
        entries.append(_entry(name, "gguf", quant_of(stem + ".gguf"), parts))
    folders = sorted({posixpath.dirname(p) for p in by_path if p.lower().endswith(".safetensors")})
    for folder in folders:
        config_path = posixpath.join(folder, "config.json")
        if config_path not in by_path:
            continue
        members = [f for p, f in sorted(by_path.items())
                   if posixpath.dirname(p) == folder and not p.lower().endswith(_OTHER_WEIGHTS)]
        name = (folder or "") + "/" if folder else "(repository root)"
        entries.append(_entry(name, "safetensors", _folder_quant(config if not folder else None), members))
    entries.sort(key=lambda e: (e.format != "gguf", e.size_bytes))
    return entries


def _entry(name: str, fmt: str, quant: str, files: list[RepoFile]) -> FileEntry:
    sha = {f.path: f.lfs.sha256 for f in files if f.lfs is not None}
    size = sum(int(f.size or 0) for f in files)
    return FileEntry(name, fmt, quant, tuple(f.path for f in files), size, sha)


def _folder_quant(config: dict[str, Any] | None) -> str:
    """A safetensors folder's precision: its quantization method, else its stored dtype."""
    if not config:
        return "?"
    quant = config.get("quantization_config")
    if isinstance(quant, dict) and quant.get("quant_method"):
        bits = quant.get("bits") or ("4" if quant.get("load_in_4bit") else "8" if quant.get("load_in_8bit") else "")
        return f"{quant['quant_method']}{'-' + str(bits) + 'bit' if bits else ''}"
    return str(config.get("torch_dtype") or config.get("dtype") or "?").upper()


def list_files(
    repo_id: str, revision: str | None = None, context: int | None = None, available_bytes: int | None = None,
    endpoint: str | None = None, token: str | bool | None = None,
) -> RepoFiles:
    """The entries of ``repo_id`` with their fit on this machine, the recommended one marked.

    Args:
        context: The context to judge fit at; None means the model's own, at most :data:`DEFAULT_CONTEXT`.
        available_bytes: The memory to judge against; None measures it now.

    Raises:
        HubError: The hub cannot be reached, the repository does not exist, or it is gated.
    """
    api = HfApi(endpoint=endpoint, token=token)
    with hub_errors(repo_id, endpoint=endpoint):
        info = api.model_info(repo_id, revision=revision)
        tree = [f for f in api.list_repo_tree(repo_id, revision=info.sha or revision, recursive=True)
                if isinstance(f, RepoFile)]
        config = _config(api, info)
    model_len = int((config or {}).get("max_position_embeddings") or (info.gguf or {}).get("context_length") or 0)
    if context is None:
        context = min(DEFAULT_CONTEXT, model_len) if model_len else DEFAULT_CONTEXT
    available = available_memory() if available_bytes is None else available_bytes
    entries = group_files(tree, config)
    per_token = kv_per_token(config)
    for entry in entries:
        entry.fit = judge_fit(entry.size_bytes, per_token, context, available)
    _recommend(entries, context)
    try:
        params = count_parameters(config) if config else None
    except (TypeError, ValueError, KeyError):
        params = None
    params = params or (info.gguf or {}).get("total")
    return RepoFiles(repo_id, info.sha, bool(info.gated), context, available, params, entries)


def _config(api: HfApi, info: Any) -> dict[str, Any] | None:
    """The model's config as the hub parsed it; for a GGUF-only repository, its base model's."""
    config = info.config if isinstance(info.config, dict) else None
    if config and config.get("num_hidden_layers"):
        return config
    base = getattr(info.card_data, "base_model", None) if info.card_data is not None else None
    base = base[0] if isinstance(base, list) and base else base
    if isinstance(base, str) and base != info.id:
        base_info = api.model_info(base)
        if isinstance(base_info.config, dict) and base_info.config.get("num_hidden_layers"):
            return base_info.config
    return config


def _recommend(entries: list[FileEntry], context: int) -> None:
    """Mark one entry: Q4_K_M if it fits, else the largest GGUF that fits, else what fits with a shorter context."""
    fitting = [e for e in entries if e.fit is not None and e.fit.label == FITS]
    gguf = [e for e in fitting if e.format == "gguf"]
    preferred = [e for e in gguf if e.quant == PREFERRED_QUANT]
    if preferred:
        pick, why = preferred[0], (f"{PREFERRED_QUANT} keeps most of the model's quality at about a third of "
                                   f"its full size, and it fits with {context} tokens of context")
    elif gguf:
        pick = max(gguf, key=lambda e: e.size_bytes)
        why = (f"the largest GGUF that fits with {context} tokens of context (a larger quant keeps more quality; "
               "the engine runs a GGUF's own blocks on a CPU)")
    elif fitting:
        pick = min(fitting, key=lambda e: e.size_bytes)
        why = f"it fits with {context} tokens of context"
    else:
        shorter = [e for e in entries if e.fit is not None and e.fit.label == SHORTER]
        if not shorter:
            return
        pick = max(shorter, key=lambda e: (e.fit.context if e.fit else 0, -e.size_bytes))
        longest = pick.fit.context if pick.fit else 0
        why = f"nothing fits with {context} tokens; this one leaves the longest context ({longest} tokens)"
    pick.recommended, pick.why = True, why
