"""The tool loop: generate, parse the calls, ask the user, call the tools, append the results, and go on.

Given an engine (``engine.LLM``), a chat and an :class:`~engine.mcp.host.McpHost`, :func:`run_tool_loop` renders
the enabled tools into the prompt (the chat template's own ``tools`` rendering, or the Hermes instructions when
the template has none), generates, and parses the reply's calls in the model's family format as it streams
(``engine/core/tool_calls.py``). Each call is checked (a known tool, arguments that match its ``inputSchema``),
then put to ``approve`` unless the user allowed that tool of that server always. Denied, invalid and failed calls
go back to the model as tool results that say so; nothing the model writes raises out of the loop. It stops when
a reply makes no call, or after ``max_steps`` replies.

``tool_choice`` ("required" or a tool's name) applies to the first reply only, through the engine's grammar
(:func:`engine.core.tool_calls.choice_schema`), so the arguments of a forced call always validate; later replies
choose freely, or the loop could never end.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import jsonschema

from engine.api import SamplingParams
from engine.core import tool_calls as tc
from engine.mcp.approvals import ApprovalRequest, ApprovalStore, Decision
from engine.mcp.host import McpHost, ToolInfo, ToolResult

log = logging.getLogger(__name__)
Approve = Callable[[ApprovalRequest], Decision]


@dataclass
class ToolStep:
    """One call of one reply, and what came of it."""

    call: tc.ToolCall
    server: str
    tool: str
    arguments: dict[str, Any] | None
    decision: Decision | None  # None when the call was invalid, or allowed always without asking
    result: ToolResult


@dataclass
class LoopResult:
    messages: list[dict[str, Any]]  # the chat with every assistant reply and tool result appended
    steps: list[ToolStep] = field(default_factory=list)
    text: str = ""  # the last reply's text
    finish_reason: str = "stop"  # "stop", "step_limit", "length" or "error"
    replies: int = 0
    tool_prompt_tokens: int = 0


@dataclass(frozen=True)
class ExposedTool:
    """A server's tool under the name the model sees (``server__tool`` when two servers share a name)."""

    name: str
    info: ToolInfo


def expose(tools: list[ToolInfo]) -> dict[str, ExposedTool]:
    counts: dict[str, int] = {}
    for t in tools:
        counts[t.name] = counts.get(t.name, 0) + 1
    out = {}
    for t in tools:
        name = t.name if counts[t.name] == 1 else f"{t.server}__{t.name}"
        out[name] = ExposedTool(name, t)
    return out


def _prompt(llm: Any, messages: list[dict[str, Any]], openai_tools: list[dict[str, Any]]) -> list[int]:
    """The chat with its tools as token ids, rendered as the server renders them."""
    engine = llm.engine
    if not openai_tools:
        return list(engine.tokenize(tc.plain_history(messages)))
    if tc.template_knows_tools(engine.tokenizer):
        return list(engine.tokenize([tc.history_message(m) for m in messages], openai_tools))
    return list(engine.tokenize(tc.with_tool_instructions(tc.plain_history(messages), openai_tools)))


def tool_prompt_tokens(llm: Any, messages: list[dict[str, Any]], tools: list[ToolInfo]) -> int:
    """How many prompt tokens the definitions of ``tools`` add to ``messages`` (what a chat pays for them)."""
    openai = [e.info.as_openai(name) for name, e in expose(tools).items()]
    if not openai:
        return 0
    return len(_prompt(llm, messages, openai)) - len(_prompt(llm, messages, []))


def fit_chat(llm: Any, messages: list[dict[str, Any]], tools: list[ToolInfo], params: SamplingParams,
             overflow: str) -> list[dict[str, Any]]:
    """``messages`` cut to fit the context by ``overflow``'s policy (the engine's own ``fit_context``), each cut
    measured with the definitions of ``tools`` rendered in as the loop renders them: a long chat offered tools
    leaves room for them and for the reply. Raises as ``fit_context`` does (``ContextOverflowError``)."""
    openai = [e.info.as_openai(name) for name, e in expose(tools).items()]
    return list(llm.engine.fit_context(messages, params, overflow, lambda m: len(_prompt(llm, m, openai))))


