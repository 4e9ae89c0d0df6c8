"""packaging/check_libs.py: the build's check that the bundle carries what its Qt plugins load (Linux)."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from typing import Any

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


def _load(name: str):  # a module of packaging/
    spec = importlib.util.spec_from_file_location(name, ROOT / "packaging" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


numpy_blas = _load("numpy_blas")
icu_data = _load("icu_data")
_LINUX_TOOLS = sys.platform.startswith("linux") and all(shutil.which(t) for t in ("cc", "readelf"))


def _site(package: str) -> Path:
    return Path(importlib.util.find_spec(package).origin).parent  # type: ignore[arg-type]


# numpy's linear algebra in float32/64 and complex64/128, row- and column-major, strided: every BLAS and LAPACK
# routine numpy imports is reached (gemm, gemv, syrk via a @ a.T, dot, vdot; gesv via solve, getrf via det whose
# sign reads the 64-bit pivots, potrf, gesdd, syevd/heevd, geev, geqrf/orgqr, gelsd).
_NUMPY_LINALG = """
import json, sys
import numpy as np
rng = np.random.default_rng(7)
out = {}
for dtype in (np.float32, np.float64, np.complex64, np.complex128):
    def rand(*shape):
        x = rng.standard_normal(shape)
        return (x + 1j * rng.standard_normal(shape) if np.iscomplexobj(dtype(0)) else x).astype(dtype)
    a, b, v = rand(37, 23), rand(23, 19), rand(23)
    s = rand(29, 29) + 29 * np.eye(29, dtype=dtype)
    spd = s @ s.conj().T
    results = {
        "gemm": a @ b, "gemm_f": np.asfortranarray(a) @ np.asfortranarray(b), "gemm_t": a.T @ a,
        "gemv": a @ v, "gemv_t": v[:19] @ b.T, "gemv_strided": a[::2, ::3] @ v[::3][: a[::2, ::3].shape[1]],
        "syrk": a @ a.T, "dot": v @ v, "vdot": np.vdot(v, v[::-1]), "inner": np.inner(a[:3], a[:4]),
        "solve": np.linalg.solve(s, s[:, :3]), "inv": np.linalg.inv(s), "det": np.linalg.det(s[::-1]),
        "slogdet": np.linalg.slogdet(s[::-1])[0], "cholesky": np.linalg.cholesky(spd),
        "svd": np.linalg.svd(a, compute_uv=False), "eigvalsh": np.linalg.eigvalsh(spd),
        "eigvals": np.sort_complex(np.linalg.eigvals(s)), "qr": np.abs(np.linalg.qr(a)[1]),
        "lstsq": np.linalg.lstsq(a, a[:, 0], rcond=None)[0],
    }
    out[np.dtype(dtype).name] = {k: np.asarray(r, np.complex128).ravel().tolist() for k, r in results.items()}
json.dump({k: {n: [[z.real, z.imag] for z in r] for n, r in d.items()} for k, d in out.items()}, sys.stdout)
"""


@pytest.mark.skipif(not _LINUX_TOOLS, reason="Linux, cc, readelf")
def test_numpys_blas_from_torch_matches_openblas(tmp_path: Path) -> None:
    """The library that replaces numpy's OpenBLAS in the bundle (preloaded here, so numpy's calls bind to it) gives
    numpy's results within float tolerance, for every routine numpy imports."""
    import json
    import os
    import subprocess

    import numpy as np

    openblas = next((_site("numpy").parent / "numpy.libs").glob("libscipy_openblas64_*.so"))
    shim = numpy_blas.build(tmp_path / openblas.name, openblas.name, _site("torch") / "lib", rpath=str(_site("torch") / "lib"))
    wanted = set()
    for ext in _site("numpy").rglob("*.so"):
        wanted |= {n for n in numpy_blas.dynamic_symbols(ext)[1] if n.startswith("scipy_")}
    assert len(wanted) > 40 and numpy_blas.missing(shim, wanted, _site("torch") / "lib" / "libtorch_cpu.so") == []

    def run(preload: bool) -> dict:
        env = dict(os.environ, LD_PRELOAD=str(shim)) if preload else dict(os.environ)
        done = subprocess.run([sys.executable, "-c", _NUMPY_LINALG], capture_output=True, text=True, env=env,
                              check=False, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout)

    expected, got = run(False), run(True)
    for dtype, results in expected.items():
        tol = 2e-3 if dtype in ("float32", "complex64") else 1e-9
        for name, values in results.items():
            assert np.allclose(np.array(got[dtype][name]), np.array(values), rtol=tol, atol=tol), (dtype, name)


