"""The Discover view in the real window (on the fake engine) against a Hugging Face hub running in the test
(tests/engine/hub/hub_server.py): search, files with fit labels, downloads with progress, cancel and resume, errors
in words, the Models list after a download, a download folder of the user's, two downloads at once, and a
window that keeps running meanwhile.

The served GGUF is a small random-weight file (``engine.tools.make_gguf``), streamed in 64 KiB chunks with a pause
between them, so that a download lasts long enough to show progress and to be cancelled halfway.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import constants
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from engine.hub import FileEntry
from engine.loading.gguf_reader import gguf_config, read_gguf_header
from engine.tools.make_gguf import write_gguf
from tests.app.fake_engine import FakeLLM, fake_hardware, make_fake_api
from tests.engine.hub import hub_server
from tests.engine.hub.hub_server import FakeHub, HubThread

pytestmark = pytest.mark.gui

GGUF_REPO = "hearth-test/Tiny-Chat-GGUF"
GGUF_FILE = "tiny-chat.Q8_0.gguf"
MISSING_FILE = "tiny-chat.Q4_0.gguf"
PLAIN_REPO = "hearth-test/tiny-chat-safetensors"
CHUNK = 64 << 10


class SlowHub(FakeHub):
    """The test hub, with a pause before each chunk of file bytes (``delay_s``)."""

    delay_s = 0.0

    async def cdn(self, request: Request) -> Response:
        response = await super().cdn(request)
        if isinstance(response, StreamingResponse) and self.delay_s:
            inner, delay = response.body_iterator, self.delay_s

            async def slow() -> AsyncIterator[Any]:
                async for chunk in inner:
                    await asyncio.sleep(delay)
                    yield chunk

            response.body_iterator = slow()
        return response


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubThread]:
    files = tmp_path_factory.mktemp("discover-hub")
    gguf = files / GGUF_FILE
    write_gguf(gguf, "tiny", "Q8_0", seed=3, vocab=2048)
    metadata, tensors = read_gguf_header(gguf)
    fake = SlowHub()
    repo = fake.repo(GGUF_REPO, config=gguf_config(metadata, tensors), downloads=42)
    repo.add(GGUF_FILE, gguf.read_bytes())
    repo.add(MISSING_FILE, gguf.read_bytes()[:300_000])  # listed, then taken away to answer 404
    fake.repo(PLAIN_REPO, downloads=7).add("config.json", b"{}")
    with HubThread(fake) as running:
        yield running


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch, hub: HubThread, tmp_path: Path) -> Path:
    """Talk to the test hub only, in small chunks; downloads go to a home of the test's own; returns that home."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", "")
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", "/nonexistent/token")
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", CHUNK)
    monkeypatch.setattr(hub_server, "CHUNK", CHUNK)
    home = tmp_path / "home"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / ".cache" / "huggingface" / "hub"))
    fake = hub.hub
    assert isinstance(fake, SlowHub)
    fake.delay_s = 0.01
    fake.corrupt.clear()
    fake.requests.clear()
    return home


@pytest.fixture
def window(qtbot: Any, online: Path, tmp_path: Path) -> Iterator[Any]:
    """The main window on the fake engine, with the real discovery of models reading the test's home."""
    from app import create_window
    from app.bridge.engine_bridge import EngineBridge
    from engine.loading.discovery import discover_models

    FakeLLM.instances.clear()
    api = dataclasses.replace(make_fake_api(load_delay_s=0.05),
                              discover_models=functools.partial(discover_models, home=online, hardware=fake_hardware()))
    win = create_window(data_dir=tmp_path / "data", bridge=EngineBridge(api=api))
    qtbot.add_widget(win)
    win.show()
    qtbot.wait_exposed(win)
    yield win
    view = _view(win)
    if view is not None:
        view.shutdown()
    FakeLLM.instances.clear()


def _view(window: Any) -> Any:
    from app.model.discover import DiscoverView

    return window.findChild(DiscoverView, "discoverView")


def open_discover(qtbot: Any, window: Any, hub: HubThread) -> Any:
    from PySide6.QtGui import QAction

    action = window.findChild(QAction, "discoverAction")
    assert action is not None
    action.trigger()
    view = _view(window)
    assert view is not None and view.isVisible()
    view.client.endpoint = hub.endpoint
    return view


