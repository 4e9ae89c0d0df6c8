"""Context you can see (issue 31): the context meter under the message box, the line over a reply whose chat was cut
to fit the context, and long user messages folded in the transcript. On the fake engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QUrl
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QSpinBox

from app.chat.message_extras import FOLD_MAX_CHARS, folded_text, is_long, left_out_note
from app.chat.message_view import MessageView
from app.chat.search_highlight import highlight_matches
from app.chat.token_counter import TokenCounter
from app.data.conversations import STATUS_DONE, STATUS_ERROR, Message
from app.window.main_window import MainWindow
from tests.app import ui_flows
from tests.app.fake_engine import FakeLLM

TIMEOUT_MS = 8000
#: The default model on a slow machine's CPU.
REAL_TIMEOUTS = ui_flows.Timeouts(load_ms=180_000, reply_ms=120_000, first_token_ms=60_000)
PASTE = "\n".join(f"line {n}: some pasted log output, {'x' * 40}" for n in range(80)) + "\nTHE-LAST-LINE"


def fill_chat(window: MainWindow, num_turns: int) -> None:
    """Put ``num_turns`` finished exchanges in the shown chat, as if they had been had."""
    pane = window.chat_pane
    conversation = pane.current_conversation
    for n in range(num_turns):
        pane.store.add_user(conversation, f"Question {n}: tell me something about bread, at some length please.")
        reply = pane.store.start_reply(conversation)
        reply.content = f"Answer {n}. " + "Bread is flour, water, salt and time. " * 3
        pane.store.finish_reply(reply, "stop", {})
    pane.select_conversation(conversation.id)


def counted(window: MainWindow) -> Any:
    """The meter's latest count once no count is under way."""
    meter = window.chat_pane.context_meter
    return None if meter.is_counting else meter.count


def wait_count(qtbot: Any, window: MainWindow, check: Any) -> Any:
    qtbot.wait_until(lambda: (c := counted(window)) is not None and check(c), timeout=TIMEOUT_MS)
    return counted(window)


# -- the meter ----------------------------------------------------------------------------------------------------


