"""Folder collections in the real window, on the fake engine: made in the dialog from the Attach menu, chosen per
chat, answered from, kept up to date while the app runs (a new file read, a deleted one dropped), the choice kept
after a restart; and, without Qt, a chat's own files and its collections searched together."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices

from app.chat.attachments_bar import AttachmentsBar
from app.data.conversations import STATUS_STREAMING
from app.docs.collection_watcher import RESCAN_MS, TaskResult
from app.docs.collections import index_folders, list_collections, remove_collection
from app.docs.index import DocumentIndex
from app.window.main_window import MainWindow
from tests.app import fake_engine, ui_flows
from tests.engine.docs.files import write_pdf

PAGES = [
    "Harbour guide. The harbour opens at dawn and closes at dusk.",
    "The lighthouse keeper is named Ottoline Brask and she has kept the light since 1987.",
]
FERRY = "Ferry notes.\n\nThe night ferry to Skellig leaves from pier seven at eleven.\n"
PUFFINS = "# Puffins\n\nThe puffin colony on Skellig counts 4812 breeding pairs this year.\n"


def _poll(qtbot: Any, condition: Callable[[], bool], timeout_s: float) -> None:
    """Wait until ``condition()`` holds, checking it every 100 ms (Qt events run meanwhile)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s"
        qtbot.wait(100)


def _ask(qtbot: Any, win: MainWindow, question: str) -> str:
    """The prompt the model was given for ``question`` (its reply is a short one, not the fake's long default)."""
    engine: Any = fake_engine.FakeLLM.instances[-1].engine
    engine.replies.append("Noted.")
    reply = ui_flows.send(qtbot, win, question)
    qtbot.wait_until(lambda: reply.status != STATUS_STREAMING, timeout=10_000)
    return str(engine.submitted[-1][-1]["content"])


def test_a_collection_is_chosen_answered_from_watched_and_kept(qtbot: Any, open_window: Any,
                                                              tmp_path: Path) -> None:
    folder = tmp_path / "harbour docs"
    folder.mkdir()
    (folder / "ferry.txt").write_text(FERRY)
    write_pdf(folder / "harbour.pdf", PAGES)
    data = tmp_path / "data"
    win = open_window(data)
    ui_flows.load_model(qtbot, win)
    docs = win.chat_pane.documents
    chat_id = win.chat_pane.current_conversation.id
    seen: list[tuple[str, int, int, str]] = []
    docs.collections.progress_changed.connect(
        lambda: seen.append(p) if (p := docs.collections.progress()) is not None else None)

    dialog = ui_flows.open_collections_dialog(qtbot, win)
    assert dialog.create_collection("Harbour", [str(folder)], use=False) == "Harbour"
    assert dialog.status_text  # the count and the bar show while it is read
    ui_flows.wait_collections_idle(qtbot, win)
    # progress was reported for it; the count can end early when the folder watcher's own scan of the new folder
    # reads the files first (a fresh-clone run saw only the opening (0, 0)); the row below holds the final count
    assert any(p[0] == "Harbour" for p in seen), seen
    name, folders, files, state = dialog.row("Harbour")
    assert (name, folders, files, state) == ("Harbour", str(folder.resolve()), "2", "Up to date")
    assert docs.chat_collections(chat_id) == []
    dialog.set_used("Harbour", True)  # ticked for this chat
    assert docs.chat_collections(chat_id) == ["Harbour"]
    bar = ui_flows.child(win, AttachmentsBar, "attachmentsBar")
    assert bar.isVisible() and bar.collection_names == ["Harbour"]

    prompt = _ask(qtbot, win, "Who is the lighthouse keeper?")
    assert "harbour.pdf, page 2\nThe lighthouse keeper is named Ottoline Brask" in prompt
    assert "] ferry.txt\n" in prompt and "pier seven" in prompt  # numbered sources: "[n] file, page"

    (folder / "ferry.txt").unlink()  # while the app runs: one file goes, another comes
    (folder / "puffins.md").write_text(PUFFINS)
    docs.collections.rescan()  # what the folder watcher and the periodic scan call
    ui_flows.wait_collections_idle(qtbot, win)
    assert dialog.row("Harbour")[2] == "2"
    prompt = _ask(qtbot, win, "How many puffin pairs are there?")
    assert "4812 breeding pairs" in prompt and "puffins.md" in prompt
    assert "pier seven" not in prompt and "ferry.txt" not in prompt
    win.close()

    again = open_window(data)  # the choice is kept with the chat
    again.chat_pane.select_conversation(chat_id)
    assert again.chat_pane.documents.chat_collections(chat_id) == ["Harbour"]
    assert ui_flows.child(again, AttachmentsBar, "attachmentsBar").collection_names == ["Harbour"]


