"""Check that the bundle carries every library its Qt plugins load: ``python packaging/check_libs.py dist/Hearth``.

PyInstaller only warns ("Library not found") when a plugin's dependency is missing on the build machine, and the
bundle then fails on a user's desktop: without ``libxcb-icccm.so.4`` Qt cannot load ``libqxcb.so`` and the window
never opens. This runs ``ldd`` on every shared library under the bundle's Qt plugins folder, with the bundle's
``_internal`` folder first on the library path as the bundle's bootloader sets it, and fails when a library

* is not found on this machine, so PyInstaller could not copy it (install it and rebuild), or
* is found only on this machine, outside the bundle, although PyInstaller would have bundled it.

Libraries that PyInstaller leaves out on purpose, because every desktop that can use them has its own (glibc,
the OpenGL/EGL driver stack, libxcb, the Wayland client libraries), are the target system's part: when one of
them is missing here it is only reported (e.g. libwayland-cursor on a build machine without Wayland).

Exit status 0 when all resolve, 1 otherwise, with the apt command that installs what is missing (Debian/Ubuntu
package names follow the soname: ``libxcb-icccm.so.4`` is in ``libxcb-icccm4``). Needs PyInstaller (its list of
system libraries) and ``ldd``; build.sh runs it after every Linux build.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

_LDD_LINE = re.compile(r"^\s*(\S+)\s+=>\s+(not found|\S+)")


def debian_package(soname: str) -> str:
    """The Debian/Ubuntu package that usually ships ``soname``: ``libfoo.so.4`` -> ``libfoo4``."""
    name, _, version = soname.partition(".so")
    version = version.lstrip(".").split(".")[0]
    if not version:
        return name
    return f"{name}-{version}" if name[-1].isdigit() else f"{name}{version}"


def unresolved(bundle: Path) -> tuple[dict[str, set[str]], dict[str, set[str]], dict[str, set[str]]]:
    """Libraries the Qt plugins need that are missing, and those found only outside the bundle.

    Returns:
        Three maps from a library's soname to the plugins that need it: not found, although the bundle should
        carry it; found on this machine only, although the bundle should carry it; not found, but left to the
        target system.
    """
    from PyInstaller.depend.dylib import include_library  # build-time only, like the rest of this script

    internal = bundle / "_internal"
    plugins = sorted((internal / "PySide6" / "Qt" / "plugins").rglob("*.so"))
    if not plugins:
        raise SystemExit(f"check_libs: no Qt plugins under {internal}/PySide6/Qt/plugins")
    env = dict(os.environ, LD_LIBRARY_PATH=str(internal))
    root = internal.resolve()
    missing: dict[str, set[str]] = {}
    outside: dict[str, set[str]] = {}
    system: dict[str, set[str]] = {}
    for plugin in plugins:
        run = subprocess.run(["ldd", str(plugin)], env=env, capture_output=True, text=True, check=False)
        where = str(plugin.relative_to(internal))
        for line in run.stdout.splitlines():
            match = _LDD_LINE.match(line)
            if not match:
                continue
            soname, found = match.groups()
            if found == "not found":
                (missing if include_library(soname) else system).setdefault(soname, set()).add(where)
            elif not Path(found).resolve().is_relative_to(root) and include_library(soname):
                outside.setdefault(soname, set()).add(where)
    return missing, outside, system


def main(argv: list[str]) -> int:
    """Check the bundle named on the command line (default ``dist/Hearth``); print what is wrong."""
    if not sys.platform.startswith("linux"):
        return 0
    bundle = Path(argv[1] if len(argv) > 1 else "dist/Hearth")
    missing, outside, system = unresolved(bundle)
    for soname, users in sorted(system.items()):
        print(
            f"check_libs: note: {soname} (the target system's part) is not on this machine; needed by "
            f"{len(users)} plugin(s), e.g. {min(users)}"
        )
    for title, libs in (("not found", missing), ("taken from this machine, not in the bundle", outside)):
        for soname, users in sorted(libs.items()):
            print(f"check_libs: {soname} {title}; needed by {', '.join(sorted(users))}", file=sys.stderr)
    if missing or outside:
        packages = " ".join(sorted({debian_package(name) for name in {*missing, *outside}}))
        print(
            "check_libs: FAIL: the bundle lacks libraries its Qt plugins load, so its window would not open on "
            f"a desktop without them. Install them on the build machine and rebuild:\n"
            f"    sudo apt-get install -y {packages}",
            file=sys.stderr,
        )
        return 1
    print(f"check_libs: every library the Qt plugins need is in {bundle} or part of the system")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
