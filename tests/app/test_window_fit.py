"""The window a new user sees: it fits a laptop, reads in dark mode, says what state it is in, keeps its panes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QPoint, QRect, QUrl
from PySide6.QtGui import QColor, QGuiApplication, QPalette, QTextFrame
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QLabel,
    QListWidget,
    QMessageBox,
    QPushButton,
    QRadioButton,
    QScrollArea,
    QStyle,
    QStyleOptionButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.bridge.types import NativeBuild
from app.chat.chat_input import ChatInput
from app.chat.markdown import split_reasoning
from app.chat.message_view import MessageView
from app.data.conversations import Message
from app.monitor.monitor_pane import THROUGHPUT_IDLE_S, MonitorPane
from app.window.main_window import MainWindow, import_error_text
from app.window.theme import apply_theme
from tests.app import ui_flows

LAPTOP = (1366, 768)
TIMEOUT_MS = 5000


@pytest.fixture
def dark() -> Iterator[None]:
    apply_theme("dark")
    yield
    apply_theme("system")


def _luminance(colour: QColor) -> float:
    def channel(value: float) -> float:
        return value / 12.92 if value <= 0.03928 else ((value + 0.055) / 1.055) ** 2.4

    return 0.2126 * channel(colour.redF()) + 0.7152 * channel(colour.greenF()) + 0.0722 * channel(colour.blueF())


def contrast(a: QColor, b: QColor) -> float:
    """The WCAG contrast ratio of two colours (1 to 21)."""
    high, low = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def _on_screen(window: MainWindow, widget: QWidget) -> bool:
    """Whether ``widget`` is shown and lies wholly inside the window."""
    top_left = widget.mapTo(window, QPoint(0, 0))
    return widget.isVisible() and window.rect().contains(QRect(top_left, widget.size()))


# -- fits a 1366x768 laptop --------------------------------------------------------------------------------


def test_window_fits_a_laptop_screen(qtbot: Any, window: MainWindow) -> None:
    hint = window.minimumSizeHint()
    assert hint.width() <= LAPTOP[0] and hint.height() <= LAPTOP[1] - 60  # room for a title bar and panel
    window.resize(*LAPTOP)
    qtbot.wait_until(lambda: window.width() == LAPTOP[0], timeout=2000)
    for name in ("sendButton", "stopButton", "loadModelButton", "unloadModelButton"):
        assert _on_screen(window, ui_flows.child(window, QPushButton, name)), name
    assert _on_screen(window, window.statusBar())
    assert window.chat_pane.width() > window.width() / 2  # the chat gets most of the width
    window.monitor_dock.raise_()
    qtbot.wait_until(lambda: window.monitor_pane.isVisible(), timeout=2000)
    assert _on_screen(window, ui_flows.child(window, QPushButton, "exportCsvButton"))


def _settle(qtbot: Any, window: MainWindow, size: tuple[int, int]) -> None:
    window.resize(*size)
    qtbot.wait_until(lambda: window.size().toTuple() == size, timeout=2000)
    qtbot.wait(50)  # the docks and the splitter settle after the resize


def _assert_within(window: MainWindow, size: tuple[int, int]) -> None:
    """The window, its minimum size and its panes stay inside a screen of ``size``."""
    assert window.width() <= size[0] and window.height() <= size[1]
    assert window.minimumSizeHint().width() <= size[0] - 200  # room to spare, even with every section open
    for widget in (window.chat_pane, window.model_dock, window.statusBar(), window.chat_pane.view):
        assert _on_screen(window, widget), widget.objectName()


def test_opening_the_sampling_and_folded_sections_keeps_the_window_on_a_laptop_screen(
        qtbot: Any, window: MainWindow) -> None:
    _settle(qtbot, window, LAPTOP)
    scroll = window.model_pane.findChild(QScrollArea)
    assert scroll is not None
    qtbot.wait_until(lambda: scroll.verticalScrollBar().maximum() == 0, timeout=2000)  # no scrolling, folded
    assert window.chat_pane.view.viewport().width() >= 600  # the chat column gets the room the pane gave up
    toggle = ui_flows.child(window, QToolButton, "samplingToggle")
    toggle.setChecked(True)
    qtbot.wait_until(lambda: ui_flows.child(window, QCheckBox, "customSamplingCheck").isVisible(), timeout=2000)
    qtbot.wait(50)
    _assert_within(window, LAPTOP)
    for section in (window.model_pane.engine_section, window.model_pane.hardware_section):
        assert section.is_folded
        section.set_folded(False)
        assert section.box.isVisible()
        qtbot.wait(50)
        _assert_within(window, LAPTOP)
    assert window.model_dock.width() <= 450


#: The real default model's recommendation, as long as it is on a machine without a GPU (the fake's is one line).
DEFAULT_MODEL_REASON = (
    "int4 weights (0.1 GiB) plus a 4096-token KV cache for 4 chats (0.70 GiB) fit in 13.1 GiB of free RAM; the "
    "decoder's linear weights are Q4_1 blocks in SmolLM2-135M-Instruct.Q4_1.gguf, and int4 runs those same 4-bit "
    "values, reading about a third of bf16's bytes per weight (bf16 would only hold them dequantized).")


def _content_fits(scroll: QScrollArea) -> bool:
    content = scroll.widget()
    return content.heightForWidth(content.width()) <= scroll.viewport().height() \
        and scroll.verticalScrollBar().maximum() == 0


def test_the_model_pane_fits_a_laptop_screen_with_the_default_model_loaded(qtbot: Any, window: MainWindow) -> None:
    _settle(qtbot, window, LAPTOP)
    pane = window.model_pane
    qtbot.wait_until(lambda: pane.findChild(QLabel, "recommendationLabel").text().startswith("Recommended"),
                     timeout=TIMEOUT_MS)
    advice = pane._choices.advice
    assert advice is not None and advice.recommendation is not None
    long_advice = replace(advice, recommendation=replace(advice.recommendation, reason=DEFAULT_MODEL_REASON))
    pane._on_recommendation_ready(long_advice)
    ui_flows.load_model(qtbot, window)
    ui_flows.child(window, QCheckBox, "autoLoadCheck").setChecked(True)
    card = ui_flows.child(window, QLabel, "modelInfoLabel")
    assert "small demo model" in card.text() and "loaded in" in card.text()
    scroll = pane.findChild(QScrollArea)
    assert scroll is not None
    qtbot.wait_until(lambda: _content_fits(scroll), timeout=2000)  # no scrolling with a model loaded
    window.bridge.signals.native_build_changed.emit(NativeBuild("building"))  # a first start's extra line
    qtbot.wait_until(ui_flows.child(window, QLabel, "nativeBuildLabel").isVisible, timeout=2000)
    qtbot.wait_until(lambda: _content_fits(scroll), timeout=2000)
    label = ui_flows.child(window, QLabel, "recommendationLabel")
    assert DEFAULT_MODEL_REASON[:40] in label.toolTip() and DEFAULT_MODEL_REASON[:40] not in label.text()
    label.linkActivated.emit("why")  # "Why?" unfolds the reason (the pane may scroll then)
    assert DEFAULT_MODEL_REASON[:40] in label.text()
    label.linkActivated.emit("why")
    qtbot.wait_until(lambda: _content_fits(scroll), timeout=2000)


def test_a_wide_screen_keeps_the_transcript_lines_readable_and_the_titles_whole(
        qtbot: Any, window: MainWindow) -> None:
    pane = window.chat_pane
    title = "Planning a week of vegetarian dinners for four people"
    pane.store.rename(pane.current_conversation.id, title)
    pane.refresh()
    pane.store.add_user(pane.current_conversation, "word " * 600)
    pane.select_conversation(pane.current_conversation.id)
    _settle(qtbot, window, (1920, 1080))
    view = pane.view
    assert 500 <= view.viewport().width() <= window.readable_width.max_width() + 20
    assert view.document().idealWidth() <= view.viewport().width()
    centre = view.viewport().mapTo(window, view.viewport().rect().center()).x()
    middle = view.mapTo(window, view.rect().center()).x()
    assert abs(centre - middle) <= view.verticalScrollBar().sizeHint().width()  # centred, not pushed left
    listing = pane.findChild(QListWidget, "conversationList")
    row = listing.visualItemRect(listing.item(0))
    assert listing.fontMetrics().horizontalAdvance(title) <= row.width()  # the title fits on its line
    _settle(qtbot, window, LAPTOP)
    row = listing.visualItemRect(listing.item(0))
    lines = row.height() // listing.fontMetrics().lineSpacing()
    assert listing.wordWrap() and lines >= 2  # narrower, the title wraps rather than being cut off
    _assert_within(window, LAPTOP)


def test_a_long_code_line_does_not_scroll_the_chat_sideways(qtbot: Any) -> None:
    view = MessageView()
    qtbot.add_widget(view)
    view.resize(500, 400)
    view.show()
    line = "x = [" + ", ".join(str(i) for i in range(400)) + "]"
    view.append_message(Message("assistant", f"Here:\n\n```python\n{line}\n```\n\nand a {'y' * 300} word."))
    qtbot.wait_until(lambda: view.horizontalScrollBar().maximum() == 0, timeout=2000)
    assert view.document().idealWidth() <= view.viewport().width()


# -- dark mode ---------------------------------------------------------------------------------------------


def _frame_background(view: MessageView, index: int) -> QColor:
    """The colour message ``index``'s bubble is drawn in: its background, over the view's base if translucent."""
    frames = [f for f in view.document().rootFrame().childFrames() if isinstance(f, QTextFrame)]
    colour = frames[index].frameFormat().background().color()
    base, a = view.palette().color(QPalette.ColorRole.Base), colour.alphaF()
    return QColor.fromRgbF(a * colour.redF() + (1 - a) * base.redF(), a * colour.greenF() + (1 - a) * base.greenF(),
                           a * colour.blueF() + (1 - a) * base.blueF())


def test_dark_mode_chat_text_contrasts_with_its_bubbles(qtbot: Any, window: MainWindow, dark: None) -> None:
    ui_flows.load_model(qtbot, window)
    reply = ui_flows.send(qtbot, window, ui_flows.FRANCE_QUESTION)
    ui_flows.wait_finished(qtbot, reply, TIMEOUT_MS)
    view = window.chat_pane.view
    text = view.palette().color(QPalette.ColorRole.Text)
    assert text.lightness() > 150  # light text ...
    qtbot.wait_until(lambda: _frame_background(view, 1).lightness() < 100, timeout=2000)  # ... on dark bubbles
    for index in (0, 1):
        assert contrast(text, _frame_background(view, index)) >= 4.5, index


def _indicator_contrast(button: QCheckBox | QRadioButton) -> float:
    """The largest luminance step between the button's indicator and the background beside it (0 to 1)."""
    image = button.grab().toImage()
    option = QStyleOptionButton()
    button.initStyleOption(option)
    element = (QStyle.SubElement.SE_CheckBoxIndicator if isinstance(button, QCheckBox)
               else QStyle.SubElement.SE_RadioButtonIndicator)
    rect = button.style().subElementRect(element, option, button)
    background = _luminance(QColor(image.pixel(rect.left(), image.height() - 1)))
    return max(abs(_luminance(QColor(image.pixel(x, y))) - background)
               for x in range(rect.left(), rect.right() + 1) for y in range(rect.top(), rect.bottom() + 1))


