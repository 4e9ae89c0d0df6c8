"""Everything that can be checked from a model's files before any weight is allocated.

Paths, config, tokenizer files, architecture, safetensors/GGUF integrity. Each failure raises
:class:`~engine.api.ModelLoadError` saying what is wrong and what to do. Remote code is never run:
configs with ``auto_map`` are refused.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.api import ModelInfo, ModelLoadError
from engine.architectures import ARCHITECTURES
from engine.loading.default_model import bundled_gguf, default_model_path, is_converted
from engine.loading.gguf_reader import GGUF_ADVICE, is_gguf_file, read_gguf_header, read_regular_text
from engine.loading.safetensors_reader import (
    FLOAT_DTYPES,
    SAFETENSORS_ITEMSIZE,
    read_safetensors_header,
    safetensors_files,
)
from engine.loading.shape import check_config_values, check_dimensions, layers_present
from engine.system import hardware

ProgressFn = Callable[[float, str], None]

_TOKENIZER_SETS: tuple[tuple[str, ...], ...] = (
    ("tokenizer.json",),
    ("tokenizer.model",),
    ("vocab.json", "merges.txt"),
)
_PICKLE_WEIGHTS = ("*.bin", "*.pt", "*.pth")
_TARGET_ITEMSIZE_AUTO = 2  # "auto" resolves to bf16 or fp16 everywhere


@dataclass(slots=True)
class Checked:
    """Result of validating a model path: everything needed to estimate and load."""

    info: ModelInfo
    config: dict[str, Any]
    #: (element count, stored itemsize, is floating) per tensor, for memory estimates.
    tensors: list[tuple[int, float, bool]]


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


def resolve_path(model: str | Path, progress: ProgressFn | None) -> Path:
    """Turn "default", a folder or a .gguf file name into an existing path."""
    if isinstance(model, str) and model.strip().lower() == "default":
        shipped = bundled_gguf()
        if shipped is not None:
            return shipped
        converting = not is_converted()
        if not converting or progress is None:
            return default_model_path(None)
        sub = ProgressSpan(progress, 0.0, 0.6)
        def named(fraction: float, stage: str) -> None:  # "verify" (the file's sha256), then "convert 3/272"
            sub.report(fraction, stage if stage.startswith(("verify", "convert")) else "convert")

        return default_model_path(named)
    if isinstance(model, str) and not model.strip():
        raise ModelLoadError("No model given. Pass 'default', a model folder or a .gguf file.")
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelLoadError(
            f"Model path {path} does not exist. Check the spelling, or pass 'default' for the built-in model."
        )
    return path


def _check_config(config: dict[str, Any], where: Path) -> tuple[str, str]:
    """Refuse remote code and unsupported architectures; return (architecture, model_type)."""
    if "auto_map" in config:
        raise ModelLoadError(
            f"{where} needs custom Python code from the model's authors (its config has 'auto_map'). "
            "Hearth never runs code that comes with a model; pick a model that works with stock "
            "transformers."
        )
    model_type = str(config.get("model_type", "")).strip()
    architectures = config.get("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise ModelLoadError(
            f"{where} is corrupt: its 'architectures' is {str(architectures)[:40]!r}, not a list of names. "
            "Re-download the model."
        )
    architecture = str(architectures[0]) if architectures else model_type
    supported = ", ".join(sorted(ARCHITECTURES))
    if not model_type:
        raise ModelLoadError(
            f"{where} does not say which architecture it is (no model_type). Supported: {supported}."
        )
    if model_type not in ARCHITECTURES or not _transformers_knows(model_type):
        raise ModelLoadError(
            f"Unsupported architecture '{model_type}' ({architecture}) in {where}. Hearth runs "
            f"decoder-only chat models of these types: {supported}."
        )
    if architectures and not any(str(a).endswith("ForCausalLM") for a in architectures):
        raise ModelLoadError(
            f"{where} is a {architecture}, not a text-generation model (…ForCausalLM). Pick the "
            "chat or base model rather than a classifier or encoder."
        )
    layer_types = config.get("layer_types") or []
    window = config.get("sliding_window")
    max_pos = config.get("max_position_embeddings")
    windowed = (
        bool(config.get("use_sliding_window", True))
        and isinstance(window, int)
        and isinstance(max_pos, int)
        and window < max_pos
    )
    if windowed or any("sliding" in str(t) for t in layer_types):
        raise ModelLoadError(
            f"Unsupported architecture: {where} uses sliding-window attention, which Hearth's "
            "engine does not run yet. Pick a model with full attention."
        )
    return architecture, model_type


def _transformers_knows(model_type: str) -> bool:
    """Whether the installed transformers has a causal LM of this type (the fused types run without it)."""
    if ARCHITECTURES[model_type].path == "fused":
        return True  # built by engine/loading/native.py; importing transformers' model tables would slow the start
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def _read_config(folder: Path) -> dict[str, Any]:
    """Read and parse ``config.json`` in ``folder``."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        ggufs = sorted(folder.glob("*.gguf"))
        hint = f" To load {ggufs[0].name}, pass that file itself." if ggufs else ""
        raise ModelLoadError(
            f"{folder} has no config.json, so it is not a Hugging Face model folder.{hint} Pass a "
            "folder with config.json, *.safetensors and tokenizer files, or a .gguf file."
        )
    try:
        config = json.loads(read_regular_text(config_path))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ModelLoadError(f"{config_path} is not valid JSON ({exc}). Re-download the model.") from None
    except RecursionError:
        raise ModelLoadError(f"{config_path} nests its JSON too deeply to be a config. Re-download the model.") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"{config_path} is not a JSON object. Re-download the model.")
    return config


