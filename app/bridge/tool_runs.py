"""Replies that may call MCP tools: :func:`engine.mcp.loop.run_tool_loop` over the loaded model, one Python thread
per reply.

The tool loop blocks: it waits for the model's replies, for the user's answer to each call (``approve``, which
shows the approval dialog on the GUI thread) and for each tool. So each reply runs on a ``threading.Thread`` of
its own (a Python callable handed to ``QThreadPool.start`` once crashed this app), and reports as a plain reply
does, through :class:`~app.bridge.signals.EngineSignals`: ``context_fitted`` when the chat was cut to fit the
context (by the engine's own fit, as a plain reply's is), ``token_delta`` for the replies' text (the final answer
streams in as a normal reply), ``tool_step`` for each call's outcome, then ``request_finished`` or
``request_failed``, exactly once. The model's requests go straight to its engine (``LLMEngine.submit`` is
thread-safe); the app's engine loop steps them along with every other chat's.

Stopping (:meth:`ToolRun.cancel`) cancels the reply being generated, answers Deny to a call waiting for the user
(``ToolRunSpec.deny_all``, on the GUI thread) and any later one, and ends the run with "abort". A tool already
running is not interrupted: the run ends when it returns or times out.

The MCP SDK (``engine.mcp.host``, and the loop over it) is imported by the worker threads here, never at this
module's import: the GUI thread, which makes the specs and starts the runs, would otherwise stop while it loads.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app import log
from app.bridge.protocols import BridgedLLM
from app.bridge.signals import EngineSignals
from app.bridge.types import RequestInfo
from app.data.tool_steps import ToolStepRecord
from engine.api import SamplingParams
from engine.mcp.approvals import ApprovalRequest, ApprovalStore, Decision

if TYPE_CHECKING:
    from engine.mcp.host import McpHost, ToolInfo
    from engine.mcp.loop import ToolStep

#: How long a reply waits for a chat's servers to start before it goes on without the ones still starting.
START_TIMEOUT_S = 60.0
#: The chat that :func:`measure` renders the tools into, to count what their definitions cost.
_PROBE = [{"role": "user", "content": "Hello"}]


@dataclass
class ToolRunSpec:
    """What a chat's tools reply needs: the host (``host()`` gives it, on the worker thread: making the first one
    loads the MCP SDK), the chat's servers (started here if need be), how to ask the user, and the "always"
    answers; ``deny_all`` answers Deny to the questions open (called on the GUI thread). ``max_steps`` caps the
    replies with tool calls, ``call_timeout_s`` each call; ``tools_off`` holds the (server, tool) pairs the chat
    turned off, which neither the model nor the count of prompt tokens sees."""

    host: Callable[[], McpHost]
    servers: list[str]
    approve: Callable[[ApprovalRequest], Decision]
    approvals: ApprovalStore
    deny_all: Callable[[], None]
    max_steps: int = 8
    call_timeout_s: float = 30.0
    tools_off: frozenset[tuple[str, str]] = frozenset()


@dataclass(frozen=True)
class ToolsMeasure:
    """A chat's tools: each one's (server, name), their definitions' prompt tokens (None without a local model
    to count them with), and the servers that could not start, in words. ``offered`` holds every tool of the
    chat's servers, the ones it turned off too (the Tools menu lists them all)."""

    tools: tuple[tuple[str, str], ...]
    prompt_tokens: int | None
    problems: tuple[str, ...] = ()
    offered: tuple[tuple[str, str], ...] = ()