def search(qtbot: Any, view: Any, query: str) -> None:
    view.search_edit.setText(query)
    with qtbot.wait_signal(view.client.searched, timeout=10_000):
        view.search_button.click()


def choose_file(qtbot: Any, view: Any, name: str) -> None:
    """Search for the GGUF repository and choose ``name`` among its files."""
    from PySide6.QtCore import Qt

    search(qtbot, view, "tiny-chat")
    qtbot.waitUntil(lambda: view.files.topLevelItemCount() > 0, timeout=10_000)
    for i in range(view.files.topLevelItemCount()):
        item = view.files.topLevelItem(i)
        if item.data(0, Qt.ItemDataRole.UserRole).name == name:
            view.files.setCurrentItem(item)
    assert view.selected_entry() is not None and view.selected_entry().name == name


def download(qtbot: Any, view: Any, timeout_ms: int = 20_000) -> Any:
    box = view.download_box
    with qtbot.wait_signal(box.finished, timeout=timeout_ms) as done:
        assert box.download_button.isEnabled()
        box.download_button.click()
    return done.args[0]


def _cached(home: Path, name: str) -> Path:
    repo = home / ".cache" / "huggingface" / "hub" / f"models--{GGUF_REPO.replace('/', '--')}"
    return repo / "snapshots" / hashlib.sha1(GGUF_REPO.encode()).hexdigest() / name


def _models_list(window: Any) -> list[str]:
    from PySide6.QtWidgets import QTreeWidget

    tree = window.models_view.findChild(QTreeWidget, "modelsTree")
    return [tree.topLevelItem(i).text(0) for i in range(tree.topLevelItemCount())]


def test_search_shows_gguf_repositories_and_their_files_with_fit_labels(qtbot: Any, window: Any, hub: HubThread) -> None:
    from app.model.discover import RECOMMENDED_MARK

    view = open_discover(qtbot, window, hub)
    search(qtbot, view, "tiny-chat")
    assert view.results.topLevelItemCount() == 1  # GGUF only: the safetensors repository is left out
    hit = view.results.topLevelItem(0)
    assert [hit.text(c) for c in range(4)] == [GGUF_REPO, "42", "1", "2026-01-01"]
    qtbot.waitUntil(lambda: view.files.topLevelItemCount() == 2, timeout=10_000)
    rows = {view.files.topLevelItem(i).text(0): [view.files.topLevelItem(i).text(c) for c in range(5)]
            for i in range(2)}
    main = rows.get(GGUF_FILE + RECOMMENDED_MARK) or rows[GGUF_FILE]
    assert main[1:3] == ["GGUF", "Q8_0"] and main[3].endswith("MiB")
    assert main[4] == "Fits"  # a few MiB, judged against the memory available now
    assert "judged at" in view.status.text() and "GiB of memory available now" in view.status.text()
    assert "KV cache" in view.detail.text() and view.download_box.download_button.isEnabled()
    view.gguf_check.setChecked(False)
    search(qtbot, view, "tiny-chat")
    assert view.results.topLevelItemCount() == 2


def test_a_download_shows_progress_then_the_model_is_in_the_models_list(
    qtbot: Any, window: Any, hub: HubThread, online: Path
) -> None:
    from PySide6.QtCore import QTimer

    from app.model.download_box import progress_text

    view = open_discover(qtbot, window, hub)
    choose_file(qtbot, view, GGUF_FILE)
    seen: list[str] = []
    ticks: list[float] = []
    timer = QTimer()
    timer.setInterval(20)
    timer.timeout.connect(lambda: ticks.append(time.monotonic()))
    timer.start()
    box = view.download_box
    started = time.monotonic()
    with qtbot.wait_signal(box.finished, timeout=20_000) as done:
        box.download_button.click()
        assert box.job is not None and not box.download_button.isEnabled() and box.cancel_button.isEnabled()
        box.job.progress.connect(lambda p: seen.append(progress_text(p)))
    ended = time.monotonic()
    timer.stop()
    result = done.args[0]
    assert not result.error and result.paths == [_cached(online, GGUF_FILE)]
    data = hub.hub.repos[GGUF_REPO].files[GGUF_FILE]
    assert hashlib.sha256(result.paths[0].read_bytes()).hexdigest() == data.sha256
    assert any("/s" in text and " of " in text for text in seen), seen  # bytes, total and speed
    assert any("checking its sha256" in text for text in seen)
    assert box.progress.value() == 1000 and "It is in the Models list now" in box.status.text()
    during = [t for t in ticks if started <= t <= ended]
    gaps = [b - a for a, b in zip([started, *during], [*during, ended], strict=True)]
    assert len(during) >= 3 and max(gaps) < max(0.5, 0.5 * (ended - started)), (len(during), max(gaps))
    qtbot.waitUntil(lambda: f"{GGUF_REPO}/{GGUF_FILE}" in _models_list(window), timeout=10_000)


