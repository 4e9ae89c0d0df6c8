"""The app's remote backend against Hearth's own server, running in a subprocess on the default model."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.bridge.engine_bridge import EngineBridge
from app.bridge.remote_backend import api_root, parse_server_metrics, sampling_body
from app.bridge.types import REMOTE_DEVICE, ModelInfo, RequestInfo
from engine.api import EngineMetrics
from tests.engine.server_process import API_KEY, KEYED, ServerProcess, free_port

HI = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def server(shared_server: Callable[..., ServerProcess]) -> ServerProcess:
    return shared_server(*KEYED)


@pytest.fixture
def bridge(qtbot: Any) -> Iterator[EngineBridge]:
    bridge = EngineBridge()
    yield bridge
    bridge.shutdown()


def connect(qtbot: Any, bridge: EngineBridge, server: ServerProcess) -> ModelInfo:
    listed: list[list[str]] = []
    bridge.signals.remote_models_listed.connect(listed.append)
    with qtbot.wait_signal(bridge.signals.model_loaded, timeout=15000) as blocker:
        bridge.connect_remote(server.base_url, API_KEY)
    info = blocker.args[0]
    assert isinstance(info, ModelInfo) and listed == [["SmolLM2-135M-Instruct"]]
    return info


def test_bridge_streams_a_reply_from_the_server(qtbot: Any, bridge: EngineBridge, server: ServerProcess) -> None:
    info = connect(qtbot, bridge, server)
    assert (info.model_name, info.device, info.spec) == ("SmolLM2-135M-Instruct", REMOTE_DEVICE, server.v1)
    deltas: list[str] = []
    bridge.signals.token_delta.connect(lambda rid, text: deltas.append(text))
    with qtbot.wait_signal(bridge.signals.request_finished, timeout=30000) as blocker:
        rid = bridge.submit("conv-1", HI, {"temperature": 0.0, "max_tokens": 8, "top_p": 1.0})
    finished: RequestInfo = blocker.args[1]
    assert blocker.args[0] == rid and finished.conversation_id == "conv-1"
    assert finished.finish_reason in ("stop", "length") and "".join(deltas).strip()
    assert 0 < finished.metrics["num_generated_tokens"] <= 8 and finished.metrics["ttft_s"] > 0
    # The monitor's figures: client-side latency plus the server's own KV-cache gauge from /metrics.
    qtbot.wait_until(lambda: (m := bridge._engine_metrics()) is not None and m.kv_blocks_total > 0, timeout=5000)
    snapshot = bridge._engine_metrics()
    assert snapshot is not None and snapshot.ttft_p50 > 0 and snapshot.kv_blocks_total > 0
    assert snapshot.concurrency_limit > 0  # a Hearth server: its scheduler's own figures too


def test_cancel_stops_a_remote_reply(qtbot: Any, bridge: EngineBridge, server: ServerProcess) -> None:
    connect(qtbot, bridge, server)
    with qtbot.wait_signal(bridge.signals.token_delta, timeout=30000):
        rid = bridge.submit("conv-2", [{"role": "user", "content": "Tell me a long story."}],
                            {"temperature": 0.0, "max_tokens": 300})
    with qtbot.wait_signal(bridge.signals.request_finished, timeout=10000) as blocker:
        bridge.cancel(rid)
    assert blocker.args[0] == rid and blocker.args[1].finish_reason == "abort"


def test_connection_errors_are_in_plain_words(qtbot: Any, bridge: EngineBridge, server: ServerProcess) -> None:
    with qtbot.wait_signal(bridge.signals.model_load_failed, timeout=15000) as blocker:
        bridge.connect_remote(f"http://127.0.0.1:{free_port()}")
    assert "Could not connect" in blocker.args[0] and "running" in blocker.args[0]
    with qtbot.wait_signal(bridge.signals.model_load_failed, timeout=15000) as blocker:
        bridge.connect_remote(server.base_url, "wrong-key")
    assert "refused the API key" in blocker.args[0]
    with qtbot.wait_signal(bridge.signals.model_load_failed, timeout=15000) as blocker:
        bridge.connect_remote(server.base_url, API_KEY, "no-such-model")
    assert "no model 'no-such-model'" in blocker.args[0]


def test_model_pane_connects_through_the_remote_choice(qtbot: Any, bridge: EngineBridge,
                                                       server: ServerProcess) -> None:
    from app.model.model_pane import ModelPane

    pane = ModelPane(bridge)
    qtbot.add_widget(pane)
    bridge.signals.model_loaded.connect(pane._on_model_loaded)
    pane._source_combo.setCurrentIndex(pane._source_combo.findData("remote"))
    assert pane.is_remote() and not pane._remote_box.isHidden() and pane._local_box.isHidden()
    assert pane._load_button.text() == "Connect"
    pane._remote_url_edit.setText(server.v1)
    pane._remote_key_edit.setText(API_KEY)
    with qtbot.wait_signal(bridge.signals.model_loaded, timeout=15000):
        pane._load_button.click()
    assert pane._remote_model_combo.currentText() == "SmolLM2-135M-Instruct"
    assert "SmolLM2-135M-Instruct" in pane._info_label.text()


def test_helpers() -> None:
    assert api_root("localhost:8000") == "http://localhost:8000/v1"
    assert api_root("https://gpu-box/v1/") == "https://gpu-box/v1"
    assert sampling_body({"temperature": 0.5, "top_k": 40, "max_tokens": 9, "stop": []}) == {
        "temperature": 0.5, "max_tokens": 9}
    text = ('vllm:kv_cache_usage_perc{engine="0"} 0.25\nvllm:num_requests_running{engine="0"} 3\n'
            'vllm:prefix_cache_queries_total 10\nvllm:prefix_cache_hits_total 4\n')
    assert parse_server_metrics(text) == EngineMetrics(kv_cache_usage=0.25, num_running=3, prefix_cache_queries=10,
                                                       prefix_cache_hits=4, prefix_cache_hit_rate=0.4)
    client = EngineMetrics(time=5.0, num_running=1, ttft_p50=0.2)  # the server's figures win where it has them
    assert parse_server_metrics(text, client) == EngineMetrics(
        time=5.0, kv_cache_usage=0.25, num_running=3, ttft_p50=0.2, prefix_cache_queries=10, prefix_cache_hits=4,
        prefix_cache_hit_rate=0.4)


@pytest.mark.slow  # a tiny model built, loaded and served
def test_serve_on_localhost_shares_the_loaded_engine(qtbot: Any, bridge: EngineBridge, tmp_path: Path,
                                                     default_model_dir: Path) -> None:
    import httpx

    from app.bridge.types import ServerState
    from tests.engine.conftest import build_tiny_model

    folder = build_tiny_model("llama", tmp_path / "tiny", default_model_dir)
    with qtbot.wait_signal(bridge.signals.model_loaded, timeout=60000):
        bridge.load_model(str(folder), "cpu", "float32")
    port = free_port()
    with qtbot.wait_signal(bridge.signals.server_state_changed, timeout=15000) as blocker:
        bridge.start_server(port, "local-key")
    state: ServerState = blocker.args[0]
    assert state.is_running and state.url == f"http://127.0.0.1:{port}/v1"
    body = {"prompt": "Hello", "max_tokens": 4, "temperature": 0}
    headers = {"Authorization": "Bearer local-key"}
    reply = httpx.post(f"{state.url}/completions", json=body, headers=headers, timeout=30)
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4
    assert httpx.post(f"{state.url}/completions", json=body, timeout=30).status_code == 401
    with qtbot.wait_signal(bridge.signals.server_state_changed, timeout=15000) as blocker:
        bridge.unload_model()
    assert not blocker.args[0].is_running
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
