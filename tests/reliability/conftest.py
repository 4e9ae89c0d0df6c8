"""Fixtures for the reliability suite.

``fake_engine`` and ``serve_fake``: the HTTP server in-process over a fake engine, on a loopback port.
``dialogs``: the app's warning dialogs, recorded as (title, text) instead of shown.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from engine.api import CapacityError, EngineMetrics, SamplingParams, StepOutput
from engine.serving.guards import GuardRules
from engine.serving.openai_app import ServerThread
from engine.serving.transport import ConnectionLimits


class FakeHandle:
    def __init__(self, request_id: str, prompt_token_ids: list[int]) -> None:
        self.request_id, self.prompt_token_ids = request_id, prompt_token_ids

    def cancel(self) -> None:
        pass


class FakeEngine:
    """Stands in for ``LLMEngine``: each request answers "Hello!" at once.

    Tokenizing is one token per UTF-8 byte (a lone surrogate raises TypeError, as in a real tokenizer), counted in
    ``num_tokenized`` and slowed by ``tokenize_delay_s``. ``queue_full`` makes ``submit`` raise
    ``CapacityError``; ``_loop_thread`` plays the engine's loop thread. With ``hold`` set, requests get no answer
    until ``release()``.
    """

    max_model_len = 256

    def __init__(self) -> None:
        self.tokenize_delay_s = 0.0
        self.num_tokenized = 0
        self.queue_full = False
        self.last_params: SamplingParams | None = None
        self._loop_thread: threading.Thread | None = None
        self._ids = itertools.count()
        self.hold = False
        self._held: list[tuple[str, Callable[[StepOutput], None]]] = []
        self._held_lock = threading.Lock()

    def release(self) -> int:
        """Answer every held request; returns how many there were."""
        with self._held_lock:
            held, self._held = self._held, []
        for request_id, on_output in held:
            on_output(StepOutput(request_id, "Hello!", [1], True, "stop", {"num_generated_tokens": 1}))
        return len(held)

    def num_held(self) -> int:
        with self._held_lock:
            return len(self._held)

    def tokenize(self, prompt: Any, tools: Any = None) -> list[int]:
        self.num_tokenized += 1
        time.sleep(self.tokenize_delay_s)
        text = prompt if isinstance(prompt, str) else "".join(m["content"] for m in prompt)
        try:
            return list(text.encode("utf-8"))
        except UnicodeEncodeError:  # what Hugging Face's fast tokenizers raise
            raise TypeError("TextEncodeInput must be Union[TextInputSequence, Tuple[InputSequence, InputSequence]]") from None

    def submit(self, prompt: Any, params: SamplingParams | None = None, priority: int = 0,
               request_id: str | None = None, on_output: Callable[[StepOutput], None] | None = None) -> FakeHandle:
        if self.queue_full:
            raise CapacityError("64 requests are already waiting; retry when some have finished")
        ids = prompt if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) else self.tokenize(prompt)
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens but the context holds {self.max_model_len}")
        self.last_params = params
        handle = FakeHandle(request_id or f"req-{next(self._ids)}", ids)
        assert on_output is not None
        if self.hold:
            with self._held_lock:
                self._held.append((handle.request_id, on_output))
            return handle
        on_output(StepOutput(handle.request_id, "Hello!", [1], True, "stop", {"num_generated_tokens": 1}))
        return handle

    def metrics(self) -> EngineMetrics:
        return EngineMetrics()


@pytest.fixture
def fake_engine() -> FakeEngine:
    return FakeEngine()


Serve = Callable[..., contextlib.AbstractContextManager[str]]


@pytest.fixture
def serve_fake(fake_engine: FakeEngine) -> Serve:
    """``with serve_fake(rules=..., limits=...) as base_url:`` runs the server over ``fake_engine`` on a free
    loopback port."""

    @contextlib.contextmanager
    def run(rules: GuardRules | None = None, limits: ConnectionLimits | None = None,
            api_key: str | None = None, **options: Any) -> Iterator[str]:
        server = ServerThread(fake_engine, "fake-model", "127.0.0.1", 0, api_key, rules=rules, limits=limits,
                              **options)
        server.start()
        try:
            yield f"http://127.0.0.1:{server.port}"
        finally:
            server.stop()

    return run


@pytest.fixture
def dialogs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    from PySide6.QtWidgets import QMessageBox

    shown: list[tuple[str, str]] = []

    def warning(parent: Any, title: str, text: str, *args: Any) -> Any:
        shown.append((title, text))
        return QMessageBox.StandardButton.Ok

    monkeypatch.setattr(QMessageBox, "warning", staticmethod(warning))
    return shown