def test_cancel_keeps_the_part_and_download_resumes_it(qtbot: Any, window: Any, hub: HubThread, online: Path) -> None:
    view = open_discover(qtbot, window, hub)
    choose_file(qtbot, view, GGUF_FILE)
    hub.hub.delay_s = 0.03  # type: ignore[attr-defined]
    box = view.download_box
    with qtbot.wait_signal(box.finished, timeout=20_000) as done:
        box.download_button.click()
        qtbot.waitUntil(lambda: box.progress.value() > 0, timeout=10_000)
        box.cancel_button.click()
    assert done.args[0].cancelled and "continues from there" in box.status.text()
    data = hub.hub.repos[GGUF_REPO].files[GGUF_FILE]
    partial = _cached(online, GGUF_FILE).parent.parent.parent / "blobs" / f"{data.sha256}.incomplete"
    kept = partial.stat().st_size
    assert 0 < kept < len(data.data) and not _cached(online, GGUF_FILE).exists()
    assert box.download_button.text() == "Resume"
    choose_file(qtbot, view, MISSING_FILE)
    assert box.download_button.text() == "Download"
    choose_file(qtbot, view, GGUF_FILE)  # chosen again, as after a restart: the part kept is found
    assert box.download_button.text() == "Resume" and "downloaded earlier" in box.status.text()
    hub.hub.delay_s = 0.0  # type: ignore[attr-defined]
    hub.hub.requests.clear()
    result = download(qtbot, view)
    assert not result.error and hub.hub.ranges_seen("/cdn/") == [f"bytes={kept}-"]
    assert hashlib.sha256(result.paths[0].read_bytes()).hexdigest() == data.sha256


def test_server_errors_are_shown_in_words(qtbot: Any, window: Any, hub: HubThread) -> None:
    view = open_discover(qtbot, window, hub)
    box = view.download_box
    choose_file(qtbot, view, GGUF_FILE)
    data = hub.hub.repos[GGUF_REPO].files[GGUF_FILE]
    hub.hub.corrupt.add(data.sha256)
    result = download(qtbot, view)
    assert "arrived damaged" in result.error and box.error.isVisible()
    assert f"Could not download {GGUF_FILE}" in box.error.text() and "download it again" in box.error.text()
    hub.hub.corrupt.clear()
    choose_file(qtbot, view, MISSING_FILE)
    taken = hub.hub.repos[GGUF_REPO].files.pop(MISSING_FILE)
    try:
        result = download(qtbot, view)
    finally:
        hub.hub.repos[GGUF_REPO].files[MISSING_FILE] = taken
    assert f"has no file '{MISSING_FILE}'" in box.error.text(), result
    with qtbot.wait_signal(view.client.failed, timeout=10_000):
        view.search_edit.setText("nobody/nothing")
        view.search_button.click()
    assert "No model repository 'nobody/nothing'" in view.status.text()


