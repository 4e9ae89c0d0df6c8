"""Readers on real files: page numbers kept, headings marked, and every unreadable file refused with its reason."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from engine.docs import readers
from engine.docs.readers import UnreadableFile, read_pages
from tests.engine.docs.files import (
    write_corrupt_pdf,
    write_docx,
    write_encrypted_pdf,
    write_pdf,
    write_zip_bomb_docx,
)


def test_pdf_pages_keep_their_numbers(tmp_path: Path) -> None:
    path = write_pdf(tmp_path / "a.pdf", ["First page text.", "Second page (with parentheses).", "Third."])
    pages = read_pages(path)
    assert [p.number for p in pages] == [1, 2, 3]
    assert "Second page (with parentheses)." in pages[1].text


def test_docx_headings_become_markdown_headings(tmp_path: Path) -> None:
    path = write_docx(tmp_path / "a.docx", [("Overview", ["Body one.", "Body two."]), ("Details", ["More."])])
    [page] = read_pages(path)
    assert page.number is None
    assert page.text == "# Overview\n\nBody one.\n\nBody two.\n\n# Details\n\nMore."


def test_html_code_csv_and_utf16(tmp_path: Path) -> None:
    html = tmp_path / "a.html"
    html.write_text("<html><head><title>x</title><style>p{}</style></head><body><h2>Title</h2><p>One &amp; two."
                    "</p><script>var x;</script><p>Three <b>bold</b> words</p></body></html>")  # fmt: skip
    assert read_pages(html)[0].text == "## Title\n\nOne & two.\n\nThree bold words"
    code = tmp_path / "a.py"
    code.write_text("def f():\n    return 1\n")
    assert "return 1" in read_pages(code)[0].text
    table = tmp_path / "a.csv"
    table.write_text("name,city\nAda,London\nGrace,Arlington\n")
    assert read_pages(table)[0].text == "name | city\nname: Ada; city: London\nname: Grace; city: Arlington"
    wide = tmp_path / "w.txt"
    wide.write_bytes("héllo wörld".encode("utf-16"))
    assert read_pages(wide)[0].text == "héllo wörld"


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda d: write_corrupt_pdf(d / "bad.pdf"), "corrupt PDF"),
        (lambda d: write_encrypted_pdf(d / "locked.pdf", ["secret"]), "encrypted"),
        (lambda d: write_zip_bomb_docx(d / "bomb.docx"), "zip bomb"),
        (lambda d: (d / "fake.docx").write_bytes(b"not a zip at all") and d / "fake.docx", "corrupt"),
        (lambda d: (d / "fake.pdf").write_bytes(b"hello") and d / "fake.pdf", "not a PDF"),
        (lambda d: (d / "image.txt").write_bytes(bytes(range(256)) * 4) and d / "image.txt", "binary"),
        (lambda d: (d / "blank.md").write_text("  \n\n ") and d / "blank.md", "no text"),
        (lambda d: write_pdf(d / "scan.pdf", [""]), "no text"),
    ],
    ids=[
        "corrupt-pdf",
        "encrypted-pdf",
        "zip-bomb-docx",
        "not-a-zip",
        "not-a-pdf",
        "binary",
        "empty",
        "no-text",
    ],
)
def test_unreadable_files_are_refused_with_the_reason(
    tmp_path: Path, make: Callable[[Path], Path], reason: str
) -> None:
    path = make(tmp_path)
    with pytest.raises(UnreadableFile, match=reason):
        read_pages(path)


def test_too_large_and_total_unpacked_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    big = tmp_path / "big.txt"
    big.write_text("word " * 1000)
    monkeypatch.setattr(readers, "MAX_FILE_BYTES", 1000)
    with pytest.raises(UnreadableFile, match="too large"):
        read_pages(big)
    monkeypatch.undo()
    doc = write_docx(tmp_path / "ok.docx", [("Heading", ["Text."])])
    monkeypatch.setattr(readers, "MAX_DOCX_UNPACKED_BYTES", 1000)
    with pytest.raises(UnreadableFile, match="zip bomb: unpacks to"):
        read_pages(doc)
