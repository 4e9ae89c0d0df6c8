"""Tool calling: OpenAI's ``tools`` into the prompt, the constraint for ``tool_choice``, and calls out of the reply.

The code lives in ``engine/core/tool_calls.py``, which the MCP loop (``engine/mcp/``) shares; these are its names.

- The prompt: the model's chat template renders the tools when it knows how (its source mentions ``tools``).
  Otherwise a system message lists them and asks for Hermes-style calls:
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
- ``tool_choice``: ``"none"`` leaves the tools out and parses nothing; ``"auto"`` lets the model choose and parses
  whatever calls it wrote; ``"required"`` and a named function constrain the reply by a JSON schema, so the
  arguments always validate: a named function's reply is its arguments object, ``required``'s is an array of
  ``{"name", "arguments"}`` objects (one item when ``parallel_tool_calls`` is false).
- The reply: :func:`parse_tool_calls` finds each family's calls (Hermes ``<tool_call>`` blocks, Llama's
  ``<|python_tag|>`` JSON, Mistral's ``[TOOL_CALLS]``, or a reply that is a JSON call or a list of them) naming a
  known function.
"""

from __future__ import annotations

from engine.core.tool_calls import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    ToolCall,
    choice_schema,
    constrained_calls,
    function_names,
    history_message,
    may_be_call,
    parse_tool_calls,
    plain_history,
    template_knows_tools,
    with_tool_instructions,
)

__all__ = [
    "TOOL_CALL_CLOSE", "TOOL_CALL_OPEN", "ToolCall", "choice_schema", "constrained_calls", "function_names",
    "history_message", "may_be_call", "parse_tool_calls", "plain_history", "template_knows_tools",
    "with_tool_instructions",
]
