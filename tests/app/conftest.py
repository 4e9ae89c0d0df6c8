"""Fixtures for app tests: a fake engine, a bridge on it, and the main window."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.app.fake_engine import FakeLLM, make_fake_api

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test here that needs a QApplication as ``gui``."""
    for item in items:
        if _HERE in Path(str(item.fspath)).parents and {"qapp", "qtbot"} & set(
                getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.gui)


@pytest.fixture
def fake_api() -> Iterator[Any]:
    FakeLLM.instances.clear()
    yield make_fake_api(load_delay_s=0.05, step_delay_s=0.01)
    FakeLLM.instances.clear()


@pytest.fixture
def bridge(qtbot: Any, fake_api: Any) -> Iterator[Any]:
    from app.bridge.engine_bridge import EngineBridge

    bridge = EngineBridge(api=fake_api)
    yield bridge
    bridge.shutdown()


@pytest.fixture
def loaded_bridge(qtbot: Any, bridge: Any) -> Any:
    with qtbot.wait_signal(bridge.signals.model_loaded, timeout=5000):
        bridge.load_model("default")
    return bridge


@pytest.fixture
def window(qtbot: Any, fake_api: Any, tmp_path: Path) -> Any:
    from app import create_window
    from app.bridge.engine_bridge import EngineBridge

    win = create_window(data_dir=tmp_path, bridge=EngineBridge(api=fake_api))
    qtbot.add_widget(win)
    win.show()
    qtbot.wait_exposed(win)
    return win


@pytest.fixture
def open_window(qtbot: Any, fake_api: Any) -> Iterator[Callable[[Path], Any]]:
    """Open main windows on the fake engine; they stay referenced (so alive) until teardown closes them."""
    from app import create_window
    from app.bridge.engine_bridge import EngineBridge

    windows: list[Any] = []

    def opener(data_dir: Path) -> Any:
        win = create_window(data_dir=data_dir, bridge=EngineBridge(api=fake_api))
        windows.append(win)
        win.show()
        qtbot.wait_exposed(win)
        return win

    yield opener
    for win in windows:
        win.close()
