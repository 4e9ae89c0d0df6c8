"""Replies whose chat was cut to fit the context: how many messages were left out, and of what context.

No Qt here. The ``reply_context`` table of schema 7 (:mod:`app.data.migrations`) keeps one row per such reply, so
the line over it ("2 earlier turns are left out (context 512 tokens)", :func:`left_out_words`) shows again after a
restart (:class:`app.data.conversations.ConversationStore`), in an exported conversation (:mod:`app.data.export`:
the JSON carries it with its message, the Markdown says it) and after an import.
"""

from __future__ import annotations

from typing import NamedTuple

from app.data.storage import Storage


class LeftOut(NamedTuple):
    """``num_dropped`` messages of a reply's chat were left out to fit ``context_length`` tokens (0: not known)."""

    num_dropped: int
    context_length: int

    def check(self) -> LeftOut:
        """This, or ValueError when the counts are impossible."""
        if self.num_dropped < 1 or self.context_length < 0:
            raise ValueError(f"a cut chat leaves out at least 1 message of a context >= 0, got {self.num_dropped} "
                             f"of {self.context_length}")
        return self


def left_out_words(left_out: LeftOut) -> str:
    """The line over a reply whose chat was cut, as the chat shows it: ``2 earlier turns are left out (context
    512 tokens)``."""
    num, context = left_out
    turns = "1 earlier turn is" if num == 1 else f"{num} earlier turns are"
    return f"{turns} left out" + (f" (context {context:,} tokens)" if context else " (to fit the context)")


def set_left_out(storage: Storage, message_id: int, left_out: LeftOut) -> None:
    """Keep (or replace) reply ``message_id``'s left-out count."""
    num, context = left_out.check()
    storage._write("INSERT OR REPLACE INTO reply_context (message_id, num_dropped_messages, context_length) "
                   "VALUES (?, ?, ?)", (message_id, num, context))


def conversation_left_out(storage: Storage, conversation_id: int) -> dict[int, LeftOut]:
    """Every cut reply of a conversation, all branches, by message id."""
    rows = storage._all(
        "SELECT c.message_id, c.num_dropped_messages, c.context_length FROM reply_context c"
        " JOIN messages m ON m.id = c.message_id WHERE m.conversation_id = ?", (conversation_id,))
    return {int(message_id): LeftOut(int(num), int(context)) for message_id, num, context in rows}
