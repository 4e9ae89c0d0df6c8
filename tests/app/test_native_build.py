"""The native decode step's build, told in words: while it compiles after a load, when it is ready, why it failed
(``app/bridge/native_build.py``, ``app/model/load_status.py``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtWidgets import QLabel

from app.bridge.engine_bridge import EngineBridge
from app.bridge.types import NativeBuild
from app.model.load_stage import native_build_text
from app.window.main_window import MainWindow
from tests.app import ui_flows
from tests.app.fake_engine import FakeLLM, FakeNativeBuild, make_fake_api

TIMEOUT_MS = 5000
BUILD_S = 8  # how long the stand-in first build runs: a load that waits for it outlasts it


@pytest.mark.parametrize(
    ("build", "text"),
    [
        (NativeBuild("building"), "Building the fast decode step… (runs int4 meanwhile)"),
        (NativeBuild("ready"), "The fast decode step is ready: replies run faster from now on."),
        (NativeBuild("failed", "the native step did not build (g++ exited with 1)."),
         ("The fast decode step could not be built (the native step did not build (g++ exited with 1)); the model "
          "runs int4 without it.")),
        (NativeBuild("absent"), ""),
    ],
)
def test_the_build_in_words(build: NativeBuild, text: str) -> None:
    assert native_build_text(build, "int4") == text


def test_a_build_state_is_one_of_four() -> None:
    with pytest.raises(ValueError, match="state must be one of"):
        NativeBuild("compiling")


@pytest.fixture
def build() -> Iterator[FakeNativeBuild]:
    FakeLLM.instances.clear()
    yield FakeNativeBuild("building")
    FakeLLM.instances.clear()


@pytest.fixture
def building_bridge(qtbot: Any, build: FakeNativeBuild) -> Iterator[EngineBridge]:
    bridge = EngineBridge(api=make_fake_api(load_delay_s=0.05, native_build=build))
    yield bridge
    bridge.shutdown()


def test_the_bridge_tells_a_build_under_way_and_its_end(qtbot: Any, building_bridge: EngineBridge,
                                                        build: FakeNativeBuild) -> None:
    seen: list[NativeBuild] = []
    building_bridge.signals.native_build_changed.connect(seen.append)
    with qtbot.wait_signals([building_bridge.signals.model_loaded, building_bridge.signals.native_build_changed],
                            timeout=TIMEOUT_MS):
        building_bridge.load_model("default")
    assert seen == [NativeBuild("building")]
    with qtbot.wait_signal(building_bridge.signals.model_loaded, timeout=TIMEOUT_MS):
        building_bridge.load_model("default")  # a second load during the build: told again, one watch
    qtbot.wait_until(lambda: len(seen) == 2, timeout=TIMEOUT_MS)
    build.state = "ready"
    qtbot.wait_until(lambda: len(seen) == 3, timeout=TIMEOUT_MS)
    assert seen[-1] == NativeBuild("ready")
    qtbot.wait(1000)  # two polling intervals: no second "ready"
    assert len(seen) == 3
    with qtbot.wait_signal(building_bridge.signals.model_loaded, timeout=TIMEOUT_MS):
        building_bridge.load_model("default")  # built: a later load says nothing of it
    qtbot.wait(200)
    assert len(seen) == 3


def test_no_build_asked_for_says_nothing(qtbot: Any, loaded_bridge: EngineBridge) -> None:
    seen: list[NativeBuild] = []
    loaded_bridge.signals.native_build_changed.connect(seen.append)
    with qtbot.wait_signal(loaded_bridge.signals.model_loaded, timeout=TIMEOUT_MS):
        loaded_bridge.load_model("default")
    qtbot.wait(200)
    assert seen == []


def test_the_model_pane_says_the_build_runs_then_why_it_failed(qtbot: Any, build: FakeNativeBuild,
                                                                tmp_path: Path) -> None:
    from app import create_window

    window: MainWindow = create_window(data_dir=tmp_path, bridge=EngineBridge(
        api=make_fake_api(load_delay_s=0.05, native_build=build)))
    qtbot.add_widget(window)
    window.show()
    qtbot.wait_exposed(window)
    label = ui_flows.child(window, QLabel, "nativeBuildLabel")
    assert not label.isVisible()
    ui_flows.load_model(qtbot, window)
    qtbot.wait_until(label.isVisible, timeout=TIMEOUT_MS)
    assert label.text() == "Building the fast decode step… (runs int8 meanwhile)"  # the fake loads int8
    build.state, build.problem = "failed", "no C++ compiler found (set CXX, or install g++)"
    qtbot.wait_until(lambda: "could not be built" in label.text(), timeout=TIMEOUT_MS)
    assert "no C++ compiler found" in label.text() and "runs int8 without it" in label.text()
    ui_flows.child(window, QLabel, "modelInfoLabel")  # the card stays below it
    window.close()


def test_the_real_engine_reads_its_build_without_starting_one() -> None:
    from app.bridge.jobs import import_engine
    from engine.model.native import EXTENSION

    api = import_engine()
    before = (EXTENSION.ready, EXTENSION.problem, EXTENSION._thread)
    build = api.native_build()
    assert isinstance(build, NativeBuild) and build.state in ("absent", "building", "ready", "failed")
    assert (EXTENSION.ready, EXTENSION.problem, EXTENSION._thread) == before


@pytest.fixture
def first_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[threading.Thread]:
    """The real extension as a fresh machine has it during its first build: nothing built on disk, nothing loaded,
    the build thread running (for ``BUILD_S`` at most; it ends at teardown)."""
    from engine.model import native

    done = threading.Event()
    thread = threading.Thread(target=done.wait, args=(BUILD_S,), name="hearth-native", daemon=True)
    thread.start()
    monkeypatch.setattr(native, "library_path", lambda: tmp_path / "not-built-yet.so")
    monkeypatch.setattr(native.EXTENSION, "ready", False)
    monkeypatch.setattr(native.EXTENSION, "problem", None)
    monkeypatch.setattr(native.EXTENSION, "_thread", thread)
    yield thread
    done.set()
    thread.join()


def test_a_gguf_load_during_the_first_build_never_waits_for_it(first_build: threading.Thread, tmp_path: Path) -> None:
    """The advice leaves out the "file" level while its block kernels build, and a "file" load asked for anyway (an
    advice given before the build began) runs the level the advice names, at once, and says so."""
    from app.bridge.jobs import import_engine, quantization_advice
    from engine import SamplingParams
    from engine.tools.make_gguf import write_gguf

    path = tmp_path / "tiny-Q4_K_M.gguf"
    write_gguf(path, "tiny", "Q4_K_M", seed=1)
    api = import_engine()
    assert api.native_build() == NativeBuild("building")
    advice = quantization_advice(lambda: api, str(path), "cpu")
    assert advice.recommendation is not None and advice.recommendation.quantization not in ("file", "auto")
    assert advice.estimates["file"].fits != "no"  # still offered, for a later load
    stages: list[str] = []
    llm: Any = api.LLM(str(path), device="cpu", quantization="file", start_loop=False, kv_cache_bytes=8 << 20,
                  progress=lambda fraction, stage: stages.append(stage))
    try:
        assert first_build.is_alive(), "the load waited for the native build"
        assert llm.quantization == advice.recommendation.quantization
        assert f"block kernels still building: loading {llm.quantization}" in stages
        out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        assert len(out[0].token_ids) == 4
    finally:
        llm.close()
