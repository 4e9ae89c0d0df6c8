"""A tools reply's chat cut to fit the context (app/bridge/tool_runs.py) on the real default model's tokenizer and
chat template: the tools' definitions are counted, so the loop's first prompt leaves the reply its room."""

from __future__ import annotations

from typing import Any

from app.bridge.signals import EngineSignals
from app.bridge.tool_runs import ToolRun, ToolRunSpec
from engine.api import SamplingParams
from engine.mcp.approvals import ApprovalStore, Decision
from engine.mcp.host import ToolInfo
from engine.mcp.loop import tool_prompt_tokens

#: Tools as an MCP server describes them: a few hundred tokens of definitions.
TOOLS = [
    ToolInfo("notes", f"search_notes_{n}", "Search the user's notes for a phrase and return the matching lines, "
             "each with its file and line number. " * 4,
             {"type": "object", "properties": {"query": {"type": "string", "description": "the phrase to find"},
                                               "limit": {"type": "integer", "description": "most lines to return"}},
              "required": ["query"]})
    for n in range(3)
]


def _spec() -> ToolRunSpec:
    def no_host() -> Any:
        raise AssertionError("fitting the chat starts no server")

    return ToolRunSpec(host=no_host, servers=[], approve=lambda request: Decision.DENY,
                       approvals=ApprovalStore(None), deny_all=lambda: None)


def test_a_tools_chat_is_cut_with_room_for_the_tools_definitions(qapp: Any, shared_default_llm: Any) -> None:
    llm = shared_default_llm("fp32")
    engine = llm.engine
    params = SamplingParams(max_tokens=64, temperature=0.0)
    room = engine.intake.room
    budget = room - min(params.max_tokens, room // 2)
    turn = "Tell me one more thing about bread, briefly."
    chat = [{"role": "user" if n % 2 == 0 else "assistant", "content": f"{n}: {turn}"} for n in range(301)]
    definitions = tool_prompt_tokens(llm, chat[-1:], TOOLS)
    assert definitions > 200  # enough to overflow a chat cut without them

    signals = EngineSignals()
    cut: list[int] = []
    signals.context_fitted.connect(lambda request_id, dropped: cut.append(dropped))
    run = ToolRun("req-1", "1", llm, chat, params, _spec(), signals, overflow="truncate_middle")
    fitted = run._fitted(TOOLS)

    sent = len(engine.tokenize(fitted)) + tool_prompt_tokens(llm, fitted, TOOLS)  # the loop's first prompt
    assert sent <= budget, f"{sent} prompt tokens with the tools, {budget} fit beside the reply's {params.max_tokens}"
    assert cut == [len(chat) - len(fitted)]
    assert fitted[0] == chat[0] and fitted[-1] == chat[-1]  # "truncate_middle" keeps the first turn and the last
    without_tools = engine.fit_context(chat, params, "truncate_middle")
    assert len(without_tools) > len(fitted)  # the tools took the room of some turns
