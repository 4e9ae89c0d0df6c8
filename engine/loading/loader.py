"""Load a causal language model (HF safetensors folder, GGUF file, or the default model).

Everything that can be checked from the files alone is checked before any weight is allocated:
paths, config, tokenizer files, architecture, safetensors/GGUF integrity and memory. Each failure
raises :class:`~engine.errors.ModelLoadError` saying what is wrong and what to do. Remote code is
never run: ``trust_remote_code`` is never passed and configs with ``auto_map`` are refused.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import logging
import math
import mmap
import os
import pickle
import struct
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.api import HardwareInfo, ModelInfo, ModelLoadError
from engine.loading.default_model import default_model_path, is_converted
from engine.system import hardware

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

logger = logging.getLogger("engine")

ProgressFn = Callable[[float, str], None]

#: Model types the engine runs: decoder-only transformers with full (not sliding-window) attention.
SUPPORTED_MODEL_TYPES: frozenset[str] = frozenset(
    {"llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "granite", "olmo2"}
)

_GB = 1e9
_MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
#: Bytes per element of each safetensors dtype (sub-byte types are checked loosely).
_SAFETENSORS_ITEMSIZE: dict[str, float] = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8,
    "F4": 0.5, "F6_E2M3": 0.75, "F6_E3M2": 0.75,
}  # fmt: skip
_FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}
_TOKENIZER_SETS: tuple[tuple[str, ...], ...] = (
    ("tokenizer.json",),
    ("tokenizer.model",),
    ("vocab.json", "merges.txt"),
)
_PICKLE_WEIGHTS = ("*.bin", "*.pt", "*.pth")
_TARGET_ITEMSIZE_AUTO = 2  # "auto" resolves to bf16 or fp16 everywhere


@dataclass(slots=True)
class LoadedModel:
    """A model ready for inference, with the facts about how it was loaded."""

    model: torch.nn.Module
    tokenizer: Any
    config: Any
    path: Path
    device: torch.device
    dtype: torch.dtype
    device_reason: str
    weights_bytes: int
    num_parameters: int


@dataclass(slots=True)
class _Checked:
    """Result of validating a model path: everything needed to estimate and load."""

    info: ModelInfo
    config: dict[str, Any]
    #: (element count, stored itemsize, is floating) per tensor, for memory estimates.
    tensors: list[tuple[int, float, bool]]


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


def _resolve_path(model: str | Path, progress: ProgressFn | None) -> Path:
    """Turn "default", a folder or a .gguf file name into an existing path."""
    if isinstance(model, str) and model.strip().lower() == "default":
        converting = not is_converted()
        if not converting or progress is None:
            return default_model_path(None)
        sub = _Span(progress, 0.0, 0.6)
        return default_model_path(lambda fraction, _stage: sub.report(fraction, "convert"))
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
    architecture = str(architectures[0]) if architectures else model_type
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    supported = ", ".join(sorted(SUPPORTED_MODEL_TYPES))
    if not model_type:
        raise ModelLoadError(
            f"{where} does not say which architecture it is (no model_type). Supported: {supported}."
        )
    if model_type not in SUPPORTED_MODEL_TYPES or model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
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
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ModelLoadError(f"{config_path} is not valid JSON ({exc}). Re-download the model.") from None
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


def read_safetensors_header(path: Path) -> list[tuple[str, str, list[int]]]:
    """Parse and check a safetensors file's header against the file size.

    Args:
        path: The ``.safetensors`` file.

    Returns:
        ``(name, dtype, shape)`` for every tensor.

    Raises:
        ModelLoadError: The file is truncated or its header is corrupt; the message names the file.
    """
    advice = "Re-download the model; the file is damaged or was not copied completely."
    size = path.stat().st_size
    try:
        with path.open("rb") as fh:
            prefix = fh.read(8)
            if len(prefix) < 8:
                raise ModelLoadError(f"{path.name} is truncated ({size} bytes, no header). {advice}")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > _MAX_SAFETENSORS_HEADER or 8 + header_len > size:
                raise ModelLoadError(
                    f"{path.name} is corrupt or truncated: its header claims {header_len} bytes but the "
                    f"file has {size}. {advice}"
                )
            raw = fh.read(header_len)
    except OSError as exc:
        raise ModelLoadError(f"Cannot read {path}: {exc}.") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ModelLoadError(f"{path.name} is corrupt: its header is not valid JSON. {advice}") from None
    if not isinstance(header, dict):
        raise ModelLoadError(f"{path.name} is corrupt: its header is not a JSON object. {advice}")
    data_size = size - 8 - header_len
    tensors: list[tuple[str, str, list[int]]] = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = str(entry["dtype"])
            shape = [int(d) for d in entry["shape"]]
            begin, end = (int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ModelLoadError(
                f"{path.name} is corrupt: tensor '{name}' has a malformed header entry. {advice}"
            ) from None
        itemsize = _SAFETENSORS_ITEMSIZE.get(dtype)
        if itemsize is None:
            raise ModelLoadError(f"{path.name}: tensor '{name}' has unknown dtype {dtype}. {advice}")
        if end > data_size:
            raise ModelLoadError(
                f"{path.name} is truncated: tensor '{name}' ends at byte {8 + header_len + end} but the "
                f"file has only {size} bytes. {advice}"
            )
        expected = math.prod(shape) * itemsize
        if begin < 0 or end < begin or (itemsize >= 1 and end - begin != expected):
            raise ModelLoadError(
                f"{path.name} is corrupt: tensor '{name}' ({dtype} {shape}) should take {int(expected)} "
                f"bytes but its offsets give {end - begin}. {advice}"
            )
        tensors.append((name, dtype, shape))
    return tensors


def _safetensors_files(folder: Path) -> list[Path]:
    """List the weight shards, following an index file when there is one."""
    index_path = folder / "model.safetensors.index.json"
    if index_path.is_file():
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
            names = sorted(set(index["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise ModelLoadError(
                f"{index_path.name} in {folder} is corrupt. Re-download the model."
            ) from None
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise ModelLoadError(
                f"{folder} is incomplete: weight shard(s) {', '.join(missing)} listed in "
                f"{index_path.name} are missing. Re-download the model."
            )
        return [folder / n for n in names]
    return sorted(folder.glob("*.safetensors"))


def _check_folder(folder: Path) -> _Checked:
    """Validate a Hugging Face model folder."""
    config = _read_config(folder)
    architecture, model_type = _check_config(config, folder)
    _check_tokenizer(folder)
    shards = _safetensors_files(folder)
    tensors: list[tuple[int, float, bool]] = []
    dtypes: dict[str, int] = {}
    if shards:
        fmt = "safetensors"
        for shard in shards:
            for _name, dtype, shape in read_safetensors_header(shard):
                count = math.prod(shape)
                tensors.append((count, _SAFETENSORS_ITEMSIZE[dtype], dtype in _FLOAT_DTYPES))
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
    return _Checked(info=info, config=config, tensors=tensors)


class _GgufCursor:
    """Bounds-checked little-endian reads from a memory-mapped GGUF file."""

    def __init__(self, data: mmap.mmap, name: str) -> None:
        self.data, self.name, self.pos = data, name, 0

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise ModelLoadError(
                f"{self.name} is truncated: its metadata ends early (at byte {self.pos} of "
                f"{len(self.data)}). {_GGUF_ADVICE}"
            )
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        length = int(self.take("<Q"))
        if self.pos + length > len(self.data):
            raise ModelLoadError(
                f"{self.name} is truncated: a metadata string runs past the end. {_GGUF_ADVICE}"
            )
        raw = bytes(self.data[self.pos : self.pos + length])
        self.pos += length
        return raw.decode("utf-8", errors="replace")

    def skip(self, kind: int) -> None:
        if kind == _GGUF_STRING:
            length = int(self.take("<Q"))  # read first: `pos += take()` would use the old pos
            self.pos += length
        elif kind == _GGUF_ARRAY:
            item_kind, count = int(self.take("<I")), int(self.take("<Q"))
            if item_kind in _GGUF_SCALARS:
                self.pos += struct.calcsize(_GGUF_SCALARS[item_kind]) * count
            else:
                for _ in range(count):
                    self.skip(item_kind)
        elif kind in _GGUF_SCALARS:
            self.pos += struct.calcsize(_GGUF_SCALARS[kind])
        else:
            raise ModelLoadError(f"{self.name} is corrupt: unknown metadata type {kind}. {_GGUF_ADVICE}")
        if self.pos > len(self.data):
            raise ModelLoadError(f"{self.name} is truncated: its metadata runs past the end. {_GGUF_ADVICE}")


_GGUF_ADVICE = "Re-download it; the file is damaged or was not copied completely."
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_GGUF_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}


def read_gguf_header(path: Path) -> tuple[dict[str, Any], list[tuple[str, int, str, int]]]:
    """Parse a GGUF file's metadata and tensor table and check every tensor lies inside the file.

    Only the metadata values the loader needs are decoded (strings and integers); large arrays such
    as the vocabulary are skipped, which keeps this fast even for big tokenizers.

    Args:
        path: The ``.gguf`` file.

    Returns:
        ``(metadata, tensors)``: metadata maps keys to decoded scalars/strings (arrays map to their
        length); tensors are ``(name, element count, ggml type name, bytes)``.

    Raises:
        ModelLoadError: The file is not a GGUF, is truncated or is corrupt; the message names it.
    """
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    name = path.name
    size = path.stat().st_size
    if size < 24:
        raise ModelLoadError(f"{name} is truncated ({size} bytes). {_GGUF_ADVICE}")
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"GGUF":
            raise ModelLoadError(f"{name} is not a GGUF file (it does not start with 'GGUF'). {_GGUF_ADVICE}")
        cur = _GgufCursor(data, name)
        cur.pos = 4
        version = int(cur.take("<I"))
        if version not in (2, 3):
            raise ModelLoadError(
                f"{name} uses GGUF version {version}, which is not supported (only 2 and 3, little-endian)."
            )
        tensor_count, kv_count = int(cur.take("<Q")), int(cur.take("<Q"))
        metadata: dict[str, Any] = {}
        for _ in range(kv_count):
            key, kind = cur.string(), int(cur.take("<I"))
            if kind == _GGUF_STRING:
                metadata[key] = cur.string()
            elif kind in _GGUF_SCALARS:
                metadata[key] = cur.take(_GGUF_SCALARS[kind])
            elif kind == _GGUF_ARRAY:
                start = cur.pos
                cur.take("<I")
                metadata[key] = int(cur.take("<Q"))
                cur.pos = start
                cur.skip(kind)
            else:
                cur.skip(kind)
        infos: list[tuple[str, int, int, int]] = []
        for _ in range(tensor_count):
            tname = cur.string()
            dims = [int(cur.take("<Q")) for _ in range(int(cur.take("<I")))]
            infos.append((tname, math.prod(dims), int(cur.take("<I")), int(cur.take("<Q"))))
        alignment = int(metadata.get("general.alignment", 32)) or 32
        data_start = -(-cur.pos // alignment) * alignment
    tensors: list[tuple[str, int, str, int]] = []
    for tname, count, kind, offset in infos:
        try:
            qtype = GGMLQuantizationType(kind)
            block, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise ModelLoadError(
                f"{name} is corrupt: tensor '{tname}' has unknown type {kind}. {_GGUF_ADVICE}"
            ) from None
        nbytes = count // block * type_size
        end = data_start + offset + nbytes
        if end > size:
            raise ModelLoadError(
                f"{name} is truncated: tensor '{tname}' ends at byte {end} but the file has only {size} "
                f"bytes. {_GGUF_ADVICE}"
            )
        tensors.append((tname, count, qtype.name, nbytes))
    return metadata, tensors


def _check_gguf(path: Path) -> _Checked:
    """Validate a GGUF file: header, tensor data inside the file, tokenizer, architecture."""
    metadata, tensor_table = read_gguf_header(path)
    if not tensor_table:
        raise ModelLoadError(f"{path.name} holds no tensors. {_GGUF_ADVICE}")
    if not metadata.get("tokenizer.ggml.tokens"):
        raise ModelLoadError(
            f"{path.name} has no tokenizer inside it (no tokenizer.ggml.tokens). Use a GGUF that "
            "embeds its tokenizer, as llama.cpp's converter writes them."
        )
    model_type = str(metadata.get("general.architecture", ""))
    _check_config({"model_type": model_type}, path)
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
    return _Checked(info=info, config={"model_type": model_type}, tensors=tensors)


def _check(path: Path) -> _Checked:
    """Validate ``path`` (folder or .gguf file) without allocating weights."""
    if path.is_dir():
        return _check_folder(path)
    if path.suffix.lower() == ".gguf":
        return _check_gguf(path)
    raise ModelLoadError(
        f"{path} is a file but not a .gguf. Pass a model folder (with config.json) or a .gguf file."
    )


def _estimate(tensors: list[tuple[int, float, bool]], itemsize: int) -> int:
    """Bytes the tensors take once floating ones are cast to a dtype of ``itemsize`` bytes."""
    return int(sum(count * (itemsize if is_float else stored) for count, stored, is_float in tensors))


def _itemsize(dtype: torch.dtype | str) -> int:
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
    checked = _check(_resolve_path(path, None))
    return _estimate(checked.tensors, _itemsize(dtype))


def inspect_model(model: str | Path) -> ModelInfo:
    """Describe a model from its files, without loading its weights.

    Args:
        model: "default", a model folder or a .gguf file.

    Returns:
        Its :class:`ModelInfo`.

    Raises:
        ModelLoadError: The model is missing or invalid.
    """
    return _check(_resolve_path(model, None)).info


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


class _Span:
    """Maps a sub-step's progress in [0, 1] onto [start, end] of the overall bar."""

    def __init__(self, progress: ProgressFn | None, start: float, end: float) -> None:
        self.progress, self.start, self.end = progress, start, end

    def report(self, fraction: float, stage: str) -> None:
        """Forward ``fraction`` of this span as overall progress."""
        if self.progress is not None:
            clamped = min(max(fraction, 0.0), 1.0)
            self.progress(self.start + (self.end - self.start) * clamped, stage)


