"""Describe one model file or folder found on disk, from its headers only.

A :class:`FoundModel` says what the model is (architecture, parameters, quantization, size), whether
Hearth can run it (the loader's own validation, :func:`engine.loading.validate.inspect_model`; if not,
why, in a sentence) and whether it fits this machine (:func:`engine.loading.recommend.recommend`).
Weights are never read, and a damaged file gives a reason, never an exception.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from engine.api import HardwareInfo, ModelLoadError
from engine.loading.embedding_model import embedding_problem, is_embedding_folder
from engine.loading.gguf_reader import read_gguf_header, read_regular_text
from engine.loading.recommend import recommend
from engine.loading.safetensors_reader import read_safetensors_header
from engine.loading.validate import inspect_model

Source = Literal["huggingface", "lmstudio", "ollama", "gpt4all", "jan", "user"]
SOURCES: tuple[Source, ...] = ("huggingface", "lmstudio", "ollama", "gpt4all", "jan", "user")

#: ``name-00001-of-00003.gguf``: one part of a GGUF split by llama.cpp's gguf-split.
SPLIT_GGUF = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin", "*.pt", "*.pth")
#: GGUF architectures of embedding models (llama.cpp's names); any file whose metadata has a pooling type is one too.
EMBEDDING_GGUF_ARCHITECTURES = ("bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3", "t5encoder")


@dataclass(slots=True)
class FoundModel:
    """A model found on disk, described without loading it."""

    name: str
    path: Path
    source: Source
    format: str  # "gguf", "safetensors" or "pytorch"
    architecture: str = ""  # e.g. "LlamaForCausalLM" (folders) or "llama" (GGUF)
    model_type: str = ""  # e.g. "llama"
    num_parameters: int | None = None
    quantization: str = ""  # GGUF file type ("Q4_1", "Q4_K_M", "F16") or stored dtype ("BF16")
    size_bytes: int = 0
    context_length: int | None = None
    runnable: bool = False
    reason: str = ""  # why Hearth cannot run it; "" when it can
    fits: str | None = None  # the recommendation's verdict: "yes", "tight" or "no"; None when not estimated
    recommended_level: str | None = None
    fit_reason: str = ""
    #: "chat" (a model to load and talk to) or "embedding" (texts to vectors: the document index's embedders,
    #: ``engine/loading/embedding_model.py``); the chat's model list hides embedding models
    kind: str = "chat"

    def to_json(self) -> dict[str, Any]:
        """The fields as JSON-ready values (the path as a string)."""
        data = asdict(self)
        data["path"] = str(self.path)
        return data


def unreadable(name: str, path: Path, source: Source, fmt: str, reason: str) -> FoundModel:
    """A model that could not be described at all."""
    return FoundModel(name, path, source, fmt, reason=reason)


# ---------------------------------------------------------------------------------------------
# GGUF files (including Ollama's extension-less blobs)
# ---------------------------------------------------------------------------------------------


def describe_gguf(path: Path, name: str, source: Source, hardware: HardwareInfo) -> FoundModel:
    """Describe a GGUF file (any name; Ollama blobs have no extension) from its header."""
    found = FoundModel(name, path, source, "gguf")
    try:
        found.size_bytes = path.stat().st_size
        metadata, tensors = read_gguf_header(path)
    except ModelLoadError as exc:
        found.reason = str(exc)
        return found
    except (OSError, ValueError) as exc:
        found.reason = f"Cannot read {path}: {_os_message(exc)}."
        return found
    arch = str(metadata.get("general.architecture", ""))
    found.architecture = found.model_type = arch
    found.num_parameters = sum(count for _name, count, _kind, _nbytes in tensors)
    found.quantization = gguf_quantization(metadata, tensors)
    context = metadata.get(f"{arch}.context_length")
    found.context_length = int(context) if isinstance(context, int) else None
    split = SPLIT_GGUF.search(path.name)
    if split is not None:
        parts = int(split.group(2))
        found.size_bytes = sum(_size(p) for p in _split_parts(path, parts))
        if parts > 1:
            found.reason = (
                f"It is split into {parts} files; Hearth loads single-file GGUFs. Merge them with "
                f"llama.cpp's `llama-gguf-split --merge {path.name} merged.gguf`."
            )
            return found
    if arch in EMBEDDING_GGUF_ARCHITECTURES or f"{arch}.pooling_type" in metadata:
        found.kind = "embedding"  # bert and nomic-bert files run as embedders; the reason names what does not
        found.reason = embedding_problem(path)
        found.runnable = not found.reason
        return found
    found.reason = _inspect(path)
    found.runnable = not found.reason
    if found.runnable:
        # the path, not its config, so that a file whose own blocks a level runs is recommended that level
        # (recommend knows a GGUF by its magic bytes too, so an Ollama blob gets the verdict of the same .gguf)
        _add_fit(found, str(path), hardware)
    return found


def gguf_quantization(metadata: dict[str, Any], tensors: list[tuple[str, int, str, int]]) -> str:
    """The file type llama.cpp recorded (``general.file_type``), else the most common tensor type."""
    from gguf import LlamaFileType

    file_type = metadata.get("general.file_type")
    if isinstance(file_type, int):
        try:
            kind = LlamaFileType(file_type)
        except ValueError:
            kind = None
        if kind is not None and kind is not LlamaFileType.GUESSED:
            return kind.name.removeprefix("MOSTLY_").removeprefix("ALL_")
    counts: dict[str, int] = {}
    for _name, count, kind_name, _nbytes in tensors:
        counts[kind_name] = counts.get(kind_name, 0) + count
    return max(counts, key=lambda k: counts[k]) if counts else ""


def _inspect(path: Path) -> str:
    """The loader's objection to ``path``, or "" when it would load it (the loader knows a GGUF by its magic bytes
    too, so an Ollama blob is checked as it is)."""
    try:
        inspect_model(path)
    except ModelLoadError as exc:
        return str(exc)
    return ""


def _split_parts(first: Path, parts: int) -> list[Path]:
    stem = SPLIT_GGUF.sub("", first.name)
    return [first.with_name(f"{stem}-{i:05d}-of-{parts:05d}.gguf") for i in range(1, parts + 1)]


# ---------------------------------------------------------------------------------------------
# Hugging Face folders
# ---------------------------------------------------------------------------------------------


def read_model_config(folder: Path) -> dict[str, Any] | None:
    """``folder/config.json`` when it describes a transformers model (has model_type or architectures); None when
    it does not, or is not a regular file (a FIFO so named would block the scan)."""
    try:
        config = json.loads(read_regular_text(folder / "config.json"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if isinstance(config, dict) and (config.get("model_type") or config.get("architectures")):
        return config
    return None


def describe_folder(folder: Path, name: str, source: Source, hardware: HardwareInfo) -> FoundModel:
    """Describe a Hugging Face model folder (config.json with safetensors or .bin weights)."""
    config = read_model_config(folder) or {}
    architectures = config.get("architectures") or []
    model_type = str(config.get("model_type") or "")
    text = config.get("text_config")
    if not model_type and isinstance(text, dict):
        model_type = str(text.get("model_type") or "")
    weights = sorted({p for pattern in _WEIGHT_GLOBS for p in folder.glob(pattern)})
    shards = [p for p in weights if p.suffix == ".safetensors"]
    found = FoundModel(
        name,
        folder,
        source,
        "safetensors" if shards or not weights else "pytorch",
        architecture=str(architectures[0]) if architectures else model_type,
        model_type=model_type,
        size_bytes=sum(_size(p) for p in (shards or weights)),
    )
    context = config.get("max_position_embeddings")
    found.context_length = int(context) if isinstance(context, int) else None
    dtypes: dict[str, int] = {}
    try:
        for shard in shards:
            for _tensor, dtype, shape in read_safetensors_header(shard):
                dtypes[dtype] = dtypes.get(dtype, 0) + math.prod(shape)
    except (ModelLoadError, OSError) as exc:
        found.reason = str(exc) if isinstance(exc, ModelLoadError) else f"Cannot read it: {_os_message(exc)}."
    if dtypes:
        found.num_parameters = sum(dtypes.values())
    found.quantization = _folder_quantization(config, dtypes)
    if is_embedding_folder(folder, config):
        found.kind = "embedding"  # the loader's and the recommendation's checks are for chat models
        found.reason = found.reason or embedding_problem(folder)
        found.runnable = not found.reason
        return found
    found.reason = found.reason or _inspect(folder)
    found.runnable = not found.reason
    if found.runnable:
        _add_fit(found, str(folder), hardware)
    return found


def _folder_quantization(config: dict[str, Any], dtypes: dict[str, int]) -> str:
    """A pre-quantized checkpoint's method and bits (GPTQ, AWQ, MLX, ...), else the dominant stored dtype."""
    quant = config.get("quantization_config")
    if isinstance(quant, dict) and quant.get("quant_method"):
        bits = quant.get("bits") or quant.get("w_bit")
        method = str(quant["quant_method"]).upper()
        return f"{method} {bits}-bit" if bits else method
    mlx = config.get("quantization")
    if isinstance(mlx, dict) and mlx.get("bits"):
        return f"MLX {mlx['bits']}-bit"
    if dtypes:
        return max(dtypes, key=lambda d: dtypes[d])
    stored = str(config.get("dtype") or config.get("torch_dtype") or "")
    return {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}.get(stored, stored.upper())


# ---------------------------------------------------------------------------------------------
# Shared
# ---------------------------------------------------------------------------------------------


def _add_fit(found: FoundModel, model: Any, hardware: HardwareInfo) -> None:
    """Fill in the recommendation's verdict; leave it empty when the estimate cannot be made."""
    try:
        rec = recommend(model, hardware=hardware)
    except Exception:  # noqa: BLE001 -- an estimate is optional; a config it cannot read just has none
        return
    found.fits, found.recommended_level, found.fit_reason = rec.fits, rec.quantization, rec.reason
    if found.num_parameters is None and rec.num_parameters:
        found.num_parameters = rec.num_parameters


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _os_message(exc: Exception) -> str:
    if isinstance(exc, OSError):
        if isinstance(exc, FileNotFoundError) and exc.filename:
            return "the file is missing (a broken link?)"
        return exc.strerror or str(exc)
    return str(exc)