def _generate(llm: Any, ids: list[int], params: SamplingParams, stream: tc.ToolCallStream | None,
              on_text: Callable[[str], None] | None) -> tuple[str, str | None, tc.ToolCallParse]:
    """One reply: its text, finish reason and (when ``stream``) its calls, parsed as the deltas come."""
    engine = llm.engine
    handle = engine.submit(ids, params)
    parsed = tc.ToolCallParse()

    def take(delta: str) -> None:
        if stream is None:
            if on_text is not None:
                on_text(delta)
            return
        part = stream.feed(delta)
        parsed.extend(part)
        if part.content and on_text is not None:
            on_text(part.content)

    if engine.is_alive:
        try:
            for delta in handle:
                take(delta)
        except RuntimeError:
            pass  # the error is in the result
    else:
        while not handle.done():
            engine.step()
    out = handle.result()
    if not engine.is_alive:
        take(out.text)
    if stream is not None:
        rest = stream.finish()
        parsed.extend(rest)
        if rest.content and on_text is not None:
            on_text(rest.content)
    reason = "error" if out.error else out.finish_reason
    return out.text, reason, parsed


def _closed(tool: dict[str, Any]) -> dict[str, Any]:
    """``tool`` with its arguments object closed to the properties it names when its schema leaves that open:
    a forced call then cannot wander into keys nobody asked for (small models do), and still validates."""
    params = tool["function"].get("parameters") or {}
    if params.get("type") == "object" and "additionalProperties" not in params and params.get("properties"):
        params = {**params, "additionalProperties": False}
    return {**tool, "function": {**tool["function"], "parameters": params}}


def _validate(exposed: ExposedTool, arguments: dict[str, Any]) -> str | None:
    """Why ``arguments`` do not match the tool's ``inputSchema``, in words; None when they do."""
    schema = exposed.info.input_schema or {"type": "object"}
    try:
        jsonschema.validate(arguments, schema)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "the arguments"
        return f"the arguments of {exposed.name!r} do not match its input schema: {where}: {exc.message}"
    except jsonschema.SchemaError:
        return None  # the server's schema is broken, not the call: the server judges the arguments
    return None


def run_tool_loop(
    llm: Any,
    messages: list[dict[str, Any]],
    host: McpHost,
    approve: Approve,
    approvals: ApprovalStore,
    *,
    tools: list[ToolInfo] | None = None,
    params: SamplingParams | None = None,
    tool_choice: str = "auto",
    max_steps: int = 8,
    call_timeout_s: float | None = None,
    on_text: Callable[[str], None] | None = None,
    on_step: Callable[[ToolStep], None] | None = None,
) -> LoopResult:
    """Answer ``messages`` with the tools of ``tools`` (default: every tool of every ready server); see the module
    docstring. ``on_text`` gets the replies' plain text as it streams, ``on_step`` each call's outcome."""
    if tools is None:
        tools = [t for s in host.status() if s.state == "ready" for t in s.tools]
    exposed = expose(tools)
    openai_tools = [e.info.as_openai(name) for name, e in exposed.items()]
    chat = [dict(m) for m in messages]
    result = LoopResult(chat, tool_prompt_tokens=tool_prompt_tokens(llm, messages, tools))
    base = params or SamplingParams(max_tokens=512)
    choice = tool_choice
    while True:
        if result.replies >= max_steps:
            result.finish_reason = "step_limit"
            return result
        step_params, schema = base, None
        if openai_tools and choice != "auto":
            named: str | dict[str, Any] = choice if choice == "required" else {"function": {"name": choice}}
            schema = tc.choice_schema([_closed(t) for t in openai_tools], named, parallel=True)
            step_params = replace(base, json_schema=schema, response_format="json")
        try:
            ids = _prompt(llm, chat, openai_tools)
            stream = tc.ToolCallStream(set(exposed)) if openai_tools and schema is None else None
            text, reason, parsed = _generate(llm, ids, step_params, stream, on_text)
        except Exception as exc:  # noqa: BLE001 -- a prompt the template refuses ends the loop, in words
            result.finish_reason, result.text = "error", f"the reply could not be generated: {exc}"
            return result
        result.replies += 1
        if schema is not None:
            parsed = tc.ToolCallParse(calls=tc.constrained_calls(text, named))
        choice = "auto"
        result.text = parsed.content.strip() if stream is not None else text
        if schema is not None and parsed.calls:
            # A forced reply is its call's arguments, not text: kept as the message's content too, the history
            # would show the model a reply that repeats its arguments beside the call, and a small model copies it.
            result.text = ""
        if not parsed.calls and not parsed.problems:
            chat.append({"role": "assistant", "content": text if stream is None and schema is None else
                         result.text})
            result.finish_reason = reason or "stop"
            return result
        calls = list(parsed.calls)
        problems = [(tc.ToolCall("invalid_call", "{}"), p) for p in parsed.problems]
        chat.append({"role": "assistant", "content": result.text,
                     "tool_calls": [c.as_openai() for c in calls + [c for c, _ in problems]]})
        for call in calls:
            step = _run_call(call, exposed, host, approve, approvals, call_timeout_s)
            _record(result, chat, step, on_step)
        for call, problem in problems:
            step = ToolStep(call, "", call.name, None, None, ToolResult(
                f"The tool call could not be run: {problem}. Write the call again, correctly.", is_error=True))
            _record(result, chat, step, on_step)


