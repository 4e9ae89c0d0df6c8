"""The app says which embedder searches a chat's documents, and why that one (issue 27, item 4): in the notice after
files are attached, and for each folder collection in the collections dialog. Real window on the fake engine, real
index, the real WordLlama weights; no embedding model on disk (tests/conftest.py gives ``auto`` an empty home)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.window.main_window import MainWindow
from engine.docs import store
from engine.docs.indexer import index_collection
from tests.app import ui_flows

#: What ``auto`` picks here, and why: WordLlama, since no embedding model is on disk.
WORDLLAMA_WHY = ("WordLlama static embeddings (256 dimensions), the best embedder available offline: "
                 "no embedding model on disk")
NOTE = "# Harbour\n\nThe night ferry to Skellig leaves from pier seven at eleven.\n"


def test_the_attach_notice_names_the_embedder_and_why(qtbot: Any, window: MainWindow, tmp_path: Path) -> None:
    note = tmp_path / "harbour.md"
    note.write_text(NOTE)
    notices: list[str] = []
    window.chat_pane.documents.notice.connect(notices.append)
    window.chat_pane.attach_files([str(note)])
    status = window.statusBar()
    qtbot.wait_until(lambda: status.currentMessage().startswith("Read "), timeout=20_000)
    assert status.currentMessage() == f"Read 1 file. Search: {WORDLLAMA_WHY}."
    assert notices[-1] == status.currentMessage()


def test_the_collections_dialog_shows_each_collections_embedder_and_why(qtbot: Any, window: MainWindow,
                                                                       tmp_path: Path) -> None:
    folder = tmp_path / "harbour docs"
    folder.mkdir()
    (folder / "ferry.md").write_text(NOTE)
    docs = window.chat_pane.documents
    dialog = ui_flows.open_collections_dialog(qtbot, window)
    assert dialog.search_text == ""  # no collection yet: nothing to say
    assert dialog.create_collection("Harbour", [str(folder)]) == "Harbour"
    ui_flows.wait_collections_idle(qtbot, window)
    harbour = f"Search in “Harbour”: {WORDLLAMA_WHY}."
    assert dialog.search_text == harbour
    assert dialog.row("Harbour")[3] == "Up to date"
    docs.collections.rescan()  # a later scan keeps the embedder: why it was chosen stays said
    ui_flows.wait_collections_idle(qtbot, window)
    assert dialog.search_text == harbour

    # A collection made by `python -m engine.docs index --embedder bm25` is listed with its embedder at once...
    conn = store.connect(docs.index.home)
    try:
        index_collection(conn, "Plain", [folder], embedder="bm25")
    finally:
        conn.close()
    dialog.refresh()
    assert dialog.search_text == f"{harbour}\nSearch in “Plain”: BM25 alone."
    # ...and once the app has indexed it, with why: its index was made with BM25 alone, and the app keeps that.
    docs.collections.rescan()
    ui_flows.wait_collections_idle(qtbot, window)
    assert dialog.search_text == f"{harbour}\nSearch in “Plain”: BM25 alone: the collection's embedder."

    docs.remove_collection("Harbour")
    ui_flows.wait_collections_idle(qtbot, window)
    assert dialog.search_text == "Search in “Plain”: BM25 alone: the collection's embedder."