def test_offline_the_view_says_so(qtbot: Any, window: Any, hub: HubThread, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    view = open_discover(qtbot, window, hub)
    with qtbot.wait_signal(view.client.failed, timeout=5_000):
        view.search_edit.setText("SmolLM2")
        view.search_button.click()
    assert "Hugging Face cannot be reached" in view.status.text()
    assert "everything else works offline" in view.status.text()
    # a download that fails at once (before any request) still ends, with the reason
    view.download_box.set_choice(GGUF_REPO, FileEntry(GGUF_FILE, "gguf", "Q8_0", (GGUF_FILE,), 1))
    result = download(qtbot, view, timeout_ms=5_000)
    assert "cannot be reached" in result.error and "cannot be reached" in view.download_box.error.text()


def test_the_model_pane_opens_discover(qtbot: Any, window: Any) -> None:
    from PySide6.QtWidgets import QPushButton

    button = window.model_pane.findChild(QPushButton, "discoverButton")
    button.click()
    view = _view(window)
    assert view is not None and view.isVisible()
    button.click()  # the same view again, not a second one
    assert len([w for w in window.findChildren(type(view)) if w.objectName() == "discoverView"]) == 1


def test_downloads_go_to_a_folder_the_user_sets_which_is_remembered_and_listed(
    qtbot: Any, window: Any, hub: HubThread, online: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PySide6.QtWidgets import QFileDialog

    from app.model.discover import DiscoverView

    folder = tmp_path / "my models"
    folder.mkdir()
    view = open_discover(qtbot, window, hub)
    assert "Hugging Face cache" in view.folder_label.text() and not view.cache_button.isEnabled()
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *_args, **_kw: str(folder))
    view.folder_button.click()
    assert str(folder) in view.folder_label.text() and view.cache_button.isEnabled()
    assert window.settings.download_folder == str(folder)
    assert str(folder) in window.models_view.folders  # the Models list reads it from now on
    choose_file(qtbot, view, GGUF_FILE)
    result = download(qtbot, view)
    expected = folder / "hearth-test" / "Tiny-Chat-GGUF" / GGUF_FILE
    assert not result.error and result.paths == [expected] and result.folder == folder
    assert hashlib.sha256(expected.read_bytes()).hexdigest() == hub.hub.repos[GGUF_REPO].files[GGUF_FILE].sha256
    assert not _cached(online, GGUF_FILE).exists() and str(expected.parent) in view.download_box.status.text()
    qtbot.waitUntil(lambda: any(name.endswith(GGUF_FILE) for name in _models_list(window)), timeout=10_000)
    again = DiscoverView(settings=window.settings)  # as after a restart: the folder is remembered
    qtbot.add_widget(again)
    assert again.target_folder() == folder and again.client.dest_dir == folder
    view.cache_button.click()
    assert window.settings.download_folder == "" and view.target_folder() == Path(constants.HF_HUB_CACHE)


def test_two_downloads_run_at_once_and_each_can_be_cancelled(
    qtbot: Any, window: Any, hub: HubThread, online: Path, tmp_path: Path
) -> None:
    view = open_discover(qtbot, window, hub)
    box = view.download_box
    hub.hub.delay_s = 0.03  # type: ignore[attr-defined]
    files = hub.hub.repos[GGUF_REPO].files
    ended: list[Any] = []
    box.finished.connect(ended.append)

    def start_both() -> None:
        choose_file(qtbot, view, GGUF_FILE)
        box.download_button.click()
        choose_file(qtbot, view, MISSING_FILE)  # the first one goes on, listed under the bar
        assert box.download_button.isEnabled() and box.download_button.text() == "Download"
        box.download_button.click()
        assert len(box.jobs()) == 2 and not ended  # both at once
        assert f"Downloading {GGUF_FILE} from {GGUF_REPO}" in box.others.text() and box.others.isVisible()

    start_both()
    qtbot.waitUntil(lambda: len(ended) == 2, timeout=30_000)
    by_name = {r.entry_name: r for r in ended}
    for name in (GGUF_FILE, MISSING_FILE):
        assert not by_name[name].error and by_name[name].paths == [_cached(online, name)]
        assert hashlib.sha256(by_name[name].paths[0].read_bytes()).hexdigest() == files[name].sha256
    assert f"Downloaded {GGUF_FILE}" in box.others.text()  # how the other one ended stays in view
    assert "It is in the Models list now" in box.status.text() and not box.is_running()
    # again into a folder of the user's, where neither is yet; the first is cancelled from its line
    view.set_download_folder(str(tmp_path / "mine"))
    ended.clear()
    start_both()
    box.others.linkActivated.emit("cancel:0")
    qtbot.waitUntil(lambda: len(ended) == 2, timeout=30_000)
    by_name = {r.entry_name: r for r in ended}
    assert by_name[GGUF_FILE].cancelled and not by_name[MISSING_FILE].error
    assert by_name[MISSING_FILE].paths == [tmp_path / "mine" / "hearth-test" / "Tiny-Chat-GGUF" / MISSING_FILE]
    assert f"Download of {GGUF_FILE} cancelled" in box.others.text()
    choose_file(qtbot, view, GGUF_FILE)  # chosen, it shows how it ended; its part is kept in the folder: Resume
    assert box.download_button.text() == "Resume" and "Resume continues from there" in box.status.text()
    assert f"{GGUF_FILE} cancelled" not in box.others.text()
