"""Child process for the kill test: streams a reply into a Storage until it is killed.

Usage: ``python tests/reliability/storage_writer.py DBPATH``. After each committed update it prints one JSON
line, ``{"message_id": ..., "content": ...}``, so the parent knows what must survive a SIGKILL.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from app.data.storage import Storage

UPDATE_INTERVAL_S = 0.05
MAX_UPDATES = 2000  # about 100 s: the parent kills us long before


def main(db_path: Path) -> None:
    """Create a conversation and stream a reply into it, reporting each committed update."""
    storage = Storage(db_path)
    conversation = storage.create_conversation("kill test")
    question = storage.add_message(conversation.id, "user", "Count for me, please.")
    reply = storage.add_message(
        conversation.id, "assistant", "", question.id, model="writer", is_complete=False
    )
    content = ""
    for index in range(MAX_UPDATES):
        content += f"token{index} "
        storage.update_message(reply.id, content=content, num_generated_tokens=index + 1)
        print(json.dumps({"message_id": reply.id, "content": content}), flush=True)
        time.sleep(UPDATE_INTERVAL_S)
    storage.update_message(reply.id, is_complete=True, finish_reason="length")
    storage.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
