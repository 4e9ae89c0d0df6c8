"""Indexing real files into a real SQLite index: search finds the right page, changes and deletions are followed,
unreadable files are listed with their reason, and a ``kill -9`` mid-indexing resumes with no duplicates."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from engine.docs import store
from engine.docs.chunking import chunk_pages
from engine.docs.indexer import index_collection
from engine.docs.readers import read_pages
from engine.docs.search import search
from tests.engine.docs.files import write_corrupt_pdf, write_docx, write_pdf, write_zip_bomb_docx

REPO = Path(__file__).resolve().parents[3]

PAGES = [
    "Annual report of the lighthouse society.\nMembers met in the harbour hall.",
    "The lantern lens was polished and the clockwork rotation motor was oiled.",
    "Finances: the society spent 420 pounds on new paint for the tower.",
    "Next year the keepers plan a museum for old foghorns.",
]


def _counts(conn: sqlite3.Connection) -> tuple[int, int, int]:
    files = conn.execute("SELECT COUNT(*) FROM files WHERE reason IS NULL").fetchone()[0]
    chunks = conn.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
    fts = conn.execute("SELECT COUNT(*) FROM chunks_fts").fetchone()[0]
    return files, chunks, fts


def test_search_finds_the_right_page_and_skips_unreadable_files(
    tmp_path: Path, conn: sqlite3.Connection
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    write_pdf(docs / "report.pdf", PAGES)
    write_docx(
        docs / "guide.docx", [("Boats", ["Rowing boats are stored in the shed."]), ("Keys", ["Ask Mary."])]
    )
    write_corrupt_pdf(docs / "broken.pdf")
    write_zip_bomb_docx(docs / "bomb.docx")
    (docs / "photo.txt").write_bytes(b"\x89PNG\x00\x00" * 100)
    (docs / "ignored.bin").write_bytes(b"\x00")

    report = index_collection(conn, "lights", [docs], embedder="wordllama")
    assert report.embedder == "wordllama" and "WordLlama" in report.embedder_reason
    assert sorted(Path(p).name for p in report.indexed) == ["guide.docx", "report.pdf"]
    reasons = {Path(p).name: r for p, r in report.skipped}
    assert set(reasons) == {"broken.pdf", "bomb.docx", "photo.txt"}
    assert reasons["bomb.docx"].startswith("zip bomb") and reasons["broken.pdf"].startswith("corrupt")
    assert reasons["photo.txt"].startswith("binary")

    [hit] = search(conn, "lights", "how much was spent on paint?", top_k=1)
    assert (Path(hit.file).name, hit.page) == ("report.pdf", 3)
    page_text = read_pages(Path(hit.file))[2].text
    assert page_text[hit.start : hit.end] == hit.text
    assert Path(search(conn, "lights", "where are rowing boats kept", top_k=1)[0].file).name == "guide.docx"
    for mode in ("bm25", "vector"):
        assert search(conn, "lights", "foghorn museum lighthouse", top_k=1, mode=mode)[0].page == 4
    [listed] = store.list_collections(conn)
    assert (listed["files"], listed["skipped"], listed["queued"]) == (2, 3, 0)


def test_reindexing_follows_changes_and_deletions(tmp_path: Path, conn: sqlite3.Connection) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# Alpha\n\nThe zebra lives on the savannah.\n")
    (docs / "b.txt").write_text("Bananas are yellow and grow in bunches.\n")
    (docs / "c.md").write_text("Copper conducts electricity well.\n")
    first = index_collection(conn, "notes", [docs], embedder="bm25")
    assert len(first.indexed) == 3 and first.embedder == "bm25"
    assert _counts(conn) == (3, 3, 3)

    again = index_collection(conn, "notes")  # nothing changed: nothing is read again
    assert (again.indexed, again.unchanged, again.removed) == ([], 3, [])

    (docs / "a.md").write_text("# Alpha\n\nThe giraffe lives on the savannah.\n")
    (docs / "b.txt").unlink()
    os.utime(docs / "c.md", (1, 1))  # a touched file with the same content keeps its chunks
    (docs / "sub").mkdir()
    (docs / "sub" / "d.md").write_text("Dolphins sleep with one eye open.\n")
    update = index_collection(conn, "notes")
    assert sorted(Path(p).name for p in update.indexed) == ["a.md", "d.md"]
    assert [Path(p).name for p in update.removed] == ["b.txt"] and update.unchanged == 1
    assert _counts(conn) == (3, 3, 3)
    assert search(conn, "notes", "zebra") == []
    assert Path(search(conn, "notes", "giraffe")[0].file).name == "a.md"
    assert search(conn, "notes", "bananas") == []
    assert Path(search(conn, "notes", "dolphins")[0].file).name == "d.md"

    switched = index_collection(
        conn, "notes", embedder="wordllama"
    )  # new embedder: every file again, with vectors
    assert len(switched.indexed) == 3
    assert conn.execute("SELECT COUNT(*) FROM chunks WHERE vector IS NULL").fetchone()[0] == 0
    assert Path(search(conn, "notes", "marine mammal", mode="vector")[0].file).name == "d.md"


def test_kill_9_mid_indexing_then_resume_completes_without_duplicates(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    n_files = 240
    for i in range(n_files):
        body = "\n\n".join(
            f"File {i} paragraph {j}: " + " ".join(f"term{i}x{k}" for k in range(60)) for j in range(6)
        )
        (docs / f"f{i:03d}.md").write_text(f"# Document {i}\n\n{body}\n")
    home = tmp_path / "home"
    child = subprocess.Popen(
        [sys.executable, "-m", "engine.docs", "index", str(docs), "--collection", "big", "--embedder", "wordllama",
         "--home", str(home)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stderr is not None
    started = 0
    for line in child.stderr:
        started += line.startswith("[")
        if started == 40:
            os.kill(child.pid, signal.SIGKILL)
            break
    child.wait(timeout=30)
    child.stderr.close()
    assert child.returncode == -signal.SIGKILL, "the indexer finished before it could be killed"

    conn = store.connect(home)
    try:
        queued = conn.execute("SELECT COUNT(*) FROM queue").fetchone()[0]
        files, chunks, fts = _counts(conn)
        assert queued > 0 and 0 < files < n_files and queued + files == n_files and chunks == fts

        report = index_collection(conn, "big")  # resumes with the collection's own embedder
        assert report.embedder == "wordllama"
        expected = sum(len(chunk_pages(read_pages(p))) for p in sorted(docs.iterdir()))
        assert _counts(conn) == (n_files, expected, expected)
        assert conn.execute("SELECT COUNT(*) FROM queue").fetchone()[0] == 0
        duplicates = conn.execute(
            'SELECT COUNT(*) FROM (SELECT file_id, page, start, "end" FROM chunks'
            ' GROUP BY file_id, page, start, "end" HAVING COUNT(*) > 1)'
        ).fetchone()[0]
        assert duplicates == 0
        assert conn.execute("SELECT COUNT(*) FROM chunks WHERE vector IS NULL").fetchone()[0] == 0
        assert Path(search(conn, "big", "term7x33", top_k=1)[0].file).name == "f007.md"
    finally:
        conn.close()


def test_cli_index_search_list(tmp_path: Path) -> None:
    write_pdf(tmp_path / "manual.pdf", ["Install the kettle.", "Descale the kettle with vinegar monthly."])
    home = str(tmp_path / "home")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "engine.docs", *args, "--home", home],
            check=False, cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    indexed = run("index", str(tmp_path / "manual.pdf"), "--collection", "kitchen", "--embedder", "bm25")
    assert indexed.returncode == 0, indexed.stderr
    assert "BM25 alone, as asked" in indexed.stdout
    found = run("search", "kitchen", "vinegar descale", "--top-k", "1", "--json")
    assert found.returncode == 0, found.stderr
    [hit] = json.loads(found.stdout)
    assert set(hit) == {"file", "page", "start", "end", "text", "score"}
    assert hit["page"] == 2 and hit["text"] == "Descale the kettle with vinegar monthly."
    listed = json.loads(run("list", "--json").stdout)
    assert [(c["name"], c["files"], c["chunks"]) for c in listed] == [("kitchen", 1, 2)]
    missing = run("search", "nowhere", "x", "--json")
    assert missing.returncode == 2 and "no collection named 'nowhere'" in missing.stderr
    assert run("index", str(tmp_path / "absent.pdf"), "--collection", "kitchen").returncode == 2


def test_bad_input_is_refused_in_words(conn: sqlite3.Connection, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown embedder"):
        index_collection(conn, "x", [tmp_path], embedder="nope")
    with pytest.raises(FileNotFoundError, match="no such file"):
        index_collection(conn, "x", [tmp_path / "absent"])
    with pytest.raises(KeyError, match="no collection"):
        search(conn, "absent", "query")
    index_collection(conn, "plain", [tmp_path], embedder="bm25")
    with pytest.raises(ValueError, match="no vectors"):
        search(conn, "plain", "query", mode="vector")


def test_an_index_chunked_by_an_earlier_version_is_chunked_again(tmp_path: Path) -> None:
    """An index made before sizes were counted in tokens (no ``chunking`` column) gains the column on open, and its
    collection's files are read and cut again on the next run, with nothing of the old chunks left beside the new."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# Alpha\n\n" + "The zebra lives on the savannah. " * 200)
    home = tmp_path / "home"
    conn = store.connect(home)
    index_collection(conn, "notes", [docs], embedder="bm25")
    new_chunks = conn.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
    # the earlier layout: no chunking column, and chunks of another cut (here: one chunk per 50 words)
    conn.execute("ALTER TABLE collections DROP COLUMN chunking")
    conn.execute("DELETE FROM chunks")
    words = (docs / "a.md").read_text().split()
    file_id = conn.execute("SELECT id FROM files").fetchone()[0]
    for i in range(0, len(words), 50):
        conn.execute("INSERT INTO chunks(file_id, collection_id, page, start, \"end\", text) VALUES (?, 1, NULL, 0, 1, ?)",
                     (file_id, " ".join(words[i:i + 50])))
    old_chunks = conn.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
    assert old_chunks != new_chunks
    conn.close()

    conn = store.connect(home)
    assert store.collection_row(conn, "notes")["chunking"] == ""
    again = index_collection(conn, "notes")
    assert [Path(p).name for p in again.indexed] == ["a.md"]
    assert conn.execute("SELECT COUNT(*) FROM chunks").fetchone()[0] == new_chunks
    assert _counts(conn) == (1, new_chunks, new_chunks)
    assert index_collection(conn, "notes").indexed == []  # chunked the way this version cuts: left alone
    conn.close()
