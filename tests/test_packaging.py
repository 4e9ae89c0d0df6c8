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


_contents_spec = importlib.util.spec_from_file_location("check_contents", ROOT / "packaging" / "check_contents.py")
assert _contents_spec is not None and _contents_spec.loader is not None
check_contents = importlib.util.module_from_spec(_contents_spec)
_contents_spec.loader.exec_module(check_contents)


def _fake_bundle(root: Path, *entries: str) -> Path:
    bundle = root / "Hearth"
    (bundle / "_internal").mkdir(parents=True)
    (bundle / "Hearth").write_bytes(b"")
    for entry in entries:
        path = bundle / "_internal" / entry
        if entry.endswith("/"):
            path.mkdir()
        else:
            path.write_bytes(b"")
    return bundle


def test_the_declared_list_flags_what_the_build_machine_added(tmp_path: Path) -> None:
    """GTK copied in because the build machine had it, and a listed part the bundle lacks, both fail the build."""
    listed = tmp_path / "contents.txt"
    listed.write_text("[files]\nHearth\n_internal\n_internal/torch  # comment\n_internal/libQt6Core.so.6\n"
                      "_internal/numpy-*.dist-info\n_internal/native\n[modules]\nengine\ntorch\n")
    bundle = _fake_bundle(tmp_path, "torch/", "libQt6Core.so.6", "numpy-2.4.6.dist-info/", "libgtk-3.so.0")

    problems = check_contents.check(check_contents.bundle_files(bundle), ["engine", "torch", "gi"],
                                    check_contents.read_list(listed))

    assert problems == [
        "file _internal/libgtk-3.so.0 is not in the declared list",
        "file pattern '_internal/native' matches nothing in the bundle",
        "module gi is not in the declared list",
    ]


def test_a_bundle_that_matches_its_list_passes(tmp_path: Path) -> None:
    listed = tmp_path / "contents.txt"
    listed.write_text("[files]\nHearth\n_internal\n_internal/torch\n[modules]\ntorch\n")
    bundle = _fake_bundle(tmp_path, "torch/")
    assert check_contents.check(check_contents.bundle_files(bundle), ["torch"], check_contents.read_list(listed)) == []


def test_the_declared_list_parses(tmp_path: Path) -> None:
    declared = check_contents.read_list(check_contents.DEFAULT_LIST)
    assert "_internal/torch" in declared["files"] and "torch" in declared["modules"]
    assert not any("gtk" in pattern.lower() for pattern in declared["files"])
    broken = tmp_path / "broken.txt"
    broken.write_text("torch\n")
    with pytest.raises(ValueError, match="before any section"):
        check_contents.read_list(broken)


def test_the_bundles_torch_compile_imports_nothing() -> None:
    """The runtime hook makes ``torch.compile`` a no-op that needs neither TorchDynamo nor sympy, which the bundle
    leaves out: llguidance's torch helpers apply it at import, and every constrained request failed without it."""
    import subprocess

    code = f"""
import runpy, sys
runpy.run_path({str(ROOT / "packaging" / "rthook_no_compile.py")!r})
import torch
def double(x):
    return 2 * x
assert torch.compile(dynamic=True)(double) is double and torch.compile(double) is double
assert "torch._dynamo" not in sys.modules and "sympy" not in sys.modules, "torch.compile imported its compiler"
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=300)
    assert done.stdout.strip() == "ok", done.stderr


@pytest.mark.parametrize(("given", "expected"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_the_bundles_openmp_threads_sleep_while_waiting(
    monkeypatch: pytest.MonkeyPatch, given: str | None, expected: str
) -> None:
    """Spinning OpenMP threads made loads several times slower on a busy machine; a user's own setting wins."""
    import runpy

    if given is None:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", given)
    runpy.run_path(str(ROOT / "packaging" / "rthook_threads.py"))
    import os

    assert os.environ["OMP_WAIT_POLICY"] == expected