def test_unticked_boxes_show_in_dark_mode(qtbot: Any, dark: None) -> None:
    holder = QWidget()
    qtbot.add_widget(holder)
    layout = QVBoxLayout(holder)
    boxes = [QCheckBox("Reply as JSON"), QRadioButton("One"), QCheckBox("Ticked")]
    boxes[2].setChecked(True)
    for box in boxes:
        layout.addWidget(box)
    holder.show()
    qtbot.wait_exposed(holder)
    assert holder.palette().color(QPalette.ColorRole.Window).lightness() < 100
    for box in boxes:
        assert _indicator_contrast(box) > 0.2, box.text()  # light mode's unticked box reaches about 0.2
    apply_theme("light")
    qtbot.wait_until(lambda: holder.palette().color(QPalette.ColorRole.Window).lightness() > 150, timeout=2000)
    assert all(_indicator_contrast(box) > 0.15 for box in boxes)  # and light mode keeps its own


def test_theme_set_before_start_draws_the_open_chat_dark(qtbot: Any, open_window: Any, tmp_path: Path) -> None:
    first = open_window(tmp_path)
    first.chat_pane.store.add_user(first.chat_pane.current_conversation, "hello")
    first.settings.theme = "dark"
    first.close()
    try:
        again = open_window(tmp_path)
        view = again.chat_pane.view
        assert view.message_count == 1
        qtbot.wait_until(lambda: _frame_background(view, 0).lightness() < 120, timeout=2000)
        assert view.palette().color(QPalette.ColorRole.Text).lightness() > 150
    finally:
        apply_theme("system")


