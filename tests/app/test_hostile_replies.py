"""Replies that point at local files, odd link schemes or inline HTML, through the real chat view.

A reply comes from a model, a remote server or an imported file, so nothing in it may make the view read a file
(``/dev/zero`` would fill the memory, a FIFO would block the GUI thread forever) or open an address by itself.
Images show as text, only a click on an http(s) link opens it, and inline HTML shows as the text it is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QPoint, Qt, QUrl
from PySide6.QtGui import QDesktopServices, QImage, QTextCursor
from PySide6.QtWidgets import QApplication, QFileDialog

from app.chat.message_view import MessageView
from app.data.conversations import Conversation, Message
from app.window.main_window import MainWindow
from tests.app import fake_engine, ui_flows

_ROOT = Path(__file__).resolve().parents[2]
_LINKS = {
    "file": "file:///etc/passwd",
    "smb": "smb://fileserver/share/setup.exe",
    "javascript": "javascript:alert(1)",
    "hearth": "hearth:regenerate/0",
    "https": "https://example.org/page",
}


class FifoWatch:
    """Counts each time something opens a FIFO for reading, and lets that reader go (it sees an empty file).

    Opening a FIFO for writing without blocking succeeds only while a reader has it open, so a reader is seen
    within milliseconds, and the writer closes at once: a test fails rather than hangs. The watcher is a process
    of its own, since a reader blocked on the GUI thread may hold the GIL.
    """

    def __init__(self, path: Path, log: Path) -> None:
        self.path, self._log = path, log
        self._process = subprocess.Popen([sys.executable, "-c", _WATCH_FIFO, str(path), str(log)],
                                         stdout=subprocess.PIPE, text=True)
        assert self._process.stdout is not None and self._process.stdout.readline().strip() == "ready"

    def reads(self) -> int:
        time.sleep(0.05)
        return self._log.read_text().count("read")

    def stop(self) -> None:
        self._process.terminate()
        self._process.communicate(timeout=10)


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[FifoWatch]:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this system")
    path = tmp_path / "pipe.png"
    os.mkfifo(path)
    watch = FifoWatch(path, tmp_path / "fifo-reads.log")
    yield watch
    for widget in QApplication.topLevelWidgets():  # close the views while the watcher still lets readers go
        widget.close()
    QApplication.processEvents()
    watch.stop()


@pytest.fixture
def real_image(tmp_path: Path) -> Path:
    path = tmp_path / "real.png"
    image = QImage(4, 4, QImage.Format.Format_RGB32)
    image.fill(0x336699)
    assert image.save(str(path))
    return path


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The addresses handed to ``QDesktopServices.openUrl``, in order (none is really opened)."""
    calls: list[str] = []
    monkeypatch.setattr(QDesktopServices, "openUrl", staticmethod(lambda url: calls.append(url.toString()) or True))
    return calls


def hostile_reply(fifo: Path, real_image: Path) -> str:
    """A reply with an image of every scheme, links of every scheme, and inline and block HTML."""
    links = " ".join(f"[{name} link]({href})" for name, href in _LINKS.items())
    return (
        f"Images: ![a fifo]({fifo.as_uri()}) ![a bare fifo]({fifo}) ![relative fifo]({fifo.name}) "
        f"![a real file]({real_image.as_uri()}) ![a web image](http://example.org/cat.png) "
        "![a data image](data:image/png;base64,iVBORw0KGgo=) ![a qrc image](qrc:/qt-project.org/logo.png) "
        "![](missing.png) end of images.\n\n"
        f"Links: {links} <file:///etc/hostname> end of links.\n\n"
        f'Before <b>bold</b> and <img src="{fifo.as_uri()}"> and <a href="file:///etc/passwd">x</a> '
        "then the rest of the paragraph.\n\n"
        f'<div><img src="{fifo.as_uri()}"></div>\n\n'
        "Last line."
    )


_WATCH_FIFO = """
import os, sys, time
open(sys.argv[2], "w").close()
print("ready", flush=True)
while True:
    try:
        fd = os.open(sys.argv[1], os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # no reader
        time.sleep(0.002)
        continue
    with open(sys.argv[2], "a") as log:
        log.write("read\\n")
    os.close(fd)
    time.sleep(0.01)
"""


def show_and_paint(qtbot: Any, view: MessageView) -> None:
    view.resize(900, 1400)
    view.show()
    qtbot.wait_exposed(view)
    view.grab()  # lays out and paints every image the document holds
    qtbot.wait(20)


def image_count(view: MessageView) -> int:
    count, block = 0, view.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            count += it.fragment().charFormat().isImageFormat()
            it += 1
        block = block.next()
    return count


