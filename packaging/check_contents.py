"""Check a built bundle against the declared list: ``python packaging/check_contents.py dist/Hearth``.

What PyInstaller collects depends on the build machine: a hook copies whatever it finds installed (GTK through
Qt's GTK3 theme, the metadata of test tools, a second copy of a library), and nothing says so. The bundle is meant
to be built from a list instead: ``packaging/bundle-contents.txt`` names, as shell patterns,

* ``[files]``: every entry allowed directly under the bundle's ``_internal/`` folder (libraries, package folders,
  ``.dist-info`` folders, the model, the native decode step) and beside it (``Hearth``, ``_internal``), and
* ``[modules]``: every top-level module or package allowed in its bytecode archive (the PYZ inside the
  executable), Python's standard library aside.

This fails (exit 1) naming each entry and module that the list does not allow, and each pattern that matched
nothing (a part the list promises and the bundle lacks). build.sh runs it after every build; a new dependency
means adding it to the list, on purpose.
"""

from __future__ import annotations

import sys
from fnmatch import fnmatchcase
from pathlib import Path

DEFAULT_LIST = Path(__file__).resolve().parent / "bundle-contents.txt"
SECTIONS = ("files", "modules")


def read_list(path: Path) -> dict[str, list[str]]:
    """The patterns of each section of a contents list (``# comments`` and blank lines skipped)."""
    sections: dict[str, list[str]] = {name: [] for name in SECTIONS}
    current: list[str] | None = None
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            if line[1:-1] not in sections:
                raise ValueError(f"{path}:{number}: unknown section {line}; the sections are {', '.join(SECTIONS)}")
            current = sections[line[1:-1]]
        elif current is None:
            raise ValueError(f"{path}:{number}: {line!r} comes before any section")
        else:
            current.append(line)
    return sections


def bundle_files(bundle: Path) -> list[str]:
    """The entries directly under ``bundle`` and its ``_internal`` folder, as ``Hearth`` and ``_internal/torch``."""
    names = [entry.name for entry in bundle.iterdir()]
    internal = bundle / "_internal"
    if internal.is_dir():
        names += [f"_internal/{entry.name}" for entry in internal.iterdir()]
    return sorted(names)


def bundle_modules(bundle: Path) -> list[str]:
    """The top-level names of the modules in the executable's PYZ, the standard library left out (needs
    PyInstaller, as the build does)."""
    from PyInstaller.archive.readers import CArchiveReader

    executable = next((p for p in (bundle / "Hearth", bundle / "Hearth.exe") if p.is_file()), None)
    if executable is None:
        raise SystemExit(f"check_contents: no Hearth executable in {bundle}")
    archive = CArchiveReader(str(executable))
    names: set[str] = set()
    for name in archive.toc:
        if name.endswith(".pyz"):
            names.update(module.split(".")[0] for module in archive.open_embedded_archive(name).toc)
    return sorted(names - set(sys.stdlib_module_names))


def unlisted(names: list[str], patterns: list[str]) -> tuple[list[str], list[str]]:
    """The names no pattern allows, and the patterns that allow no name."""
    outside = [name for name in names if not any(fnmatchcase(name, pattern) for pattern in patterns)]
    unused = [pattern for pattern in patterns if not any(fnmatchcase(name, pattern) for name in names)]
    return outside, unused


def check(files: list[str], modules: list[str], declared: dict[str, list[str]]) -> list[str]:
    """Every problem, one line each: an entry or module outside the list, or a declared part the bundle lacks."""
    problems = []
    for what, names, patterns in (("file", files, declared["files"]), ("module", modules, declared["modules"])):
        outside, unused = unlisted(names, patterns)
        problems += [f"{what} {name} is not in the declared list" for name in outside]
        problems += [f"{what} pattern {pattern!r} matches nothing in the bundle" for pattern in unused]
    return problems


def main(argv: list[str]) -> int:
    """Check the bundle named on the command line (default ``dist/Hearth``) against ``bundle-contents.txt``."""
    bundle = Path(argv[1] if len(argv) > 1 else "dist/Hearth")
    declared = read_list(Path(argv[2]) if len(argv) > 2 else DEFAULT_LIST)
    files = bundle_files(bundle)
    modules = bundle_modules(bundle)
    problems = check(files, modules, declared)
    for line in problems:
        print(f"check_contents: {line}", file=sys.stderr)
    if problems:
        print(
            f"check_contents: FAIL: {bundle} differs from {DEFAULT_LIST.name}. Leave out what the build machine "
            "brought by accident (packaging/hearth.spec: excludes, DROP), or declare what the app now needs.",
            file=sys.stderr,
        )
        return 1
    print(f"check_contents: {bundle} holds only what {DEFAULT_LIST.name} declares ({len(files)} entries, "
          f"{len(modules)} top-level packages besides the standard library)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
