"""Attaching documents to a chat in the real window, on the fake engine: indexing off the GUI thread with progress,
the numbered sources in the prompt, the Sources list under the reply (cited sources only) and a click on one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDesktopServices, QDropEvent

from app.chat.attachments_bar import AttachmentsBar
from app.data.conversations import STATUS_DONE, STATUS_STREAMING
from app.window.main_window import MainWindow
from engine.docs.bench import Prose
from tests.app import fake_engine, ui_flows
from tests.engine.docs.files import write_corrupt_pdf, write_pdf

PAGES = [
    "Harbour guide. The harbour opens at dawn and closes at dusk.",
    "The lighthouse keeper is named Ottoline Brask and she has kept the light since 1987.",
    "Tides. The spring tide rises four metres above the low water mark.",
]


@pytest.fixture
def cited_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake model answers a prompt with sources by citing [2] (real) and [9] (invented)."""
    plain = fake_engine.reply_for

    def reply_for(messages: Any) -> str:
        last = messages[-1]["content"] if not isinstance(messages, str) else messages
        if "Sources:" in last:
            return "The keeper is Ottoline Brask [2]. She also runs the museum [9]."
        return plain(messages)

    monkeypatch.setattr(fake_engine, "reply_for", reply_for)


def _bar(win: MainWindow) -> AttachmentsBar:
    return ui_flows.child(win, AttachmentsBar, "attachmentsBar")


def _intercept_opens(monkeypatch: pytest.MonkeyPatch) -> list[QUrl]:
    """The URLs the app asks the desktop to open from now on (none is opened)."""
    opened: list[QUrl] = []

    def open_url(url: QUrl) -> bool:
        opened.append(url)
        return True

    monkeypatch.setattr(QDesktopServices, "openUrl", staticmethod(open_url))
    return opened


def _wait_read(qtbot: Any, win: MainWindow) -> None:
    conversation = win.chat_pane.current_conversation
    assert conversation is not None
    qtbot.wait_until(lambda: not win.chat_pane.documents.is_indexing(conversation.id), timeout=20_000)


def test_attach_a_pdf_ask_and_click_the_cited_source(qtbot: Any, window: MainWindow, tmp_path: Path,
                                                    cited_reply: None, monkeypatch: pytest.MonkeyPatch) -> None:
    pdf = write_pdf(tmp_path / "harbour.pdf", PAGES)
    ui_flows.load_model(qtbot, window)
    pane = window.chat_pane
    progress: list[tuple[int, int, str]] = []
    pane.documents.progress_changed.connect(
        lambda cid: progress.append(p) if (p := pane.documents.progress(cid)) is not None else None)
    assert pane.attach_files([str(pdf)]) == [str(pdf.resolve())]
    assert _bar(window).isVisible() and _bar(window).status_text  # the count and bar show at once
    _wait_read(qtbot, window)
    assert progress[-1][:2] == (1, 1)  # the count reached the end
    assert not _bar(window).status_text and _bar(window).chip_paths == [str(pdf.resolve())]

    reply = ui_flows.send(qtbot, window, "Who is the lighthouse keeper?")
    qtbot.wait_until(lambda: reply.status != STATUS_STREAMING, timeout=10_000)
    [llm] = fake_engine.FakeLLM.instances
    submitted: Any = llm.engine.submitted
    prompt = submitted[-1][-1]["content"]
    assert "[2] harbour.pdf, page 2\nThe lighthouse keeper is named Ottoline Brask" in prompt
    assert prompt.endswith("Question: Who is the lighthouse keeper?")  # the stored message is what was typed
    conversation = pane.current_conversation
    assert conversation is not None and conversation.messages[-2].content == "Who is the lighthouse keeper?"

    index = len(conversation.messages) - 1
    text = pane.view.message_text(index)
    assert "Sources" in text and "[2] harbour.pdf, page 2" in text and "Ottoline" in text
    assert "[9]" not in text.split("Sources", 1)[1] and "page 1" not in text  # invented and uncited: not listed
    shown = pane.documents.shown_sources(conversation.messages[-1])
    assert shown is not None and [n for n, _ in shown.entries] == [2]
    score = shown.entries[0][1].score  # its retrieval score, drawn beside the label
    assert score > 0 and f"[2] harbour.pdf, page 2  ·  score {score:.3f}  ·  " in text, text
    sources = [h for h in pane.view.hrefs(index) if h.startswith("hearth:source/")]
    assert sources == [f"hearth:source/{index}/2"]

    opened = _intercept_opens(monkeypatch)
    pane.view.anchorClicked.emit(QUrl(sources[0]))
    assert [u.toLocalFile() for u in opened] == [str(pdf.resolve())]