@pytest.mark.skipif(not _LINUX_TOOLS, reason="Linux, cc, readelf")
def test_openblas_gives_way_with_its_fortran_runtime_and_stays_when_a_symbol_is_missing(tmp_path: Path) -> None:
    numpy_dir, torch_lib = _site("numpy"), _site("torch") / "lib"
    libs = numpy_dir.parent / "numpy.libs"
    openblas = next(libs.glob("libscipy_openblas64_*.so"))
    gfortran = next(libs.glob("libgfortran-*.so*"))
    umath = next((numpy_dir / "_core").glob("_multiarray_umath*.so"))
    binaries = [
        (f"numpy/_core/{umath.name}", str(umath), "EXTENSION"),
        (f"numpy.libs/{openblas.name}", str(openblas), "BINARY"),
        (f"numpy.libs/{gfortran.name}", str(gfortran), "BINARY"),
        (gfortran.name, f"numpy.libs/{gfortran.name}", "SYMLINK"),
        ("torch/lib/libc10.so", str(torch_lib / "libc10.so"), "BINARY"),
    ]
    kept, note = numpy_blas.replace_openblas(binaries, tmp_path, torch_lib)
    assert [dest for dest, *_ in kept] == [binaries[0][0], binaries[1][0], "torch/lib/libc10.so"], note
    assert kept[1][1] == str(tmp_path / "numpy_blas" / openblas.name) and "replaced" in note
    assert "RUNPATH" in numpy_blas.subprocess.run(["readelf", "-d", kept[1][1]], capture_output=True, text=True).stdout

    shim = Path(kept[1][1])
    assert numpy_blas.missing(shim, {"scipy_cblas_sgemm64_", "scipy_sgesvx_64_"}, torch_lib / "libc10.so") == [
        "scipy_sgesvx_64_ (numpy)", *[f"{n} (libtorch_cpu.so)" for n in
                                      sorted(n for n in numpy_blas.dynamic_symbols(shim)[1] if n.endswith("_64"))]
    ]  # fmt: skip
    unchanged, why = numpy_blas.replace_openblas(binaries[:1] + binaries[2:], tmp_path, torch_lib)
    assert unchanged == binaries[:1] + binaries[2:] and "kept" in why


def test_icu_items_left_out_are_those_of_the_unused_trees() -> None:
    names = ["root.res", "en.res", "brkitr/char.brk", "coll/root.res", "unit/de.res", "zone/en.res", "cnvalias.icu",
             "curr/en.res", "lang/fr.res", "translit/root.res", "rbnf/en.res", "region/en.res", "gb18030.cnv",
             "confusables.cfu", "unit.res"]
    assert icu_data.unused_items(names) == ["brkitr/char.brk", "unit/de.res", "curr/en.res", "lang/fr.res",
                                            "translit/root.res", "rbnf/en.res", "gb18030.cnv", "confusables.cfu"]  # fmt: skip


# What QtCore asks ICU for: case mapping, collation, time-zone names, codecs (number formatting is Qt's own).
_QT_ICU = """
from PySide6.QtCore import QCollator, QDateTime, QLocale, QStringDecoder, QTimeZone
for name in ("en_US", "de_DE", "ja_JP", "tr_TR", "fr_FR"):
    locale = QLocale(name)
    print(locale.toUpper("straße istanbul"), locale.toLower("İSTANBUL ΣΑΣ"), locale.toString(1234567.891, "f", 2))
    collator = QCollator(locale)
    print([collator.compare(x, y) for x, y in (("ä", "z"), ("a", "B"), ("é", "f"), ("10", "9"))])
    for zone in (b"Europe/Berlin", b"America/New_York", b"Asia/Tokyo"):
        tz = QTimeZone(zone)
        print(tz.isValid(), tz.displayName(QTimeZone.StandardTime, QTimeZone.LongName, locale),
              tz.displayName(QTimeZone.DaylightTime, QTimeZone.ShortName, locale))
print(len(QTimeZone.availableTimeZoneIds()))
print("codecs", [QStringDecoder(c).isValid() for c in ("UTF-8", "UTF-16LE", "ISO-8859-1", "Shift_JIS", "GB18030")])
"""


@pytest.mark.skipif(not _LINUX_TOOLS or shutil.which("icupkg") is None, reason="Linux, cc, readelf, icupkg")
def test_the_smaller_icu_data_answers_qt_as_the_whole(tmp_path: Path) -> None:
    import os
    import subprocess

    original = next((_site("PySide6") / "Qt" / "lib").glob("libicudata.so.*"))
    small, removed = icu_data.shrink(original, tmp_path)
    assert removed > 1000 and small.stat().st_size < original.stat().st_size * 0.6
    assert icu_data.data_symbol(small)[0] == icu_data.data_symbol(original)[0]

    def run(preload: Path | None) -> str:
        env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
        if preload:
            env["LD_PRELOAD"] = str(preload)
        done = subprocess.run([sys.executable, "-c", _QT_ICU], capture_output=True, text=True, env=env, check=False,
                              timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    whole, smaller = run(None), run(small)
    assert "Central European" in whole and "codecs [True, True, True, True, True]" in whole
    # The same answers, but for the legacy codecs, whose tables were left out (Qt's own UTF and Latin-1 stay).
    assert smaller.replace("codecs [True, True, True, False, False]", "codecs [True, True, True, True, True]") == whole


def _spec_constant(name: str) -> Any:
    """The literal value the spec assigns to ``name`` (the spec runs only inside PyInstaller, so it is parsed)."""
    import ast

    tree = ast.parse((ROOT / "packaging" / "hearth.spec").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"packaging/hearth.spec assigns no {name}")


def test_the_spec_bundles_the_files_the_wordllama_embedder_reads() -> None:
    """The spec names WordLlama's files one by one; the embedder finds its own by pattern. A wordllama release that
    renames either makes the two disagree here (and stops the build), instead of a bundle that indexes with BM25."""
    from engine.docs.embedders import _wordllama_root, wordllama_files

    root = _wordllama_root()
    read = {path.relative_to(root).as_posix() for path in wordllama_files()}
    assert set(_spec_constant("WORDLLAMA_FILES")) == read
    contents = (ROOT / "packaging" / "bundle-contents.txt").read_text(encoding="utf-8")
    assert "_internal/wordllama\n" in contents
    assert all(f"wordllama/{name}" in contents for name in read)