def _check_tokenizer(folder: Path) -> None:
    """Require a complete set of tokenizer files."""
    if any(all((folder / name).is_file() for name in names) for names in _TOKENIZER_SETS):
        return
    raise ModelLoadError(
        f"{folder} has no tokenizer files (tokenizer.json, tokenizer.model, or vocab.json with "
        "merges.txt). Copy the tokenizer files from the model's original repository into it."
    )


def _check_folder(folder: Path) -> Checked:
    """Validate a Hugging Face model folder."""
    config = _read_config(folder)
    architecture, model_type = _check_config(config, folder)
    _check_tokenizer(folder)
    shards = safetensors_files(folder)
    tensors: list[tuple[int, float, bool]] = []
    dtypes: dict[str, int] = {}
    names: list[str] = []
    if shards:
        fmt = "safetensors"
        for shard in shards:
            for name, dtype, shape in read_safetensors_header(shard):
                names.append(name)
                count = math.prod(shape)
                tensors.append((count, SAFETENSORS_ITEMSIZE[dtype], dtype in FLOAT_DTYPES))
                dtypes[dtype] = dtypes.get(dtype, 0) + count
        weight_files = shards
        num_parameters: int | None = sum(t[0] for t in tensors)
        stored = max(dtypes, key=lambda d: dtypes[d]).lower() if dtypes else "unknown"
    else:
        weight_files = sorted({p for pattern in _PICKLE_WEIGHTS for p in folder.glob(pattern)})
        weight_files = [p for p in weight_files if p.name != "training_args.bin"]
        if not weight_files:
            raise ModelLoadError(
                f"{folder} has no weights (*.safetensors or pytorch_model.bin). Download the "
                "model's weight files into it."
            )
        fmt = "pytorch"
        stored = str(config.get("dtype") or config.get("torch_dtype") or "float32")
        itemsize = torch.empty(0, dtype=getattr(torch, stored, torch.float32)).element_size()
        total = sum(p.stat().st_size for p in weight_files)
        tensors = [(total // itemsize, itemsize, True)]
        num_parameters = None
    advice = "The config and the weights come from different models; re-download the model."
    check_dimensions(config, folder / "config.json", sum(t[0] for t in tensors), layers_present(names), advice)
    check_config_values(config, folder / "config.json", advice)
    info = ModelInfo(
        path=folder,
        format=fmt,
        architecture=architecture,
        model_type=model_type,
        num_parameters=num_parameters,
        stored_dtype=stored,
        weight_files=weight_files,
        file_bytes=sum(p.stat().st_size for p in weight_files),
    )
    return Checked(info=info, config=config, tensors=tensors)


def _check_gguf(path: Path) -> Checked:
    """Validate a GGUF file: header, tensor data inside the file, tokenizer, architecture."""
    metadata, tensor_table = read_gguf_header(path)
    if not tensor_table:
        raise ModelLoadError(f"{path.name} holds no tensors. {GGUF_ADVICE}")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not tokens or isinstance(tokens, bool) or not isinstance(tokens, int):
        raise ModelLoadError(
            f"{path.name} has no tokenizer inside it (no tokenizer.ggml.tokens). Use a GGUF that "
            "embeds its tokenizer, as llama.cpp's converter writes them."
        )
    model_type = str(metadata.get("general.architecture", ""))
    _check_config({"model_type": model_type}, path)
    keys = {
        "num_hidden_layers": "block_count",
        "hidden_size": "embedding_length",
        "num_attention_heads": "attention.head_count",
        "num_key_value_heads": "attention.head_count_kv",
    }
    sizes = {field: metadata.get(f"{model_type}.{key}") for field, key in keys.items()}
    total = sum(count for _name, count, _kind, _nbytes in tensor_table)
    check_dimensions(sizes, path, total, layers_present(n for n, _c, _k, _b in tensor_table), GGUF_ADVICE)
    check_config_values(gguf_shape(metadata, model_type, tensor_table), path, GGUF_ADVICE,
                        tokenizer_size=tokens)  # fmt: skip
    counts: dict[str, int] = {}
    for _name, count, kind, _nbytes in tensor_table:
        counts[kind] = counts.get(kind, 0) + count
    tensors = [(count, 4.0, True) for _name, count, _kind, _nbytes in tensor_table]
    info = ModelInfo(
        path=path,
        format="gguf",
        architecture=model_type,
        model_type=model_type,
        num_parameters=sum(t[0] for t in tensors),
        stored_dtype=max(counts, key=lambda k: counts[k]),
        weight_files=[path],
        file_bytes=path.stat().st_size,
    )
    return Checked(info=info, config={"model_type": model_type}, tensors=tensors)


#: config.json's name for each GGUF metadata key (after ``<architecture>.``) that :func:`check_config_values` reads.
_GGUF_KEYS = {
    "num_hidden_layers": "block_count", "hidden_size": "embedding_length", "intermediate_size": "feed_forward_length",
    "num_attention_heads": "attention.head_count", "num_key_value_heads": "attention.head_count_kv",
    "head_dim": "attention.key_length", "max_position_embeddings": "context_length", "vocab_size": "vocab_size",
    "rms_norm_eps": "attention.layer_norm_rms_epsilon", "layer_norm_eps": "attention.layer_norm_epsilon",
    "rope_theta": "rope.freq_base",
}  # fmt: skip


def gguf_shape(metadata: dict[str, Any], model_type: str, tensor_table: list[tuple[str, int, str, int]]) -> dict[str, Any]:
    """A GGUF's shape under config.json's names. The vocabulary is the embedding's rows (``token_embd``'s element
    count over the hidden size), what a token id indexes, whatever the metadata says."""
    shape: dict[str, Any] = {"model_type": model_type}
    for field, key in _GGUF_KEYS.items():
        if f"{model_type}.{key}" in metadata:
            shape[field] = metadata[f"{model_type}.{key}"]
    hidden = shape.get("hidden_size")
    embedding = next((count for name, count, _kind, _nbytes in tensor_table if name == "token_embd.weight"), None)
    if embedding and isinstance(hidden, int) and not isinstance(hidden, bool) and hidden > 0 and embedding % hidden == 0:
        shape["vocab_size"] = embedding // hidden
    return shape


def check_path(path: Path) -> Checked:
    """Validate ``path`` (folder or .gguf file) without allocating weights."""
    if path.is_dir():
        return _check_folder(path)
    if path.suffix.lower() == ".gguf" or is_gguf_file(path):  # Ollama's blobs have no extension
        return _check_gguf(path)
    raise ModelLoadError(
        f"{path} is a file but not a .gguf. Pass a model folder (with config.json) or a .gguf file."
    )


def estimate_bytes(tensors: list[tuple[int, float, bool]], itemsize: int) -> int:
    """Bytes the tensors take once floating ones are cast to a dtype of ``itemsize`` bytes."""
    return int(sum(count * (itemsize if is_float else stored) for count, stored, is_float in tensors))


def dtype_itemsize(dtype: torch.dtype | str) -> int:
    """Bytes per element of a dtype given as torch.dtype or a dtype name ("auto" counts as 2)."""
    if isinstance(dtype, str):
        if dtype.strip().lower() == "auto":
            return _TARGET_ITEMSIZE_AUTO
        dtype = hardware.resolve_dtype(dtype, "cpu")
    return torch.empty(0, dtype=dtype).element_size()


def estimate_weights_bytes(path: str | Path, dtype: torch.dtype | str = "auto") -> int:
    """Estimate the memory a model's weights take in ``dtype``, from file headers only.

    Args:
        path: "default", a model folder or a .gguf file. The path is validated.
        dtype: Target dtype (torch.dtype or name; "auto" counts 2 bytes per weight).

    Returns:
        Estimated bytes of the weights once loaded.

    Raises:
        ModelLoadError: The model is missing or invalid.
        ValueError: ``dtype`` is not an accepted name.
    """
    checked = check_path(resolve_path(path, None))
    return estimate_bytes(checked.tensors, dtype_itemsize(dtype))


def inspect_model(model: str | Path) -> ModelInfo:
    """Describe a model from its files, without loading its weights.

    Args:
        model: "default", a model folder or a .gguf file.

    Returns:
        Its :class:`ModelInfo`.

    Raises:
        ModelLoadError: The model is missing or invalid.
    """
    return check_path(resolve_path(model, None)).info


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


class ProgressSpan:
    """Maps a sub-step's progress in [0, 1] onto [start, end] of the overall bar."""

    def __init__(self, progress: ProgressFn | None, start: float, end: float) -> None:
        self.progress, self.start, self.end = progress, start, end

    def report(self, fraction: float, stage: str) -> None:
        """Forward ``fraction`` of this span as overall progress."""
        if self.progress is not None:
            clamped = min(max(fraction, 0.0), 1.0)
            self.progress(self.start + (self.end - self.start) * clamped, stage)
