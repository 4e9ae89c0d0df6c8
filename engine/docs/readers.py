"""Files to text: one reader per format, and a clear reason for every file that cannot be read.

A reader returns the file's text as pages (a PDF's real page numbers; one page numbered ``None`` for formats without
pages). A file that cannot be read raises `UnreadableFile` with a reason in words (encrypted, corrupt, too large,
binary under a text name, a zip bomb); the indexer records the reason and skips the file, so one bad file never stops
a folder. Headings found by a reader (docx heading styles, HTML ``<h1>``..``<h6>``) are written as Markdown ``#``
lines so that the chunker sees them the same way in every format.
"""

from __future__ import annotations

import csv
import io
import zipfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

#: Files larger than this are not read (a reason, not a crash): their text would not fit any sensible index.
MAX_FILE_BYTES = 64 * 1024 * 1024
#: A .docx whose members unpack to more than this in all is treated as a zip bomb and never opened.
MAX_DOCX_UNPACKED_BYTES = 256 * 1024 * 1024
#: ... and so is one whose member packs more than this ratio (real Office files stay far below it).
MAX_DOCX_RATIO = 200

TEXT_SUFFIXES = frozenset(
    {
        ".txt",
        ".md",
        ".markdown",
        ".rst",
        ".text",
        ".log",
        ".json",
        ".yaml",
        ".yml",
        ".toml",
        ".ini",
        ".cfg",
        ".xml",
    }
)
CODE_SUFFIXES = frozenset(
    {
        ".py", ".pyi", ".js", ".jsx", ".ts", ".tsx", ".c", ".h", ".cc", ".cpp", ".hpp", ".cxx", ".cs", ".java",
        ".kt", ".go", ".rs", ".rb", ".php", ".swift", ".scala", ".sh", ".bash", ".zsh", ".ps1", ".sql", ".r",
        ".lua", ".pl", ".m", ".jl", ".dart", ".css", ".scss", ".vue", ".svelte",
    }
)  # fmt: skip
HTML_SUFFIXES = frozenset({".html", ".htm", ".xhtml"})
CSV_SUFFIXES = frozenset({".csv", ".tsv"})
SUPPORTED_SUFFIXES = TEXT_SUFFIXES | CODE_SUFFIXES | HTML_SUFFIXES | CSV_SUFFIXES | {".pdf", ".docx"}


class UnreadableFile(Exception):
    """A file that is skipped; ``str(error)`` is the reason in words."""


@dataclass(frozen=True)
class Page:
    """One page of a file's text: ``number`` is 1-based for PDFs, ``None`` for formats without pages."""

    number: int | None
    text: str


def is_supported(path: Path) -> bool:
    """Whether a folder scan picks this file up (by its suffix)."""
    return path.suffix.lower() in SUPPORTED_SUFFIXES


def read_pages(path: Path, data: bytes | None = None) -> list[Page]:
    """Read a file's text as pages.

    Args:
        path: the file; its suffix picks the reader (an unknown suffix is read as text).
        data: the file's bytes when the caller already read them (the indexer hashes them first).

    Raises:
        UnreadableFile: with the reason, for a file too large, encrypted, corrupt, binary under a text name, a
            zip bomb, or with no text at all.
    """
    path = Path(path)
    if data is None:
        try:
            size = path.stat().st_size
        except OSError as exc:
            raise UnreadableFile(f"cannot open: {exc.strerror or exc}") from exc
        if size > MAX_FILE_BYTES:
            raise UnreadableFile(f"too large: {size / 2**20:.0f} MiB (limit {MAX_FILE_BYTES // 2**20} MiB)")
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise UnreadableFile(f"cannot open: {exc.strerror or exc}") from exc
    if len(data) > MAX_FILE_BYTES:
        raise UnreadableFile(f"too large: {len(data) / 2**20:.0f} MiB (limit {MAX_FILE_BYTES // 2**20} MiB)")
    suffix = path.suffix.lower()
    if suffix == ".pdf":
        pages = _read_pdf(data)
    elif suffix == ".docx":
        pages = [Page(None, _read_docx(data))]
    elif suffix in HTML_SUFFIXES:
        pages = [Page(None, html_to_text(decode_text(data)))]
    elif suffix in CSV_SUFFIXES:
        pages = [Page(None, _read_csv(decode_text(data), "\t" if suffix == ".tsv" else ","))]
    else:
        pages = [Page(None, decode_text(data))]
    pages = [p for p in pages if p.text.strip()]
    if not pages:
        raise UnreadableFile("no text found" + (" (a scanned PDF needs OCR)" if suffix == ".pdf" else ""))
    return pages


def decode_text(data: bytes) -> str:
    """Bytes of a text file to text: UTF-8 (with or without a BOM), UTF-16 with a BOM, else Windows-1252.

    Raises:
        UnreadableFile: for binary content (NUL bytes or mostly control characters) under a text name.
    """
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError as exc:
            raise UnreadableFile("corrupt: invalid UTF-16 text") from exc
    head = data[:8192]
    if b"\x00" in head:
        raise UnreadableFile("binary content under a text file name")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    controls = sum(1 for b in head if b < 32 and b not in (9, 10, 12, 13))
    if controls > len(head) * 0.05:
        raise UnreadableFile("binary content under a text file name")
    return data.decode("cp1252", errors="replace")


