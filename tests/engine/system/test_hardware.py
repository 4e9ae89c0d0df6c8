"""Hardware detection and device/dtype choice, on this machine's real hardware."""

from __future__ import annotations

import logging
import sys

import pytest
import torch

from engine.api import GpuInfo, HardwareInfo
from engine.system import hardware

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a usable CUDA GPU")


def _machine_with_gpu(free_gb: float, name: str = "NVIDIA H200") -> HardwareInfo:
    """This machine's facts, plus one CUDA GPU with ``free_gb`` free (for the device decision)."""
    info = hardware.detect()
    info.gpus = [GpuInfo(0, name, int(141e9), int(free_gb * 1e9), (9, 0))]
    info.gpu_reason = ""
    info.torch_cuda_available = True
    info.torch_is_cpu_build = False
    return info


def test_detect_gives_sane_numbers() -> None:
    info = hardware.detect()
    assert info.cpu_model
    assert 1 <= info.physical_cores <= info.logical_cores
    assert 0 < info.ram_available_bytes <= info.ram_total_bytes
    assert info.ram_total_bytes > 256 * 2**20
    assert info.torch_is_cpu_build == (torch.version.cuda is None)
    if info.avx512_bf16:
        assert info.avx512
    if not info.gpus:
        assert info.gpu_reason, "an empty GPU list must say why"
    for gpu in info.gpus:
        assert 0 <= gpu.free_bytes <= gpu.total_bytes
        assert gpu.name


def test_missing_pynvml_is_a_normal_case(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    info = hardware.detect()
    if not torch.cuda.is_available():
        assert info.gpus == []
        assert "nvidia-ml-py" in info.gpu_reason


@needs_no_cuda
def test_explicit_cuda_falls_back_to_cpu_with_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="engine"):
        device, reason = hardware.resolve_device("cuda")
    assert device == torch.device("cpu")
    assert reason
    assert any(
        "CUDA was requested" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records
    )


@needs_no_cuda
def test_auto_picks_cpu_quietly(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="engine"):
        device, reason = hardware.resolve_device("auto")
    assert device.type == "cpu"
    assert reason in {"no NVIDIA driver found", "torch is a CPU build"} or reason
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_cpu_requested() -> None:
    assert hardware.resolve_device("cpu") == (torch.device("cpu"), "CPU requested")


def test_gpu_too_small_for_model_gives_cpu_and_numbers() -> None:
    info = _machine_with_gpu(free_gb=1.2)
    device, reason = hardware.resolve_device("auto", needed_bytes=int(3.4e9), hardware=info)
    assert device.type == "cpu"
    assert reason == "GPU has 1.2 GB free, model needs 3.4 GB"


def test_gpu_with_room_is_chosen() -> None:
    info = _machine_with_gpu(free_gb=139.0)
    device, reason = hardware.resolve_device("auto", needed_bytes=int(3.4e9), hardware=info)
    assert device == torch.device("cuda", 0)
    assert reason == "CUDA GPU NVIDIA H200 with 139.0 GB free"


def test_cpu_build_with_gpu_present_says_so() -> None:
    info = _machine_with_gpu(free_gb=100.0)
    info.torch_cuda_available = False
    info.torch_is_cpu_build = True
    device, reason = hardware.resolve_device("auto", hardware=info)
    assert device.type == "cpu"
    assert reason == "torch is a CPU build"


@pytest.mark.parametrize("bad", ["tpu", "cuda:x", "", "gpu"])
def test_bad_device_names_raise(bad: str) -> None:
    with pytest.raises(ValueError, match="device"):
        hardware.resolve_device(bad)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("float32", torch.float32),
        ("fp32", torch.float32),
        ("bfloat16", torch.bfloat16),
        ("BF16", torch.bfloat16),
        ("float16", torch.float16),
        ("fp16", torch.float16),
        ("auto", torch.bfloat16),
    ],
)
def test_resolve_dtype_on_cpu(name: str, expected: torch.dtype) -> None:
    assert hardware.resolve_dtype(name, torch.device("cpu")) is expected


def test_resolve_dtype_rejects_unknown() -> None:
    with pytest.raises(ValueError, match="dtype"):
        hardware.resolve_dtype("int4", "cpu")


def test_configure_threads_sets_a_sane_count() -> None:
    threads = hardware.configure_threads()
    assert threads == torch.get_num_threads()
    assert 1 <= threads <= hardware.detect().logical_cores


@pytest.mark.parametrize(("value", "expected"), [("", None), ("3", 3), (" 1 ", 1)])
def test_hearth_threads_is_read_as_a_count(value: str, expected: int | None) -> None:
    assert hardware.requested_threads({hardware.THREADS_ENV: value}) == expected
    assert hardware.requested_threads({}) is None


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_a_bad_hearth_threads_is_refused_naming_it(value: str) -> None:
    with pytest.raises(ValueError, match=f"HEARTH_THREADS={value!r}: give a positive whole number"):
        hardware.requested_threads({hardware.THREADS_ENV: value})


def test_hearth_threads_sets_the_engines_threads_in_a_fresh_process() -> None:
    """The first configuration in a process takes ``$HEARTH_THREADS`` over one thread per core; a bad value is a
    warning naming it, and the engine keeps one thread per core."""
    import os
    import subprocess
    import sys

    code = ("import logging; logging.basicConfig(); from engine.system import hardware; "
            "print(hardware.configure_threads(), hardware.detect().physical_cores)")
    for value, expect in (("1", lambda n, cores: n == 1), ("zero", lambda n, cores: n == cores)):
        env = {**os.environ, hardware.THREADS_ENV: value}
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        threads, cores = map(int, done.stdout.split())
        assert expect(threads, cores), (value, done.stdout)
        assert ("HEARTH_THREADS='zero'" in done.stderr) == (value == "zero"), done.stderr
