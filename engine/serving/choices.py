"""How one OpenAI request's replies are shaped (:class:`Plan`) and each choice's state while it streams
(:class:`Choice`): chat or text, logprobs, echo, the tools to render and the calls to parse."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.api import StepOutput, TokenLogprob
from engine.serving import tools as tools_mod


@dataclass(slots=True)
class Plan:
    """How one request's replies are shaped: chat or text, logprobs, tools to render and calls to parse."""

    chat: bool
    logprobs: bool = False
    choice: str | dict[str, Any] = "none"
    names: list[str] = field(default_factory=list)
    template_tools: list[dict[str, Any]] | None = None
    echo: str = ""

    @property
    def constrained(self) -> bool:
        """``required`` or a named function: the whole reply is the calls."""
        return bool(self.names) and self.choice != "auto"

    def calls(self, text: str) -> tuple[str, list[tools_mod.ToolCall]]:
        """The reply's content and its tool calls."""
        if not self.names:
            return text, []
        if self.constrained:
            return "", tools_mod.constrained_calls(text, self.choice)
        return tools_mod.parse_tool_calls(text, self.names)


@dataclass(slots=True)
class Choice:
    """One choice's text so far, its logprobs and final output; ``sent``/``held`` track what streaming let out."""

    parts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    final: StepOutput | None = None
    sent: int = 0
    held: bool = False

    def add(self, out: StepOutput) -> None:
        self.parts.append(out.delta_text)
        if out.logprobs:
            self.logprobs = (self.logprobs or []) + out.logprobs
        if out.finished:
            self.final = out

    def release(self, plan: Plan, finished: bool) -> str:
        """The text a stream may send now: all of it, unless it may still become a tool call."""
        text = "".join(self.parts)
        if plan.names and not plan.constrained and self.sent == 0 and not text.strip() and not finished:
            return ""  # nothing to judge by yet
        if plan.names and (plan.constrained or self.held or (self.sent == 0 and tools_mod.may_be_call(text))):
            self.held = True
            return ""
        new, self.sent = text[self.sent:], len(text)
        return new
