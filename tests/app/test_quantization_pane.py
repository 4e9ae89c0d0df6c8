"""The model pane's quantization choice on the fake engine: recommendation, fit warning, and the level loaded."""

from __future__ import annotations

from typing import Any

from PySide6.QtWidgets import QComboBox, QLabel, QLineEdit

from app.bridge.types import QuantizationAdvice
from app.window.main_window import MainWindow
from tests.app import ui_flows
from tests.app.fake_engine import FakeLLM

TIMEOUT_MS = 5000


def _wait_recommendation(qtbot: Any, window: MainWindow) -> None:
    label = ui_flows.child(window, QLabel, "recommendationLabel")
    qtbot.wait_until(lambda: "Recommended" in label.text(), timeout=TIMEOUT_MS)


def test_recommendation_shows_and_preselects(qtbot: Any, window: MainWindow) -> None:
    _wait_recommendation(qtbot, window)
    text = ui_flows.child(window, QLabel, "recommendationLabel").text()
    # The fake model has 4 B parameters and 6 GiB free: int8 (3.7 GiB) fits, bf16 (7.5 GiB) does not.
    assert "precision: <b>int8</b>" in text and "weights 3.7 GiB" in text and "128.0 KiB per token" in text
    assert "512.0 MiB for 4096 tokens" in text and "6.0 GiB free" in text and "fits: yes" in text
    label = ui_flows.child(window, QLabel, "recommendationLabel")
    assert "fit in the fake's free RAM" in label.toolTip() and "Why?" in text  # the reason, a click away
    label.linkActivated.emit("why")
    assert "fit in the fake&#x27;s free RAM" in label.text()  # the reason, escaped
    combo = ui_flows.child(window, QComboBox, "quantizationCombo")
    assert combo.currentData() == "int8" and combo.currentText().startswith("int8")
    assert not ui_flows.child(window, QLabel, "quantizationWarning").isVisible()


def test_level_that_does_not_fit_warns(qtbot: Any, window: MainWindow) -> None:
    _wait_recommendation(qtbot, window)
    combo = ui_flows.child(window, QComboBox, "quantizationCombo")
    warning = ui_flows.child(window, QLabel, "quantizationWarning")
    combo.setCurrentIndex(combo.findData("bf16"))
    assert warning.isVisible()
    assert warning.text() == "bf16 needs 8.0 GiB but only 6.0 GiB is free — it will not fit."
    combo.setCurrentIndex(combo.findData("fp32"))
    assert warning.text().startswith("fp32 needs 15.4 GiB")
    combo.setCurrentIndex(combo.findData("int4"))
    assert not warning.isVisible()
    combo.setCurrentIndex(combo.findData("auto"))
    assert not warning.isVisible()


def test_chosen_level_reaches_the_llm(qtbot: Any, window: MainWindow) -> None:
    _wait_recommendation(qtbot, window)
    combo = ui_flows.child(window, QComboBox, "quantizationCombo")
    combo.setCurrentIndex(combo.findData("int4"))
    ui_flows.load_model(qtbot, window)
    llm = FakeLLM.instances[-1]
    assert llm.requested_quantization == "int4" and llm.quantization == "int4"
    assert window.bridge.model_info.quantization == "int4"
    assert "precision <b>int4</b>" in ui_flows.child(window, QLabel, "modelInfoLabel").text()
    assert window.monitor_pane._model["quantization"] == "int4"


def test_one_precision_choice_sets_the_dtype_too(qtbot: Any, window: MainWindow) -> None:
    assert window.findChild(QComboBox, "dtypeCombo") is None  # no second, overlapping menu
    _wait_recommendation(qtbot, window)
    combo = ui_flows.child(window, QComboBox, "quantizationCombo")
    assert [combo.itemData(i) for i in range(combo.count())] == [
        "auto", "fp32", "bf16", "fp16", "int8", "int4", "file"
    ]
    combo.setCurrentIndex(combo.findData("fp32"))
    ui_flows.load_model(qtbot, window)
    llm = FakeLLM.instances[-1]
    assert llm.requested_quantization == "fp32" and llm.dtype == "float32"


def test_bad_path_gives_no_recommendation(qtbot: Any, window: MainWindow, tmp_path: Any) -> None:
    _wait_recommendation(qtbot, window)
    label = ui_flows.child(window, QLabel, "recommendationLabel")
    with qtbot.wait_signal(window.bridge.signals.recommendation_ready, timeout=TIMEOUT_MS):
        ui_flows.child(window, QLineEdit, "modelPathEdit").setText(str(tmp_path / "missing.gguf"))
    qtbot.wait_until(lambda: "No recommendation" in label.text(), timeout=TIMEOUT_MS)


def test_bridge_recommends_each_level(qtbot: Any, bridge: Any) -> None:
    with qtbot.wait_signal(bridge.signals.recommendation_ready, timeout=TIMEOUT_MS) as blocker:
        bridge.recommend_quantization("", "cpu")
    advice = blocker.args[0]
    assert isinstance(advice, QuantizationAdvice) and advice.spec == "default" and advice.device == "cpu"
    assert advice.recommendation.quantization == "int8" and not advice.error
    assert set(advice.estimates) == {"fp32", "bf16", "fp16", "int8", "int4", "file"}
    assert advice.estimates["bf16"].fits == "no" and advice.estimates["int4"].fits == "yes"
    assert advice.estimates["file"].fits == "no" and "GGUF" in advice.estimates["file"].reason  # no blocks to keep
