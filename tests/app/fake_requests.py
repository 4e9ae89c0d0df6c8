"""The fake engine's requests (``tests/app/fake_engine.py``): one request's state, and the caller's handle, which
streams the deltas and gives a ``result()`` as ``engine.core.request.RequestHandle`` does (the MCP tool loop
reads them so)."""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from engine.api import SamplingParams, StepOutput


class Request:
    def __init__(self, request_id: str, words: list[str], params: SamplingParams) -> None:
        self.request_id = request_id
        self.words = deque(words)
        self.params = params
        self.num_generated = 0
        self.is_cancelled = False
        self.submitted_at = time.monotonic()
        self.first_token_at: float | None = None
        self.outputs: queue.Queue[StepOutput] = queue.Queue()  # what the handle streams
        self.text: list[str] = []
        self.final: StepOutput | None = None

    def deliver(self, out: StepOutput) -> None:
        """Hand ``out`` to the handle (the engine's step thread)."""
        self.text.append(out.delta_text)
        if out.finished:
            self.final = out
        self.outputs.put(out)


class FakeHandle:
    def __init__(self, lock: threading.Condition, request: Request) -> None:
        self._lock = lock
        self._request = request
        self.request_id = request.request_id
        #: Messages left out to fit the fake's context (``FakeEngine.submit``).
        self.num_dropped_messages = 0

    def cancel(self) -> None:
        with self._lock:
            self._request.is_cancelled = True

    def done(self) -> bool:
        return self._request.final is not None

    def __iter__(self) -> Iterator[str]:
        """The text deltas as they come, until the request ends."""
        while True:
            out = self._request.outputs.get()
            if out.delta_text:
                yield out.delta_text
            if out.finished:
                return

    def result(self, timeout: float | None = None) -> Any:
        final = self._request.final
        assert final is not None, "result() before the request finished"
        return SimpleNamespace(text="".join(self._request.text), finish_reason=final.finish_reason,
                               error=final.error)
