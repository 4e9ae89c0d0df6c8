"""The tool loop: approvals (once, always remembered, deny), invalid calls answered in words, the step limit, and
one whole loop on a tiny model whose call is forced by the engine's grammar."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.api import SamplingParams
from engine.mcp.approvals import ApprovalRequest, ApprovalStore, Decision
from engine.mcp.host import McpHost
from engine.mcp.loop import run_tool_loop, tool_prompt_tokens
from tests.engine.conftest import TINY_LLM_OPTIONS, build_tiny_model


class _Handle:
    def __init__(self, text: str) -> None:
        self.text = text

    def done(self) -> bool:
        return True

    def __iter__(self) -> Any:  # streamed in small chunks, as a running engine loop delivers them
        return iter([self.text[i:i + 3] for i in range(0, len(self.text), 3)])

    def result(self) -> Any:
        return type("Out", (), {"text": self.text, "finish_reason": "stop", "error": None})()


class ScriptedLLM:
    """An engine double that answers each request with the next scripted reply (Hermes-style calls)."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)
        self.prompts: list[Any] = []
        self.engine = self
        self.tokenizer = type("Tok", (), {"chat_template": "{{ messages }}"})()
        self.is_alive = False

    def tokenize(self, prompt: Any, tools: Any = None) -> list[int]:
        self.prompts.append(prompt)
        return [0] * len(json.dumps(prompt))

    def submit(self, ids: list[int], params: SamplingParams) -> _Handle:
        return _Handle(self.replies.pop(0))


def _call(name: str, **args: Any) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(args)}}}</tool_call>'


def _answers(*decisions: Decision) -> tuple[list[ApprovalRequest], Any]:
    asked: list[ApprovalRequest] = []
    queue = list(decisions)

    def approve(request: ApprovalRequest) -> Decision:
        asked.append(request)
        return queue.pop(0)
    return asked, approve


