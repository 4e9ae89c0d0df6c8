"""One whole tool loop on the real default model over PyPI's ``mcp-server-time``: asked the time in Tokyo, the
model calls the tool, the user allows the call, the server answers, and the model's answer carries that time.

The first reply's tool choice is forced (``get_current_time``, its arguments held to the tool's ``inputSchema`` by
the grammar); the model still chooses the timezone itself. Unguided, SmolLM2-135M writes a UTC offset there
("UTC+08:30", "UTC+9") at every precision, which the server refuses; the chat's system message says that timezones
are IANA names (with examples of other cities), and with both of the server's tools offered (``convert_time``'s
description names Asia/Tokyo among its examples) it writes Asia/Tokyo. The answer is generated with tool choice
``auto`` and greedy decoding, at int4, the precision the app picks for this model on a CPU. The model answers by
quoting the result ("The result of the function call is: {...}"), which carries the time; had the forced reply's
arguments stayed in the history as its text, it would copy those instead.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from engine.api import SamplingParams
from engine.mcp.approvals import ApprovalRequest, ApprovalStore, Decision
from engine.mcp.config import parse_config
from engine.mcp.host import McpHost
from engine.mcp.loop import run_tool_loop
from tests.engine.mcp.test_real_servers import start, time_entry

SYSTEM = "Timezones are IANA names such as Europe/Paris or America/New_York, never offsets like UTC+01."


@pytest.fixture(scope="module")
def time_host() -> Iterator[McpHost]:
    with start(parse_config({"mcpServers": {"time": time_entry()}}), "time") as host:
        yield host


def test_the_default_model_asks_the_time_server_and_answers_with_its_time(
        time_host: McpHost, shared_default_llm: Callable[..., Any], tmp_path: Path) -> None:
    llm = shared_default_llm("int4")
    asked: list[ApprovalRequest] = []

    def approve(request: ApprovalRequest) -> Decision:
        asked.append(request)
        return Decision.ALLOW_ONCE

    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What time is it in Tokyo?"}]
    result = run_tool_loop(llm, messages, time_host, approve, ApprovalStore(tmp_path / "approvals.json"),
                           tools=list(time_host.status("time")[0].tools), tool_choice="get_current_time",
                           max_steps=2, params=SamplingParams(max_tokens=48, temperature=0.0))

    # the call: the model's own arguments, put to the user, run by the server
    assert [(a.server, a.tool, a.arguments) for a in asked] == [("time", "get_current_time",
                                                                 {"timezone": "Asia/Tokyo"})]
    (step,) = result.steps
    assert step.decision is Decision.ALLOW_ONCE and not step.result.is_error, step.result.text
    answer = json.loads(step.result.text)
    now = datetime.fromisoformat(answer["datetime"])
    assert answer["timezone"] == "Asia/Tokyo" and now.utcoffset() == timedelta(hours=9)
    assert [m["role"] for m in result.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert result.messages[3]["content"] == step.result.text
    assert result.messages[3]["tool_call_id"] == result.messages[2]["tool_calls"][0]["id"]

    # the answer: text, no further call, and it tells the time the server gave
    assert result.replies == 2 and "<tool_call>" not in result.text
    assert now.strftime("%H:%M") in result.text, result.text
