"""Ollama's model store: tag manifests mapped to the GGUF blobs they name.

Ollama keeps ``models/manifests/<registry>/<namespace>/<model>/<tag>`` (JSON, one per tag) and
``models/blobs/sha256-<hex>`` (content-addressed files without an extension). A manifest's layer of
media type ``application/vnd.ollama.image.model`` is the model's weights: a plain GGUF file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
DEFAULT_REGISTRY = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
#: Where the Linux installer's system service keeps its models (used only when scanning the real home).
SYSTEM_MODELS_DIR = Path("/usr/share/ollama/.ollama/models")


@dataclass(slots=True)
class OllamaModel:
    """One tag of an Ollama model: its name as ``ollama list`` shows it and its weights blob."""

    name: str
    blob: Path
    problem: str = ""  # why the tag cannot be read, in a sentence; "" when the blob is there


def models_dirs(home: Path, use_env: bool) -> list[Path]:
    """Ollama's model folders for ``home``: ``$OLLAMA_MODELS`` (when ``use_env``), else ``~/.ollama/models``."""
    override = os.environ.get("OLLAMA_MODELS") if use_env else None
    dirs = [Path(override).expanduser()] if override else [home / ".ollama" / "models"]
    if use_env:
        dirs.append(SYSTEM_MODELS_DIR)
    return dirs


def display_name(registry: str, namespace: str, model: str, tag: str) -> str:
    """``model:tag`` for the default registry's library, with namespace and registry added when they differ."""
    if registry == DEFAULT_REGISTRY:
        return f"{model}:{tag}" if namespace == DEFAULT_NAMESPACE else f"{namespace}/{model}:{tag}"
    return f"{registry}/{namespace}/{model}:{tag}"


def blob_path(models_dir: Path, digest: str) -> Path:
    """The blob file for ``digest`` ("sha256:<hex>"); older Ollama versions kept the colon in the name."""
    blobs = models_dir / "blobs"
    current = blobs / digest.replace(":", "-")
    legacy = blobs / digest
    return legacy if not _is_file(current) and ":" in digest and _is_file(legacy) else current


def list_models(models_dir: Path) -> list[OllamaModel]:
    """Every tag under ``models_dir/manifests`` with the blob holding its weights.

    Args:
        models_dir: Ollama's ``models`` folder (the one holding ``manifests`` and ``blobs``).

    Returns:
        One entry per manifest, sorted by name. A manifest that cannot be read, names no model
        layer or points at a missing blob is listed with ``problem`` set; nothing raises.
    """
    manifests = models_dir / "manifests"
    found: list[OllamaModel] = []
    if not manifests.is_dir():
        return found
    for manifest in sorted(manifests.glob("*/*/*/*")):
        parts = manifest.relative_to(manifests).parts
        if any(p.startswith(".") for p in parts) or not _is_file(manifest):
            continue
        name = display_name(*parts)
        digest, problem = _model_digest(manifest)
        if digest is None:
            found.append(OllamaModel(name, manifest, problem))
            continue
        blob = blob_path(models_dir, digest)
        if not _is_file(blob):
            problem = (
                f"Its weights ({blob.name}) are missing from {blob.parent}; the download did not finish. "
                f"Run `ollama pull {name}` again."
            )
        found.append(OllamaModel(name, blob, problem))
    return sorted(found, key=lambda m: m.name)


def manifest_name(path: Path) -> str | None:
    """The name (``llama3.2:1b``) of the first tag whose weights are the blob at ``path``, so that a model loaded
    from its blob is called what ``ollama list`` calls it; None when ``path`` is not a blob of an Ollama store."""
    blobs = path.parent
    if blobs.name != "blobs" or not path.name.startswith("sha256"):
        return None
    for model in list_models(blobs.parent):
        if not model.problem and model.blob.name == path.name:
            return model.name
    return None


def _is_file(path: Path) -> bool:
    """``path.is_file()``, False where the path cannot be looked at (an unreadable folder, a link loop)."""
    try:
        return path.is_file()
    except OSError:
        return False


def _model_digest(manifest: Path) -> tuple[str | None, str]:
    """The digest of the manifest's model layer, or None and the reason."""
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
        layers = data.get("layers") or []
        for layer in layers:
            digest = str(layer.get("digest", ""))
            if layer.get("mediaType") == MODEL_MEDIA_TYPE and digest.startswith("sha256"):
                return digest, ""
    except (OSError, UnicodeDecodeError, ValueError, AttributeError, TypeError) as exc:
        return None, f"Its Ollama manifest {manifest} cannot be read ({exc})."
    return None, f"Its Ollama manifest {manifest} names no model weights (no {MODEL_MEDIA_TYPE} layer)."