def test_a_theme_change_after_a_window_closed_leaves_its_closed_database_alone(qtbot: Any, open_window: Any,
                                                                             tmp_path: Path) -> None:
    """A closed window's transcript (alive until deleted) redraws on a theme change: its replies' tool steps and
    sources must not be read from the database the window closed (pytest-qt fails the test on the error)."""
    first = open_window(tmp_path)
    store, conversation = first.chat_pane.store, first.chat_pane.current_conversation
    store.add_user(conversation, "hello")
    reply = store.start_reply(conversation)
    reply.content = "hi"
    store.finish_reply(reply, "stop", {})
    first.close()
    again = open_window(tmp_path)  # opens the chat: its reply drawn from the database
    qtbot.wait_until(lambda: again.chat_pane.view.message_count == 2, timeout=2000)
    again.close()
    try:
        apply_theme("dark")
        qtbot.wait(50)
    finally:
        apply_theme("system")
    qtbot.wait(50)


def test_graphs_follow_the_theme(qtbot: Any) -> None:
    pane = MonitorPane(sample_interval_ms=3_600_000, stagger_ms=0)
    qtbot.add_widget(pane)
    pane.show()
    try:
        apply_theme("dark")
        qtbot.wait_until(lambda: pane.kv_graph.plot.backgroundBrush().color().lightness() < 100, timeout=2000)
        axis = pane.kv_graph.plot.getPlotItem().getAxis("left")
        assert axis.textPen().color().lightness() > 150
    finally:
        apply_theme("system")
    qtbot.wait_until(lambda: pane.kv_graph.plot.backgroundBrush().color().lightness() > 150, timeout=2000)


