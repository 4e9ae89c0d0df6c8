"""Models kept loaded (``app.bridge.kept_models``) against the fake engine: switching back with no load, the list of
loaded models with their memory, LRU eviction that spares a running reply, the idle time-to-live, and cancels that
reach a model no longer in use."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.bridge.engine_bridge import EngineBridge
from app.bridge.kept_models import LoadedModel
from tests.app.fake_engine import FRANCE_REPLY, FakeLLM, make_fake_api

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
LONG = [{"role": "user", "content": "Tell me a story."}]


@pytest.fixture
def kept(qtbot: Any, tmp_path: Path) -> Iterator[tuple[EngineBridge, list[list[LoadedModel]], list[str]]]:
    """A bridge keeping two models, the lists it sends, and the stages of its loads."""
    FakeLLM.instances.clear()
    bridge = EngineBridge(api=make_fake_api(load_delay_s=0.05, step_delay_s=0.01))
    lists: list[list[LoadedModel]] = []
    stages: list[str] = []
    bridge.loaded_models.changed.connect(lists.append)
    bridge.signals.model_load_progress.connect(lambda _f, stage: stages.append(stage))
    bridge.set_models_kept(2)
    yield bridge, lists, stages
    bridge.shutdown()
    assert all(llm.is_closed for llm in FakeLLM.instances)
    FakeLLM.instances.clear()


def load(qtbot: Any, bridge: EngineBridge, spec: str) -> None:
    with qtbot.wait_signal(bridge.signals.model_loaded, timeout=5000):
        bridge.load_model(spec)


def folder(tmp_path: Path, name: str) -> str:
    (tmp_path / name).mkdir(exist_ok=True)
    return str(tmp_path / name)


def llm_named(name: str) -> FakeLLM:
    return next(llm for llm in FakeLLM.instances if llm.model_name == name)


def test_switching_back_to_a_kept_model_loads_nothing(qtbot: Any, kept: Any, tmp_path: Path) -> None:
    bridge, lists, stages = kept
    load(qtbot, bridge, "default")
    load(qtbot, bridge, folder(tmp_path, "b"))
    assert not llm_named("fake-smollm").is_closed
    qtbot.wait_until(lambda: bool(lists) and len(lists[-1]) == 2, timeout=3000)
    assert [(m.name, m.is_active) for m in lists[-1]] == [("b", True), ("fake-smollm", False)]
    assert all(m.memory_bytes > 0 for m in lists[-1])
    stages.clear()
    with qtbot.wait_signal(bridge.signals.model_loaded, timeout=1000) as blocker:
        bridge.load_model("default")
    assert blocker.args[0].model_name == "fake-smollm" and blocker.args[0].load_s == 0.0
    assert stages == ["Ready"] and len(FakeLLM.instances) == 2  # no load job ran
    texts: dict[str, str] = {}
    bridge.signals.token_delta.connect(lambda rid, text: texts.__setitem__(rid, texts.get(rid, "") + text))
    with qtbot.wait_signal(bridge.signals.request_finished, timeout=5000):
        rid = bridge.submit("c1", FRANCE, {})
    assert texts[rid] == FRANCE_REPLY
    qtbot.wait_until(lambda: [m.name for m in lists[-1]] == ["fake-smollm", "b"], timeout=3000)


def test_a_third_load_frees_the_least_recently_used_idle_model(qtbot: Any, kept: Any, tmp_path: Path) -> None:
    bridge, lists, _ = kept
    load(qtbot, bridge, "default")
    load(qtbot, bridge, folder(tmp_path, "b"))
    load(qtbot, bridge, "default")  # the switch back: b is now the least recently used
    load(qtbot, bridge, folder(tmp_path, "c"))
    qtbot.wait_until(lambda: llm_named("b").is_closed, timeout=3000)
    assert not llm_named("fake-smollm").is_closed and not llm_named("c").is_closed
    qtbot.wait_until(lambda: sorted(m.name for m in lists[-1]) == ["c", "fake-smollm"], timeout=3000)


def test_a_model_with_a_running_reply_is_not_freed(qtbot: Any, kept: Any, tmp_path: Path) -> None:
    bridge, _, _ = kept
    load(qtbot, bridge, "default")
    texts: dict[str, str] = {}
    bridge.signals.token_delta.connect(lambda rid, text: texts.__setitem__(rid, texts.get(rid, "") + text))
    rid = bridge.submit("c1", LONG, {})
    qtbot.wait_until(lambda: len(texts.get(rid, "")) > 20, timeout=5000)
    load(qtbot, bridge, folder(tmp_path, "b"))
    load(qtbot, bridge, folder(tmp_path, "c"))  # default is the least recently used, but busy: b goes
    qtbot.wait_until(lambda: llm_named("b").is_closed, timeout=3000)
    assert not llm_named("fake-smollm").is_closed
    before = len(texts[rid])
    qtbot.wait_until(lambda: len(texts[rid]) > before, timeout=3000)  # still streaming
    # The cancel reaches the loop of the model no longer in use.
    with qtbot.wait_signal(bridge.signals.request_finished, timeout=5000) as blocker:
        bridge.cancel(rid)
    assert blocker.args[0] == rid and blocker.args[1].finish_reason == "abort"
    qtbot.wait_until(lambda: sorted(m.name for m in kept[1][-1]) == ["c", "fake-smollm"], timeout=3000)
    assert not llm_named("fake-smollm").is_closed and not llm_named("c").is_closed


def test_idle_models_unload_after_their_time(qtbot: Any, kept: Any, tmp_path: Path) -> None:
    bridge, lists, _ = kept
    bridge.set_models_kept(2, idle_unload_s=1.5)
    load(qtbot, bridge, "default")
    load(qtbot, bridge, folder(tmp_path, "b"))
    qtbot.wait_until(lambda: bool(lists) and all(m.unloads_in_s is not None for m in lists[-1])
                     and len(lists[-1]) == 2, timeout=3000)
    assert all(0 < m.unloads_in_s <= 1.5 for m in lists[-1])
    with qtbot.wait_signal(bridge.signals.model_unloaded, timeout=6000):
        pass
    qtbot.wait_until(lambda: all(llm.is_closed for llm in FakeLLM.instances), timeout=3000)
    qtbot.wait_until(lambda: lists[-1] == [], timeout=3000)
    assert bridge.model_info is None


def test_unload_one_loaded_model(qtbot: Any, kept: Any, tmp_path: Path) -> None:
    bridge, lists, _ = kept
    load(qtbot, bridge, "default")
    load(qtbot, bridge, folder(tmp_path, "b"))
    bridge.unload_loaded("default")
    qtbot.wait_until(lambda: llm_named("fake-smollm").is_closed, timeout=3000)
    qtbot.wait_until(lambda: [m.name for m in lists[-1]] == ["b"], timeout=3000)
    assert bridge.model_info is not None and bridge.model_info.model_name == "b"
    with qtbot.wait_signal(bridge.signals.model_loaded, timeout=5000):
        bridge.load_model("default")  # no longer kept: loads again
    assert len(FakeLLM.instances) == 3


def test_one_model_kept_frees_the_old_one_as_before(qtbot: Any, kept: Any, tmp_path: Path) -> None:
    bridge, lists, _ = kept
    bridge.set_models_kept(1)
    load(qtbot, bridge, "default")
    load(qtbot, bridge, folder(tmp_path, "b"))
    assert llm_named("fake-smollm").is_closed
    qtbot.wait_until(lambda: [m.name for m in lists[-1]] == ["b"], timeout=3000)
    with pytest.raises(ValueError, match="1 to 4"):
        bridge.set_models_kept(5)


def test_the_loaded_models_box_lists_and_unloads(qtbot: Any, kept: Any, tmp_path: Path) -> None:
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QLabel, QPushButton

    from app.model.loaded_models_box import LoadedModelsBox

    bridge, _, _ = kept
    box = LoadedModelsBox(bridge)
    qtbot.add_widget(box)
    box.restore(3, 290.0)
    assert (box.models_kept(), box.idle_unload_s()) == (3, 300.0)
    load(qtbot, bridge, "default")
    load(qtbot, bridge, folder(tmp_path, "b"))
    qtbot.wait_until(lambda: len(box.findChildren(QPushButton, "unloadLoadedButton")) == 2, timeout=3000)
    texts = [label.text() for label in box.findChildren(QLabel, "loadedModelLabel")]
    assert "<b>b</b>" in texts[0] and "in use" in texts[0]
    assert "<b>fake-smollm</b>" in texts[1] and "unloads in " in texts[1] and "iB" in texts[1]
    qtbot.mouseClick(box.findChildren(QPushButton, "unloadLoadedButton")[1], Qt.MouseButton.LeftButton)
    qtbot.wait_until(lambda: llm_named("fake-smollm").is_closed, timeout=3000)
    qtbot.wait_until(lambda: len(box.findChildren(QPushButton, "unloadLoadedButton")) == 1, timeout=3000)


def test_the_settings_keep_the_choices(tmp_path: Path) -> None:
    from app.data.settings import Settings

    settings = Settings(tmp_path)
    assert (settings.models_kept, settings.idle_unload_s) == (1, None)
    settings.models_kept, settings.idle_unload_s = 3, 300.0
    settings.sync()
    again = Settings(tmp_path)
    assert (again.models_kept, again.idle_unload_s) == (3, 300.0)
    with pytest.raises(ValueError, match="1 to 4"):
        again.models_kept = 0


def test_the_window_keeps_the_choices_across_a_restart(qtbot: Any, open_window: Any, tmp_path: Path) -> None:
    first = open_window(tmp_path / "data")
    first.model_pane.loaded_models_box.restore(3, 300.0)
    first.save_settings()
    first.close()
    again = open_window(tmp_path / "data").model_pane.loaded_models_box
    assert (again.models_kept(), again.idle_unload_s()) == (3, 300.0)
