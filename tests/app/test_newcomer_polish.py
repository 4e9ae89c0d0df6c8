"""What a newcomer sees at once: wheels that scroll panes, button texts, honest labels, the Models list, dates, Help."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import QApplication, QScrollArea, QSpinBox


def _wheel(widget: Any, steps: int = 3) -> QWheelEvent:
    centre = QPointF(widget.rect().center())
    return QWheelEvent(centre, QPointF(widget.mapToGlobal(centre.toPoint())), QPoint(0, 0), QPoint(0, 120 * steps),
                       Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False)


def test_wheel_over_an_unfocused_spin_box_in_the_model_pane_leaves_its_value(window: Any, qtbot: Any) -> None:
    pane = window.model_pane
    spin = pane.findChild(QSpinBox, "maxBatchSizeSpin")
    assert spin is not None
    assert isinstance(pane.findChild(QScrollArea), QScrollArea)
    assert spin.focusPolicy() == Qt.FocusPolicy.StrongFocus  # a wheel does not give it the focus
    window.chat_pane.focus_input()
    assert not spin.hasFocus()
    before = spin.value()
    QApplication.sendEvent(spin, _wheel(spin))
    assert spin.value() == before
    spin.setFocus()
    qtbot.waitUntil(spin.hasFocus, timeout=2000)
    QApplication.sendEvent(spin, _wheel(spin))  # focused, it takes the wheel as before
    assert spin.value() != before


def shown_text(text: str) -> str:
    """A button's or action's text as Qt draws it: "&&" is one "&", a lone "&" marks the next character as the
    mnemonic (drawn underlined; "_" here) and is not drawn itself."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "&" and i + 1 < len(text):
            out.append("&" if text[i + 1] == "&" else "_" + text[i + 1] if text[i + 1] in " \t" else text[i + 1])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def test_shown_text_follows_qt() -> None:
    assert shown_text("Save && send") == "Save & send"
    assert shown_text("Save & send") == "Save _ send"
    assert shown_text("&File") == "File"


def test_no_button_or_action_text_has_a_stray_mnemonic(window: Any) -> None:
    from PySide6.QtGui import QAction
    from PySide6.QtWidgets import QAbstractButton

    from app.chat.composer import Composer

    composer = window.chat_pane.findChild(Composer)
    composer.update_controls(can_send=True, is_streaming=False, is_model_ready=True, is_editing=True)
    send = composer.findChild(QAbstractButton, "sendButton")
    assert shown_text(send.text()) == "Save & send"
    texts = [button.text() for button in window.findChildren(QAbstractButton)]
    texts += [action.text() for action in window.findChildren(QAction)]
    for text in texts:
        for i, char in enumerate(text[:-1]):
            if char == "&" and (i == 0 or text[i - 1] != "&"):
                follower = text[i + 1]
                assert follower == "&" or follower.isalnum(), f"{text!r} shows a stray mnemonic: {shown_text(text)!r}"


def test_status_bar_card_and_markdown_export_name_the_precision_that_runs(qtbot: Any, window: Any) -> None:
    from PySide6.QtWidgets import QComboBox, QLabel

    from app.data import export
    from tests.app import ui_flows
    from tests.app.fake_engine import FakeLLM

    label = ui_flows.child(window, QLabel, "recommendationLabel")
    qtbot.wait_until(lambda: "Recommended" in label.text(), timeout=10_000)
    combo = ui_flows.child(window, QComboBox, "quantizationCombo")
    combo.setCurrentIndex(combo.findData("int4"))
    ui_flows.load_model(qtbot, window)
    llm = FakeLLM.instances[-1]
    assert (llm.quantization, llm.dtype) == ("int4", "bfloat16")  # runs int4, computes in bf16
    assert ui_flows.child(window, QLabel, "modelStatusLabel").text() == "fake-smollm · cpu · int4"
    card = ui_flows.child(window, QLabel, "modelInfoLabel").text()
    assert "precision <b>int4</b> (computes in bfloat16)" in card
    ui_flows.set_generation(window, max_tokens=4)
    reply = ui_flows.send(qtbot, window, "What is the capital of France?")
    ui_flows.wait_finished(qtbot, reply, 10_000)
    text = export.to_markdown(window.storage, window.chat_pane.current_conversation.id)
    assert "model fake-smollm (int4)" in text and "bfloat16" not in text
