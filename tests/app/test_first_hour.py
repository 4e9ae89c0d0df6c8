"""The first hour on the fake engine: the Models view, keeping a working model, settings that persist, context."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QCheckBox, QComboBox, QLabel, QLineEdit, QPushButton, QSpinBox, QTreeWidget

from app.bridge.engine_bridge import EngineBridge
from app.bridge.types import LoadSettings
from app.window.main_window import MainWindow
from tests.app import ui_flows
from tests.app.fake_engine import FakeLLM


def test_models_view_lists_models_and_loads_one_with_a_double_click(qtbot: Any, window: MainWindow) -> None:
    tree = ui_flows.child(window, QTreeWidget, "modelsTree")
    qtbot.wait_until(lambda: tree.topLevelItemCount() == 2, timeout=5000)
    smol, whisper = tree.topLevelItem(0), tree.topLevelItem(1)
    assert [smol.text(i) for i in range(7)] == ["SmolLM2-135M-Instruct", "Hugging Face", "LlamaForCausalLM", "135M",
                                                "BF16", "0.25 GiB", "Yes"]
    assert smol.toolTip(0).splitlines()[1].startswith("Hugging Face: ")
    assert whisper.text(6) == "Can't run" and "speech model" in whisper.toolTip(0)
    tree.setCurrentItem(whisper)
    assert not ui_flows.child(window, QPushButton, "loadFoundModelButton").isEnabled()
    assert "can't run" in ui_flows.child(window, QLabel, "modelDetailLabel").text()
    with qtbot.wait_signal(window.bridge.signals.model_loaded, timeout=5000) as blocker:
        tree.itemDoubleClicked.emit(smol, 0)
    assert blocker.args[0].spec == "default"


def test_added_folders_are_listed_and_kept(qtbot: Any, window: MainWindow, tmp_path: Path) -> None:
    tree = ui_flows.child(window, QTreeWidget, "modelsTree")
    qtbot.wait_until(lambda: tree.topLevelItemCount() == 2, timeout=5000)
    folder = tmp_path / "my-models"
    folder.mkdir()
    window.models_view.add_folder(str(folder))
    qtbot.wait_until(lambda: tree.topLevelItemCount() == 3, timeout=5000)
    assert tree.topLevelItem(2).toolTip(0).splitlines()[1].startswith("Added folder: ")
    assert window.settings.model_folders == [str(folder)]


def test_a_bad_path_keeps_the_loaded_model_and_the_server(qtbot: Any, window: MainWindow, tmp_path: Path) -> None:
    ui_flows.load_model(qtbot, window)
    first = FakeLLM.instances[-1]
    ui_flows.child(window, QCheckBox, "serveCheck").setChecked(True)
    edit = ui_flows.child(window, QLineEdit, "modelPathEdit")
    edit.setText(str(tmp_path / "missing.gguf"))
    with qtbot.wait_signal(window.bridge.signals.model_load_failed, timeout=5000):
        qtbot.mouseClick(ui_flows.child(window, QPushButton, "loadModelButton"), Qt.MouseButton.LeftButton)
    assert not first.is_closed and FakeLLM.instances[-1] is first
    assert window.bridge.model_info is not None and window.bridge.model_info.model_name == "fake-smollm"
    error = ui_flows.child(window, QLabel, "modelErrorLabel").text()
    assert "No model found" in error and "fake-smollm stays in use" in error
    assert "fake-smollm" in ui_flows.child(window, QLabel, "modelInfoLabel").text()
    assert window.findChild(QLabel, "modelStatusLabel").text().startswith("fake-smollm")
    reply = ui_flows.send(qtbot, window, ui_flows.FRANCE_QUESTION)  # the kept model still answers
    ui_flows.wait_finished(qtbot, reply, 5000)
    assert reply.content


def test_a_failed_connect_keeps_the_local_model(qtbot: Any, loaded_bridge: EngineBridge) -> None:
    llm = FakeLLM.instances[-1]
    with qtbot.wait_signal(loaded_bridge.signals.model_load_failed, timeout=15000):
        loaded_bridge.connect_remote("http://127.0.0.1:9/v1")
    assert not llm.is_closed and loaded_bridge.model_info is not None and loaded_bridge.remote is None


def test_the_chosen_precision_survives_a_new_recommendation(qtbot: Any, window: MainWindow) -> None:
    combo = ui_flows.child(window, QComboBox, "quantizationCombo")
    qtbot.wait_until(lambda: combo.currentData() == "int8", timeout=5000)  # the fake's recommendation
    combo.setCurrentIndex(combo.findData("int4"))
    combo.activated.emit(combo.currentIndex())
    with qtbot.wait_signal(window.bridge.signals.recommendation_ready, timeout=5000):
        ui_flows.child(window, QComboBox, "deviceCombo").setCurrentIndex(1)
    assert combo.currentData() == "int4"


def test_cuda_without_a_gpu_says_why_and_falls_back(qtbot: Any, window: MainWindow) -> None:
    device = ui_flows.child(window, QComboBox, "deviceCombo")
    qtbot.wait_until(lambda: window.model_pane._hardware is not None, timeout=5000)
    device.setCurrentIndex(device.findData("cuda"))
    device.activated.emit(device.currentIndex())
    note = ui_flows.child(window, QLabel, "deviceNoteLabel")
    assert note.isVisibleTo(window) and "runs on the CPU" in note.text()
    assert device.currentData() == "auto"


def test_the_model_card_says_the_default_is_a_demo_and_the_model_sets_sampling(qtbot: Any,
                                                                                  window: MainWindow) -> None:
    ui_flows.load_model(qtbot, window)
    assert "small demo model" in ui_flows.child(window, QLabel, "modelInfoLabel").text()
    assert window.model_pane.sampling_params()["top_p"] == 0.3


def test_settings_persist_across_restarts(qtbot: Any, fake_api: Any, tmp_path: Path) -> None:
    from app import create_window

    win = create_window(data_dir=tmp_path, bridge=EngineBridge(api=fake_api))
    qtbot.add_widget(win)
    model = tmp_path / "my-model"
    model.mkdir()
    ui_flows.load_model(qtbot, win, str(model))
    assert ui_flows.child(win, QCheckBox, "autoLoadCheck").isChecked()  # on by default: a restart loads it again
    ui_flows.child(win, QSpinBox, "servePortSpin").setValue(8123)
    ui_flows.child(win, QCheckBox, "serveCheck").setChecked(True)
    ui_flows.child(win, QSpinBox, "contextLengthSpin").setValue(2048)
    win.model_pane.load_settings_form.set_overflow("stop")
    ui_flows.load_model(qtbot, win, str(model))  # the context length is kept for the model it was loaded with
    win.close()
    again = create_window(data_dir=tmp_path, bridge=EngineBridge(api=fake_api))
    qtbot.add_widget(again)
    with qtbot.wait_signal(again.bridge.signals.model_loaded, timeout=5000) as blocker:
        pass  # auto-load on start
    assert blocker.args[0].spec == str(model)
    assert ui_flows.child(again, QSpinBox, "servePortSpin").value() == 8123
    assert ui_flows.child(again, QCheckBox, "serveCheck").isChecked()
    assert again.model_pane.load_settings().context_length == 2048
    assert again.model_pane.load_settings().overflow == "stop"
    assert FakeLLM.instances[-1].max_model_len == 2048
    again.close()


def test_replies_are_repeatable_by_default_speculation_is_a_choice_and_repeatable_is_kept(qtbot: Any, fake_api: Any, tmp_path: Path) -> None:
    """The app's chat loads the engine deterministic unless the user turns it off; the choice survives a restart."""
    from app import create_window

    win = create_window(data_dir=tmp_path, bridge=EngineBridge(api=fake_api))
    qtbot.add_widget(win)
    repeatable = ui_flows.child(win, QCheckBox, "repeatableCheck")
    assert repeatable.isChecked()
    ui_flows.load_model(qtbot, win)
    assert FakeLLM.instances[-1].deterministic is True
    assert FakeLLM.instances[-1].speculative == "ngram"
    repeatable.setChecked(False)
    speculative = ui_flows.child(win, QComboBox, "speculativeCombo")
    speculative.setCurrentIndex(speculative.findData("off"))
    ui_flows.load_model(qtbot, win)
    assert FakeLLM.instances[-1].deterministic is False
    assert FakeLLM.instances[-1].speculative == "off"
    win.close()
    again = create_window(data_dir=tmp_path, bridge=EngineBridge(api=fake_api))
    qtbot.add_widget(again)
    assert not ui_flows.child(again, QCheckBox, "repeatableCheck").isChecked()
    again.close()


