"""Entry script of the PyInstaller bundle (``packaging/hearth.spec``): runs ``app.__main__.main``; with
``serve``/``service`` the headless server (``engine.serving.headless``), and with ``--self-test`` the engine's
self-test (``engine.tools.self_test``). Neither of those two imports Qt, so both run on a machine without the
display libraries Qt's GUI needs.

``import app`` (through ``app.__main__``) applies ``app.qtfix`` before any window exists, exactly
as ``python -m app`` does. When Qt's GUI cannot load for want of a system library, the window's start says which
one and how to install it, instead of a traceback.
"""

import multiprocessing
import re
import sys

#: System libraries Qt's GUI loads, by the Debian/Ubuntu package that provides each.
DEBIAN_PACKAGES = {
    "libEGL.so": "libegl1",
    "libGL.so": "libgl1",
    "libOpenGL.so": "libopengl0",
    "libxkbcommon.so": "libxkbcommon0",
    "libxkbcommon-x11.so": "libxkbcommon-x11-0",
    "libfontconfig.so": "libfontconfig1",
    "libfreetype.so": "libfreetype6",
    "libdbus-1.so": "libdbus-1-3",
    "libX11-xcb.so": "libx11-xcb1",
    "libX11.so": "libx11-6",
    "libglib-2.0.so": "libglib2.0-0",
}


def missing_library_message(exc: ImportError) -> str | None:
    """Words for an ImportError that names a missing shared library (``libEGL.so.1: cannot open shared object
    file``); None for any other ImportError."""
    error: BaseException | None = exc
    while error is not None and "cannot open shared object" not in str(error):
        error = error.__cause__ or error.__context__
    found = re.search(r"(lib[\w.+-]*?\.so)(\.[\d.]+)?", str(error))
    if error is None or found is None:
        return None
    library = found.group(1) + (found.group(2) or "")
    package = DEBIAN_PACKAGES.get(found.group(1))
    install = f"On Debian or Ubuntu: sudo apt install {package}" if package else "Install it with your system's packages"
    return (f"Hearth's window cannot start: this machine lacks the system library {library}, which Qt needs to draw "
            f"windows.\n{install}, then start Hearth again.\n"
            "Without a window, 'Hearth serve' runs the server and 'Hearth --self-test PROMPT' checks the engine.")


def run(argv: list[str]) -> int:
    """Start what ``argv`` (the arguments after the program's name) asks for; returns the exit code."""
    if argv[:1] in (["serve"], ["service"]):  # headless: the server without importing Qt at all
        from engine.serving.headless import bundle_main

        return bundle_main(argv)
    if any(arg == "--self-test" or arg.startswith("--self-test=") for arg in argv):
        from engine.tools.self_test import main as self_test

        return self_test(argv)
    try:
        from app.__main__ import main
    except ImportError as exc:
        message = missing_library_message(exc)
        if message is None:
            raise
        print(message, file=sys.stderr)
        return 1
    return main([sys.argv[0], *argv])


if __name__ == "__main__":
    multiprocessing.freeze_support()  # a no-op unless a spawned child process starts the bundle
    sys.exit(run(sys.argv[1:]))