def _check_memory(needed: int, device: torch.device, info: HardwareInfo, cap: int | None) -> None:
    """Refuse to load when the weights will not fit in free memory on ``device``."""
    free: int | None
    if device.type == "cuda":
        gpu = next((g for g in info.gpus if g.index == (device.index or 0)), None)
        free = gpu.free_bytes if gpu is not None else None
        where = f"free on GPU {gpu.name}" if gpu is not None else "free on the GPU"
    else:
        free, where = info.ram_available_bytes, "of RAM free"
    if cap is not None and (free is None or cap < free):
        free, where = cap, "allowed by max_memory_bytes"
    if free is not None and needed > free:
        raise ModelLoadError(
            f"Not enough memory: the model needs about {needed / _GB:.2f} GB but only "
            f"{free / _GB:.2f} GB is {where}. Close other programs, choose a smaller model, or load "
            "it with a smaller dtype."
        )


def _release_memory() -> None:
    """Collect garbage and hand freed heap memory back to the OS where the C library allows it."""
    gc.collect()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)


@contextlib.contextmanager
def _quiet_hf() -> Iterator[None]:
    """Silence transformers' progress bars and per-load info chatter."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    with contextlib.suppress(ImportError):
        import huggingface_hub.utils

        huggingface_hub.utils.disable_progress_bars()
    # transformers logs a load report table for missing/unexpected keys; the loader turns those into
    # a ModelLoadError of its own, so keep its logger to errors while loading.
    verbosity = transformers.utils.logging.get_verbosity()
    transformers.utils.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.utils.logging.set_verbosity(verbosity)


def _check_loading_info(loading_info: dict[str, Any], path: Path) -> None:
    """Refuse a checkpoint whose tensors do not cover the model (transformers would init them randomly)."""
    missing = sorted(loading_info.get("missing_keys") or [])
    mismatched = sorted(loading_info.get("mismatched_keys") or [])
    errors = list(loading_info.get("error_msgs") or [])
    if missing or mismatched or errors:
        problems = []
        if missing:
            problems.append(f"{len(missing)} weight(s) missing (e.g. {missing[0]})")
        if mismatched:
            problems.append(f"{len(mismatched)} weight(s) with the wrong shape (e.g. {mismatched[0][0]})")
        if errors:
            problems.append(str(errors[0]))
        raise ModelLoadError(
            f"The weights in {path} do not match its config.json: {'; '.join(problems)}. The download "
            "is incomplete or the files come from different models; re-download the model."
        )


def _materialize(
    checked: _Checked, device: torch.device, dtype: torch.dtype, span: _Span
) -> tuple[torch.nn.Module, Any, Any]:
    """Read the weights and tokenizer; raise ModelLoadError if the result is not usable."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    info = checked.info
    device_map = {"": device} if device.type == "cuda" else None
    with _quiet_hf():
        if info.format == "gguf":
            from engine.loading.default_model import gguf_tensor_progress

            folder, name = str(info.path.parent), info.path.name
            span.report(0.0, "read weights")
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
            with gguf_tensor_progress(_Span(span.report, 0.05, 0.9).report, "convert"):
                result: Any = AutoModelForCausalLM.from_pretrained(
                    folder,
                    gguf_file=name,
                    quantization_config=GgufConfig(dequantize=True),
                    dtype=dtype,
                    device_map=device_map,
                    local_files_only=True,
                    output_loading_info=True,
                )
        else:
            span.report(0.0, "read weights")
            tokenizer = AutoTokenizer.from_pretrained(str(info.path), local_files_only=True)
            span.report(0.1, "read weights")
            result = AutoModelForCausalLM.from_pretrained(
                str(info.path),
                dtype=dtype,
                device_map=device_map,
                local_files_only=True,
                use_safetensors=info.format == "safetensors",
                output_loading_info=True,
            )
        model, loading_info = result
        del result
        _check_loading_info(loading_info, info.path)
        if device_map is None and device.type != "cpu":
            model.to(device)
        model.eval()
        model.requires_grad_(False)
        return model, tokenizer, model.config


