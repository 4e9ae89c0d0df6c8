"""What this machine can run on: CPU features, memory, NVIDIA GPUs; and choosing device and dtype."""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import threading
import warnings
from collections.abc import Mapping
from pathlib import Path

import psutil
import torch

from engine.api import GpuInfo, HardwareInfo, dtype_name

logger = logging.getLogger("engine")

_GB = 1e9


def cpu_flags_and_model() -> tuple[set[str], str]:
    """Read CPU flags and the model name (from /proc/cpuinfo on Linux, best effort elsewhere)."""
    flags: set[str] = set()
    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("flags", "Features") and not flags:
            flags = set(value.split())
        elif key in ("model name", "Model", "Hardware") and not model:
            model = value.strip()
    if not flags:
        # No /proc/cpuinfo (macOS, Windows): ask torch what its kernels dispatch to.
        try:
            capability = str(torch.backends.cpu.get_cpu_capability()).lower()
        except (AttributeError, RuntimeError):
            capability = ""
        if "avx2" in capability or "avx512" in capability:
            flags.add("avx2")
        if "avx512" in capability:
            flags.add("avx512f")
    return flags, model or platform.processor() or platform.machine() or "unknown CPU"


def _physical_cores() -> tuple[int, int]:
    """Return (physical, logical) core counts, falling back sensibly when psutil cannot tell."""
    logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    physical = psutil.cpu_count(logical=False) or logical
    return max(physical, 1), max(logical, 1)


def _nvml_gpus() -> tuple[list[GpuInfo], str]:
    """List GPUs through NVML. A missing library or driver is normal and gives a reason instead."""
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:  # LibraryNotFound, DriverNotLoaded, ... all mean "no driver"
        logger.debug("NVML init failed: %s", exc)
        return [], "no NVIDIA driver found"
    gpus: list[GpuInfo] = []
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            if isinstance(name, bytes):
                name = name.decode("utf-8", errors="replace")
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            capability: tuple[int, int] | None
            try:
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
                capability = (int(major), int(minor))
            except pynvml.NVMLError:
                capability = None
            gpus.append(GpuInfo(index, str(name), int(memory.total), int(memory.free), capability))
    except pynvml.NVMLError as exc:
        logger.warning("reading NVIDIA GPU details failed: %s", exc)
        return gpus, f"reading GPU details failed: {exc}"
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    return gpus, "" if gpus else "the NVIDIA driver reports no GPUs"


def _torch_gpus() -> list[GpuInfo]:
    """List GPUs through torch.cuda (used when NVML is unavailable but CUDA works)."""
    gpus: list[GpuInfo] = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        try:
            free, total = torch.cuda.mem_get_info(index)
        except RuntimeError:
            free, total = props.total_memory, props.total_memory
        gpus.append(GpuInfo(index, props.name, int(total), int(free), (props.major, props.minor)))
    return gpus


def detect() -> HardwareInfo:
    """Describe this machine's CPU, memory and GPUs.

    Returns:
        A :class:`HardwareInfo`. GPU detection failures are not errors: ``gpus`` is then empty and
        ``gpu_reason`` says why in plain words.
    """
    flags, model = cpu_flags_and_model()
    physical, logical = _physical_cores()
    memory = psutil.virtual_memory()
    is_cpu_build = torch.version.cuda is None
    cuda_available = (not is_cpu_build) and torch.cuda.is_available()
    gpus, reason = _nvml_gpus()
    if not gpus and cuda_available:
        gpus, reason = _torch_gpus(), ""
    if gpus and is_cpu_build:
        reason = "torch is a CPU build"
    elif gpus and not cuda_available:
        reason = "torch cannot use CUDA (driver too old for this torch build?)"
    return HardwareInfo(
        cpu_model=model,
        physical_cores=physical,
        logical_cores=logical,
        avx2="avx2" in flags,
        avx512="avx512f" in flags,
        avx512_bf16="avx512_bf16" in flags,
        amx=bool({"amx_tile", "amx_bf16"} & flags),
        ram_total_bytes=int(memory.total),
        ram_available_bytes=int(memory.available),
        gpus=gpus,
        gpu_reason=reason,
        torch_cuda_available=cuda_available,
        torch_is_cpu_build=is_cpu_build,
    )


def _cpu_reason(hardware: HardwareInfo) -> str:
    """Explain in plain words why no GPU is used."""
    if not hardware.gpus:
        return hardware.gpu_reason or "no NVIDIA driver found"
    if hardware.torch_is_cpu_build:
        return "torch is a CPU build"
    return hardware.gpu_reason or "torch cannot use CUDA"


def _cuda_device_for(hardware: HardwareInfo, index: int | None) -> GpuInfo | None:
    """Pick the requested GPU, or the one with the most free memory."""
    if not hardware.gpus:
        return None
    if index is not None:
        return next((gpu for gpu in hardware.gpus if gpu.index == index), None)
    return max(hardware.gpus, key=lambda gpu: gpu.free_bytes)


def parse_device(requested: str) -> tuple[str, int | None]:
    """Check a device name without touching the hardware.

    Args:
        requested: "auto", "cpu", "cuda" or "cuda:N" (case and surrounding spaces ignored).

    Returns:
        ``(kind, index)`` with kind one of "auto", "cpu", "cuda" and index the N of "cuda:N".

    Raises:
        ValueError: ``requested`` is not one of the accepted values.
    """
    text = requested.strip().lower()
    index: int | None = None
    if text.startswith("cuda:"):
        number = text.split(":", 1)[1]
        if not number.isdigit():
            raise ValueError(f"device: {requested!r} is not valid; use auto, cpu, cuda or cuda:N")
        text, index = "cuda", int(number)
    if text not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device: {requested!r} is not valid; use auto, cpu, cuda or cuda:N")
    return text, index