def _record(result: LoopResult, chat: list[dict[str, Any]], step: ToolStep,
            on_step: Callable[[ToolStep], None] | None) -> None:
    result.steps.append(step)
    chat.append({"role": "tool", "tool_call_id": step.call.id, "name": step.call.name, "content": step.result.text})
    if on_step is not None:
        try:
            on_step(step)
        except Exception:  # a caller's display error must not end the loop
            log.exception("on_step callback failed")


def _run_call(call: tc.ToolCall, exposed: dict[str, ExposedTool], host: McpHost, approve: Approve,
              approvals: ApprovalStore, timeout_s: float | None) -> ToolStep:
    target = exposed.get(call.name)
    if target is None:
        return ToolStep(call, "", call.name, None, None, ToolResult(
            f"There is no tool named {call.name!r}; the tools are: {', '.join(sorted(exposed)) or 'none'}.",
            is_error=True))
    server, tool = target.info.server, target.info.name
    try:
        arguments = json.loads(call.arguments or "{}")
    except ValueError as exc:
        arguments = None
        problem: str | None = f"the arguments of {call.name!r} are not valid JSON ({exc})"
    else:
        problem = (f"the arguments of {call.name!r} must be a JSON object" if not isinstance(arguments, dict)
                   else _validate(target, arguments))
    if problem is not None or not isinstance(arguments, dict):
        return ToolStep(call, server, tool, None, None, ToolResult(
            f"The tool call was not run: {problem}. Write the call again, correctly.", is_error=True))
    decision: Decision | None = None
    if not approvals.is_always(server, tool):
        try:
            decision = approve(ApprovalRequest(server, tool, arguments))
        except Exception:  # no answer is a no
            log.exception("the approval callback failed; the call is denied")
            decision = Decision.DENY
        if decision is Decision.ALLOW_ALWAYS:
            approvals.remember(server, tool)
        elif decision is not Decision.ALLOW_ONCE:
            return ToolStep(call, server, tool, arguments, Decision.DENY, ToolResult(
                f"The user denied this call to {tool!r} (server {server!r}); it was not run.", is_error=True))
    timeout = timeout_s or host.call_timeout_s
    try:
        outcome = host.call_tool(server, tool, arguments, timeout).result(timeout + host.start_timeout_s + 10)
    except Exception as exc:  # noqa: BLE001 -- a host failure goes back to the model as a failed call
        outcome = ToolResult(f"The call to {tool!r} of {server!r} failed: {exc or type(exc).__name__}",
                             is_error=True)
    return ToolStep(call, server, tool, arguments, decision, outcome)