def gather_tools(host: McpHost, servers: list[str]) -> tuple[list[ToolInfo], list[str]]:
    """Start each of ``servers`` if need be; the ready ones' tools, and why the others have none (any thread
    but the GUI's: it waits for the servers)."""
    tools: list[ToolInfo] = []
    problems: list[str] = []
    futures = [(name, host.start(name)) for name in servers]  # they start side by side
    for name, future in futures:
        try:
            status = future.result(START_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 -- a server that does not start is left out, in words
            problems.append(f"{name}: {exc or type(exc).__name__}")
            continue
        if status.state == "ready":
            tools.extend(status.tools)
        else:
            problems.append(f"{name}: {status.error or status.state}")
    return tools, problems


def measure(spec: ToolRunSpec, llm: BridgedLLM | None) -> ToolsMeasure:
    """Start ``spec``'s servers and count the prompt tokens of the tools the chat uses with ``llm``'s template
    (a worker thread: it blocks, and may load the MCP SDK)."""
    from engine.mcp.loop import tool_prompt_tokens

    offered, problems = gather_tools(spec.host(), spec.servers)
    tools = [t for t in offered if (t.server, t.name) not in spec.tools_off]
    tokens = None
    if llm is not None:
        try:
            tokens = tool_prompt_tokens(llm, _PROBE, tools)
        except Exception:  # noqa: BLE001 -- a template that cannot render tools: not counted
            log.bridge.exception("could not count the tools' prompt tokens")
    return ToolsMeasure(tuple((t.server, t.name) for t in tools), tokens, tuple(problems),
                        tuple((t.server, t.name) for t in offered))


def step_record(step: ToolStep) -> ToolStepRecord:
    """A loop step as the transcript keeps it."""
    outcome = "denied" if step.decision is Decision.DENY else "error" if step.result.is_error else "ok"
    arguments = (json.dumps(step.arguments, ensure_ascii=False) if step.arguments is not None
                 else step.call.arguments)
    return ToolStepRecord(step.server, step.tool, arguments, outcome, step.result.text)


class _Cancelled(Exception):
    pass


class _Engine:
    """The model's engine as the loop sees it: each request it submits is kept, so that Stop can cancel it."""

    def __init__(self, engine: Any, run: ToolRun) -> None:
        self._engine, self._run = engine, run

    #: The app's engine loop steps every request, this one's too: the tool loop must never step the engine
    #: itself, even in the moment between a model's load and its loop's start.
    is_alive = True

    def __getattr__(self, name: str) -> Any:  # tokenizer, tokenize: the engine's own
        return getattr(self._engine, name)

    def submit(self, prompt: Any, params: SamplingParams) -> Any:
        with self._run.lock:
            if self._run.cancelled.is_set():
                raise _Cancelled("stopped")
            self._run.handle = handle = self._engine.submit(prompt, params)
        return handle


class _LLM:
    def __init__(self, engine: _Engine) -> None:
        self.engine = engine


class ToolRun:
    """One reply through the tool loop, on a thread of its own; see the module docstring."""

    def __init__(self, request_id: str, conversation_id: str, llm: BridgedLLM, messages: list[dict[str, Any]],
                 params: SamplingParams, spec: ToolRunSpec, signals: EngineSignals,
                 overflow: str | None = None) -> None:
        self.request_id, self.conversation_id = request_id, conversation_id
        self.spec = spec
        self.lock = threading.Lock()
        self.cancelled = threading.Event()
        self.handle: Any = None
        self._llm = _LLM(_Engine(llm.engine, self))
        self._messages, self._params, self._signals = messages, params, signals
        self._overflow = overflow
        self._ended = False
        self._has_text = self._after_step = False
        self.thread = threading.Thread(target=self._run, name=f"hearth-tools-{request_id}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def cancel(self) -> None:
        """Stop the reply (any thread; the bridge also calls ``spec.deny_all`` on the GUI thread)."""
        with self.lock:
            self.cancelled.set()
            handle = self.handle
        if handle is not None:
            handle.cancel()

    def abandon(self, message: str) -> None:
        """End the reply now as failed with ``message`` (its model is going away); the thread's own end is dropped."""
        self.cancel()
        self._end(lambda: self._signals.request_failed.emit(self.request_id, message))

    # -- the run's thread -------------------------------------------------------------------------

    def _approve(self, request: ApprovalRequest) -> Decision:
        if self.cancelled.is_set():
            return Decision.DENY
        decision = self.spec.approve(request)
        return Decision.DENY if self.cancelled.is_set() else decision

    def _on_text(self, text: str) -> None:
        if not text or self._ended:
            return
        if self._after_step and self._has_text:  # the next reply's text starts a paragraph of its own
            text = "\n\n" + text.lstrip()
        self._has_text, self._after_step = True, False
        self._signals.token_delta.emit(self.request_id, text)

    def _on_step(self, step: ToolStep) -> None:
        self._after_step = True
        if not self._ended:
            self._signals.tool_step.emit(self.request_id, step_record(step))

    def _run(self) -> None:
        rid = self.request_id
        try:
            from engine.mcp.loop import run_tool_loop

            host = self.spec.host()
            tools, problems = gather_tools(host, self.spec.servers)
            for problem in problems:
                log.bridge.warning("tools reply %s goes on without a server: %s", rid, problem)
            tools = [t for t in tools if (t.server, t.name) not in self.spec.tools_off]
            result = run_tool_loop(self._llm, self._fitted(tools), host, self._approve, self.spec.approvals,
                                   tools=tools, params=self._params, max_steps=self.spec.max_steps,
                                   call_timeout_s=self.spec.call_timeout_s, on_text=self._on_text,
                                   on_step=self._on_step)
        except Exception as exc:  # noqa: BLE001 -- a worker thread must report, not die
            log.bridge.exception("tools reply %s failed", rid)
            why = str(exc) or type(exc).__name__
            self._end(lambda: self._signals.request_failed.emit(rid, why))
            return
        if self.cancelled.is_set():
            reason = "abort"
        elif result.finish_reason == "error":
            self._end(lambda: self._signals.request_failed.emit(rid, result.text))
            return
        else:
            reason = result.finish_reason
        if result.finish_reason == "step_limit" and not self.cancelled.is_set():
            self._on_text(f"(Stopped after {self.spec.max_steps} replies with tool calls.)")
        metrics = {"tool_prompt_tokens": result.tool_prompt_tokens, "num_tool_steps": len(result.steps)}
        info = RequestInfo(rid, self.conversation_id, "length" if reason == "length" else
                           "abort" if reason == "abort" else "stop", metrics)
        self._end(lambda: self._signals.request_finished.emit(rid, info))

    def _fitted(self, tools: list[ToolInfo]) -> list[dict[str, Any]]:
        """The chat cut to fit the context by the overflow policy, as the engine cuts a plain reply's
        (``LLMEngine.fit_context``) but counting the definitions of ``tools`` as the loop renders them
        (``engine.mcp.loop.fit_chat``), the cut told as ``context_fitted``; a chat the "stop" policy refuses
        raises, in words. Unchanged without a policy."""
        if self._overflow is None:
            return self._messages
        from engine.mcp.loop import fit_chat

        fitted = fit_chat(self._llm, self._messages, tools, self._params, self._overflow)
        if (dropped := len(self._messages) - len(fitted)) > 0:
            self._signals.context_fitted.emit(self.request_id, dropped)
        return fitted

    def _end(self, emit: Callable[[], None]) -> None:
        with self.lock:
            if self._ended:
                return
            self._ended = True
        emit()