def click_link(qtbot: Any, view: MessageView, index: int, href: str) -> None:
    """Click the first link to ``href`` in message ``index`` with the mouse, as a user would."""
    frame_start = view._frames[index].firstPosition()
    block = view.document().findBlock(frame_start)
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            if fragment.charFormat().anchorHref() == href:
                cursor = QTextCursor(view.document())
                cursor.setPosition(fragment.position() + max(fragment.length() // 2, 1))
                view.setTextCursor(cursor)
                view.ensureCursorVisible()
                rect = view.cursorRect(cursor)
                qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton,
                                 pos=QPoint(rect.left() - 1, rect.center().y()))
                return
            it += 1
        block = block.next()
    raise AssertionError(f"no link to {href} in {view.hrefs(index)}")


def assert_rendered_safely(view: MessageView, index: int, fifo: Path) -> None:
    text = view.message_text(index)
    assert image_count(view) == 0
    for alt in ("a fifo", "a bare fifo", "relative fifo", "a real file", "a web image", "a data image",
                "a qrc image"):
        assert f"[image: {alt}]" in text, text
    assert "end of images." in text and "end of links." in text and "Last line." in text
    assert (f'Before <b>bold</b> and <img src="{fifo.as_uri()}"> and <a href="file:///etc/passwd">x</a> '
            "then the rest of the paragraph.") in text
    assert f'<div><img src="{fifo.as_uri()}"></div>' in text


def test_a_hostile_reply_reads_no_file_and_opens_nothing_by_itself(
        qtbot: Any, fifo: FifoWatch, real_image: Path, opened: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(fifo.path.parent)  # the relative image names the FIFO too
    view = MessageView()
    qtbot.add_widget(view)
    reply = Message(role="assistant", content=hostile_reply(fifo.path, real_image))
    view.show_conversation(Conversation(id=1, messages=[Message(role="user", content="hi"), reply]))
    show_and_paint(qtbot, view)
    view.set_font_size(15)  # a re-render, as a theme or font change does
    view.grab()
    assert fifo.reads() == 0
    assert opened == []
    assert_rendered_safely(view, 1, fifo.path)


def test_only_a_click_on_an_http_link_opens_it(qtbot: Any, fifo: FifoWatch, real_image: Path,
                                                opened: list[str]) -> None:
    view = MessageView()
    qtbot.add_widget(view)
    actions: list[tuple[str, int, int]] = []
    view.action_requested.connect(lambda *args: actions.append(args))
    view.show_conversation(Conversation(id=1, messages=[
        Message(role="assistant", content=hostile_reply(fifo.path, real_image))]))
    show_and_paint(qtbot, view)
    for name in ("file", "smb", "javascript"):
        click_link(qtbot, view, 0, _LINKS[name])
    click_link(qtbot, view, 0, "file:///etc/hostname")
    assert opened == []
    with qtbot.wait_signal(view.link_refused, timeout=1000) as refused:  # the click says why nothing opened
        click_link(qtbot, view, 0, _LINKS["smb"])
    assert refused.args == [_LINKS["smb"]] and opened == []
    # A link in a reply cannot pose as one of the view's own actions: it is plain text.
    assert "hearth link" in view.message_text(0)
    assert view.hrefs(0).count(_LINKS["hearth"]) == 1
    assert actions == []
    click_link(qtbot, view, 0, "http://example.org/cat.png")  # the web image shows as its link
    click_link(qtbot, view, 0, _LINKS["https"])
    assert opened == ["http://example.org/cat.png", _LINKS["https"]]
    assert fifo.reads() == 0
    click_link(qtbot, view, 0, "hearth:regenerate/0")  # the view's own action links still work
    assert actions == [("regenerate", 0, 0)]


def test_a_streamed_model_reply_reads_no_file(qtbot: Any, window: MainWindow, fifo: FifoWatch, real_image: Path,
                                              opened: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fake_engine, "reply_for", lambda messages: hostile_reply(fifo.path, real_image))
    ui_flows.load_model(qtbot, window)
    reply = ui_flows.send(qtbot, window, "Show me a picture")
    ui_flows.wait_finished(qtbot, reply, 8000)
    window.chat_pane.view.grab()
    assert fifo.reads() == 0 and opened == []
    assert_rendered_safely(window.chat_pane.view, 1, fifo.path)


def test_an_imported_conversation_reads_no_file(qtbot: Any, window: MainWindow, fifo: FifoWatch, real_image: Path,
                                                opened: list[str], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "chat.json"
    path.write_text(json.dumps({"messages": [
        {"role": "user", "content": f"![mine]({fifo.path.as_uri()}) <b>not bold</b> rest"},
        {"role": "assistant", "content": hostile_reply(fifo.path, real_image)},
    ]}), encoding="utf-8")
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(path), "")))
    with qtbot.wait_signal(window.import_finished, timeout=10_000) as finished:
        assert window.import_conversation()
    assert finished.args[0] is not None
    view = window.chat_pane.view
    view.grab()
    assert fifo.reads() == 0 and opened == []
    assert f"![mine]({fifo.path.as_uri()}) <b>not bold</b> rest" in view.message_text(0)  # the user's own text
    assert_rendered_safely(view, 1, fifo.path)


_RENDER_ZERO = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
from PySide6.QtWidgets import QApplication
app = QApplication([])
from app.chat.message_view import MessageView
from app.data.conversations import Conversation, Message
view = MessageView()
view.resize(600, 400)
view.show()
view.show_conversation(Conversation(id=1, messages=[Message(role="assistant", content=sys.argv[1])]))
view.grab()
app.processEvents()
print(view.message_text(0))
"""


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_an_image_of_dev_zero_does_not_take_the_app_down() -> None:
    """In a child process, since reading ``/dev/zero`` ends in an abort: the child must live and show the alt."""
    reply = "Look: ![endless](file:///dev/zero) ![bare](/dev/zero) and the end."
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(_ROOT)}
    done = subprocess.run([sys.executable, "-c", _RENDER_ZERO, reply], cwd=_ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Look: [image: endless] [image: bare] and the end." in done.stdout


def test_a_click_on_a_link_with_no_scheme_opens_nothing(qtbot: Any, opened: list[str]) -> None:
    view = MessageView()
    qtbot.add_widget(view)
    view.anchorClicked.emit(QUrl("notes.txt"))
    view.anchorClicked.emit(QUrl("ftp://example.org/file"))
    assert opened == []
