"""EngineBridge against the fake engine: loading, streaming, cancel, metrics, shutdown."""

from __future__ import annotations

import ast
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import shiboken6

from app.bridge.engine_bridge import EngineBridge
from app.bridge.types import LoadSettings, ModelInfo, RequestInfo
from engine.api import EngineMetrics
from tests.app.fake_engine import FRANCE_REPLY, FakeLLM, make_fake_api

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
LONG = [{"role": "user", "content": "Tell me a story."}]


def collect_text(bridge: EngineBridge) -> dict[str, str]:
    texts: dict[str, str] = {}

    def on_delta(rid: str, text: str) -> None:
        texts[rid] = texts.get(rid, "") + text

    bridge.signals.token_delta.connect(on_delta)
    return texts


def test_load_reports_progress_and_model_info(qtbot: Any, bridge: EngineBridge) -> None:
    stages: list[tuple[float, str]] = []
    bridge.signals.model_load_progress.connect(lambda f, s: stages.append((f, s)))
    with qtbot.wait_signal(bridge.signals.model_loaded, timeout=5000) as blocker:
        bridge.load_model("default", "cpu", "float32", LoadSettings(max_batch_size=4, kv_cache_mb=64))
    info = blocker.args[0]
    assert isinstance(info, ModelInfo)
    assert (info.model_name, info.device, info.dtype) == ("fake-smollm", "cpu", "float32")
    assert bridge.model_info is info and not bridge.is_loading
    llm = FakeLLM.instances[-1]
    assert llm.max_batch_size == 4 and llm.kv_cache_bytes == 64 * 1024 * 1024
    qtbot.wait_until(lambda: bool(stages) and stages[-1] == (1.0, "Ready"), timeout=2000)
    assert "Loading weights" in [s for _, s in stages]


def test_load_model_does_not_block(qtbot: Any) -> None:
    bridge = EngineBridge(api=make_fake_api(load_delay_s=1.0))
    try:
        started = time.perf_counter()
        bridge.load_model("default")
        assert time.perf_counter() - started < 0.05
        assert bridge.is_loading
        with qtbot.wait_signal(bridge.signals.model_loaded, timeout=5000):
            pass
    finally:
        bridge.shutdown()


def test_bad_model_path_fails_with_readable_message(qtbot: Any, bridge: EngineBridge) -> None:
    with qtbot.wait_signal(bridge.signals.model_load_failed, timeout=5000) as blocker:
        bridge.load_model("/no/such/model.gguf")
    assert "No model found at /no/such/model.gguf" in blocker.args[0]
    assert bridge.model_info is None and not bridge.is_loading
    with qtbot.wait_signal(bridge.signals.model_loaded, timeout=5000):
        bridge.load_model("default")


def test_submit_streams_and_finishes_with_metrics(qtbot: Any, loaded_bridge: EngineBridge) -> None:
    texts = collect_text(loaded_bridge)
    with qtbot.wait_signal(loaded_bridge.signals.request_finished, timeout=5000) as blocker:
        rid = loaded_bridge.submit("c1", FRANCE, {"temperature": 0.0, "max_tokens": 64})
    assert blocker.args[0] == rid
    info = blocker.args[1]
    assert isinstance(info, RequestInfo)
    assert (info.conversation_id, info.finish_reason) == ("c1", "stop")
    assert info.metrics["num_generated_tokens"] > 1 and info.metrics["tok_s"] > 0
    assert texts[rid] == FRANCE_REPLY


def test_engine_is_stepped_off_the_gui_thread(qtbot: Any, loaded_bridge: EngineBridge) -> None:
    with qtbot.wait_signal(loaded_bridge.signals.request_finished, timeout=5000):
        loaded_bridge.submit("c1", FRANCE, {})
    assert threading.current_thread().name not in FakeLLM.instances[-1].engine.step_threads


def test_one_thread_loads_steps_and_frees_each_model(qtbot: Any, loaded_bridge: EngineBridge, tmp_path: Path) -> None:
    """All of a model's torch work runs on one thread (a second thread keeps a second OpenMP team on the cores):
    the pool thread that loaded it steps it and, once it is replaced or unloaded, closes it."""
    first = FakeLLM.instances[-1]
    with qtbot.wait_signal(loaded_bridge.signals.request_finished, timeout=5000):
        loaded_bridge.submit("c1", FRANCE, {})
    assert first.load_thread != threading.get_ident()
    assert first.engine.step_thread_ids == {first.load_thread}
    with qtbot.wait_signal(loaded_bridge.signals.model_loaded, timeout=5000):
        loaded_bridge.load_model(str(tmp_path))
    assert first.close_thread == first.load_thread
    second = FakeLLM.instances[-1]
    with qtbot.wait_signal(loaded_bridge.signals.request_finished, timeout=5000):
        loaded_bridge.submit("c1", FRANCE, {})
    assert second.engine.step_thread_ids == {second.load_thread}
    with qtbot.wait_signal(loaded_bridge.signals.model_unloaded, timeout=5000):
        loaded_bridge.unload_model()
    assert second.close_thread == second.load_thread