def _read_pdf(data: bytes) -> list[Page]:
    from pypdf import PdfReader
    from pypdf.errors import FileNotDecryptedError, PdfReadError

    if not data.lstrip()[:5].startswith(b"%PDF"):
        raise UnreadableFile("corrupt: not a PDF file")
    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted:
            try:
                reader.decrypt("")
                reader.pages[0].extract_text()
            except (FileNotDecryptedError, PdfReadError, NotImplementedError) as exc:
                raise UnreadableFile("encrypted: the PDF needs a password") from exc
        return [Page(i + 1, page.extract_text() or "") for i, page in enumerate(reader.pages)]
    except UnreadableFile:
        raise
    except FileNotDecryptedError as exc:
        raise UnreadableFile("encrypted: the PDF needs a password") from exc
    except Exception as exc:  # pypdf raises many kinds on damaged files; each is a corrupt file here
        raise UnreadableFile(f"corrupt PDF: {exc.__class__.__name__}: {exc}"[:300]) from exc


def check_zip_sizes(archive: zipfile.ZipFile) -> None:
    """Refuse an archive whose declared uncompressed sizes are too large or too compressed (a zip bomb).

    Raises:
        UnreadableFile: naming the limit exceeded.
    """
    total = 0
    for info in archive.infolist():
        total += info.file_size
        if info.file_size > 1024 * 1024 and info.file_size > MAX_DOCX_RATIO * max(info.compress_size, 1):
            raise UnreadableFile(
                f"zip bomb: {info.filename} unpacks {info.file_size // max(info.compress_size, 1)}x its size"
            )
    if total > MAX_DOCX_UNPACKED_BYTES:
        raise UnreadableFile(f"zip bomb: unpacks to {total / 2**20:.0f} MiB")


def _read_docx(data: bytes) -> str:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            check_zip_sizes(archive)
            if "word/document.xml" not in archive.namelist():
                raise UnreadableFile("corrupt: not a Word document (no word/document.xml)")
    except zipfile.BadZipFile as exc:
        raise UnreadableFile("corrupt: not a .docx (zip) file") from exc
    import docx

    try:
        document = docx.Document(io.BytesIO(data))
    except Exception as exc:  # python-docx and lxml raise many kinds on damaged files
        raise UnreadableFile(f"corrupt .docx: {exc.__class__.__name__}: {exc}"[:300]) from exc
    blocks: list[str] = []
    for paragraph in document.paragraphs:
        text = paragraph.text.strip()
        if not text:
            continue
        style = (paragraph.style.name if paragraph.style is not None else "") or ""
        if style.startswith("Heading") or style == "Title":
            level = int(style.split()[-1]) if style.split()[-1].isdigit() else 1
            text = "#" * min(level, 6) + " " + text
        blocks.append(text)
    for table in document.tables:
        for row in table.rows:
            cells = [cell.text.strip() for cell in row.cells]
            if any(cells):
                blocks.append(" | ".join(cells))
    return "\n\n".join(blocks)


def _read_csv(text: str, delimiter: str) -> str:
    rows = list(csv.reader(io.StringIO(text), delimiter=delimiter))
    if not rows:
        return ""
    header = rows[0]
    lines = [" | ".join(header)]
    for row in rows[1:]:
        lines.append("; ".join(f"{h}: {v}" if h else v for h, v in zip(header, row, strict=False) if v))
    return "\n".join(lines)


class _TextExtractor(HTMLParser):
    BLOCK = frozenset(
        {"p", "div", "br", "li", "tr", "table", "section", "article", "header", "footer", "blockquote", "pre", "ul",
         "ol", "dl", "dt", "dd", "hr", "main", "nav", "aside", "figure", "figcaption"}
    )  # fmt: skip
    SKIP = frozenset({"script", "style", "noscript", "template", "head"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.SKIP:
            self.skipping += 1
        elif tag in self.BLOCK:
            self.parts.append("\n\n")
        elif len(tag) == 2 and tag[0] == "h" and tag[1] in "123456":
            self.parts.append("\n\n" + "#" * int(tag[1]) + " ")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIP:
            self.skipping = max(0, self.skipping - 1)
        elif tag in self.BLOCK or (len(tag) == 2 and tag[0] == "h" and tag[1] in "123456"):
            self.parts.append("\n\n")

    def handle_data(self, data: str) -> None:
        if not self.skipping and data:
            # inline elements split text ("one <b>bold</b> word"): the spaces at a piece's ends are kept
            text = " ".join(data.split())
            lead = " " if data[0].isspace() else ""
            trail = " " if data[-1].isspace() and text else ""
            self.parts.append(lead + text + trail)


def html_to_text(html: str) -> str:
    """HTML to plain text: scripts and styles dropped, block elements as paragraphs, headings as ``#`` lines."""
    parser = _TextExtractor()
    parser.feed(html)
    parser.close()
    paragraphs = ("".join(parser.parts)).split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs if p.strip())