def resolve_device(
    requested: str = "auto",
    needed_bytes: int | None = None,
    hardware: HardwareInfo | None = None,
) -> tuple[torch.device, str]:
    """Choose where a model runs.

    Args:
        requested: "auto", "cpu", "cuda" or "cuda:N". An explicit CUDA request that cannot be met
            falls back to the CPU with a logged warning rather than failing.
        needed_bytes: Memory the model needs; a GPU with less free memory is not chosen.
        hardware: A previous :func:`detect` result; detected now when omitted.

    Returns:
        The device and a plain-words reason for choosing it.

    Raises:
        ValueError: ``requested`` is not one of the accepted values.
    """
    text, index = parse_device(requested)
    if text == "cpu":
        return torch.device("cpu"), "CPU requested"
    info = hardware if hardware is not None else detect()
    reason: str
    gpu = _cuda_device_for(info, index)
    if not info.torch_cuda_available:
        reason = _cpu_reason(info)
    elif gpu is None:
        reason = f"no CUDA GPU with index {index}" if index is not None else _cpu_reason(info)
    elif needed_bytes is not None and gpu.free_bytes < needed_bytes:
        reason = f"GPU has {gpu.free_bytes / _GB:.1f} GB free, model needs {needed_bytes / _GB:.1f} GB"
    else:
        return (
            torch.device("cuda", gpu.index),
            f"CUDA GPU {gpu.name} with {gpu.free_bytes / _GB:.1f} GB free",
        )
    if text == "cuda":
        logger.warning("CUDA was requested but cannot be used (%s); running on the CPU", reason)
    return torch.device("cpu"), reason


_threads_lock = threading.Lock()
_threads_configured = False


#: Set to a positive number, the torch threads the engine uses, in place of one per physical core.
THREADS_ENV = "HEARTH_THREADS"


def requested_threads(environ: Mapping[str, str] | None = None) -> int | None:
    """The thread count ``$HEARTH_THREADS`` asks for, or None when it is unset.

    Raises:
        ValueError: it is set to something other than a positive whole number (the message names it).
    """
    text = (os.environ if environ is None else environ).get(THREADS_ENV, "").strip()
    if not text:
        return None
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"{THREADS_ENV}={text!r}: give a positive whole number of threads, or leave it unset")
    return count


def configure_threads(hardware: HardwareInfo | None = None, reserve: int = 0, threads: int | None = None) -> int:
    """Set torch's intra-op thread count, once per process: ``threads``, else ``$HEARTH_THREADS``, else the number of
    physical cores less ``reserve``.

    Args:
        hardware: A previous :func:`detect` result; detected now when omitted.
        reserve: Cores to leave free for other work (the app keeps one for its GUI thread); at least one
            thread is always used. Only the first call in a process sets the count: changing it later, while
            another thread may be inside a parallel region, is not safe.
        threads: An explicit count (the server's ``--threads``).

    Returns:
        The number of threads torch uses. A ``$HEARTH_THREADS`` that is not a positive whole number is logged as a
        warning and left out (the server refuses it at start, ``engine/serving/cli.py``).
    """
    global _threads_configured
    with _threads_lock:
        if not _threads_configured:
            count = threads
            if count is None:
                try:
                    count = requested_threads()
                except ValueError as exc:
                    logger.warning("%s; using one thread per physical core", exc)
            if count is None:
                cores = hardware.physical_cores if hardware is not None else _physical_cores()[0]
                count = max(cores - reserve, 1)
            torch.set_num_threads(count)
            _threads_configured = True
            logger.debug("torch uses %d threads", torch.get_num_threads())
    return torch.get_num_threads()


def resolve_dtype(requested: str, device: torch.device | str) -> torch.dtype:
    """Choose the dtype weights are held in.

    Args:
        requested: "auto", or one of float32/fp32, bfloat16/bf16, float16/fp16.
        device: Where the model runs.

    Returns:
        The torch dtype. "auto" gives bfloat16 on the CPU and on CUDA GPUs that support it, else
        float16.

    Raises:
        ValueError: ``requested`` is not an accepted value.
    """
    text = requested.strip().lower()
    if text != "auto":
        try:
            return getattr(torch, dtype_name(text))
        except ValueError:
            raise ValueError(f"dtype: {requested!r} is not valid; use auto, float32, bfloat16 or float16") from None
    dev = torch.device(device)
    if dev.type == "cuda":
        try:
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        except (RuntimeError, AssertionError):
            return torch.float16
    return torch.bfloat16


_fbgemm_fp16: bool | None = None


def fbgemm_fp16_available() -> bool:
    """Whether torch has fbgemm's fp16-weight GEMM on this CPU (x86 builds with fbgemm), checked once by use."""
    global _fbgemm_fp16
    if _fbgemm_fp16 is None:
        try:
            with warnings.catch_warnings():  # torch marks the fbgemm fp16 ops deprecated; they are pinned with torch
                warnings.simplefilter("ignore")
                packed = torch.fbgemm_pack_gemm_matrix_fp16(torch.ones(8, 8))
                y = torch.fbgemm_linear_fp16_weight(torch.ones(1, 8), packed, torch.zeros(8))
            _fbgemm_fp16 = bool(torch.allclose(y, torch.full((1, 8), 8.0)))
        except (AttributeError, RuntimeError):
            _fbgemm_fp16 = False
    return _fbgemm_fp16