def test_allow_once_runs_the_call_and_asks_again_next_time(host: McpHost, tmp_path: Path) -> None:
    llm = ScriptedLLM([_call("add", a=2, b=3), _call("add", a=1, b=1), "The sums are 5 and 2."])
    asked, approve = _answers(Decision.ALLOW_ONCE, Decision.ALLOW_ONCE)
    store = ApprovalStore(tmp_path / "approvals.json")
    result = run_tool_loop(llm, [{"role": "user", "content": "add"}], host, approve, store,
                           tools=list(host.list_tools("t").result(60)))
    assert [a.arguments for a in asked] == [{"a": 2, "b": 3}, {"a": 1, "b": 1}]
    assert [s.result.text for s in result.steps] == ["5", "2"]
    assert result.text == "The sums are 5 and 2." and result.finish_reason == "stop"
    tool_messages = [m for m in result.messages if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == ["5", "2"]
    assert result.messages[1]["tool_calls"][0]["id"] == tool_messages[0]["tool_call_id"]
    assert result.tool_prompt_tokens > 0


def test_always_is_remembered_per_server_and_tool_across_instances(host: McpHost, tmp_path: Path) -> None:
    path = tmp_path / "approvals.json"
    asked, approve = _answers(Decision.ALLOW_ALWAYS)
    tools = list(host.list_tools("t").result(60))
    run_tool_loop(ScriptedLLM([_call("add", a=1, b=2), "3"]), [{"role": "user", "content": "?"}], host, approve,
                  ApprovalStore(path), tools=tools)
    assert len(asked) == 1 and json.loads(path.read_text()) == {"always": {"t": ["add"]}}
    # a new store over the same file (as after a restart of the app): add runs without asking; slow still asks
    asked2, approve2 = _answers(Decision.DENY)
    result = run_tool_loop(ScriptedLLM([_call("add", a=4, b=4) + _call("slow", seconds=0), "done"]),
                           [{"role": "user", "content": "?"}], host, approve2, ApprovalStore(path), tools=tools)
    assert [a.tool for a in asked2] == ["slow"]
    assert result.steps[0].result.text == "8" and result.steps[0].decision is None


def test_denied_and_invalid_calls_go_back_to_the_model_in_words(host: McpHost, tmp_path: Path) -> None:
    asked, approve = _answers(Decision.DENY)
    llm = ScriptedLLM([
        _call("add", a=1, b=2) + _call("add", a="one", b=2) + _call("rm_rf") + "<tool_call>{not json}</tool_call>",
        "Sorry.",
    ])
    result = run_tool_loop(llm, [{"role": "user", "content": "?"}], host, approve,
                           ApprovalStore(tmp_path / "a.json"), tools=list(host.list_tools("t").result(60)))
    texts = [s.result.text for s in result.steps]
    assert "denied" in texts[0] and "not run" in texts[0] and result.steps[0].decision is Decision.DENY
    assert "input schema" in texts[1] and "'one' is not of type 'integer'" in texts[1]
    assert any("no tool named 'rm_rf'" in t for t in texts) and any("not valid JSON" in t for t in texts)
    assert all(s.result.is_error for s in result.steps) and len(asked) == 1  # invalid calls are never asked
    assert result.text == "Sorry."


def test_streamed_replies_show_their_text_and_hold_back_the_calls(host: McpHost, tmp_path: Path) -> None:
    llm = ScriptedLLM(["Checking. " + _call("add", a=3, b=4), "It is 7."])
    llm.is_alive = True  # a running loop: the reply arrives as deltas
    shown: list[str] = []
    store = ApprovalStore(tmp_path / "a.json")
    store.remember("t", "add")
    result = run_tool_loop(llm, [{"role": "user", "content": "?"}], host, lambda r: Decision.DENY, store,
                           tools=list(host.list_tools("t").result(60)), on_text=shown.append)
    assert "".join(shown) == "Checking. It is 7." and result.steps[0].result.text == "7"


def test_the_loop_stops_at_the_step_limit(host: McpHost, tmp_path: Path) -> None:
    llm = ScriptedLLM([_call("add", a=1, b=1)] * 3)
    store = ApprovalStore(tmp_path / "a.json")
    store.remember("t", "add")
    result = run_tool_loop(llm, [{"role": "user", "content": "?"}], host, lambda r: Decision.DENY, store,
                           tools=list(host.list_tools("t").result(60)), max_steps=2)
    assert result.finish_reason == "step_limit" and result.replies == 2 and len(result.steps) == 2


def test_a_forced_reply_is_kept_as_its_call_only(host: McpHost, tmp_path: Path) -> None:
    """The text of a reply forced by tool_choice is the call's arguments: kept as the message's content as well,
    the next prompt would show a reply that repeats them beside the call, and the default model copies it."""
    llm = ScriptedLLM(['{"a": 2, "b": 3}', "It is 5."])
    store = ApprovalStore(tmp_path / "a.json")
    store.remember("t", "add")
    result = run_tool_loop(llm, [{"role": "user", "content": "2 + 3?"}], host, lambda r: Decision.DENY, store,
                           tools=list(host.list_tools("t").result(60)), tool_choice="add")
    forced = result.messages[1]
    assert forced["content"] == "" and json.loads(forced["tool_calls"][0]["function"]["arguments"]) == {"a": 2, "b": 3}
    assert result.steps[0].result.text == "5" and result.text == "It is 5."
    replayed = next(m["content"] for m in llm.prompts[-1] if m["role"] == "assistant")
    assert replayed.startswith("<tool_call>"), replayed


def test_a_whole_loop_on_a_tiny_model_with_a_forced_call(host: McpHost, tmp_path: Path,
                                                         default_model_dir: Path, request: pytest.FixtureRequest) -> None:
    from engine import LLM

    folder = build_tiny_model("llama", tmp_path / "tiny", default_model_dir)  # one family, not the session's all
    llm = LLM(folder, **TINY_LLM_OPTIONS)
    request.addfinalizer(llm.close)
    tools = [t for t in host.list_tools("t").result(60) if t.name == "city_time"]
    messages = [{"role": "user", "content": "What time is it in Tokyo?"}]
    asked, approve = _answers(Decision.ALLOW_ONCE)
    result = run_tool_loop(llm, messages, host, approve, ApprovalStore(tmp_path / "a.json"), tools=tools,
                           tool_choice="city_time", max_steps=2,
                           params=SamplingParams(max_tokens=24, temperature=0.0))
    assert asked and asked[0].tool == "city_time" and asked[0].arguments["city"] in ("Tokyo", "Paris")
    step = result.steps[0]
    assert step.result.text == f"It is 09:30 in {asked[0].arguments['city']}." and not step.result.is_error
    assert result.replies == 2 and [m["role"] for m in result.messages[:3]] == ["user", "assistant", "tool"]
    assert tool_prompt_tokens(llm, messages, tools) == result.tool_prompt_tokens > 0