def test_a_running_loop_leaves_threads_for_every_other_job(qtbot: Any, loaded_bridge: EngineBridge,
                                                           tmp_path: Path) -> None:
    """The loop keeps its load job's pool thread for the model's lifetime; reloads queued behind one another,
    hardware detection and model discovery all still run, and exactly one model stays loaded."""
    folders = [tmp_path / f"model-{i}" for i in range(3)]
    loaded: list[ModelInfo] = []
    loaded_bridge.signals.model_loaded.connect(loaded.append)
    with qtbot.wait_signals([loaded_bridge.signals.hardware_detected, loaded_bridge.signals.models_discovered],
                            timeout=5000):
        for folder in folders:
            folder.mkdir()
            loaded_bridge.load_model(str(folder))
        loaded_bridge.detect_hardware()
        loaded_bridge.discover_models([])
    qtbot.wait_until(lambda: bool(loaded) and loaded[-1].model_name == folders[-1].name, timeout=5000)
    assert sum(not llm.is_closed for llm in FakeLLM.instances) == 1
    texts = collect_text(loaded_bridge)
    with qtbot.wait_signal(loaded_bridge.signals.request_finished, timeout=5000):
        rid = loaded_bridge.submit("c1", FRANCE, {})
    assert texts[rid] == FRANCE_REPLY


def test_two_requests_stream_in_the_same_steps(qtbot: Any, loaded_bridge: EngineBridge) -> None:
    texts = collect_text(loaded_bridge)
    finished: list[str] = []
    loaded_bridge.signals.request_finished.connect(lambda rid, info: finished.append(rid))
    first = loaded_bridge.submit("c1", LONG, {"max_tokens": 40})
    second = loaded_bridge.submit("c2", LONG, {"max_tokens": 40})
    qtbot.wait_until(lambda: set(finished) == {first, second}, timeout=5000)
    assert FakeLLM.instances[-1].engine.max_batch_seen == 2
    assert texts[first] == texts[second] and texts[first]


def test_cancel_keeps_partial_text_and_finishes_with_abort(qtbot: Any, loaded_bridge: EngineBridge) -> None:
    texts = collect_text(loaded_bridge)
    rid = loaded_bridge.submit("c1", LONG, {})
    qtbot.wait_until(lambda: len(texts.get(rid, "")) > 20, timeout=5000)
    with qtbot.wait_signal(loaded_bridge.signals.request_finished, timeout=5000) as blocker:
        loaded_bridge.cancel(rid)
    assert blocker.args[1].finish_reason == "abort"
    partial = texts[rid]
    qtbot.wait(50)
    assert texts[rid] == partial
    qtbot.wait_until(lambda: (m := loaded_bridge.last_metrics) is not None and m.num_running == 0, timeout=3000)


def test_bad_sampling_params_fail_the_request(qtbot: Any, loaded_bridge: EngineBridge) -> None:
    with qtbot.wait_signal(loaded_bridge.signals.request_failed, timeout=5000) as blocker:
        rid = loaded_bridge.submit("c1", FRANCE, {"temperature": -1.0})
    assert blocker.args[0] == rid
    assert "temperature" in blocker.args[1]


def test_a_failing_step_fails_its_requests_and_the_loop_goes_on(qtbot: Any, loaded_bridge: EngineBridge) -> None:
    FakeLLM.instances[-1].engine.fail_next_steps = 1
    with qtbot.wait_signal(loaded_bridge.signals.request_failed, timeout=5000) as blocker:
        rid = loaded_bridge.submit("c1", FRANCE, {})
    assert blocker.args == [rid, "generation failed: the fake model broke"]
    with qtbot.wait_signal(loaded_bridge.signals.request_finished, timeout=5000) as blocker:
        loaded_bridge.submit("c1", FRANCE, {})
    assert blocker.args[1].finish_reason == "stop"


class _Fatal(BaseException):
    """Something no engine loop survives."""


