"""A smaller ICU data library for the bundle's Qt (used by packaging/hearth.spec).

Qt's libicudata.so.* is one 30 MiB array (``icudt<N>_dat``) holding all of ICU's data. QtCore calls ICU only for
case mapping, collation (QCollator, locale-aware compare), legacy codecs (QStringConverter) and time-zone names and IDs
(QTimeZone): the ``u_strTo*``, ``ucol_*``, ``ucnv_*`` and ``ucal_*`` functions its dynamic symbols import, no other
Qt library imports any, and nothing else in the bundle links ICU. So the data that only other ICU services read
goes: break-iterator rules and dictionaries (brkitr/, ~3 MiB: Qt finds text boundaries with its own tables),
measurement units (unit/), currency names (curr/), language names (lang/), transliterators (translit/) and
rule-based number formats (rbnf/), and the legacy codec tables (*.cnv) that only a QStringDecoder asked for such
a codec by name reads, which neither the app nor pyqtgraph does: ~18 MiB in all. Locale data, collation, zone and region
names stay.

The array is taken out of the library, the items are removed with ICU's ``icupkg -r`` (package icu-devtools), and
a library of the same soname exporting the same symbol is assembled around the rest. Without icupkg, or when the
library does not look as expected, the original stays and the spec says why.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

# Item folders (the part after "icudt<N>l/") that no ICU service Qt calls reads.
UNUSED_TREES = ("brkitr", "unit", "curr", "lang", "translit", "rbnf")
# Items by suffix: the legacy codec tables (.cnv, ~4.9 MiB; only a QStringDecoder/QStringEncoder asked for such a
# codec by name reads one, and neither the app nor the libraries it uses do; UTF-8/16/32, Latin-1 and the system
# codec are Qt's own), and the spoof checker's confusables (.cfu).
UNUSED_SUFFIXES = (".cnv", ".cfu")


def data_symbol(library: Path) -> tuple[str, int, int]:
    """(name, file offset, size) of the ``icudt<N>_dat`` array in an ICU data library (readelf)."""
    syms = subprocess.run(["readelf", "--dyn-syms", "-W", str(library)], capture_output=True, text=True,
                          check=True).stdout  # fmt: skip
    found = re.findall(r"^\s*\d+: ([0-9a-f]+)\s+(\d+|0x[0-9a-f]+) OBJECT\s+GLOBAL\s+\w+\s+(\d+) (icudt\d+_dat)$",
                       syms, re.MULTILINE)  # fmt: skip
    if len(found) != 1:
        raise ValueError(f"{library.name}: expected one icudt*_dat symbol, found {len(found)}")
    value, size, section, name = found[0]
    sections = subprocess.run(
        ["readelf", "-SW", str(library)], capture_output=True, text=True, check=True
    ).stdout
    for line in sections.splitlines():
        match = re.match(r"\s*\[\s*(\d+)\]\s+\S+\s+\S+\s+([0-9a-f]+)\s+([0-9a-f]+)\s+([0-9a-f]+)", line)
        if match and match[1] == section:
            address, offset = int(match[2], 16), int(match[3], 16)
            return name, int(value, 16) - address + offset, int(size, 0)
    raise ValueError(f"{library.name}: section {section} of {name} not found")


def item_names(package: Path, icupkg: str) -> list[str]:
    """The items of an ICU common data package (``icupkg -l``)."""
    out = subprocess.run([icupkg, "-l", str(package)], capture_output=True, text=True, check=True).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def unused_items(
    names: list[str], trees: tuple[str, ...] = UNUSED_TREES, suffixes: tuple[str, ...] = UNUSED_SUFFIXES
) -> list[str]:
    """The items (``icupkg -l`` names them as ``brkitr/char.brk``) under the ``trees`` folders or with one of the
    ``suffixes``."""
    return [
        name for name in names if ("/" in name and name.split("/")[0] in trees) or name.endswith(suffixes)
    ]


def shrink(library: Path, workdir: Path, trees: tuple[str, ...] = UNUSED_TREES) -> tuple[Path, int]:
    """A copy of ICU data library ``library`` in ``workdir`` without the items under ``trees``, and how many items
    went. Raises RuntimeError when it cannot be made."""
    icupkg = shutil.which("icupkg")
    cc = shutil.which("cc") or shutil.which("gcc")
    if icupkg is None or cc is None:
        raise RuntimeError("icupkg (apt-get install icu-devtools) or a C compiler is missing")
    symbol, offset, size = data_symbol(library)
    workdir.mkdir(parents=True, exist_ok=True)
    package = workdir / f"{symbol.removesuffix('_dat')}l.dat"
    with open(library, "rb") as f:
        f.seek(offset)
        package.write_bytes(f.read(size))
    unused = unused_items(item_names(package, icupkg), trees)
    if not unused:
        raise RuntimeError(f"{library.name}: none of {', '.join(trees)} found in its data")
    listing = workdir / "removed.txt"
    listing.write_text("\n".join(unused) + "\n")
    subprocess.run([icupkg, "-r", str(listing), str(package)], capture_output=True, text=True, check=True)
    soname = re.search(r"SONAME\)\s+Library soname: \[([^\]]+)\]", subprocess.run(
        ["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout)  # fmt: skip
    source = workdir / "icudata.S"
    source.write_text(
        f'.section .rodata\n.globl {symbol}\n.type {symbol}, @object\n.balign 16\n{symbol}:\n.incbin "{package}"\n'
        f'.size {symbol}, .-{symbol}\n.section .note.GNU-stack,"",@progbits\n'
    )
    out = workdir / library.name
    subprocess.run([cc, "-shared", "-nostdlib", "-o", str(out), str(source), "-Wl,-z,noexecstack",
                    f"-Wl,-soname,{soname[1] if soname else library.name}"], capture_output=True, text=True,
                   check=True)  # fmt: skip
    return out, len(unused)
