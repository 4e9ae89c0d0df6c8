"""``python -m engine.docs bench``: the document index's speed, measured on generated files, printed as JSON.

Two figures, each against a target of issue 27:

- ``index_pdf``: a generated PDF of ``--pages`` pages (300 by default) indexed from a cold start (reading, chunking,
  the embedder's loading and embedding, the SQLite writes) with ``--embedder`` (the offline default, WordLlama).
- ``search``: a collection of at least ``--chunks`` chunks (20,000 by default) searched with a set of short queries;
  the median milliseconds of each mode, after one untimed query per mode has read the vectors into memory (the
  first query's time is reported apart).

- ``embed``: with ``--embedder PATH`` (an embedding model run by the engine), chunks embedded per second over
  ``--embed-chunks`` generated chunks, after one untimed batch; and sentence-transformers' figure on the same model
  and chunks, with the largest cosine distance between the two, where sentence-transformers is installed (it is
  no dependency of Hearth: the line says when it was skipped and why).

The text is drawn from the WordLlama tokenizer's own English words with Zipf-like frequencies (the common words
common, the rare ones rare), so that BM25's posting lists have the lengths of real prose rather than of a tiny
vocabulary. The run is a benchmark, not a test: the machine it runs on decides the figures.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from engine.docs import embedders, store
from engine.docs.chunking import chunk_text
from engine.docs.indexer import index_collection
from engine.docs.search import MODES, search

WORDS_PER_LINE = 12
LINES_PER_PAGE = 40
QUERIES = 20


def pdf_bytes(pages: list[str]) -> bytes:
    """A minimal valid PDF: one page per string, each line of it drawn in Helvetica (pypdf reads it back)."""

    def escape(text: str) -> str:
        return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")

    page_ids = [4 + 2 * i for i in range(len(pages))]
    kids = " ".join(f"{i} 0 R" for i in page_ids)
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>".encode(),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
    ]
    for page_id, text in zip(page_ids, pages, strict=True):
        lines = [
            "BT /F1 11 Tf 14 TL 50 780 Td",
            *(f"({escape(line)}) Tj T*" for line in text.split("\n")),
            "ET",
        ]
        stream = "\n".join(lines).encode("latin-1", errors="replace")
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >>"
            f" /Contents {page_id + 1} 0 R >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref))
    return out.getvalue()


class Prose:
    """Deterministic word salad with Zipf-like word frequencies, from the WordLlama tokenizer's English words."""

    def __init__(self, seed: int = 0) -> None:
        _, tokenizer = embedders.wordllama_files()
        vocab = json.loads(tokenizer.read_text(encoding="utf-8"))["model"]["vocab"]
        ordered = sorted(vocab.items(), key=lambda item: item[1])  # BPE ids: frequent pieces first
        self.words = [
            piece[1:]
            for piece, _ in ordered
            if piece.startswith("\u2581") and piece[1:].isascii() and piece[1:].isalpha() and len(piece) > 3
        ]
        weights = [1.0 / (rank + 10) for rank in range(len(self.words))]
        self.cumulative = list(itertools.accumulate(weights))
        self.random = random.Random(seed)

    def line(self, n: int = WORDS_PER_LINE) -> str:
        return " ".join(self.random.choices(self.words, cum_weights=self.cumulative, k=n))

    def page(self) -> str:
        """A page: paragraphs of 5 to 10 lines, separated by blank lines."""
        lines: list[str] = []
        while len(lines) < LINES_PER_PAGE:
            lines.extend(self.line() for _ in range(self.random.randint(5, 10)))
            lines.append("")
        return "\n".join(lines[:LINES_PER_PAGE])

    def query(self) -> str:
        """Three to five words of middling frequency, as a user's query is."""
        middle = self.words[200:5000]
        return " ".join(self.random.sample(middle, self.random.randint(3, 5)))


def bench_index_pdf(folder: Path, pages: int, embedder: str, prose: Prose) -> dict[str, object]:
    """Index a generated PDF of ``pages`` pages into a fresh home, the embedder loaded inside the timed run."""
    pdf = folder / "bench.pdf"
    pdf.write_bytes(pdf_bytes([prose.page() for _ in range(pages)]))
    embedders._cache.clear()
    conn = store.connect(folder / "home-pdf")
    try:
        started = time.perf_counter()
        report = index_collection(conn, "bench-pdf", [pdf], embedder)
        seconds = time.perf_counter() - started
    finally:
        conn.close()
    return {
        "pages": pages,
        "pdf_mib": round(pdf.stat().st_size / 2**20, 2),
        "chunks": report.chunks,
        "embedder": report.embedder,
        "seconds": round(seconds, 2),
    }