def test_message_box_fits_its_text_at_14_pt(qtbot: Any, window: MainWindow) -> None:
    box = ui_flows.child(window, ChatInput, "chatInput")
    small = box.height()
    window.chat_pane.set_font_size(14)
    assert box.height() > small
    assert box.height() >= 2 * box.fontMetrics().lineSpacing() + 2 * box.document().documentMargin()


# -- state text --------------------------------------------------------------------------------------------


def test_placeholder_follows_loading_and_replies(qtbot: Any, window: MainWindow) -> None:
    box = ui_flows.child(window, ChatInput, "chatInput")
    assert box.placeholderText().startswith("Load a model")
    ui_flows.load_model(qtbot, window)
    assert box.placeholderText().startswith("Message Hearth")
    reply = ui_flows.send(qtbot, window, ui_flows.FRANCE_QUESTION)
    assert box.placeholderText().startswith("Hearth is replying")
    ui_flows.wait_finished(qtbot, reply, TIMEOUT_MS)
    assert box.placeholderText().startswith("Message Hearth")


# -- panes can't get lost ----------------------------------------------------------------------------------


def test_reset_layout_brings_closed_panes_back(qtbot: Any, window: MainWindow) -> None:
    window.model_dock.close()
    window.monitor_dock.setFloating(True)
    window.monitor_dock.close()
    assert window.model_dock.isHidden() and window.monitor_dock.isHidden()
    assert window.chat_pane.isVisible()
    window.findChild(type(window.menuBar().actions()[0]), "resetLayoutAction").trigger()
    for dock in (window.model_dock, window.monitor_dock):
        assert not dock.isHidden() and not dock.isFloating()
    assert window.tabifiedDockWidgets(window.model_dock) == [window.models_dock, window.monitor_dock]
    assert window.model_dock.isVisible()


