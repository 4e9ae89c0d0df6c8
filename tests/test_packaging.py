"""packaging/check_libs.py: the build's check that the bundle carries what its Qt plugins load (Linux)."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("check_libs", ROOT / "packaging" / "check_libs.py")
assert _spec is not None and _spec.loader is not None
check_libs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_libs)


@pytest.mark.parametrize(
    ("soname", "package"),
    [
        ("libxcb-icccm.so.4", "libxcb-icccm4"),
        ("libxcb-cursor.so.0", "libxcb-cursor0"),
        ("libxkbcommon-x11.so.0", "libxkbcommon-x11-0"),
        ("libfoo.so", "libfoo"),
    ],
)
def test_debian_package_follows_the_soname(soname: str, package: str) -> None:
    assert check_libs.debian_package(soname) == package


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("ldd") is None, reason="Linux, ldd")
def test_a_plugin_without_its_qt_libraries_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """libqxcb.so copied alone into a bundle layout finds Qt's libraries only outside it: not carried."""
    pytest.importorskip("PyInstaller")
    qt = Path(importlib.util.find_spec("PySide6").origin).parent / "Qt"  # type: ignore[arg-type]
    platforms = tmp_path / "_internal" / "PySide6" / "Qt" / "plugins" / "platforms"
    platforms.mkdir(parents=True)
    shutil.copy(qt / "plugins" / "platforms" / "libqxcb.so", platforms)

    assert check_libs.main(["check_libs", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "libQt6XcbQpa.so.6" in err
    assert "apt-get install" in err