def test_the_chat_answers_while_a_large_document_is_read(qtbot: Any, window: MainWindow, tmp_path: Path) -> None:
    prose = Prose(seed=1)
    book = write_pdf(tmp_path / "book.pdf", [prose.page() for _ in range(800)])  # seconds to read (~1.7 MB)
    ui_flows.load_model(qtbot, window)
    pane = window.chat_pane
    conversation = pane.current_conversation
    assert conversation is not None
    pane.attach_files([str(book)])
    assert pane.documents.is_indexing(conversation.id)

    reply = ui_flows.send(qtbot, window, ui_flows.FRANCE_QUESTION)  # the chat takes it at once, not after
    qtbot.wait_until(lambda: reply.status != STATUS_STREAMING, timeout=10_000)
    # still reading: the reply did not wait for the book (if this fails, check the book still takes seconds)
    assert pane.documents.is_indexing(conversation.id)
    assert reply.status == STATUS_DONE and reply.content == fake_engine.FRANCE_REPLY  # the whole reply
    assert "largest city in France" in pane.view.message_text(len(conversation.messages) - 1)

    _wait_read(qtbot, window)  # and the book is then read, whole
    assert _bar(window).chip_paths == [str(book.resolve())] and not _bar(window).problems_text


def test_an_unreadable_file_is_listed_with_its_reason(qtbot: Any, window: MainWindow, tmp_path: Path) -> None:
    good = write_pdf(tmp_path / "good.pdf", PAGES[:1])
    bad = write_corrupt_pdf(tmp_path / "broken.pdf")
    window.chat_pane.attach_files([str(good), str(bad)])
    _wait_read(qtbot, window)
    problems = _bar(window).problems_text
    assert "broken.pdf" in problems and "good.pdf" not in problems
    assert "corrupt" in problems.lower() or "damaged" in problems.lower() or "cannot" in problems.lower(), problems
    assert window.chat_pane.view.isEnabled()  # the chat was usable throughout


def test_files_dropped_on_the_chat_are_attached(qtbot: Any, window: MainWindow, tmp_path: Path) -> None:
    note = tmp_path / "note.md"
    note.write_text("# Note\n\nThe boat leaves at nine.\n")
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(note))])
    drop = QDropEvent(QPointF(5, 5), Qt.DropAction.CopyAction, mime, Qt.MouseButton.NoButton,
                      Qt.KeyboardModifier.NoModifier)
    window.chat_pane.documents.drops.eventFilter(window.chat_pane, drop)
    _wait_read(qtbot, window)
    assert _bar(window).chip_paths == [str(note.resolve())]


def test_attachments_and_sources_survive_a_restart(qtbot: Any, open_window: Any, tmp_path: Path,
                                                   cited_reply: None) -> None:
    data = tmp_path / "data"
    pdf = write_pdf(tmp_path / "harbour.pdf", PAGES)
    win = open_window(data)
    ui_flows.load_model(qtbot, win)
    win.chat_pane.attach_files([str(pdf)])
    _wait_read(qtbot, win)
    reply = ui_flows.send(qtbot, win, "Who is the lighthouse keeper?")
    qtbot.wait_until(lambda: reply.status != STATUS_STREAMING, timeout=10_000)
    chat_id = win.chat_pane.current_conversation.id
    win.close()

    again = open_window(data)
    again.chat_pane.select_conversation(chat_id)
    assert _bar(again).chip_paths == [str(pdf.resolve())]
    index = len(again.chat_pane.current_conversation.messages) - 1
    assert "[2] harbour.pdf, page 2" in again.chat_pane.view.message_text(index)

    chip = _bar(again).chip(str(pdf.resolve()))  # removing it: the chip goes, and the next prompt has no sources
    assert chip is not None
    qtbot.mouseClick(chip, Qt.MouseButton.LeftButton)
    assert _bar(again).chip_paths == []
    assert again.chat_pane.documents.attachments(chat_id) == []
