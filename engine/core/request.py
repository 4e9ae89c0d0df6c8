"""One request's state inside the engine, and the caller's end of it (``RequestHandle``).

The handle reaches the engine only through the ``cancel`` callable it is given, so this module does not import
``llm_engine``.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.api import RequestMetrics, RequestOutput, StepOutput, TokenLogprob
from engine.core.detokenizer import IncrementalDetokenizer
from engine.core.sequence import Sequence

log = logging.getLogger("engine")

if TYPE_CHECKING:
    from engine.model.grammar import Matcher

Prompt = str | list[int] | list[dict[str, Any]]


@dataclass(slots=True)
class EngineRequest:
    seq: Sequence
    detok: IncrementalDetokenizer
    metrics: RequestMetrics
    handle: RequestHandle
    max_tokens: int
    eos_ids: frozenset[int]
    finish_reason: str | None = None
    deadline: float | None = None  # time.monotonic() after which the request ends with "timeout"
    matcher: Matcher | None = None  # the grammar of a constrained request
    #: The first of ``n`` parallel requests, while it has not yet produced a token: this one waits, so that it
    #: finds the prompt's KV blocks in the prefix cache instead of computing them again.
    held_for: EngineRequest | None = None


OutputCallback = Callable[[StepOutput], None]
#: Asks the engine to cancel the request of this id (``LLMEngine.cancel``); thread-safe.
CancelCallback = Callable[[str], None]


class RequestHandle:
    """The caller's end of a request: iterate it for text deltas, ``cancel()`` it, or wait for ``result()``.

    ``on_output``, if given, is called with every ``StepOutput`` on the thread that steps the engine, right
    after it is queued; it must be quick and must not raise (``AsyncLLMEngine`` uses it to wake an event loop).
    """

    def __init__(
        self,
        cancel: CancelCallback,
        request_id: str,
        prompt_token_ids: list[int],
        on_output: OutputCallback | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        #: Messages of the chat left out to fit the context (``engine.core.context``); 0 when it was sent whole.
        self.num_dropped_messages = 0
        self._cancel = cancel
        self._on_output = on_output
        self._queue: queue.Queue[StepOutput] = queue.Queue()
        self._done = threading.Event()
        self._text: list[str] = []
        self._token_ids: list[int] = []
        self._logprobs: list[TokenLogprob] = []
        self._final: StepOutput | None = None
        self._metrics: RequestMetrics | None = None

    def cancel(self) -> None:
        """Stop generating; the request finishes with reason "abort" and keeps its partial text."""
        self._cancel(self.request_id)

    def done(self) -> bool:
        return self._done.is_set()

    def _deliver(self, out: StepOutput, metrics: RequestMetrics) -> None:
        self._text.append(out.delta_text)
        self._token_ids.extend(out.new_token_ids)
        if out.logprobs:
            self._logprobs.extend(out.logprobs)
        self._metrics = metrics
        self._queue.put(out)
        if out.finished:
            self._final = out
            self._done.set()
        if self._on_output is not None:
            try:
                self._on_output(out)
            except Exception:
                log.exception("on_output callback of %s failed", self.request_id)

    def __iter__(self) -> Iterator[str]:
        """Yield text deltas as they arrive, until the request finishes."""
        while True:
            out = self._queue.get()
            if out.delta_text:
                yield out.delta_text
            if out.finished:
                if out.error:
                    raise RuntimeError(out.error)
                return

    def result(self, timeout: float | None = None) -> RequestOutput:
        """Block until the request finishes and return its output."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.request_id} did not finish within {timeout} s")
        assert self._final is not None and self._metrics is not None
        return RequestOutput(
            request_id=self.request_id,
            prompt_token_ids=self.prompt_token_ids,
            text="".join(self._text),
            token_ids=list(self._token_ids),
            finish_reason=self._final.finish_reason,
            metrics=self._metrics,
            error=self._final.error,
            logprobs=list(self._logprobs) or None,
        )
