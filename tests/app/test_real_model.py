"""The main window on the real engine and the default model.

These run the same user flows as ``test_main_window.py`` (``ui_flows``), with the real
``engine`` package and its bundled default model, on whatever device ``auto`` picks.
They are skipped while ``from engine import LLM`` fails (the engine is being written).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.app import ui_flows

try:
    from engine import LLM  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the engine being present
    ENGINE_MISSING: str | None = f"the engine is not importable yet (from engine import LLM: {exc})"
else:
    ENGINE_MISSING = None

pytestmark = [pytest.mark.slow, pytest.mark.skipif(ENGINE_MISSING is not None, reason=ENGINE_MISSING or "")]

#: The CPU of a CI machine is slow; the default model is small.
TIMEOUTS = ui_flows.Timeouts(load_ms=180_000, reply_ms=120_000, first_token_ms=60_000)


@pytest.fixture
def real_window(qtbot: Any, tmp_path: Path) -> Iterator[Any]:
    from app import create_window

    win = create_window(data_dir=tmp_path)
    qtbot.add_widget(win)
    win.show()
    qtbot.wait_exposed(win)
    yield win
    win.close()


def test_capital_of_france(qtbot: Any, real_window: Any) -> None:
    ui_flows.flow_capital_of_france(qtbot, real_window, TIMEOUTS)


def test_stop_mid_reply_leaves_nothing_running(qtbot: Any, real_window: Any) -> None:
    ui_flows.flow_stop_mid_reply(qtbot, real_window, TIMEOUTS)


def test_two_conversations_stream_at_once(qtbot: Any, real_window: Any) -> None:
    ui_flows.flow_two_conversations(qtbot, real_window, TIMEOUTS)


def test_bad_model_path_shows_error(qtbot: Any, real_window: Any, tmp_path: Path) -> None:
    ui_flows.flow_bad_model_path(qtbot, real_window, str(tmp_path / "no-such-model.gguf"), TIMEOUTS)


def test_event_loop_never_stalls_while_streaming(qtbot: Any, real_window: Any) -> None:
    ui_flows.flow_event_loop_never_stalls(qtbot, real_window, TIMEOUTS)


def test_edit_and_regenerate_make_switchable_branches(qtbot: Any, real_window: Any) -> None:
    ui_flows.flow_edit_and_regenerate_branch(qtbot, real_window, TIMEOUTS)
