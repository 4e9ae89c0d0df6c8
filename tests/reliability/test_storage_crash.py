"""kill -9 during storage writes: a child process streams a reply into a real SQLite database and is killed
mid-write; everything it reported committed survives, and the database passes its integrity checks."""

from __future__ import annotations

import json
import queue
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from app.data.storage import Storage

WRITER = Path(__file__).with_name("storage_writer.py")


def _reader(stream: object, lines: queue.Queue[str | None]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        lines.put(line)
    lines.put(None)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_sigkill_mid_stream_keeps_committed_content(tmp_path: Path) -> None:
    path = tmp_path / "killed.db"
    reported: list[dict[str, object]] = []
    with subprocess.Popen(
        [sys.executable, str(WRITER), str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as child:
        lines: queue.Queue[str | None] = queue.Queue()
        reader = threading.Thread(target=_reader, args=(child.stdout, lines), daemon=True)
        reader.start()
        try:
            while len(reported) < 6:
                line = lines.get(timeout=20)
                if line is None:
                    pytest.fail(f"writer exited early: {child.stderr.read() if child.stderr else ''}")
                reported.append(json.loads(line))
        finally:
            child.kill()  # SIGKILL: no cleanup, no final commit
            child.wait(timeout=10)
            reader.join(timeout=10)  # it sees EOF now; join before the pipe is closed under it
    assert child.returncode == -9
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    last = reported[-1]
    with Storage(path) as storage:
        message = storage.get_message(int(str(last["message_id"])))
        assert message.content.startswith(str(last["content"]))  # at least what was reported committed
        assert not message.is_complete
        assert [c.title for c, _ in storage.search("token3 ")] == ["kill test"]
        assert storage.check_integrity() == []
