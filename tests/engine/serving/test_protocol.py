"""The OpenAI wire format (``engine/serving/protocol.py``): request bodies parsed, validated and turned into the
engine's parameters, and every bad body answered as a 400 that names the parameter."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine.api import MAX_N, SamplingParams
from engine.serving.protocol import (
    MAX_SEED,
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    parse_body,
)

USER = [{"role": "user", "content": "Hi"}]


def chat(**fields: Any) -> ChatCompletionRequest:
    """A chat request body with ``fields`` beside one user message, parsed as the server parses it."""
    return parse_body(json.dumps({"messages": USER, **fields}).encode(), ChatCompletionRequest)


def refused(raw: bytes | dict[str, Any], model: type = ChatCompletionRequest) -> APIError:
    """The 400 that parsing ``raw`` (bytes, or a dict sent as JSON) raises."""
    body = raw if isinstance(raw, bytes) else json.dumps(raw).encode()
    with pytest.raises(APIError) as caught:
        parse_body(body, model)
    assert caught.value.status == 400
    return caught.value


# --- the body as JSON ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw", [b"{", b"", b"{\"messages\": NaN}", b"{\"model\": \"\\ud800\"}",
                                 b"[" * 5000 + b"]" * 5000])
def test_bodies_that_are_not_json_are_a_400_not_a_crash(raw: bytes) -> None:
    error = refused(raw)
    assert error.code == "invalid_json"
    assert error.message.startswith("The request body is not valid JSON: ")


@pytest.mark.parametrize(("raw", "kind"), [(b"[]", "list"), (b"3", "int"), (b"null", "NoneType")])
def test_a_body_must_be_an_object(raw: bytes, kind: str) -> None:
    assert refused(raw).message == f"The request body must be a JSON object, not {kind}."


def test_an_error_is_openais_error_object() -> None:
    error = refused({"messages": USER, "temperature": 3})
    assert error.body() == {"error": {"message": error.message, "type": "invalid_request_error",
                                      "param": "temperature", "code": "invalid_value"}}
    response = error.response()
    assert response.status_code == 400
    assert json.loads(bytes(response.body)) == error.body()


def test_a_401_asks_for_a_bearer_token() -> None:
    assert APIError(401, "no key").headers == {"WWW-Authenticate": "Bearer"}
    assert APIError(400, "bad").headers == {}


# --- field checks --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("field", "value"), [
    ("temperature", -0.1), ("temperature", 2.5), ("top_p", 0), ("top_p", 1.5), ("max_tokens", 0),
    ("max_completion_tokens", -1), ("n", 0), ("n", MAX_N + 1), ("seed", -1), ("seed", MAX_SEED + 1),
    ("presence_penalty", 2.5), ("frequency_penalty", -3), ("top_k", -1), ("min_p", 1.5),
    ("repetition_penalty", 0), ("timeout_s", 0), ("top_logprobs", 21), ("repeat_last_n", -2),
])
def test_impossible_parameters_name_the_field(field: str, value: Any) -> None:
    error = refused({"messages": USER, field: value})
    assert error.param == field and error.code == "invalid_value"
    assert error.message.startswith(f"Invalid value for '{field}': ")


@pytest.mark.parametrize(("field", "value"), [("temperature", "0.5"), ("max_tokens", 1.5), ("stream", "yes"),
                                              ("n", True)])
def test_types_are_strict(field: str, value: Any) -> None:
    assert refused({"messages": USER, field: value}).param == field


def test_messages_are_required_and_not_empty() -> None:
    missing = refused({"model": "x"})
    assert (missing.param, missing.code) == ("messages", "missing_parameter")
    assert missing.message == "Missing required parameter 'messages'."
    assert refused({"messages": []}).param == "messages"


def test_a_message_role_must_be_known() -> None:
    error = refused({"messages": [{"role": "robot", "content": "beep"}]})
    assert error.param == "messages.0.role"


@pytest.mark.parametrize("key", ["best_friend", "logprob"])
def test_unknown_fields_are_refused_by_name(key: str) -> None:
    error = refused({"messages": USER, key: 1})
    assert (error.param, error.code) == (key, "unsupported_parameter")
    assert error.message == f"Unsupported parameter '{key}': Hearth's server does not support it."


def test_unknown_fields_inside_a_message_are_refused_too() -> None:
    error = refused({"messages": [{"role": "user", "content": "Hi", "mood": "happy"}]})
    assert error.param == "messages.0.mood" and error.code == "unsupported_parameter"


def test_images_in_content_are_refused() -> None:
    image = {"type": "image_url", "image_url": {"url": "http://x/cat.png"}}
    error = refused({"messages": [{"role": "user", "content": [image]}]})
    assert error.param is not None and error.param.startswith("messages.0.content")


def test_bookkeeping_fields_are_accepted_and_ignored() -> None:
    body = chat(store=True, metadata={"team": "a"}, user="u1", service_tier="auto", reasoning_effort="low",
                prediction={"type": "content", "content": "x"}, parallel_tool_calls=False)
    assert body.sampling_params(None, 16) == chat().sampling_params(None, 16)


@pytest.mark.parametrize(("field", "value", "says"), [
    ("audio", {"voice": "alloy", "format": "mp3"}, "audio output is not supported"),
    ("modalities", ["text", "audio"], "audio output is not supported"),
    ("web_search_options", {"search_context_size": "low"}, "web search is not supported"),
])
def test_features_hearth_lacks_are_refused_only_when_asked_for(field: str, value: Any, says: str) -> None:
    error = refused({"messages": USER, field: value})
    assert error.param == field and says in error.message
    chat(audio=None, modalities=["text"], web_search_options=None)  # the neutral values pass


@pytest.mark.parametrize(("bias", "says"), [({"hello": 1}, "keys must be token ids"),
                                            ({"5": 101}, "biases must lie in [-100, 100]")])
def test_logit_bias_takes_token_ids_and_bounded_values(bias: dict[str, float], says: str) -> None:
    error = refused({"messages": USER, "logit_bias": bias})
    assert error.param == "logit_bias" and says in error.message


# --- to the engine's parameters ------------------------------------------------------------------------------

def test_defaults_become_the_engines_neutral_parameters() -> None:
    params = chat().sampling_params(None, 64)
    assert params == SamplingParams(max_tokens=64)
    assert chat().stream is False and chat().tool_list() == [] and chat().format_params() == {}


def test_given_fields_reach_the_engine() -> None:
    body = chat(temperature=0, top_p=0.5, top_k=4, min_p=0.1, seed=7, n=2, stop="END", logit_bias={"42": -100},
                presence_penalty=0.5, frequency_penalty=-0.5, repetition_penalty=1.2, ignore_eos=True,
                repeat_last_n=16)
    params = body.sampling_params(30, 64)
    assert params.repeat_last_n == 16 and chat(repeat_last_n=-1).sampling_params(None, 8).repeat_last_n == -1
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k, params.min_p) == (30, 0, 0.5, 4, 0.1)
    assert (params.seed, params.n, params.stop, params.logit_bias) == (7, 2, ["END"], {42: -100.0})
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (0.5, -0.5, 1.2)
    assert params.ignore_eos is True
    assert chat(stop=["a", "b"]).sampling_params(None, 8).stop == ["a", "b"]


def test_a_value_the_engine_refuses_is_a_value_error_naming_it() -> None:
    with pytest.raises(ValueError, match="stop must be a list of non-empty strings"):
        chat(stop=[""]).sampling_params(None, 8)


def test_messages_reach_the_chat_template_in_its_roles() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    body = chat(messages=[
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
        {"role": "function", "name": "f", "content": "43"},
    ])
    assert body.engine_messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "42", "tool_call_id": "call_1"},
        {"role": "tool", "content": "43", "tool_call_id": "f"},
    ]


# --- tools and response_format -------------------------------------------------------------------------------

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def test_tools_and_tool_choice() -> None:
    body = chat(tools=[WEATHER])
    assert body.tool_list() == [WEATHER]
    assert body.choice() == "auto"
    assert chat(tools=[WEATHER], tool_choice="required").choice() == "required"
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert chat(tools=[WEATHER], tool_choice=named).choice() == named


def test_the_deprecated_functions_become_tools() -> None:
    body = chat(functions=[WEATHER["function"]], function_call={"name": "get_weather"})
    assert body.tool_list() == [WEATHER]
    assert body.choice() == {"type": "function", "function": {"name": "get_weather"}}


def test_a_tool_choice_without_its_tool_is_a_400() -> None:
    with pytest.raises(APIError, match="no tools are given") as caught:
        chat(tool_choice="required").choice()
    assert caught.value.param == "tool_choice"
    other = {"type": "function", "function": {"name": "get_time"}}
    with pytest.raises(APIError, match="'get_time', which is not among the tools"):
        chat(tools=[WEATHER], tool_choice=other).choice()
    assert chat(tool_choice="none").choice() == "none"


@pytest.mark.parametrize("name", ["", "has space", "x" * 65])
def test_a_function_name_must_be_an_identifier(name: str) -> None:
    tool = {"type": "function", "function": {"name": name}}
    assert refused({"messages": USER, "tools": [tool]}).param == "tools.0.function.name"


def test_a_tool_must_be_a_function() -> None:
    assert refused({"messages": USER, "tools": [{"type": "retrieval"}]}).param is not None


def test_response_formats() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert chat(response_format={"type": "text"}).format_params() == {}
    assert chat(response_format={"type": "json_object"}).format_params() == {"response_format": "json"}
    fmt = {"type": "json_schema", "json_schema": {"name": "thing", "schema": schema, "strict": True}}
    assert chat(response_format=fmt).format_params() == {"json_schema": schema}
    params = chat(response_format=fmt).sampling_params(None, 8, **chat(response_format=fmt).format_params())
    assert params.json_schema == schema


def test_a_json_schema_format_needs_its_schema() -> None:
    with pytest.raises(APIError, match="needs json_schema.schema") as caught:
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}).format_params()
    assert caught.value.param == "response_format"
    assert refused({"messages": USER, "response_format": {"type": "yaml"}}).param == "response_format.type"


# --- completions ---------------------------------------------------------------------------------------------

def completion(**fields: Any) -> CompletionRequest:
    return parse_body(json.dumps(fields).encode(), CompletionRequest)


def test_a_completion_prompt_is_text_or_token_ids() -> None:
    assert completion(prompt="Once").engine_prompt() == "Once"
    assert completion(prompt=["Once"]).engine_prompt() == "Once"
    assert completion(prompt=[1, 2, 3]).engine_prompt() == [1, 2, 3]


@pytest.mark.parametrize("prompt", [[], ["a", "b"], [1, "a"], None])
def test_a_completion_prompt_of_another_shape_is_refused(prompt: Any) -> None:
    assert refused({"prompt": prompt}, CompletionRequest).param is not None


def test_completion_fields_hearth_lacks() -> None:
    assert "best_of > 1 is not supported" in refused({"prompt": "a", "best_of": 2}, CompletionRequest).message
    assert "suffix" in refused({"prompt": "a", "suffix": "end"}, CompletionRequest).message
    assert completion(prompt="a", best_of=1, suffix="").engine_prompt() == "a"
    assert refused({"prompt": "a", "logprobs": 6}, CompletionRequest).param == "logprobs"
    assert refused({"prompt": "a", "messages": USER}, CompletionRequest).code == "unsupported_parameter"
