"""numpy's BLAS and LAPACK from torch's MKL instead of numpy's own OpenBLAS (used by packaging/hearth.spec).

numpy's wheel brings OpenBLAS (numpy.libs/libscipy_openblas64_-*.so, 24 MiB) and the Fortran runtime that only it
links (libgfortran, libquadmath: 3 MiB), although libtorch_cpu.so already holds MKL with the same 64-bit-integer
interface. The spec builds packaging/numpy_blas.c into a library of OpenBLAS's file name and soname that defines
the symbols numpy's extension modules import and forwards them to MKL, and ships it in OpenBLAS's place. It keeps
OpenBLAS (and says why) when any symbol is missing on either side, so a different numpy or torch cannot break the
bundle. tests/test_packaging.py runs numpy's linear algebra over the built library.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from fnmatch import fnmatch
from pathlib import Path

SOURCE = Path(__file__).with_name("numpy_blas.c")
OPENBLAS = "numpy.libs/libscipy_openblas64_*.so"
# Only OpenBLAS links these; they go with it (the real files in numpy.libs and PyInstaller's links beside them).
FORTRAN_RUNTIME = ("libgfortran-*.so*", "libquadmath-*.so*")
# numpy.libs/ and torch/ sit side by side in _internal/; the second entry serves the link _internal/<name> to it.
RPATH = "$ORIGIN/../torch/lib:$ORIGIN/torch/lib"


def is_fortran_runtime(dest: str) -> bool:
    """Whether a bundle entry (a file or PyInstaller's link beside numpy.libs) is OpenBLAS's Fortran runtime."""
    return any(fnmatch(Path(dest).name, pattern) for pattern in FORTRAN_RUNTIME)


def dynamic_symbols(path: Path | str) -> tuple[set[str], set[str]]:
    """The (defined, undefined) dynamic symbols of an ELF file, without version suffixes (readelf)."""
    out = subprocess.run(
        ["readelf", "--dyn-syms", "-W", str(path)], capture_output=True, text=True, check=True
    ).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 8 and fields[0].endswith(":") and fields[4] in ("GLOBAL", "WEAK"):
            name = fields[7].split("@")[0]
            (undefined if fields[6] == "UND" else defined).add(name)
    return defined, undefined


def needed(path: Path | str) -> set[str]:
    """The sonames an ELF file lists as NEEDED (none for a file that is not one)."""
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=False).stdout
    return set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out))


def build(out: Path, soname: str, torch_lib: Path, rpath: str = RPATH) -> Path:
    """Compile numpy_blas.c into ``out``, linked against ``torch_lib``/libtorch_cpu.so."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc)")
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [cc, "-O2", "-shared", "-fPIC", "-o", str(out), str(SOURCE), f"-L{torch_lib}", "-l:libtorch_cpu.so",
         f"-Wl,-soname,{soname}", f"-Wl,-rpath,{rpath}", f"-Wl,-rpath-link,{torch_lib}", "-Wl,--as-needed", "-s"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return out


def missing(shim: Path, wanted: set[str], torch_cpu: Path) -> list[str]:
    """What stops ``shim`` from standing in for OpenBLAS: symbols numpy wants that it lacks, and symbols it wants
    that libtorch_cpu.so lacks."""
    defined, undefined = dynamic_symbols(shim)
    torch_defined, _ = dynamic_symbols(torch_cpu)
    forwarded = {name for name in undefined if re.fullmatch(r"[sdcz]\w+_64", name)}
    return sorted(f"{name} (numpy)" for name in wanted - defined) + sorted(
        f"{name} (libtorch_cpu.so)" for name in forwarded - torch_defined
    )


def replace_openblas(binaries: list, workdir: Path, torch_lib: Path) -> tuple[list, str]:
    """``binaries`` (PyInstaller's (dest, src, kind) entries) with numpy's OpenBLAS replaced by the library built
    from numpy_blas.c and the Fortran runtime left out, and a line saying what was done or why not."""
    openblas = [entry for entry in binaries if fnmatch(entry[0].replace("\\", "/"), OPENBLAS)]
    if len(openblas) != 1:
        return binaries, f"numpy's OpenBLAS kept: {len(openblas)} files match {OPENBLAS}"
    dest, _, kind = openblas[0]
    wanted = set()
    for entry_dest, entry_src, _ in binaries:
        if entry_dest.replace("\\", "/").startswith("numpy/") and entry_dest.endswith(".so"):
            wanted |= {name for name in dynamic_symbols(entry_src)[1] if name.startswith("scipy_")}
    soname = Path(dest).name
    try:
        shim = build(Path(workdir) / "numpy_blas" / soname, soname, torch_lib)
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        return (
            binaries,
            f"numpy's OpenBLAS kept: numpy_blas.c did not build ({getattr(exc, 'stderr', '') or exc})",
        )
    lacking = missing(shim, wanted, torch_lib / "libtorch_cpu.so")
    if lacking:
        return binaries, f"numpy's OpenBLAS kept: symbols missing: {', '.join(lacking[:8])}"

    others = [entry for entry in binaries if entry is not openblas[0] and not is_fortran_runtime(entry[0])]
    if any(
        fnmatch(name, pattern) for entry in others for name in needed(entry[1]) for pattern in FORTRAN_RUNTIME
    ):
        return binaries, "numpy's OpenBLAS kept: another library links its Fortran runtime"
    kept = [
        (dest, str(shim), kind) if entry is openblas[0] else entry
        for entry in binaries
        if not is_fortran_runtime(entry[0])
    ]
    return (
        kept,
        f"numpy's BLAS: {soname} replaced by numpy_blas.c over libtorch_cpu.so ({len(wanted)} symbols)",
    )