def test_a_dead_loop_says_so_and_fails_requests(qtbot: Any, loaded_bridge: EngineBridge) -> None:
    engine = FakeLLM.instances[-1].engine

    def fatal() -> list[Any]:
        raise _Fatal("out of luck")

    engine.step = fatal  # type: ignore[method-assign]
    failed: list[tuple[str, str]] = []
    loaded_bridge.signals.request_failed.connect(lambda rid, message: failed.append((rid, message)))
    with qtbot.wait_signal(loaded_bridge.signals.error, timeout=5000) as blocker:
        rid = loaded_bridge.submit("c1", FRANCE, {})
    assert "out of luck" in blocker.args[0]
    qtbot.wait_until(lambda: bool(failed), timeout=2000)
    assert failed == [(rid, "The engine stopped: _Fatal: out of luck")]
    assert not engine.is_alive and engine.loop_error == "_Fatal: out of luck"
    with qtbot.wait_signal(loaded_bridge.signals.request_failed, timeout=2000) as blocker:
        later = loaded_bridge.submit("c1", FRANCE, {})
    assert blocker.args[0] == later and "out of luck" in blocker.args[1] and "Reload" in blocker.args[1]


def test_submit_without_a_model_fails_asynchronously(qtbot: Any, bridge: EngineBridge) -> None:
    failed: list[tuple[str, str]] = []
    bridge.signals.request_failed.connect(lambda rid, msg: failed.append((rid, msg)))
    rid = bridge.submit("c1", FRANCE, {})
    assert failed == []
    qtbot.wait_until(lambda: bool(failed), timeout=2000)
    assert failed[0][0] == rid and "No model is loaded" in failed[0][1]


def test_request_submitted_while_loading_waits_for_the_model(qtbot: Any, bridge: EngineBridge) -> None:
    bridge.load_model("default")
    with qtbot.wait_signal(bridge.signals.request_finished, timeout=5000) as blocker:
        rid = bridge.submit("c1", FRANCE, {})
    assert blocker.args[0] == rid


def test_the_engine_loop_alone_publishes_metrics_once_a_second(qtbot: Any, loaded_bridge: EngineBridge) -> None:
    engine = FakeLLM.instances[-1].engine
    callers: set[str] = set()
    metrics = engine.metrics

    def recorded() -> EngineMetrics:
        callers.add(threading.current_thread().name)
        return metrics()

    engine.metrics = recorded  # type: ignore[method-assign]
    snapshots: list[dict[str, Any]] = []
    loaded_bridge.signals.metrics_updated.connect(
        lambda snapshot: snapshots.append(snapshot) if "num_running" in snapshot else None)
    with qtbot.wait_signal(loaded_bridge.signals.request_finished, timeout=5000):
        loaded_bridge.submit("c1", FRANCE, {})
    qtbot.wait_until(lambda: len(snapshots) >= 2, timeout=3000)
    started = time.monotonic()
    count = len(snapshots)
    qtbot.wait(2500)
    assert len(snapshots) - count in (2, 3), time.monotonic() - started
    assert {"num_running", "kv_cache_usage", "throughput_tok_s", "time"} <= snapshots[-1].keys()
    assert loaded_bridge.last_metrics == EngineMetrics.from_dict(snapshots[-1])
    assert len(callers) == 1 and callers <= engine.step_threads  # the thread that steps, nobody else


def test_unload_frees_the_model_and_fails_in_flight_requests(qtbot: Any, loaded_bridge: EngineBridge) -> None:
    texts = collect_text(loaded_bridge)
    rid = loaded_bridge.submit("c1", LONG, {})
    qtbot.wait_until(lambda: rid in texts, timeout=5000)
    with qtbot.wait_signals([loaded_bridge.signals.model_unloaded, loaded_bridge.signals.request_failed],
                            timeout=5000):
        loaded_bridge.unload_model()
    assert loaded_bridge.model_info is None
    assert FakeLLM.instances[-1].is_closed


def test_reload_replaces_the_model(qtbot: Any, loaded_bridge: EngineBridge, tmp_path: Path) -> None:
    first = FakeLLM.instances[-1]
    with qtbot.wait_signal(loaded_bridge.signals.model_loaded, timeout=5000) as blocker:
        loaded_bridge.load_model(str(tmp_path))
    assert blocker.args[0].model_name == tmp_path.name
    assert first.is_closed and not FakeLLM.instances[-1].is_closed


def test_superseded_load_is_dropped(qtbot: Any, tmp_path: Path) -> None:
    bridge = EngineBridge(api=make_fake_api(load_delay_s=0.3))
    loaded: list[ModelInfo] = []
    bridge.signals.model_loaded.connect(loaded.append)
    try:
        bridge.load_model("default")
        bridge.load_model(str(tmp_path))
        qtbot.wait_until(lambda: bool(loaded), timeout=5000)
        qtbot.wait(400)
        assert [info.model_name for info in loaded] == [tmp_path.name]
        assert sum(not llm.is_closed for llm in FakeLLM.instances) == 1
    finally:
        bridge.shutdown()
        FakeLLM.instances.clear()


def test_hardware_detection(qtbot: Any, bridge: EngineBridge) -> None:
    with qtbot.wait_signal(bridge.signals.hardware_detected, timeout=5000) as blocker:
        bridge.detect_hardware()
    assert blocker.args[0].cpu_model == "Fake CPU 9000"


