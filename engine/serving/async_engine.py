"""``AsyncLLMEngine``: the engine's requests as asyncio streams, for the OpenAI-compatible server.

The engine runs on its own thread (``LLM(start_loop=True)``) or is stepped by someone else (the app's bridge);
either way ``LLMEngine.submit`` is thread-safe. Each request's handle calls back on the stepping thread with
every ``StepOutput``; the callback hands it to the event loop with ``call_soon_threadsafe``, so no thread polls.
A consumer that stops early (a client that hangs up) cancels its request, which frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from engine.api import EngineMetrics, SamplingParams, StepOutput
from engine.core.llm_engine import LLMEngine
from engine.core.request import Prompt, RequestHandle


class AsyncRequest:
    """One submitted request: ``async for`` its ``StepOutput``s, or ``cancel()`` it.

    Iterating ends after the output with ``finished=True``. Created by :meth:`AsyncLLMEngine.submit`.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._outputs: asyncio.Queue[StepOutput] = asyncio.Queue()
        self._handle: RequestHandle | None = None
        self.is_finished = False

    @property
    def request_id(self) -> str:
        assert self._handle is not None
        return self._handle.request_id

    @property
    def num_prompt_tokens(self) -> int:
        assert self._handle is not None
        return len(self._handle.prompt_token_ids)

    def _on_output(self, out: StepOutput) -> None:
        """Engine thread: pass the output to the event loop (a closed loop means nobody listens)."""
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._outputs.put_nowait, out)

    def cancel(self) -> None:
        """Stop generating (no-op once finished); the engine frees the request's KV blocks."""
        if not self.is_finished and self._handle is not None:
            self._handle.cancel()

    def __aiter__(self) -> AsyncIterator[StepOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[StepOutput]:
        while not self.is_finished:
            out = await self._outputs.get()
            if out.finished:
                self.is_finished = True
            yield out


class AsyncLLMEngine:
    """Asyncio front of an :class:`LLMEngine` (or of an ``LLM``'s engine).

    Args:
        engine: an ``LLMEngine``, or an ``LLM`` (its ``.engine`` is used). Someone must step it: the engine's
            own loop thread (``LLM(start_loop=True)``) or the app's bridge.
    """

    def __init__(self, engine: LLMEngine | Any) -> None:
        self.engine: LLMEngine = getattr(engine, "engine", engine)

    def submit(
        self, prompt: Prompt, params: SamplingParams | None = None, priority: int = 0
    ) -> AsyncRequest:
        """Queue a request from inside a running event loop and return it at once.

        Raises:
            ValueError: a bad prompt, or one longer than the context (the message names the token counts).
            CapacityError: the engine's queue is full.
        """
        request = AsyncRequest(asyncio.get_running_loop())
        request._handle = self.engine.submit(prompt, params, priority=priority, on_output=request._on_output)
        return request

    async def add_request(
        self, prompt: Prompt, params: SamplingParams | None = None, priority: int = 0
    ) -> AsyncRequest:
        """Like :meth:`submit`, but tokenizing (and chat templating) run on a worker thread, so a long prompt
        never holds up the event loop. Raises as :meth:`submit` does."""
        return (await self.add_requests(prompt, params or SamplingParams(), priority))[0]

    async def add_requests(
        self, prompt: Prompt, params: SamplingParams, priority: int = 0, tools: list[dict[str, Any]] | None = None
    ) -> list[AsyncRequest]:
        """``params.n`` requests over one prompt (rendered with ``tools``), tokenized and their grammar compiled
        on a worker thread. Raises as :meth:`submit` does, and ``ValueError`` for a schema that cannot be used."""
        if not (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)):
            prompt = await asyncio.to_thread(self.engine.tokenize, prompt, tools)
        if params.is_constrained:
            await asyncio.to_thread(self.engine.prepare, params)
        if params.n == 1:
            return [self.submit(prompt, params, priority)]
        loop = asyncio.get_running_loop()
        requests = [AsyncRequest(loop) for _ in range(params.n)]
        handles = self.engine.submit_n(prompt, params, priority, on_outputs=[r._on_output for r in requests])
        for request, handle in zip(requests, handles, strict=True):
            request._handle = handle
        return requests

    async def stream(
        self, prompt: Prompt, params: SamplingParams | None = None, priority: int = 0
    ) -> AsyncIterator[StepOutput]:
        """Yield the request's outputs as they come; stopping early (or being cancelled) cancels it."""
        request = self.submit(prompt, params, priority)
        try:
            async for out in request:
                yield out
        finally:
            request.cancel()

    def metrics(self) -> EngineMetrics:
        return self.engine.metrics()

    def is_alive(self) -> bool:
        """False once the engine's own loop thread has died: no request would ever finish.

        An engine without a loop thread (stepped by the app's bridge, or stopped) counts as alive.
        """
        thread = getattr(self.engine, "_loop_thread", None)
        return thread is None or thread.is_alive()