def test_the_folder_watcher_rescans_on_its_own(qtbot: Any, window: MainWindow, tmp_path: Path) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "a.txt").write_text("Apples grow in the orchard.\n")
    docs = window.chat_pane.documents
    docs.collections.create("Notes", [str(folder)])
    ui_flows.wait_collections_idle(qtbot, window)
    with qtbot.wait_signal(docs.collections.scan_finished, timeout=15_000) as finished:
        (folder / "b.txt").write_text("Pears grow by the wall.\n")
    assert [Path(p).name for p in finished.args[0].outcome.indexed] == ["b.txt"]
    ui_flows.wait_collections_idle(qtbot, window)
    [info] = docs.collections.collections()
    assert info.files == 2


def test_a_watched_folder_that_changes_while_the_chat_runs_is_answered_from(
        qtbot: Any, window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = fake_engine.reply_for

    def reply_for(messages: Any) -> str:  # the fake model states the fact and cites every source it was given
        last = messages[-1]["content"] if not isinstance(messages, str) else messages
        if "Sources:" not in last:
            return plain(messages)
        return "The colony counts 4812 breeding pairs " + " ".join(
            f"[{n}]" for n in re.findall(r"^\[(\d+)\] ", last, re.MULTILINE)) + "."

    monkeypatch.setattr(fake_engine, "reply_for", reply_for)
    opened_at = time.monotonic()
    folder = tmp_path / "harbour docs"
    folder.mkdir()
    (folder / "ferry.txt").write_text(FERRY)
    write_pdf(folder / "harbour.pdf", PAGES)
    ui_flows.load_model(qtbot, window)
    docs = window.chat_pane.documents
    assert ui_flows.open_collections_dialog(qtbot, window).create_collection("Harbour", [str(folder)]) == "Harbour"  # ticked for the chat
    _poll(qtbot, lambda: not docs.collections.is_busy, 20)
    conversation = window.chat_pane.current_conversation
    assert conversation is not None and docs.chat_collections(conversation.id) == ["Harbour"]
    scans: list[TaskResult] = []
    docs.collections.scan_finished.connect(scans.append)

    (folder / "ferry.txt").unlink()  # while the window runs, no rescan asked for: the folder watcher sees it
    (folder / "puffins.md").write_text(PUFFINS)
    _poll(qtbot, lambda: any(str((folder / "puffins.md").resolve()) in r.outcome.indexed for r in scans)
          and not docs.collections.is_busy, 10)
    assert time.monotonic() - opened_at < RESCAN_MS / 1000  # before the periodic scan's first turn
    [info] = docs.collections.collections()
    assert info.files == 2  # harbour.pdf and puffins.md: ferry.txt was dropped

    reply = ui_flows.send(qtbot, window, "How many puffin pairs are there?")
    _poll(qtbot, lambda: reply.status != STATUS_STREAMING, 10)
    submitted: Any = fake_engine.FakeLLM.instances[-1].engine.submitted
    prompt = str(submitted[-1][-1]["content"])
    assert "] puffins.md\n# Puffins" in prompt and "pier seven" not in prompt
    index = len(conversation.messages) - 1
    shown = docs.shown_sources(conversation.messages[index])
    assert shown is not None and shown.is_cited
    labels = {source.label: number for number, source in shown.entries}
    assert "puffins.md" in labels and "ferry.txt" not in labels, labels
    text = window.chat_pane.view.message_text(index).split("Sources", 1)[1]
    assert f"[{labels['puffins.md']}] puffins.md" in text and "4812 breeding pairs" in text
    assert "ferry.txt" not in text

    href = f"hearth:source/{index}/{labels['puffins.md']}"
    assert href in window.chat_pane.view.hrefs(index)
    opened: list[QUrl] = []

    def open_url(url: QUrl) -> bool:  # the desktop is asked to open it (and opens nothing here)
        opened.append(url)
        return True

    monkeypatch.setattr(QDesktopServices, "openUrl", staticmethod(open_url))
    window.chat_pane.view.anchorClicked.emit(QUrl(href))
    assert [u.toLocalFile() for u in opened] == [str((folder / "puffins.md").resolve())]


def test_bad_collections_are_refused_in_words_and_removal_unchooses(qtbot: Any, window: MainWindow,
                                                                     tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.md").write_text("# A\n\nSome text.\n")
    dialog = ui_flows.open_collections_dialog(qtbot, window)
    assert dialog.create_collection("  ", [str(folder)]) is None and "needs a name" in dialog.error_text
    assert dialog.create_collection("chat-3", [str(folder)]) is None and "attached files" in dialog.error_text
    assert dialog.create_collection("Docs", [str(tmp_path / "missing")]) is None and "Not a folder" in dialog.error_text
    assert dialog.create_collection("Docs", [str(folder)]) == "Docs" and not dialog.error_text
    ui_flows.wait_collections_idle(qtbot, window)
    assert dialog.create_collection("Docs", [str(folder)]) is None and "already" in dialog.error_text
    docs = window.chat_pane.documents
    conversation = window.chat_pane.current_conversation
    assert conversation is not None
    chat_id = conversation.id
    assert docs.chat_collections(chat_id) == ["Docs"]  # made from the chat: used by it
    docs.remove_collection("Docs")
    ui_flows.wait_collections_idle(qtbot, window)
    assert docs.chat_collections(chat_id) == [] and dialog.row("Docs") == []
    assert ui_flows.child(window, AttachmentsBar, "attachmentsBar").collection_names == []


def test_a_chats_files_and_its_collections_are_searched_together(tmp_path: Path) -> None:
    index = DocumentIndex(tmp_path / "documents")
    own = tmp_path / "own.txt"
    own.write_text("The harbour master is Ines Varga.\n")
    index.index(5, [str(own)])
    folder = tmp_path / "folder"
    folder.mkdir()
    filler = "\n\n".join(f"Paragraph {i} is about the weather and the sea and nothing else." for i in range(400))
    (folder / "long.txt").write_text(filler + "\n\nThe secret harbour code is PELICAN-42.\n\n" + filler)
    index_folders(index, "Sea", [str(folder)])
    assert [c.name for c in list_collections(index)] == ["Sea"]  # the chat's own collection is not listed

    whole = index.prepare(5, "Who is the harbour master?", budget_tokens=10**6, collections=["Sea"])
    assert whole is not None and whole.is_whole and {Path(s.file).name for s in whole.sources} == {"own.txt",
                                                                                                  "long.txt"}
    retrieved = index.prepare(5, "What is the harbour code? Who is the harbour master?", budget_tokens=1500,
                              collections=["Sea", "gone"])
    assert retrieved is not None and not retrieved.is_whole
    names = [Path(s.file).name for s in retrieved.sources]
    assert "own.txt" in names and any("PELICAN-42" in s.text for s in retrieved.sources)
    assert index.prepare(5, "x", budget_tokens=1500) is not None  # without the collection: its own file alone
    remove_collection(index, "Sea")
    assert list_collections(index) == []
    only_own = index.prepare(5, "What is the harbour code?", budget_tokens=1500, collections=["Sea"])
    assert only_own is not None and {Path(s.file).name for s in only_own.sources} == {"own.txt"}
