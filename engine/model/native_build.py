"""Building the native extension: its C++ sources, the compiler and flags, the build's key, and the compile itself.

The sources (``csrc/``) are one ``.cpp`` per op family, each with its header: ``decode_step.cpp`` (the layer loop
and the op registrations), ``linear.cpp``, ``small_ops.cpp``, ``attention.cpp``, ``vnni.cpp`` (the AVX512-VNNI
kernels) and ``gguf_kernels.cpp`` (matmuls against GGUF block bytes). Each compiles on its own, as many at once as
there are cores, with every warning shown (``-Wall``) and, where :data:`WERROR_ENV` asks (``make install`` and the
tests), made an error; then one link against torch's libraries. Where the build lands, and when it is loaded, is ``engine/model/native.py``'s.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from engine.system import hardware

#: The extension's C++ sources: one .cpp per op family with its header (``decode_step.cpp`` registers the ops).
SOURCE_DIR = Path(__file__).parent / "csrc"
# -fopenmp at compile time only: at::parallel_for is OpenMP pragmas inlined from ATen's headers (serial without it),
# and the library is linked without libgomp, so they bind to the OpenMP runtime torch already loaded (one pool).
# Every warning is shown; torch's headers come in as system headers (-isystem), whose warnings are not ours.
FLAGS = ["-O3", "-march=native", "-std=c++17", "-fPIC", "-fopenmp", "-Wall"]
#: Set to 1 (``make install`` and the tests do) to make every warning an error. A user's first-start build leaves it
#: off: a compiler newer than the ones checked may warn where they do not, and that must not cost the native step.
WERROR_ENV = "HEARTH_NATIVE_WERROR"
#: The ``nice`` increment of a background build's compiler: the CPU scheduler then gives it about a tenth of a core
#: that a load's threads want, and every core nobody wants.
BACKGROUND_NICENESS = 10


def compiler() -> str | None:
    """The C++ compiler to build with (``CXX``, Python's own, or the usual names), if there is one."""
    for name in (os.environ.get("CXX"), sysconfig.get_config_var("CXX"), "c++", "g++", "clang++"):
        if name:
            path = shutil.which(name.split()[0])
            if path is not None:
                return path
    return None


def sources() -> list[Path]:
    """Every C++ file of the extension, headers included, in a fixed order (none in the bundle)."""
    return sorted(p for p in SOURCE_DIR.glob("*") if p.suffix in (".cpp", ".h"))


def source_digest() -> str:
    """One digest of every source file's name and content: any edit to any of them changes it."""
    digest = hashlib.sha256()
    for path in sources():
        content = path.read_bytes()
        digest.update(f"{path.name}\0{len(content)}\0".encode())
        digest.update(content)
    return digest.hexdigest()


def build_key(compiler: str) -> str:
    """Names one build: the sources, torch, the compiler and flags, and the CPU it is tuned for."""
    flags, model = hardware.cpu_flags_and_model()
    try:
        version = subprocess.run([compiler, "--version"], check=False, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        version = compiler
    parts = [source_digest(), torch.__version__, version, " ".join(FLAGS), model, " ".join(sorted(flags))]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def build(path: Path, march: tuple[str, ...] | None = None, warnings_as_errors: bool | None = None,
          background: bool = False) -> None:
    """Compile the extension into ``path`` (atomically: a half-written library is never loaded).

    ``background``: the compiler runs at a lower CPU priority (:data:`BACKGROUND_NICENESS`), so that a build
    started by a load leaves the cores to the load it runs beside (reading and dequantizing weights, timing
    kernels, the first answer) and takes what they leave.

    ``march`` replaces ``-march=native``: the offline bundle's prebuilt copies are built for CPU levels
    (``engine.model.native.BUNDLED_BUILDS``) rather than for this CPU. ``warnings_as_errors`` adds ``-Werror``;
    by default it follows ``HEARTH_NATIVE_WERROR``.
    """
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found")
    from torch.utils.cpp_extension import include_paths, library_paths

    path.parent.mkdir(parents=True, exist_ok=True)
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    flags = [g for f in FLAGS for g in (march if march is not None and f == "-march=native" else (f,))]
    if warnings_as_errors is None:
        warnings_as_errors = os.environ.get(WERROR_ENV) == "1"
    if warnings_as_errors:
        flags.append("-Werror")
    compile_cmd = [cxx, *flags, f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    for include in include_paths():
        compile_cmd += ["-isystem", include]
    # Largest first: the units compile side by side, and the longest one must not start last.
    units = sorted((source for source in sources() if source.suffix == ".cpp"), key=lambda p: -p.stat().st_size)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.stem}-") as scratch:
        objects = [Path(scratch) / f"{unit.stem}.o" for unit in units]
        steps = [[*compile_cmd, "-c", str(unit), "-o", str(obj)] for unit, obj in zip(units, objects, strict=True)]
        nice_path = shutil.which("nice") if background else None
        nice = [nice_path, "-n", str(BACKGROUND_NICENESS)] if nice_path else []
        steps = [[*nice, *step] for step in steps]
        with ThreadPoolExecutor(max_workers=max(1, min(len(steps), os.cpu_count() or 1))) as pool:
            list(pool.map(_run, steps))  # the first failure, in source order, raises
        tmp = Path(scratch) / path.name
        link_cmd = [cxx, "-shared", *map(str, objects), "-o", str(tmp)]
        for lib in library_paths():
            link_cmd += [f"-L{lib}", f"-Wl,-rpath,{lib}"]
        _run([*nice, *link_cmd, "-lc10", "-ltorch_cpu"])
        os.replace(tmp, path)


def _run(cmd: list[str]) -> None:
    """Runs one compile or link; a failure raises with the first error line."""
    result = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines()
        errors = [line for line in lines if "error" in line] or lines
        raise RuntimeError(f"the C++ build failed: {errors[0] if errors else result.returncode}")