def load_model(
    model: str | Path,
    device: str = "auto",
    dtype: str = "auto",
    progress: ProgressFn | None = None,
    max_memory_bytes: int | None = None,
) -> LoadedModel:
    """Load a causal LM for inference.

    Progress stages, in order: "convert" (only while the default model is first converted),
    "validate", "read weights", "convert" (GGUF dequantization), "quantize". Loading ends at 0.9;
    the engine reports "warm up" after it.

    Args:
        model: "default", a Hugging Face folder (config.json + *.safetensors + tokenizer), or a
            .gguf file.
        device: "auto", "cpu", "cuda" or "cuda:N". An unusable CUDA request falls back to the CPU.
        dtype: "auto", "float32"/"fp32", "bfloat16"/"bf16" or "float16"/"fp16".
        progress: Called as ``progress(fraction, stage)``.
        max_memory_bytes: Upper bound on the memory the weights may take (in addition to the
            memory actually free).

    Returns:
        The :class:`LoadedModel`, in eval mode, on its device, in its dtype.

    Raises:
        ModelLoadError: The model is missing, invalid, unsupported, does not fit, or failed to load.
        ValueError: ``device`` or ``dtype`` is not an accepted value.

    Weight quantization (int8/int4) happens after loading, when the engine builds its layers
    (``engine/model/quantization.py``).
    """
    hardware.parse_device(device)  # both raise ValueError naming the field, before any work
    if dtype.strip().lower() != "auto":
        hardware.resolve_dtype(dtype, "cpu")
    converting_default = isinstance(model, str) and model.strip().lower() == "default" and not is_converted()
    base = 0.6 if converting_default else 0.0
    path = _resolve_path(model, progress)

    def at(fraction: float) -> float:
        return base + (0.9 - base) * fraction

    if progress is not None:
        progress(at(0.0), "validate")
    checked = _check(path)
    hw = hardware.detect()
    hardware.configure_threads(hw)
    wanted = _estimate(checked.tensors, _itemsize(dtype))
    torch_device, reason = hardware.resolve_device(device, needed_bytes=wanted, hardware=hw)
    torch_dtype = hardware.resolve_dtype(dtype, torch_device)
    needed = _estimate(checked.tensors, _itemsize(torch_dtype))
    _check_memory(needed, torch_device, hw, max_memory_bytes)
    logger.info(
        "loading %s (%s, %s) on %s as %s: %s",
        path,
        checked.info.architecture,
        checked.info.format,
        torch_device,
        torch_dtype,
        reason,
    )

    span = _Span(progress, at(0.05), at(0.95))
    result = _materialize_or_error(checked, torch_device, torch_dtype, span)
    if isinstance(result, ModelLoadError):
        raise result  # raised outside any except block, so it drags no half-built model along
    net, tokenizer, config = result
    if progress is not None:
        progress(at(1.0), "quantize")  # hook: weight quantization goes here
    num_parameters = sum(p.numel() for p in net.parameters())
    weights_bytes = sum(p.numel() * p.element_size() for p in net.parameters())
    return LoadedModel(
        model=net,
        tokenizer=tokenizer,
        config=config,
        path=path,
        device=torch_device,
        dtype=torch_dtype,
        device_reason=reason,
        weights_bytes=weights_bytes,
        num_parameters=num_parameters,
    )


