"""Tool calls as each model family writes them, whole and split across streamed chunks."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from engine.core.tool_calls import ToolCallStream, parse_reply, parse_tool_calls, tool_family

NAMES = {"get_weather", "add"}

# Replies as the models emit them (special tokens kept in the text).
HERMES = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo"}}\n</tool_call>\n'
          '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>')
LLAMA_TAG = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Tokyo"}}<|eom_id|>'
LLAMA_BARE = '{"name": "get_weather", "parameters": {"city": "Tokyo"}}'
LLAMA_TWO = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Tokyo"}}; {"name": "add", "parameters": {"a": 2, "b": 3}}'
MISTRAL = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Tokyo"}}, {"name": "add", "arguments": {"a": 2, "b": 3}}]</s>'
MISTRAL_NEW = '[TOOL_CALLS]get_weather[ARGS]{"city": "Tokyo"}[TOOL_CALLS]add[ARGS]{"a": 2, "b": 3}'
REQUIRED = '[{"name": "get_weather", "arguments": {"city": "Tokyo"}}]'


def _calls(parsed: object) -> list[tuple[str, dict[str, object]]]:
    return [(c.name, json.loads(c.arguments)) for c in parsed.calls]  # type: ignore[attr-defined]


TOKYO = ("get_weather", {"city": "Tokyo"})
ADD = ("add", {"a": 2, "b": 3})


@pytest.mark.parametrize(("text", "calls", "content"), [
    (HERMES, [TOKYO, ADD], "Let me check."),
    (LLAMA_TAG, [TOKYO], ""),
    (LLAMA_BARE, [TOKYO], ""),
    (LLAMA_TWO, [TOKYO, ADD], ""),
    (MISTRAL, [TOKYO, ADD], ""),
    (MISTRAL_NEW, [TOKYO, ADD], ""),
    (REQUIRED, [TOKYO], ""),
    (MISTRAL.replace("[TOOL_CALLS]", ""), [TOKYO, ADD], ""),  # the marker skipped by the detokenizer
    (LLAMA_TAG.replace("<|python_tag|>", "").replace("<|eom_id|>", ""), [TOKYO], ""),
])
def test_each_family_whole_and_streamed(text: str, calls: list[object], content: str) -> None:
    whole = parse_reply(text, NAMES)
    assert _calls(whole) == calls and whole.content.strip() == content and whole.problems == []
    for size in (1, 3, 7):  # split across streamed chunks of any size
        stream = ToolCallStream(NAMES)
        got = [stream.feed(text[i:i + size]) for i in range(0, len(text), size)] + [stream.finish()]
        assert [c for g in got for c in _calls(g)] == calls
        assert "".join(g.content for g in got).strip() == content


def test_calls_come_out_as_they_close_and_text_is_not_held() -> None:
    stream = ToolCallStream(NAMES)
    first = stream.feed('Sure. <tool_call>{"name": "add", "arguments": {"a": 1, ')
    assert first.content == "Sure. " and first.calls == [] and stream.in_call
    second = stream.feed('"b": 2}}</tool_call> and')
    assert _calls(second) == [("add", {"a": 1, "b": 2})] and second.content == " and" and not stream.in_call
    assert stream.feed(" more <tool").content == " more "  # "<tool" may start a marker: held
    assert stream.finish().content == "<tool"


def test_plain_text_and_json_that_is_not_a_call_are_content() -> None:
    assert parse_tool_calls("The answer is 4.", ["add"]) == ("The answer is 4.", [])
    data = '{"city": "Tokyo", "temp": 21}'
    assert parse_tool_calls(data, ["add"]) == (data, [])
    assert parse_reply("[1, 2, 3]", NAMES).content == "[1, 2, 3]"


def test_malformed_calls_are_problems_in_words_never_exceptions() -> None:
    bad_json = parse_reply('<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>', NAMES)
    assert bad_json.calls == [] and "not valid JSON" in bad_json.problems[0]
    unknown = parse_reply('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', NAMES)
    assert "no tool named 'rm_rf'" in unknown.problems[0] and "add, get_weather" in unknown.problems[0]
    not_object = parse_reply('[TOOL_CALLS][{"name": "add", "arguments": [1, 2]}]', NAMES)
    assert "must be a JSON object" in not_object.problems[0]
    cut = parse_reply('<|python_tag|>{"name": "add", "parameters": {"a": 1', NAMES)
    assert "cut off" in cut.problems[0]
    string_args = parse_reply('<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}</tool_call>',
                              NAMES)
    assert _calls(string_args) == [("add", {"a": 1, "b": 2})]
    # the server's parse keeps its contract: no well-formed call, the whole reply is content
    assert parse_tool_calls('<tool_call>{"name": "rm_rf"}</tool_call>', ["add"])[1] == []


@pytest.mark.parametrize(("template", "vocab", "family"), [
    ("{% for tool in tools %}<tool_call>{{ tool }}</tool_call>{% endfor %}<|im_start|>", {}, "hermes"),
    ("{%- if tools %}<|start_header_id|>ipython<|end_header_id|>{% endif %}<|eom_id|>",
     {"<|python_tag|>": 1}, "llama"),
    ("{%- if tools %}[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]", {}, "mistral"),
    ("{{ messages }}", {"[TOOL_CALLS]": 5}, "mistral"),
    ("{{ messages }}", {}, "hermes"),
])
def test_the_family_comes_from_the_template_and_tokens(template: str, vocab: dict[str, int], family: str) -> None:
    tokenizer = SimpleNamespace(chat_template=template, get_vocab=lambda: vocab)
    assert tool_family(tokenizer) == family