def test_overflow_policy_reaches_the_engine(qtbot: Any, loaded_bridge: EngineBridge) -> None:
    engine = FakeLLM.instances[-1].engine
    long_chat = [{"role": "system", "content": "be brief"}]
    for i in range(30):
        long_chat += [{"role": "user", "content": f"question {i} " + "w " * 9},
                      {"role": "assistant", "content": f"answer {i} " + "w " * 9}]
    long_chat.append({"role": "user", "content": "What is the capital of France?"})
    with qtbot.wait_signal(loaded_bridge.signals.request_finished, timeout=5000):
        loaded_bridge.submit("c1", long_chat, {"max_tokens": 8})
    sent = engine.submitted[-1]
    assert sent[0] == long_chat[0] and sent[-1] == long_chat[-1] and len(sent) < len(long_chat)
    loaded_bridge.set_overflow_policy("stop")
    with qtbot.wait_signal(loaded_bridge.signals.request_failed, timeout=5000) as blocker:
        loaded_bridge.submit("c1", long_chat, {"max_tokens": 8})
    assert "Start a new chat" in blocker.args[1]
    assert LoadSettings().overflow == "truncate_middle"


def test_data_dir_moves_the_model_cache(tmp_path: Path) -> None:
    code = ("import sys; from app.__main__ import main; import app.__main__ as m; "
            "m.QApplication = None; sys.argv = ['hearth', '--data-dir', sys.argv[1], '--self-test', 'x']; "
            "import engine.tools.self_test as st; st.run_self_test = lambda prompt: 0; main(); "
            "from engine.system.paths import models_dir; print(models_dir())")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "data")], capture_output=True, text=True,
                         env={**os.environ, "HEARTH_DATA_DIR": ""}, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == str(tmp_path / "data" / "models")
