"""Load a causal language model (HF safetensors folder, GGUF file, or the default model).

Everything that can be checked from the files alone is checked first (``engine/loading/validate.py``), then
memory, before any weight is allocated. Llama-family models (the fused decoder's types), from safetensors or GGUF,
are built by ``engine/loading/native.py`` without importing transformers (where the tokenizer is a plain
``tokenizer.json``, read by ``engine/loading/tokenizer.py``); the rest load through transformers. Each failure
raises :class:`~engine.api.ModelLoadError` saying what is wrong and what to do. Remote code is never run:
``trust_remote_code`` is never passed and configs with ``auto_map`` are refused.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import pickle
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.api import HardwareInfo, ModelLoadError
from engine.architectures import ARCHITECTURES
from engine.loading import native
from engine.loading.default_model import is_converted
from engine.loading.gguf_weights import GGUF_SOURCE_ATTR
from engine.loading.validate import (
    Checked,
    ProgressFn,
    ProgressSpan,
    check_path,
    dtype_itemsize,
    estimate_bytes,
    resolve_path,
)
from engine.system import hardware
from engine.system.memory import trim_heap

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

logger = logging.getLogger("engine")


_GB = 1e9


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
    trim_heap()


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
    checked: Checked, device: torch.device, dtype: torch.dtype, span: ProgressSpan, keep_blocks: bool = False
) -> tuple[torch.nn.Module, Any, Any]:
    """Read the weights and tokenizer; raise ModelLoadError if the result is not usable."""
    info = checked.info
    if keep_blocks and (info.format != "gguf" or device.type != "cpu" or _native_config(checked) is None):
        what = "a GGUF file" if info.format == "gguf" else f"a {info.format} model"
        raise ModelLoadError(
            f"The 'file' precision runs a GGUF file's own blocks on the CPU, for the Llama-family models the engine "
            f"reads itself; {info.path.name} is {what} ({info.architecture}) on {device.type}. Choose int4, int8 "
            "or bf16 instead."
        )
    if _native_config(checked) is not None:  # no transformers import on this path (it costs most of a second)
        span.report(0.0, "read weights")
        model, tokenizer, config = native.load(info.path, info.format, dtype, keep_blocks)
        if info.format == "gguf":
            setattr(model, GGUF_SOURCE_ATTR, info.path)
        check_runnable(model, tokenizer, info.path)
        model.to(device)
        model.eval()
        model.requires_grad_(False)
        return model, tokenizer, config
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    device_map = {"": device} if device.type == "cuda" else None
    with _quiet_hf():
        if info.format == "gguf":
            from engine.loading.default_model import gguf_tensor_progress

            folder, name = str(info.path.parent), info.path.name
            span.report(0.0, "read weights")
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
            with gguf_tensor_progress(ProgressSpan(span.report, 0.05, 0.9).report, "convert"):
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
        check_runnable(model, tokenizer, info.path)
        if info.format == "gguf":  # the int4/int8 levels may run the file's own blocks (engine/model/kernels.py)
            setattr(model, GGUF_SOURCE_ATTR, info.path)
        if device_map is None and device.type != "cpu":
            model.to(device)
        model.eval()
        model.requires_grad_(False)
        return model, tokenizer, model.config


def _native_config(checked: Checked) -> dict[str, Any] | None:
    """The config of a model :mod:`engine.loading.native` builds, or None to load it through transformers."""
    info = checked.info
    if info.format == "gguf":
        if info.model_type not in ARCHITECTURES or ARCHITECTURES[info.model_type].path != "fused":
            return None
        config = native.read_config(native.gguf_side_folder(info.path))
    else:
        config = checked.config
    return config if native.supports(config, info.format) else None


def load_model(
    model: str | Path,
    device: str = "auto",
    dtype: str = "auto",
    progress: ProgressFn | None = None,
    max_memory_bytes: int | None = None,
    keep_blocks: bool = False,
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
        keep_blocks: leave a GGUF file's quantized weights in the file, for the block kernels (the "file"
            precision; CPU, fused architectures only, else ModelLoadError).

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
    try:
        path = resolve_path(model, progress)
    except OSError as exc:  # a name too long, a folder that may not be read
        raise ModelLoadError(f"Cannot look at {model}: {exc.strerror or exc}. Check the path.") from None

    def at(fraction: float) -> float:
        return base + (0.9 - base) * fraction

    if progress is not None:
        progress(at(0.0), "validate")
    checked = _checked(path)
    hw = hardware.detect()
    hardware.configure_threads(hw)
    wanted = estimate_bytes(checked.tensors, dtype_itemsize(dtype))
    torch_device, reason = hardware.resolve_device(device, needed_bytes=wanted, hardware=hw)
    torch_dtype = hardware.resolve_dtype(dtype, torch_device)
    needed = estimate_bytes(checked.tensors, dtype_itemsize(torch_dtype))
    if keep_blocks:  # the weights are read in place: the file's pages, at most
        needed = min(needed, path.stat().st_size)
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

    span = ProgressSpan(progress, at(0.05), at(0.95))
    result = _materialize_or_error(checked, torch_device, torch_dtype, span, keep_blocks)
    if isinstance(result, ModelLoadError):
        raise result  # raised outside any except block, so it drags no half-built model along
    net, tokenizer, config = result
    if progress is not None:
        progress(at(1.0), "quantize")  # the engine quantizes int8/int4 layers next (engine/model/quantization.py)
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


def _checked(path: Path) -> Checked:
    """:func:`check_path`, with anything but a ModelLoadError (a header value of a type or size no reader expects,
    JSON nested too deep) turned into one that says so."""
    try:
        return check_path(path)
    except ModelLoadError:
        raise
    except Exception as exc:  # noqa: BLE001 -- a crafted header can make any reader raise anything
        raise ModelLoadError(_damaged(path, exc)) from None


def _damaged(path: Path, exc: BaseException) -> str:
    summary = (str(exc).strip().splitlines() or [""])[0][:300]
    return (
        f"{path} could not be read as a model ({type(exc).__name__}: {summary}). The file is damaged or holds values "
        "no model has; re-download it, or pick another model."
    )


def check_runnable(model: torch.nn.Module, tokenizer: Any, path: Path) -> None:
    """Refuse a loaded model whose tokenizer makes ids past its embedding (a request with one would fail and take
    the batch with it) or whose embedding holds NaN or infinite values (every request with such a token would)."""
    embedding = _embedding_weight(model)
    if embedding is None:
        return
    rows = int(embedding.shape[0])
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    ids = [int(i) for i in vocab.values()]
    ids += [int(i) for i in (getattr(tokenizer, "added_tokens_decoder", None) or {})]
    top = max(ids, default=-1)
    if top >= rows:
        raise ModelLoadError(
            f"{path} cannot run: its tokenizer has token ids up to {top} but its embedding has only {rows} rows, so "
            "those tokens have no embedding. The tokenizer and the weights come from different models; "
            "re-download the model."
        )
    if embedding.is_floating_point() and not native.is_stand_in(embedding):
        for start in range(0, rows, 4096):  # in slices: no copy of the whole embedding
            if not bool(torch.isfinite(embedding[start : start + 4096]).all()):
                raise ModelLoadError(
                    f"{path} is damaged: its token embedding holds NaN or infinite values (from row {start}). "
                    "Re-download the model."
                )


def _embedding_weight(model: torch.nn.Module) -> torch.Tensor | None:
    get = getattr(model, "get_input_embeddings", None)
    module = get() if callable(get) else getattr(getattr(model, "model", None), "embed_tokens", None)
    weight = getattr(module, "weight", None)
    return weight if isinstance(weight, torch.Tensor) and weight.dim() == 2 else None


def _materialize_or_error(
    checked: Checked, device: torch.device, dtype: torch.dtype, span: ProgressSpan, keep_blocks: bool = False
) -> tuple[torch.nn.Module, Any, Any] | ModelLoadError:
    """Run :func:`_materialize`; on failure free what it allocated and return the error to raise."""
    path = checked.info.path
    try:
        return _materialize(checked, device, dtype, span, keep_blocks)
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