def test_restart_with_side_panes_closed_still_shows_the_chat(qtbot: Any, open_window: Any,
                                                             tmp_path: Path) -> None:
    first = open_window(tmp_path)
    first.model_dock.close()
    first.monitor_dock.close()
    first.close()
    again = open_window(tmp_path)
    assert again.model_dock.isHidden() and again.monitor_dock.isHidden()  # the layout is kept ...
    assert again.centralWidget() is again.chat_pane and again.chat_pane.isVisible()  # ... and the chat shows
    assert ui_flows.child(again, ChatInput, "chatInput").isVisible()



# -- plain words -------------------------------------------------------------------------------------------


def test_precision_is_one_choice(window: MainWindow) -> None:
    assert window.findChild(QComboBox, "dtypeCombo") is None
    combo = ui_flows.child(window, QComboBox, "quantizationCombo")
    assert combo.itemText(combo.findData("auto")).startswith("Automatic")
    assert "reason" in combo.toolTip()


def test_idle_throughput_decays_to_zero(qtbot: Any) -> None:
    pane = MonitorPane(sample_interval_ms=3_600_000, stagger_ms=0)
    qtbot.add_widget(pane)
    pane.show()
    now = [100.0]
    pane.clock = lambda: now[0]
    busy = {"process_rss_bytes": 1 << 29, "num_running": 1.0, "num_waiting": 0.0, "kv_blocks_total": 10.0,
            "throughput_tok_s": 26.6, "num_generated_tokens_total": 500.0}
    pane._on_metrics_updated(busy)
    pane._on_sample_timeout()
    assert pane.headline["tok_s"].text() == "26.6 tok/s"
    idle = dict(busy, num_running=0.0)  # the last reply ended; the engine's window still holds its tokens
    now[0] += 1.0
    pane._on_metrics_updated(idle)
    pane._on_sample_timeout()
    assert pane.headline["tok_s"].text() == "26.6 tok/s"
    now[0] += THROUGHPUT_IDLE_S + 0.5
    pane._on_metrics_updated(idle)
    pane._on_sample_timeout()
    assert pane.headline["tok_s"].text() == "0.0 tok/s"
    assert pane.throughput_graph.curve_data("tokens_per_s")[-1] == 0.0
    pane._on_metrics_updated(idle)  # the stale figure again, between two rows
    pane.redraw()
    assert pane.headline["tok_s"].text() == "0.0 tok/s"
    now[0] += 1.0
    pane._on_metrics_updated(dict(busy, num_generated_tokens_total=520.0))  # tokens again
    pane._on_sample_timeout()
    assert pane.headline["tok_s"].text() == "26.6 tok/s"


