"""Real clients against the real server: the ``openai`` SDK's structured output, tools, logprobs and ``n``, a
request with every OpenAI field at its neutral value, and LangChain's ``ChatOpenAI``."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from openai import OpenAI
from pydantic import BaseModel, ConfigDict, Field

from tests.engine.server_process import OPEN, ServerProcess

MODEL = "default"
HI = [{"role": "user", "content": "Say hello."}]
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False}}}]


class Person(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=150)


@pytest.fixture(scope="module")
def server(shared_server: Callable[..., ServerProcess]) -> ServerProcess:
    return shared_server(*OPEN)  # no API key


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[OpenAI]:
    with OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=120.0) as openai_client:
        yield openai_client


def test_every_field_at_its_neutral_value_gets_a_200(server: ServerProcess) -> None:
    body: dict[str, Any] = {
        "model": MODEL, "messages": [*HI, {"role": "assistant", "content": "Hi!", "refusal": None, "audio": None},
                                     {"role": "developer", "content": "Be brief."}, *HI],
        "max_tokens": 4, "max_completion_tokens": 4, "temperature": 1, "top_p": 1, "n": 1, "stream": False,
        "stream_options": None, "stop": None, "seed": None, "presence_penalty": 0, "frequency_penalty": 0,
        "logit_bias": {}, "logprobs": False, "top_logprobs": None, "response_format": {"type": "text"},
        "tools": [], "tool_choice": "none", "parallel_tool_calls": False, "functions": None, "function_call": None,
        "store": False, "metadata": {}, "user": "someone", "service_tier": "auto", "audio": None,
        "modalities": ["text"], "prediction": None, "reasoning_effort": None, "web_search_options": None,
        "prompt_cache_key": None, "safety_identifier": None, "verbosity": None,
    }
    response = httpx.post(f"{server.v1}/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    completion = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "echo": False, "best_of": 1, "logprobs": None,
                  "suffix": None, "n": 1, "user": "u", "logit_bias": {}, "presence_penalty": 0, "stream": False}
    response = httpx.post(f"{server.v1}/completions", json=completion, timeout=120)
    assert response.status_code == 200, response.text


def test_parse_returns_a_pydantic_object(client: OpenAI) -> None:
    reply = client.beta.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "A person as JSON."}], response_format=Person,
        max_tokens=100, temperature=0.7, seed=1)
    assert isinstance(reply.choices[0].message.parsed, Person)


def test_tool_round_trip(client: OpenAI) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(model=MODEL, messages=ask, tools=WEATHER, tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=60)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
    history = [*ask, choice.message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 C."}]
    second = client.chat.completions.create(model=MODEL, messages=history, tools=WEATHER, tool_choice="none",
                                            max_tokens=20, temperature=0)
    assert second.choices[0].message.content

    named = client.chat.completions.create(
        model=MODEL, messages=ask, tools=WEATHER, max_tokens=60, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    chunks = list(named)
    calls = [c for chunk in chunks for c in (chunk.choices[0].delta.tool_calls or []) if chunk.choices]
    assert calls and calls[0].function.name == "get_weather"
    assert isinstance(json.loads(calls[0].function.arguments)["city"], str)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_logprobs_shape_and_n(client: OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=6, temperature=0.8, seed=5, n=3,
                                           logprobs=True, top_logprobs=4)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    for choice in reply.choices:
        assert choice.logprobs is not None and choice.logprobs.content
        for entry in choice.logprobs.content:
            assert entry.logprob <= 0 and len(entry.top_logprobs) == 4
            assert sum(math.exp(t.logprob) for t in entry.top_logprobs) <= 1 + 1e-4
    assert reply.usage is not None and reply.usage.completion_tokens <= 18
    stream = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4, logprobs=2,
                                       stream=True)
    pieces = [c.choices[0] for c in stream if c.choices]
    assert any(p.logprobs and p.logprobs.tokens for p in pieces)


def test_langchain_bind_tools_and_structured_output(server: ServerProcess) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    llm = langchain_openai.ChatOpenAI(base_url=server.v1, api_key="unused", model=MODEL, max_tokens=80,
                                      temperature=0.5, max_retries=0)
    message = llm.bind_tools(WEATHER, tool_choice="get_weather").invoke("Weather in Rome?")
    assert message.tool_calls and message.tool_calls[0]["name"] == "get_weather"
    person = llm.with_structured_output(Person, method="json_schema").invoke("Invent a person.")
    assert isinstance(person, Person)