class FakeTemplate:
    """A tokenizer for the counter's tests: one token a word, a chat template of 3 tokens per message and 5 fixed
    (7 with a system message); it records what it was asked to tokenize."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def __call__(self, prompt: list[dict[str, str]] | str) -> list[int]:
        if isinstance(prompt, str):
            self.texts.append(prompt)
            return [0] * len(prompt.split())
        fixed = 7 if prompt[0]["role"] == "system" else 5
        return [0] * (fixed + sum(3 + len(m["content"].split()) for m in prompt))


def test_the_counter_matches_the_template_and_tokenizes_each_message_once() -> None:
    tokenize = FakeTemplate()
    counter = TokenCounter()
    chat = [{"role": "system", "content": "be brief"}]
    chat += [{"role": "user" if n % 2 == 0 else "assistant", "content": f"turn {n} " + "w " * n} for n in range(40)]
    assert counter.count(chat, tokenize) == (len(tokenize(chat)), True)
    assert counter.count(chat[1:], tokenize) == (len(tokenize(chat[1:])), True)
    tokenize.texts.clear()
    draft = {"role": "user", "content": "and one more question"}
    assert counter.count([*chat, draft], tokenize) == (len(tokenize([*chat, draft])), True)
    assert tokenize.texts == [draft["content"]]  # the chat's messages were counted before: only the draft is new
    tokenize.texts.clear()
    assert counter.count([*chat, draft], tokenize, is_draft_last=True) == (len(tokenize([*chat, draft])), True)
    counter.count([*chat, {"role": "user", "content": "a draft being typed"}], tokenize, is_draft_last=True)
    counter.count([*chat, {"role": "user", "content": "a draft being typed"}], tokenize, is_draft_last=True)
    assert tokenize.texts == ["a draft being typed"] * 2  # a draft is counted each time, never kept
    estimate, is_exact = counter.count(chat, None)  # no tokenizer (a remote server): an estimate, said to be one
    assert not is_exact and estimate > 0


def test_the_meter_counts_the_chat_and_the_draft_and_follows_each_reply(qtbot: Any, window: MainWindow) -> None:
    pane = window.chat_pane
    ui_flows.load_model(qtbot, window)
    label = pane.composer.context_meter.label
    first = wait_count(qtbot, window, lambda c: c.is_exact and c.context_length == 4096)
    assert label.text() == f"{first.num_tokens:,} / 4,096 tokens"
    pane.composer.set_text("What is the capital of France? " * 20)
    with_draft = wait_count(qtbot, window, lambda c: c.num_tokens > first.num_tokens)
    assert label.text() == f"{with_draft.num_tokens:,} / 4,096 tokens" and pane.composer.context_meter.bar.isVisible()
    pane.composer.clear()
    reply = ui_flows.send(qtbot, window, ui_flows.FRANCE_QUESTION)
    ui_flows.wait_finished(qtbot, reply, TIMEOUT_MS)
    after = wait_count(qtbot, window, lambda c: c.num_tokens > first.num_tokens + 10)
    assert label.text() == f"{after.num_tokens:,} / 4,096 tokens"
    assert not pane.composer.context_meter.is_over


HARBOUR = ("Harbour guide. The lighthouse keeper is named Ottoline Brask and she has kept the light since 1987. "
           "The harbour opens at dawn and closes at dusk.")


def test_the_meter_counts_the_sources_a_send_gives_the_draft(qtbot: Any, window: MainWindow, tmp_path: Path) -> None:
    """The documents' sources block is counted as the send builds it: the count before sending is the count of the
    prompt the engine was then given."""
    pane = window.chat_pane
    ui_flows.load_model(qtbot, window)
    alone = wait_count(qtbot, window, lambda c: c.is_exact)
    assert alone.num_document_tokens == 0
    doc = tmp_path / "harbour.txt"
    doc.write_text(HARBOUR, encoding="utf-8")
    pane.attach_files([str(doc)])
    cid = pane.current_conversation.id
    qtbot.wait_until(lambda: not pane.documents.is_indexing(cid), timeout=20_000)
    with_documents = wait_count(qtbot, window, lambda c: c.num_document_tokens > 0)  # whole, before any draft
    assert with_documents.num_tokens > alone.num_tokens + len(HARBOUR) // 8
    pane.composer.set_text("Who keeps the lighthouse?")
    before = wait_count(qtbot, window, lambda c: c.num_tokens > with_documents.num_tokens
                        and c.num_document_tokens > 0)
    assert "of document sources" in pane.composer.context_meter.toolTip()
    engine = FakeLLM.instances[-1].engine
    pane.composer.clear()
    reply = ui_flows.send(qtbot, window, "Who keeps the lighthouse?")  # typed and sent as a user would
    ui_flows.wait_finished(qtbot, reply, TIMEOUT_MS)
    sent = engine.submitted[-1]
    assert "Ottoline Brask" in sent[-1]["content"]  # the sources went in ...
    assert TokenCounter().count(sent, engine.tokenize) == (before.num_tokens, True)  # ... as the meter counted them


def test_the_meter_counts_the_chats_tool_definitions(qtbot: Any, open_window: Any, tmp_path: Path) -> None:
    from tests.app.test_chat_tools import open_with_tools

    win = open_with_tools(qtbot, open_window, tmp_path)
    cid = win.chat_pane.current_conversation.id
    tokens = win.tools.measure_of(cid).prompt_tokens
    count = wait_count(qtbot, win, lambda c: c.num_tool_tokens == tokens)
    assert tokens and count.num_tokens >= tokens
    assert "of tool definitions" in win.chat_pane.composer.context_meter.toolTip()
    win.tools.button.action("use").trigger()  # tools off: not counted
    qtbot.wait_until(lambda: not win.tools.choice(cid).enabled, timeout=2000)
    off = wait_count(qtbot, win, lambda c: c.num_tool_tokens == 0)
    assert off.num_tokens == count.num_tokens - tokens


def test_the_meter_warns_when_the_chat_outgrows_the_context(qtbot: Any, window: MainWindow) -> None:
    ui_flows.child(window, QSpinBox, "contextLengthSpin").setValue(512)
    ui_flows.load_model(qtbot, window)
    fill_chat(window, 12)
    count = wait_count(qtbot, window, lambda c: c.context_length == 512 and c.num_tokens > 512)
    meter = window.chat_pane.composer.context_meter
    assert meter.is_over and count.budget < 512
    assert meter.label.text() == f"{count.num_tokens:,} / 512 tokens"
    assert "earlier turns are left out" in meter.toolTip()


def test_without_a_model_the_meter_estimates_and_says_so(qtbot: Any, window: MainWindow) -> None:
    fill_chat(window, 2)
    count = wait_count(qtbot, window, lambda c: c.num_tokens > 0)
    assert not count.is_exact
    assert window.chat_pane.composer.context_meter.label.text() == f"≈{count.num_tokens:,} tokens"


# -- turns left out -----------------------------------------------------------------------------------------------


def test_the_chat_says_how_many_earlier_turns_were_left_out(qtbot: Any, window: MainWindow) -> None:
    ui_flows.child(window, QSpinBox, "contextLengthSpin").setValue(512)
    ui_flows.load_model(qtbot, window)
    fill_chat(window, 12)  # longer than the fake engine's context: it drops turns from the middle
    reply = ui_flows.send(qtbot, window, ui_flows.FRANCE_QUESTION)
    ui_flows.wait_finished(qtbot, reply, TIMEOUT_MS)
    conversation = window.chat_pane.current_conversation
    chat = conversation.prompt_messages(upto=len(conversation.messages) - 1)
    dropped = len(chat) - len(FakeLLM.instances[-1].engine.submitted[-1])
    assert dropped >= 2
    view = window.chat_pane.view
    index = view.message_count - 1
    text = view.message_text(index)
    assert text.splitlines()[0] == f"↳ {dropped} earlier turns are left out (context 512 tokens)"
    assert text.splitlines()[1] == "Hearth"  # the line sits over the reply
    view.show_conversation(window.chat_pane.current_conversation)  # a redraw keeps it
    assert view.message_text(index).startswith(f"↳ {dropped} earlier turns")
    # a chat that fits says nothing
    window.chat_pane.new_conversation()
    short = ui_flows.send(qtbot, window, ui_flows.FRANCE_QUESTION)
    ui_flows.wait_finished(qtbot, short, TIMEOUT_MS)
    assert "left out" not in view.message_text(1)


def _last_line(window: MainWindow) -> str:
    view = window.chat_pane.view
    return view.message_text(view.message_count - 1).splitlines()[0]


def test_the_left_out_line_is_kept_with_the_reply_after_a_restart(qtbot: Any, open_window: Any,
                                                                 tmp_path: Path) -> None:
    window = open_window(tmp_path)
    ui_flows.child(window, QSpinBox, "contextLengthSpin").setValue(512)
    ui_flows.load_model(qtbot, window)
    fill_chat(window, 12)
    reply = ui_flows.send(qtbot, window, ui_flows.FRANCE_QUESTION)
    ui_flows.wait_finished(qtbot, reply, TIMEOUT_MS)
    line = _last_line(window)
    assert line.startswith("↳ ") and line.endswith("earlier turns are left out (context 512 tokens)")
    cid = window.chat_pane.current_conversation.id
    window.close()
    again = open_window(tmp_path)
    again.chat_pane.select_conversation(cid)
    assert _last_line(again) == line  # from the database, no model loaded
    assert again.chat_pane.current_conversation.messages[-1].stats["num_dropped_messages"] >= 2


def test_a_tools_reply_says_how_many_turns_were_left_out(qtbot: Any, open_window: Any, tmp_path: Path) -> None:
    """A chat with tools is cut to fit as a plain one is (the engine's fit), before the tool loop sees it."""
    from tests.app.test_chat_tools import open_with_tools

    window = open_with_tools(qtbot, open_window, tmp_path)
    fill_chat(window, 12)  # longer than the fake engine's context
    reply = ui_flows.send(qtbot, window, ui_flows.FRANCE_QUESTION)
    ui_flows.wait_finished(qtbot, reply, TIMEOUT_MS)
    assert reply.status == STATUS_DONE and "Paris" in reply.content
    conversation = window.chat_pane.current_conversation
    chat = conversation.prompt_messages(upto=len(conversation.messages) - 1)
    dropped = reply.stats["num_dropped_messages"]
    engine = FakeLLM.instances[-1].engine
    turns = [m for m in engine.prompts[-1] if m["role"] != "system"]  # the tools' instructions come as a system turn
    assert dropped >= 2 and len(turns) == len(chat) - dropped  # the loop was given the cut chat
    assert _last_line(window) == f"↳ {dropped} earlier turns are left out (context 4,096 tokens)"
    cid = conversation.id
    window.close()
    again = open_window(tmp_path)
    again.chat_pane.select_conversation(cid)
    assert _last_line(again).startswith(f"↳ {dropped} earlier turns are left out")


def test_the_left_out_line_reads_well() -> None:
    assert left_out_note(None) == "" and left_out_note({"num_dropped_messages": 0}) == ""
    assert left_out_note({"num_dropped_messages": 2, "context_length": 512}) == \
        "2 earlier turns are left out (context 512 tokens)"
    assert left_out_note({"num_dropped_messages": 1, "context_length": 4096}) == \
        "1 earlier turn is left out (context 4,096 tokens)"


# -- long messages fold -------------------------------------------------------------------------------------------


def test_a_long_message_shows_folded_and_a_click_shows_all_of_it(qtbot: Any) -> None:
    view = MessageView()
    qtbot.add_widget(view)
    assert is_long(PASTE) and is_long("x" * (FOLD_MAX_CHARS + 1)) and not is_long("short\n" * 10)
    view.append_message(Message("user", PASTE))
    view.append_message(Message("user", "a short question"))
    folded = view.message_text(0)
    assert "THE-LAST-LINE" not in folded and folded_text(PASTE) in folded and "Show all (81 lines)" in folded
    assert len(folded) < len(PASTE) // 3
    assert "hearth:fold/0" in view.hrefs(0) and not any("fold" in h for h in view.hrefs(1))
    view.anchorClicked.emit(QUrl("hearth:fold/0"))
    assert PASTE in view.message_text(0) and "Show less" in view.message_text(0)
    view.anchorClicked.emit(QUrl("hearth:fold/0"))
    assert view.message_text(0) == folded


def test_a_folded_message_is_stored_copied_and_edited_whole(qtbot: Any, window: MainWindow) -> None:
    pane = window.chat_pane
    ui_flows.load_model(qtbot, window)
    pane.send(PASTE)
    reply = pane.current_conversation.messages[-1]
    ui_flows.wait_finished(qtbot, reply, TIMEOUT_MS)
    assert "THE-LAST-LINE" not in pane.view.message_text(0)
    assert window.storage.get_message(pane.current_conversation.messages[0].id).content == PASTE
    pane.view.anchorClicked.emit(QUrl("hearth:copy/0"))
    assert QGuiApplication.clipboard().text() == PASTE
    pane.view.anchorClicked.emit(QUrl("hearth:edit/0"))
    assert pane.composer.text() == PASTE


def test_a_search_match_in_a_folded_part_shows(qtbot: Any) -> None:
    view = MessageView()
    qtbot.add_widget(view)
    view.append_message(Message("user", PASTE))
    assert highlight_matches(view, "the-last-line") == 1
    assert "THE-LAST-LINE" in view.message_text(0)


def test_the_meter_counts_what_the_real_model_is_sent(shared_default_llm: Any) -> None:
    """On the default model's own tokenizer and chat template (which adds a system prompt of its own when a chat
    has none), the count is the length of the prompt the engine builds, to the token."""
    tokenize = shared_default_llm("fp32").engine.tokenize
    counter = TokenCounter()
    chat = [{"role": "user" if n % 2 == 0 else "assistant",
             "content": f"Turn {n}: Brot, 東京 and `code()` — {'word ' * (n * 7 % 23)}\nsecond line."}
            for n in range(21)]
    for messages in (chat, [{"role": "system", "content": "Answer in French."}, *chat], chat[:1]):
        assert counter.count(messages, tokenize) == (len(tokenize(messages)), True)


@pytest.mark.slow
def test_on_the_real_engine_a_512_context_says_what_it_left_out_and_names_512_when_it_cannot_fit(
        qtbot: Any, tmp_path: Path) -> None:
    from app import create_window

    window = create_window(data_dir=tmp_path)
    qtbot.add_widget(window)
    window.show()
    qtbot.wait_exposed(window)
    try:
        ui_flows.child(window, QSpinBox, "contextLengthSpin").setValue(512)
        ui_flows.set_generation(window, temperature=0.0, max_tokens=8)
        ui_flows.load_model(qtbot, window, timeouts=REAL_TIMEOUTS)
        fill_chat(window, 16)
        count = wait_count(qtbot, window, lambda c: c.context_length == 512 and c.is_exact)
        assert count.num_tokens > 512 and window.chat_pane.composer.context_meter.is_over
        reply = ui_flows.send(qtbot, window, ui_flows.FRANCE_QUESTION)
        ui_flows.wait_finished(qtbot, reply, REAL_TIMEOUTS.reply_ms)
        assert reply.status == STATUS_DONE, reply.error
        dropped = reply.stats["num_dropped_messages"]
        view = window.chat_pane.view
        assert view.message_text(view.message_count - 1).startswith(
            f"↳ {dropped} earlier turns are left out (context 512 tokens)\nHearth")
        window.model_pane.load_settings_form.set_overflow("stop")
        failed = ui_flows.send(qtbot, window, "And bread?")
        ui_flows.wait_finished(qtbot, failed, REAL_TIMEOUTS.reply_ms)
        assert failed.status == STATUS_ERROR
        assert "the context holds 512 tokens and 8 of them are kept for the reply" in failed.error
        assert "raise the context length above 512" in failed.error
    finally:
        window.close()