def test_monitor_says_what_it_does_not_know(qtbot: Any) -> None:
    pane = MonitorPane(sample_interval_ms=3_600_000, stagger_ms=0)
    qtbot.add_widget(pane)
    pane.show()
    pane._on_metrics_updated({"num_running": 4.0, "kv_blocks_total": 10.0, "e2e_p50": 0.0, "e2e_p99": 0.0,
                              "ttft_p50": 0.25, "batch_efficiency": 0.25})
    pane._on_sample_timeout()
    assert pane._stat_labels["Whole reply (p50 / p99)"].text() == "– / –"  # nothing finished yet, not "0 ms"
    assert "250 ms" in pane._stat_labels["Time to first token (p50 / p90 / p99)"].text()
    assert "maximum batch size" in pane._stat_labels["Batch efficiency"].toolTip()
    assert not any("legend" in type(item).__name__.lower()
                   for item in pane.kv_graph.plot.getPlotItem().items)  # no legend box over the data
    assert pane.kv_graph.legend == ["free", "cached prefixes", "used", "prefix hit rate"]


def test_import_errors_are_sentences(qtbot: Any, window: MainWindow, tmp_path: Path, monkeypatch: Any) -> None:
    bad = tmp_path / "chat.json"
    bad.write_text('{"messages": [', encoding="utf-8")
    try:
        json.loads(bad.read_text())
    except json.JSONDecodeError as exc:
        text = import_error_text(exc)
    assert text.startswith("The file is not valid JSON") and "line 1" in text and "Expecting" not in text
    assert import_error_text(ValueError("hearth.title must not be blank")).startswith("The file is JSON, but")
    assert "no such file" in import_error_text(FileNotFoundError(2, "No such file or directory"))
    shown: list[str] = []
    monkeypatch.setattr("app.window.main_window.QFileDialog.getOpenFileName",
                        lambda *args, **kwargs: (str(bad), ""))
    monkeypatch.setattr("app.window.main_window.QMessageBox.warning",
                        lambda parent, title, message: shown.append(message) or QMessageBox.StandardButton.Ok)
    with qtbot.wait_signal(window.import_finished, timeout=10_000) as finished:
        assert window.import_conversation()
    assert finished.args == [None]
    assert shown and shown[0].startswith("chat.json could not be imported.") and "not valid JSON" in shown[0]


# -- reasoning ---------------------------------------------------------------------------------------------


def test_split_reasoning() -> None:
    assert split_reasoning("<think>hmm, France</think>\n\nParis.").answer == "Paris."
    assert split_reasoning("<think>hmm, France</think>Paris.").reasoning == "hmm, France"
    thinking = split_reasoning("<think>still going")
    assert thinking.is_thinking and thinking.reasoning == "still going" and not thinking.answer
    assert split_reasoning("hmm</think>Paris.").answer == "Paris."  # the template opened the block
    assert split_reasoning("Paris.").reasoning == ""


def test_reasoning_is_a_collapsible_block(qtbot: Any) -> None:
    view = MessageView()
    qtbot.add_widget(view)
    view.show()
    view.append_message(Message("assistant", "<think>The user asks about France. Its capital is Paris.</think>"
                                             "\n\nThe capital of France is **Paris**."))
    shown = view.message_text(0)
    assert "Reasoning" in shown and "The capital of France is Paris." in shown
    assert "The user asks" not in shown and "<think>" not in shown
    href = next(h for h in view.hrefs(0) if "reasoning" in h)
    view.anchorClicked.emit(QUrl(href))
    assert view.is_reasoning_shown(0)
    assert "The user asks about France" in view.message_text(0)
    view.anchorClicked.emit(QUrl(href))
    assert "The user asks" not in view.message_text(0)


def test_copy_code_skips_code_in_the_reasoning(qtbot: Any, window: MainWindow) -> None:
    pane = window.chat_pane
    conversation = pane.current_conversation
    pane.store.add_user(conversation, "code?")
    reply = pane.store.start_reply(conversation)
    reply.content = "<think>\n```\ndraft()\n```\n</think>\n```python\nfinal()\n```"
    pane.store.finish_reply(reply, "stop", {})
    pane.copy_code(1, 0)
    assert QGuiApplication.clipboard().text() == "final()"
