"""Real files for the document tests: PDFs with text pages (written by hand: pypdf reads text but cannot draw it),
an encrypted PDF, a corrupt PDF, a .docx with headings and a zip-bomb .docx."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

from engine.docs.bench import pdf_bytes  # the one minimal PDF writer: the bench makes its 300 pages with it


def write_pdf(path: Path, pages: list[str]) -> Path:
    path.write_bytes(pdf_bytes(pages))
    return path


def write_encrypted_pdf(path: Path, pages: list[str], password: str = "secret") -> Path:
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter()
    for page in PdfReader(io.BytesIO(pdf_bytes(pages))).pages:
        writer.add_page(page)
    writer.encrypt(user_password=password, owner_password=password, algorithm="RC4-128")
    with path.open("wb") as f:
        writer.write(f)
    return path


def write_corrupt_pdf(path: Path) -> Path:
    data = pdf_bytes(["This page is fine until it is cut."])
    path.write_bytes(data[: len(data) // 3] + b"\x00garbage\xff" * 20)
    return path


def write_docx(path: Path, sections: list[tuple[str, list[str]]]) -> Path:
    import docx

    document = docx.Document()
    for heading, paragraphs in sections:
        document.add_heading(heading, level=1)
        for paragraph in paragraphs:
            document.add_paragraph(paragraph)
    document.save(str(path))
    return path


def write_zip_bomb_docx(path: Path, unpacked_mib: int = 24) -> Path:
    """A .docx whose document.xml declares (and holds) hundreds of MiB of zeros, compressed to a few hundred KiB."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
        with archive.open("word/document.xml", "w", force_zip64=True) as member:
            block = b"\x00" * (1 << 20)
            for _ in range(unpacked_mib):
                member.write(block)
    return path