def test_shutdown_stops_streaming_and_closes_the_model(qtbot: Any, loaded_bridge: EngineBridge) -> None:
    texts = collect_text(loaded_bridge)
    rid = loaded_bridge.submit("c1", LONG, {})
    qtbot.wait_until(lambda: rid in texts, timeout=5000)
    started = time.perf_counter()
    loaded_bridge.shutdown()
    assert time.perf_counter() - started < 2
    assert loaded_bridge.pool.activeThreadCount() == 0
    assert FakeLLM.instances[-1].is_closed
    loaded_bridge.shutdown()  # a second call is harmless


def test_shutdown_abandons_a_slow_load(qtbot: Any) -> None:
    bridge = EngineBridge(api=make_fake_api(load_delay_s=0.6))
    bridge.load_model("default")
    qtbot.wait(50)
    bridge.shutdown()
    assert bridge.pool.activeThreadCount() == 0
    assert all(llm.is_closed for llm in FakeLLM.instances)
    FakeLLM.instances.clear()


def test_load_settings_validate() -> None:
    with pytest.raises(ValueError, match="max_batch_size"):
        LoadSettings(max_batch_size=0)
    assert LoadSettings(kv_cache_mb=0).kv_cache_bytes is None


#: The app's seams to the engine besides app/bridge/, each with the one engine package it may reach: the chat's
#: document index (no Qt event loop needed) and the MCP host of the Tools settings.
SEAMS = {"docs/": "engine.docs", "tools/": "engine.mcp"}


def test_only_the_bridge_imports_engine() -> None:
    """Outside ``app/bridge/``, the app may import ``engine.api`` (the contracts) and nothing else of the engine,
    but for the document and tool seams, each limited to its own engine package."""
    app_dir = Path(__file__).parents[2] / "app"
    importers: dict[str, set[str]] = {}
    for path in app_dir.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                if (name == "engine" or name.startswith("engine.")) and name != "engine.api":
                    importers.setdefault(path.relative_to(app_dir).as_posix(), set()).add(name)
    seams = {p: names for p, names in importers.items() if any(p.startswith(s) for s in SEAMS)}
    for p, names in seams.items():
        allowed = next(package for prefix, package in SEAMS.items() if p.startswith(prefix))
        assert all(n == allowed or n.startswith(allowed + ".") for n in names), (p, names)
    assert seams, "the seams import their engine packages"
    # __main__.py hands `hearth --self-test` to engine.tools.self_test (headless, without the Qt event loop the
    # bridge needs); bench_reply.py measures the app against the engine alone.
    rest = {p for p in importers if not p.startswith("bridge/") and p not in seams}
    assert rest == {"__main__.py", "bench_reply.py"}


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["close", "delete"])
def test_a_first_chat_on_the_real_engine_ends_cleanly(qtbot: Any, tmp_path: Path, caplog: Any, ending: str) -> None:
    """Load the default model through the real bridge, get two replies, then close the window, or delete it
    without closing it (as when a test drops its last reference to it).

    Nothing may fail in a worker thread: pytest-qt's exception capture is on, and no error may be logged (such
    as "Signal source has been deleted" from an emit after the window took the signals object with it). Either
    way the engine loop and the resource monitor stop.
    """
    from app import create_window
    from app.data.conversations import STATUS_DONE
    from tests.app import ui_flows

    timeouts = ui_flows.Timeouts(load_ms=180_000, reply_ms=120_000, first_token_ms=60_000)
    win = create_window(data_dir=tmp_path)
    qtbot.add_widget(win)
    win.show()
    qtbot.wait_exposed(win)
    ui_flows.set_generation(win, temperature=0.0, max_tokens=12)
    ui_flows.load_model(qtbot, win, timeouts=timeouts)
    for question in (ui_flows.FRANCE_QUESTION, ui_flows.ITALY_QUESTION):
        reply = ui_flows.send(qtbot, win, question)
        ui_flows.wait_finished(qtbot, reply, timeouts.reply_ms)
        assert reply.status == STATUS_DONE, reply.error
    signals = win.bridge.signals
    qtbot.wait(1200)  # a metrics tick of the loop and of the monitor
    if ending == "close":
        bridge = win.bridge
        win.close()
        assert bridge.pool.activeThreadCount() == 0
    else:
        win.deleteLater()
        qtbot.wait_until(lambda: not shiboken6.isValid(win), timeout=5000)
        qtbot.wait(1500)  # the loop notices within a second, and stops the monitor too
    win = None  # so that pytest-qt's teardown does not find a deleted window
    emitted: list[Any] = []
    signals.metrics_updated.connect(emitted.append)
    qtbot.wait(2500)
    assert emitted == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