def bench_search(folder: Path, chunks: int, embedder: str, prose: Prose) -> dict[str, object]:
    """Search a collection of at least ``chunks`` chunks: median milliseconds per mode over ``QUERIES`` queries."""
    texts = folder / "texts"
    texts.mkdir()
    total = 0
    while total < chunks:
        text = "\n\n".join(prose.page() for _ in range(20))
        total += len(chunk_text(text))
        (texts / f"part{len(os.listdir(texts)):05d}.txt").write_text(text, encoding="utf-8")
    conn = store.connect(folder / "home-search")
    try:
        started = time.perf_counter()
        report = index_collection(conn, "bench-search", [texts], embedder)
        index_seconds = time.perf_counter() - started
        queries = [prose.query() for _ in range(QUERIES)]
        modes = [m for m in MODES if report.embedder != "bm25" or m == "bm25"]
        result: dict[str, object] = {
            "chunks": report.chunks,
            "embedder": report.embedder,
            "index_seconds": round(index_seconds, 1),
            "queries": len(queries),
        }
        for mode in modes:
            started = time.perf_counter()
            search(conn, "bench-search", "warm up", mode=mode)
            result[f"{mode}_first_ms"] = round((time.perf_counter() - started) * 1000, 1)
            times = []
            for query in queries:
                started = time.perf_counter()
                search(conn, "bench-search", query, top_k=5, mode=mode)
                times.append((time.perf_counter() - started) * 1000)
            result[f"{mode}_median_ms"] = round(statistics.median(times), 1)
            result[f"{mode}_max_ms"] = round(max(times), 1)
    finally:
        conn.close()
    return result


def bench_embed(path: str, count: int, prose: Prose) -> dict[str, object]:
    """Chunks per second of the embedding model at ``path`` (and of sentence-transformers on it, where installed)."""
    chunks: list[str] = []
    while len(chunks) < count:
        chunks.extend(c.text for c in chunk_text("\n\n".join(prose.page() for _ in range(5))))
    chunks = chunks[:count]
    embedders._cache.clear()
    started = time.perf_counter()
    choice = embedders.choose_embedder(path)
    assert choice.embedder is not None
    result: dict[str, object] = {
        "model": choice.name,
        "load_seconds": round(time.perf_counter() - started, 2),
        "chunks": len(chunks),
    }
    choice.embedder.embed(chunks[:8])  # warm up
    started = time.perf_counter()
    ours = choice.embedder.embed(chunks)
    result["chunks_per_s"] = round(len(chunks) / (time.perf_counter() - started), 1)
    result["sentence_transformers"] = _sentence_transformers(choice.name, chunks, ours)
    return result


def _sentence_transformers(path: str, chunks: list[str], ours: object) -> dict[str, object]:
    """sentence-transformers on the same model and chunks: chunks per second and the largest cosine distance from
    the engine's vectors; or why it was skipped."""
    import importlib.util

    import numpy as np

    if importlib.util.find_spec("sentence_transformers") is None:
        return {"skipped": "sentence-transformers is not installed (it is no dependency of Hearth)"}
    if not Path(path).is_dir():
        return {"skipped": f"the model is not a folder on disk ({path})"}
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(path, device="cpu", local_files_only=True)
    model.encode(chunks[:8])
    started = time.perf_counter()
    theirs = model.encode(chunks, normalize_embeddings=True, convert_to_numpy=True)
    seconds = time.perf_counter() - started
    distance = float(np.max(1.0 - np.sum(np.asarray(ours) * theirs, axis=1)))
    return {"chunks_per_s": round(len(chunks) / seconds, 1), "max_cosine_distance": round(distance, 6)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.docs bench", description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=300, help="pages of the generated PDF (0: skip)")
    parser.add_argument(
        "--chunks", type=int, default=20_000, help="chunks of the searched collection (0: skip)"
    )
    parser.add_argument(
        "--embedder", default="wordllama", metavar="wordllama|bm25|PATH", help="PATH: an embedding model's folder"
    )
    parser.add_argument(
        "--embed-chunks", type=int, default=256, help="chunks embedded to time a model given as PATH (0: skip)"
    )
    args = parser.parse_args(argv)
    prose = Prose()
    out: dict[str, object] = {"cpus": os.cpu_count(), "targets": {"index_pdf_s": 60, "search_median_ms": 50}}
    with tempfile.TemporaryDirectory(prefix="hearth-docs-bench-") as tmp:
        if embedders.is_model_path(args.embedder) and args.embed_chunks > 0:
            try:
                embed = bench_embed(args.embedder, args.embed_chunks, prose)
            except ValueError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            compared = embed["sentence_transformers"]
            if isinstance(compared, dict) and compared.get("skipped"):
                print(f"sentence-transformers comparison skipped: {compared['skipped']}", file=sys.stderr)
            out["embed"] = embed
            print(json.dumps({"embed": embed}), flush=True)
        if args.pages > 0:
            out["index_pdf"] = bench_index_pdf(Path(tmp), args.pages, args.embedder, prose)
            print(json.dumps({"index_pdf": out["index_pdf"]}), flush=True)
        if args.chunks > 0:
            out["search"] = bench_search(Path(tmp), args.chunks, args.embedder, prose)
    print(json.dumps(out, indent=1))
    return 0
