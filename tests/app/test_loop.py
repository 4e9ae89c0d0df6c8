"""``EngineLoop`` (``app/bridge/loop.py``) on the fake engine, run on a thread of its own as the bridge runs it:
commands in through the queue, text deltas and endings out through ``EngineSignals``, and how it stops."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import shiboken6
from PySide6.QtCore import QObject, Slot

from app.bridge import loop as loop_module
from app.bridge.loop import Cancel, Command, EngineLoop, Submit
from app.bridge.signals import EngineSignals
from app.bridge.types import RequestInfo
from engine.api import SamplingParams
from tests.app.fake_engine import FRANCE_REPLY, LONG_REPLY, FakeHandle, FakeLLM

TIMEOUT_MS = 5000
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
STORY = [{"role": "user", "content": "Tell me a story."}]


class Recorder(QObject):
    """Everything the loop emits, in order, received in the GUI thread (queued, as the bridge's receivers are)."""

    def __init__(self, signals: EngineSignals) -> None:
        super().__init__()
        self.events: list[tuple[str, str, Any]] = []
        self.errors: list[str] = []
        self.metrics: list[dict[str, Any]] = []
        signals.token_delta.connect(self._on_delta)
        signals.request_finished.connect(self._on_finished)
        signals.request_failed.connect(self._on_failed)
        signals.error.connect(self._on_error)
        signals.metrics_updated.connect(self._on_metrics)

    @Slot(str, str)
    def _on_delta(self, rid: str, text: str) -> None:
        self.events.append(("delta", rid, text))

    @Slot(str, object)
    def _on_finished(self, rid: str, info: RequestInfo) -> None:
        self.events.append(("finished", rid, info))

    @Slot(str, str)
    def _on_failed(self, rid: str, message: str) -> None:
        self.events.append(("failed", rid, message))

    @Slot(str)
    def _on_error(self, message: str) -> None:
        self.errors.append(message)

    @Slot(object)
    def _on_metrics(self, metrics: dict[str, Any]) -> None:
        self.metrics.append(metrics)

    def text(self, rid: str) -> str:
        return "".join(e[2] for e in self.events if e[:2] == ("delta", rid))

    def ending(self, rid: str) -> tuple[str, Any] | None:
        """("finished", RequestInfo) or ("failed", message) once the request has ended, else None."""
        return next(((e[0], e[2]) for e in self.events if e[1] == rid and e[0] != "delta"), None)


class Harness:
    """One ``EngineLoop`` over a fake model, on a plain thread, with what the bridge would hand it."""

    def __init__(self, qtbot: Any) -> None:
        self.qtbot = qtbot
        self.llm = FakeLLM("default", start_loop=False, step_delay_s=0.005)
        self.engine = self.llm.engine
        self.commands: queue.Queue[Command] = queue.Queue()
        self.signals = EngineSignals()
        self.sentinel = QObject()
        self.orphaned = threading.Event()
        self.released: list[int] = []
        self.recorder = Recorder(self.signals)
        self.loop = EngineLoop(self.llm, self.commands, self.signals, self.sentinel, self.orphaned.set,
                               release=lambda: self.released.append(threading.get_ident()))
        self.thread = threading.Thread(target=self.loop.run, name="test-engine-loop", daemon=True)
        self.thread.start()

    def submit(self, rid: str, messages: Any = FRANCE, params: Any = None, conversation: str = "c1") -> None:
        self.commands.put(Submit(rid, conversation, messages, params))
        self.loop.wake()

    def cancel(self, rid: str) -> None:
        self.commands.put(Cancel(rid))
        self.loop.wake()

    def wait_ended(self, rid: str) -> tuple[str, Any]:
        self.qtbot.wait_until(lambda: self.recorder.ending(rid) is not None, timeout=TIMEOUT_MS)
        ending = self.recorder.ending(rid)
        assert ending is not None
        return ending

    def stop(self) -> None:
        self.loop.stop()
        self.thread.join(5)


@pytest.fixture
def harness(qtbot: Any) -> Iterator[Harness]:
    FakeLLM.instances.clear()
    made = Harness(qtbot)
    yield made
    made.stop()
    assert not made.thread.is_alive()
    FakeLLM.instances.clear()


def test_a_reply_streams_as_deltas_then_finishes_with_its_conversation(harness: Harness) -> None:
    harness.submit("r1", params={"max_tokens": 100}, conversation="c7")
    kind, info = harness.wait_ended("r1")
    assert kind == "finished"
    assert (info.request_id, info.conversation_id, info.finish_reason) == ("r1", "c7", "stop")
    assert info.metrics["num_generated_tokens"] == len(FRANCE_REPLY.split())
    assert harness.recorder.text("r1") == FRANCE_REPLY
    assert harness.recorder.events[-1][0] == "finished"  # every delta came before the ending
    assert len([e for e in harness.recorder.events if e[0] == "delta"]) > 1
    assert harness.engine.submitted == [FRANCE]


def test_params_as_keywords_or_sampling_params_reach_the_engine(harness: Harness) -> None:
    harness.submit("r1", params={"max_tokens": 3})
    harness.submit("r2", params=SamplingParams(max_tokens=2))
    assert harness.wait_ended("r1")[1].finish_reason == "length"
    assert harness.wait_ended("r2")[1].finish_reason == "length"
    assert harness.recorder.text("r1") == " ".join(FRANCE_REPLY.split()[:3]) + " "
    assert len(harness.recorder.text("r2").split()) == 2


def test_two_requests_stream_side_by_side(harness: Harness) -> None:
    harness.submit("a", params={"max_tokens": 5})
    harness.submit("b", STORY, params={"max_tokens": 5})
    harness.wait_ended("a")
    harness.wait_ended("b")
    assert harness.recorder.text("a").split() == FRANCE_REPLY.split()[:5]
    assert harness.recorder.text("b").split() == LONG_REPLY.split()[:5]
    assert harness.engine.max_batch_seen == 2


def test_bad_params_fail_that_request_and_the_loop_goes_on(harness: Harness) -> None:
    harness.submit("bad", params={"temperature": -1})
    kind, message = harness.wait_ended("bad")
    assert kind == "failed" and "temperature" in message
    harness.submit("good")
    assert harness.wait_ended("good")[0] == "finished"
    assert harness.engine.submitted == [FRANCE]  # the bad one never reached the engine


def test_a_failing_step_ends_its_requests_with_an_error_and_the_loop_goes_on(harness: Harness) -> None:
    harness.engine.fail_next_steps = 1
    harness.submit("r1")
    kind, message = harness.wait_ended("r1")
    assert kind == "failed" and message == "generation failed: the fake model broke"
    harness.submit("r2")
    assert harness.wait_ended("r2")[0] == "finished"
    assert harness.recorder.text("r2") == FRANCE_REPLY
    assert harness.thread.is_alive() and harness.loop.error == "" and harness.recorder.errors == []


def test_cancel_ends_the_reply_with_abort_keeping_its_text(harness: Harness) -> None:
    harness.submit("r1", STORY, params={"max_tokens": 1000})
    harness.qtbot.wait_until(lambda: len(harness.recorder.text("r1")) > 0, timeout=TIMEOUT_MS)
    harness.cancel("r1")
    kind, info = harness.wait_ended("r1")
    assert kind == "finished" and info.finish_reason == "abort"
    text = harness.recorder.text("r1")
    assert 0 < len(text) < len(LONG_REPLY) and LONG_REPLY.startswith(text)


def test_a_cancel_the_engine_never_confirms_ends_after_the_grace_time(harness: Harness,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop_module, "CANCEL_GRACE_S", 0.1)
    monkeypatch.setattr(FakeHandle, "cancel", lambda self: None)  # an engine that ignores the cancel
    harness.submit("r1", STORY, params={"max_tokens": 1000})
    harness.qtbot.wait_until(lambda: len(harness.recorder.text("r1")) > 0, timeout=TIMEOUT_MS)
    harness.cancel("r1")
    kind, info = harness.wait_ended("r1")
    assert kind == "finished" and (info.finish_reason, info.metrics) == ("abort", {})
    at_end = len(harness.recorder.events)
    harness.qtbot.wait(100)  # the engine still streams it; nothing more reaches the GUI
    assert [e for e in harness.recorder.events[at_end:] if e[1] == "r1"] == []
    assert harness.engine.has_work()


def test_the_loop_publishes_metrics(harness: Harness) -> None:
    harness.qtbot.wait_until(lambda: len(harness.recorder.metrics) > 0, timeout=TIMEOUT_MS)
    assert harness.recorder.metrics[0]["concurrency_limit"] == harness.llm.max_batch_size


def test_stop_exits_an_idle_loop_promptly_and_releases_the_model_on_its_thread(harness: Harness) -> None:
    harness.submit("r1")
    harness.wait_ended("r1")
    harness.qtbot.wait(50)  # idle: waiting for work or the next metrics tick, up to a second away
    started = time.monotonic()
    harness.loop.stop()
    assert harness.loop.done.wait(0.5)
    assert time.monotonic() - started < 0.5
    harness.thread.join(1)
    assert not harness.thread.is_alive() and not harness.engine.is_alive
    assert harness.released == [harness.thread.ident]
    assert harness.loop.error == "" and not harness.orphaned.is_set()


def test_stop_fails_the_replies_still_streaming(harness: Harness) -> None:
    harness.submit("r1", STORY, params={"max_tokens": 1000})
    harness.qtbot.wait_until(lambda: len(harness.recorder.text("r1")) > 0, timeout=TIMEOUT_MS)
    harness.stop()
    kind, message = harness.wait_ended("r1")
    assert (kind, message) == ("failed", "The model was unloaded before the reply finished.")
    assert harness.loop.done.is_set() and len(harness.released) == 1


def test_a_deleted_bridge_stops_the_loop(harness: Harness) -> None:
    shiboken6.delete(harness.sentinel)  # the bridge's child: gone without shutdown()
    harness.loop.wake()
    assert harness.orphaned.wait(TIMEOUT_MS / 1000)
    assert harness.loop.done.wait(TIMEOUT_MS / 1000)
    assert harness.loop.stop_event.is_set()


class _Fatal(BaseException):
    """What no step survives (the loop only recovers from ``Exception``)."""


def test_a_dead_loop_says_so_fails_its_requests_and_keeps_the_model(harness: Harness,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    harness.submit("r1", STORY, params={"max_tokens": 1000})
    harness.qtbot.wait_until(lambda: len(harness.recorder.text("r1")) > 0, timeout=TIMEOUT_MS)

    def die() -> Any:
        raise _Fatal("out of luck")

    monkeypatch.setattr(harness.engine, "step", die)
    assert harness.loop.done.wait(TIMEOUT_MS / 1000)
    harness.qtbot.wait_until(lambda: harness.recorder.errors != [], timeout=TIMEOUT_MS)
    assert harness.loop.error == "_Fatal: out of luck"
    assert harness.recorder.errors == ["The engine stopped unexpectedly (_Fatal: out of luck). Reload the model."]
    kind, message = harness.wait_ended("r1")
    assert kind == "failed" and "The engine stopped" in message and "out of luck" in message
    assert harness.released == []  # a loop that died leaves the model to whoever retires it
