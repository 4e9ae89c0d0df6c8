"""The native step's C++ builds warning-free (``-Wall -Werror``) for this CPU and for each of the bundle's CPU levels.

The suite builds with ``HEARTH_NATIVE_WERROR=1`` (``tests/conftest.py``), so the session's own build covers this CPU,
and ``test_native.py`` builds and runs each bundled copy this CPU can run; this module builds the rest.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.model import native, native_build


@pytest.mark.slow
@pytest.mark.skipif(native_build.compiler() is None, reason="no C++ compiler on this machine")
@pytest.mark.parametrize(("march", "needs"), [b[1:] for b in native.BUNDLED_BUILDS], ids=lambda v: str(v)[:24])
def test_the_bundles_levels_build_with_every_warning_an_error(
    march: tuple[str, ...], needs: tuple[str, ...], tmp_path: Path
) -> None:
    """Compiling for a CPU level this machine cannot run is fine: nothing is loaded, only built."""
    if set(needs) <= native.hardware.cpu_flags_and_model()[0]:
        pytest.skip("this CPU runs that copy: test_native.py builds it (with -Werror) and runs it")
    library = tmp_path / "decode_step.so"
    native_build.build(library, march=march, warnings_as_errors=True)
    assert library.is_file() and library.stat().st_size > 0


@pytest.mark.skipif(native_build.compiler() is None, reason="no C++ compiler on this machine")
@pytest.mark.parametrize(("env", "expected"), [(None, False), ("0", False), ("1", True)])
def test_warnings_are_errors_only_where_asked(
    env: str | None, expected: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's first-start build keeps warnings as warnings; ``make install`` and the tests ask for -Werror."""
    commands: list[list[str]] = []
    monkeypatch.setattr(native_build, "_run", commands.append)  # record the commands, compile nothing
    monkeypatch.setattr(native_build.os, "replace", lambda *_: None)
    if env is None:
        monkeypatch.delenv(native_build.WERROR_ENV, raising=False)
    else:
        monkeypatch.setenv(native_build.WERROR_ENV, env)
    native_build.build(tmp_path / "decode_step.so")
    compiles = [cmd for cmd in commands if "-c" in cmd]
    assert len(compiles) == len([p for p in native_build.sources() if p.suffix == ".cpp"])
    assert all("-Wall" in cmd and ("-Werror" in cmd) is expected for cmd in compiles)


@pytest.mark.parametrize(("background", "niceness"), [(True, native_build.BACKGROUND_NICENESS), (False, 0)])
def test_a_background_build_compiles_at_a_lower_priority(
    background: bool, niceness: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build a load starts runs its compiler niced, leaving the cores to the load beside it; a build someone waits
    for does not. The compiler here is a script that notes its niceness (``nice`` with no arguments prints it)."""
    if os.nice(0) != 0:
        pytest.skip("the tests already run niced")
    noted = tmp_path / "niceness"
    script = tmp_path / "c++"
    script.write_text(f"#!/bin/sh\nnice >> {noted}\nexit 1\n")
    script.chmod(0o755)
    monkeypatch.setenv("CXX", str(script))
    with pytest.raises(RuntimeError, match="the C\\+\\+ build failed"):
        native_build.build(tmp_path / "decode_step.so", background=background)
    assert {int(line) for line in noted.read_text().split()} == {niceness}


def test_the_kernel_kinds_match_the_cpp_enum() -> None:
    """``native._KINDS`` numbers each kernel kind as ``csrc/linear.h``'s ``LinearKind`` does: a kind added on one side
    only would run the wrong kernel, so the two are read and compared here."""
    import re

    header = (native_build.SOURCE_DIR / "linear.h").read_text()
    body = re.search(r"enum\s+LinearKind[^{]*\{([^}]*)\}", header)
    assert body is not None, "csrc/linear.h no longer declares enum LinearKind"
    cpp = {re.sub(r"(?<!^)([A-Z])", r"_\1", name[1:]).lower(): int(value)
           for name, value in re.findall(r"(k\w+)\s*=\s*(\d+)", body.group(1))}
    assert cpp == native._KINDS