def _materialize_or_error(
    checked: _Checked, device: torch.device, dtype: torch.dtype, span: _Span
) -> tuple[torch.nn.Module, Any, Any] | ModelLoadError:
    """Run :func:`_materialize`; on failure free what it allocated and return the error to raise."""
    path = checked.info.path
    try:
        return _materialize(checked, device, dtype, span)
    except ModelLoadError as exc:
        _forget(exc)
        return exc
    except torch.OutOfMemoryError as exc:
        _forget(exc)
        return ModelLoadError(
            f"Ran out of memory while loading {path} on {device}. Close other programs, choose a "
            "smaller model, or load it with a smaller dtype."
        )
    except pickle.UnpicklingError as exc:
        _forget(exc)
        return ModelLoadError(
            f"Loading {path} failed: its .bin/.pt weights contain pickled Python objects other than "
            "plain tensors, which could run code, so Hearth refuses them. Use the model's "
            ".safetensors weights instead."
        )
    except Exception as exc:  # noqa: BLE001 -- whatever transformers/torch raise on bad files
        summary = (str(exc).strip().splitlines() or [""])[0][:300]
        _forget(exc)
        return ModelLoadError(
            f"Loading {path} failed ({type(exc).__name__}: {summary}). The files may be damaged or "
            "from an unsupported variant of the architecture; re-download the model."
        )


def _forget(exc: BaseException) -> None:
    """Drop the frames (and the half-built model in them) an exception holds, then free memory."""
    traceback.clear_frames(exc.__traceback__)
    context = exc.__context__
    while context is not None:
        traceback.clear_frames(context.__traceback__)
        context = context.__context__
    _release_memory()
