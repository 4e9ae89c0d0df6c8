"""The GGUF tensor table (engine/loading/gguf_reader.py): one load reads it several times and parses it once; a file
written again is parsed again, and so is a file written too recently for its times to tell two versions apart."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from engine.loading import gguf_reader
from engine.tools.make_gguf import write_gguf


def test_a_tensor_table_is_parsed_once_per_version_of_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tiny.gguf"
    write_gguf(path, "tiny", "Q8_0", layers=1)
    parses: list[str] = []
    parse = gguf_reader._parse_header
    monkeypatch.setattr(gguf_reader, "_parse_header", lambda *args: parses.append(args[1]) or parse(*args))
    monkeypatch.setattr(gguf_reader, "_now_ns", lambda: time.time_ns() + 10**10)  # the file has settled

    metadata, entries = gguf_reader.read_tensor_table(path)
    metadata["general.architecture"] = "changed by a caller"  # a caller's changes stay its own
    again, entries_again = gguf_reader.read_tensor_table(path)
    assert len(parses) == 1 and entries_again == entries and again["general.architecture"] == "llama"
    assert gguf_reader.read_gguf_header(path)[1][0][0] == entries[0].name and len(parses) == 1

    write_gguf(path, "tiny", "Q8_0", layers=2)  # written again: another table
    os.utime(path, ns=(1, 1))
    assert len(gguf_reader.read_tensor_table(path)[1]) > len(entries) and len(parses) == 2
    gguf_reader.read_tensor_table(path, arrays=True)  # the vocabulary's arrays are decoded each time they are asked for
    assert len(parses) == 3


def test_a_file_written_a_moment_ago_is_parsed_at_every_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Written twice within one tick of the file clock, at the same size, a file keeps its key: a cached table of the
    first version would be served for the second (a crafted file's metadata checks then read the old values)."""
    path = tmp_path / "tiny.gguf"
    write_gguf(path, "tiny", "Q8_0", layers=1)
    parses: list[str] = []
    parse = gguf_reader._parse_header
    monkeypatch.setattr(gguf_reader, "_parse_header", lambda *args: parses.append(args[1]) or parse(*args))
    first = gguf_reader.read_tensor_table(path)
    stat = os.stat(path)
    monkeypatch.setattr(gguf_reader, "_now_ns", lambda: max(stat.st_mtime_ns, stat.st_ctime_ns) + 10**6)  # 1 ms on
    assert gguf_reader.read_tensor_table(path) == first and len(parses) == 2
