"""The chat pane (``app/chat/chat_pane.py``) on its own, without the main window: a real ``ReplyController`` on a
bridge over the fake engine, conversations in a real SQLite file. Each user action is checked on screen, in what
the engine was asked, and in the database as a second connection reads it back."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QPushButton

from app.bridge.engine_bridge import EngineBridge
from app.chat.chat_input import ChatInput
from app.chat.chat_pane import ChatPane
from app.chat.reply_controller import ReplyController
from app.data import records
from app.data.conversations import (
    STATUS_DONE,
    STATUS_ERROR,
    STATUS_STOPPED,
    STATUS_STREAMING,
    Conversation,
    ConversationStore,
    Message,
)
from app.data.storage import Storage
from tests.app.fake_engine import FRANCE_REPLY, LONG_REPLY, FakeEngine, FakeLLM

TIMEOUT_MS = 5000
FRANCE = "What is the capital of France?"
STORY = "Tell me a long story."


@dataclass
class Chat:
    qtbot: Any
    pane: ChatPane
    replies: ReplyController
    storage: Storage
    path: Path

    @property
    def conversation(self) -> Conversation:
        conversation = self.pane.current_conversation
        assert conversation is not None
        return conversation

    @property
    def engine(self) -> FakeEngine:
        return FakeLLM.instances[-1].engine

    def button(self, name: str) -> QPushButton:
        button = self.pane.findChild(QPushButton, name)
        assert button is not None, name
        return button

    def send(self, text: str) -> Message:
        """Type ``text`` and press Enter, as the user does; the reply it starts."""
        box = self.pane.findChild(ChatInput, "chatInput")
        assert box is not None
        box.setFocus()
        self.qtbot.keyClicks(box, text)
        self.qtbot.keyClick(box, Qt.Key.Key_Return)
        assert box.toPlainText() == ""
        reply = self.conversation.messages[-1]
        assert reply.role == "assistant" and reply.request_id
        return reply

    def wait(self, reply: Message, status: str = STATUS_DONE) -> None:
        self.qtbot.wait_until(lambda: reply.status == status, timeout=TIMEOUT_MS)

    def stored(self, message: Message) -> records.Message:
        assert message.id is not None
        return self.storage.get_message(message.id)

    def reopened(self) -> Conversation:
        """The shown conversation as a fresh connection to the file reads it (what a restart would show)."""
        with Storage(self.path) as storage:
            return ConversationStore(storage).get(self.conversation.id)


@pytest.fixture
def chat(qtbot: Any, loaded_bridge: EngineBridge, tmp_path: Path) -> Iterator[Chat]:
    path = tmp_path / "hearth.db"
    storage = Storage(path)
    store = ConversationStore(storage)
    replies = ReplyController(loaded_bridge, store)
    signals = loaded_bridge.signals  # wired as MainWindow._connect_engine wires them
    signals.token_delta.connect(replies._on_token_delta)
    signals.request_finished.connect(replies._on_request_finished)
    signals.request_failed.connect(replies._on_request_failed)
    pane = ChatPane(store, replies)
    qtbot.add_widget(pane)
    pane.show()
    pane.set_model_ready(True)
    yield Chat(qtbot, pane, replies, storage, path)
    replies.shutdown()
    storage.close()


def test_send_shows_the_question_and_an_empty_reply_then_streams_it(chat: Chat) -> None:
    reply = chat.send(f"  {FRANCE}  ")
    conversation = chat.conversation
    assert [(m.role, m.content, m.status) for m in conversation.messages] == [
        ("user", FRANCE, STATUS_DONE), ("assistant", "", STATUS_STREAMING)]
    assert chat.pane.view.message_count == 2
    assert FRANCE in chat.pane.view.message_text(0)
    assert conversation.title == FRANCE  # the first question titles the conversation
    # both are stored at once, the reply as incomplete
    assert chat.stored(conversation.messages[0]).content == FRANCE
    assert chat.stored(reply).is_complete is False
    assert chat.button("stopButton").isEnabled() and not chat.button("sendButton").isEnabled()

    chat.wait(reply)
    assert reply.content == FRANCE_REPLY and reply.finish_reason == "stop"
    assert "Paris" in chat.pane.view.message_text(1)
    row = chat.stored(reply)
    assert (row.content, row.is_complete, row.finish_reason) == (FRANCE_REPLY, True, "stop")
    assert row.num_generated_tokens == len(FRANCE_REPLY.split())
    assert chat.engine.submitted == [[{"role": "user", "content": FRANCE}]]
    assert [m.content for m in chat.reopened().messages] == [FRANCE, FRANCE_REPLY]
    assert not chat.button("stopButton").isEnabled()


def test_nothing_is_sent_when_blank_without_a_model_or_while_a_reply_streams(chat: Chat) -> None:
    assert chat.pane.send("   \n ") is None
    chat.pane.set_model_ready(False)
    assert chat.pane.send(FRANCE) is None
    assert chat.conversation.messages == [] and chat.storage.messages(chat.conversation.id) == []
    chat.pane.set_model_ready(True)
    reply = chat.send(FRANCE)
    assert chat.pane.send("And of Italy?") is None
    assert len(chat.conversation.messages) == 2
    chat.wait(reply)
    assert len(chat.storage.messages(chat.conversation.id)) == 2 and len(chat.engine.submitted) == 1


def test_stop_keeps_the_text_so_far_and_saves_it(chat: Chat) -> None:
    chat.pane.set_sampling_params({"max_tokens": 1000})
    reply = chat.send(STORY)
    chat.qtbot.wait_until(lambda: len(reply.content) > 0, timeout=TIMEOUT_MS)
    chat.qtbot.mouseClick(chat.button("stopButton"), Qt.MouseButton.LeftButton)
    chat.wait(reply, STATUS_STOPPED)
    assert reply.finish_reason == "abort"
    assert 0 < len(reply.content) < len(LONG_REPLY) and LONG_REPLY.startswith(reply.content)
    row = chat.stored(reply)
    assert (row.content, row.is_complete, row.finish_reason) == (reply.content, True, "abort")
    assert chat.reopened().messages[1].status == STATUS_STOPPED


def test_regenerate_keeps_the_old_reply_as_a_branch(chat: Chat) -> None:
    first = chat.send(FRANCE)
    chat.wait(first)
    chat.pane.view.action_requested.emit("regenerate", 1, 0)  # the "Regenerate" link under the reply
    second = chat.conversation.messages[1]
    assert second is not first and second.status == STATUS_STREAMING and second.content == ""
    assert chat.pane.view.message_count == 2
    chat.wait(second)
    assert (second.branch_index, second.branch_count) == (1, 2)
    assert second.parent_id == first.parent_id == chat.conversation.messages[0].id
    assert chat.engine.submitted == [[{"role": "user", "content": FRANCE}]] * 2
    assert chat.reopened().messages[1].id == second.id

    assert chat.pane.switch_branch(1, -1)
    assert chat.conversation.messages[1].id == first.id
    assert chat.pane.view.message_count == 2 and "1/2" in chat.pane.view.message_text(1)
    assert chat.reopened().messages[1].id == first.id  # the branch shown is stored too
    assert not chat.pane.switch_branch(1, -1)  # no branch before the first


def test_edit_makes_a_new_branch_from_the_edited_question(chat: Chat) -> None:
    chat.pane.set_sampling_params({"max_tokens": 4})
    first = chat.send(FRANCE)
    chat.wait(first)
    chat.pane.view.action_requested.emit("edit", 0, 0)
    assert chat.pane.is_editing
    assert chat.button("sendButton").text() == "Save && send"  # shown as "Save & send"
    chat.pane.escape()  # Esc cancels the edit, not the conversation
    assert not chat.pane.is_editing and chat.conversation.messages[1].id == first.id

    chat.pane.view.action_requested.emit("edit", 0, 0)
    box = chat.pane.findChild(ChatInput, "chatInput")
    assert box is not None and box.toPlainText() == FRANCE
    box.clear()
    reply = chat.send(STORY)
    assert not chat.pane.is_editing
    question = chat.conversation.messages[0]
    assert (question.content, question.branch_index, question.branch_count) == (STORY, 1, 2)
    chat.wait(reply)
    assert reply.finish_reason == "length" and reply.content.split() == LONG_REPLY.split()[:4]
    assert chat.engine.submitted[-1] == [{"role": "user", "content": STORY}]  # the old question is gone
    roots = [m for m in chat.storage.messages(chat.conversation.id) if m.parent_id is None]
    assert sorted(m.content for m in roots) == sorted([FRANCE, STORY])
    assert [m.content for m in chat.reopened().messages] == [STORY, reply.content]


def test_a_reply_cut_at_its_limit_continues_in_the_same_message(chat: Chat) -> None:
    chat.pane.set_sampling_params({"max_tokens": 3})
    reply = chat.send(FRANCE)
    chat.wait(reply)
    assert reply.can_continue and reply.content.split() == FRANCE_REPLY.split()[:3]
    chat.pane.set_sampling_params({"max_tokens": 100})
    chat.pane.view.action_requested.emit("continue", 1, 0)
    assert reply.status == STATUS_STREAMING
    chat.wait(reply)
    assert reply.content == FRANCE_REPLY and reply.finish_reason == "stop"
    assert chat.engine.submitted[-1][-1]["role"] == "assistant"  # the cut reply, to be continued
    assert chat.stored(reply).content == FRANCE_REPLY
    assert len(chat.storage.messages(chat.conversation.id)) == 2


def test_a_failed_reply_shows_its_error_and_is_saved_as_failed(chat: Chat) -> None:
    chat.engine.fail_next_steps = 1
    reply = chat.send(FRANCE)
    chat.wait(reply, STATUS_ERROR)
    assert "the fake model broke" in reply.error
    assert "⚠" in chat.pane.view.message_text(1)
    assert chat.stored(reply).finish_reason == "error"
    assert chat.reopened().messages[1].status == STATUS_ERROR
    again = chat.send("And of France, again?")  # the pane is free for the next message
    chat.wait(again)


def test_deleting_a_conversation_stops_its_reply_and_undo_brings_it_back(chat: Chat) -> None:
    chat.pane.set_sampling_params({"max_tokens": 1000})
    reply = chat.send(STORY)
    chat.qtbot.wait_until(lambda: len(reply.content) > 0, timeout=TIMEOUT_MS)
    doomed = chat.conversation.id
    chat.pane.delete_conversation(doomed)
    assert reply.status == STATUS_STOPPED and chat.stored(reply).finish_reason == "abort"
    assert chat.storage.get_conversation(doomed).is_deleted
    assert chat.conversation.id != doomed and chat.conversation.messages == []
    assert chat.replies.num_streaming == 0

    chat.pane.undo_delete(doomed)
    assert chat.conversation.id == doomed and not chat.storage.get_conversation(doomed).is_deleted
    assert [m.role for m in chat.conversation.messages] == ["user", "assistant"]


def test_rename_is_saved_and_a_blank_title_is_refused(chat: Chat) -> None:
    chat.wait(chat.send(FRANCE))
    conversation_id = chat.conversation.id
    chat.pane.rename_conversation(conversation_id, "  Geography ")
    assert chat.storage.get_conversation(conversation_id).title == "Geography"
    with chat.qtbot.wait_signal(chat.pane.notice, timeout=TIMEOUT_MS) as notice:
        chat.pane.rename_conversation(conversation_id, "   ")
    assert notice.args == ["a conversation title must not be blank"]
    assert chat.storage.get_conversation(conversation_id).title == "Geography"


def test_new_conversation_reuses_an_empty_one(chat: Chat) -> None:
    empty = chat.conversation.id
    assert chat.pane.new_conversation().id == empty
    chat.wait(chat.send(FRANCE))
    fresh = chat.pane.new_conversation()
    assert fresh.id != empty and chat.pane.view.message_count == 0
    assert [c.id for c in chat.storage.list_conversations()] == [fresh.id, empty]
    chat.pane.select_conversation(empty)
    assert chat.pane.view.message_count == 2
