"""Grammar-constrained decoding: every sample validates against its schema, on a tiny model and the default one."""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from engine.api import SamplingParams


class Colour(enum.StrEnum):
    RED = "red"
    GREEN = "green"
    BLUE = "blue"


class Point(BaseModel):
    model_config = ConfigDict(extra="forbid")  # additionalProperties: false, so documents end

    x: float = Field(ge=-100, le=100)
    y: int = Field(ge=-1000, le=1000)


class Shape(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=12)
    colour: Colour
    corners: list[Point] = Field(max_length=3)
    tags: list[Annotated[str, Field(max_length=8)]] = Field(max_length=2)
    closed: bool
    area: int | None = Field(ge=0, le=10**6)  # a real model may loop on a float's digits until max_tokens


SCHEMA = Shape.model_json_schema()


def _run_all(engine: Any, prompt: Any, params: list[SamplingParams]) -> list[Any]:
    handles = [engine.submit(prompt, p) for p in params]
    while engine.has_work():
        engine.step()
    return [h.result() for h in handles]


@pytest.fixture(scope="module")
def batch32_llm(tiny_model_dirs: dict[str, Path]) -> Any:
    """The tiny llama with room for 32 sequences, shared by the module (each test drains what it submits)."""
    from engine import LLM

    llm = LLM(str(tiny_model_dirs["llama"]), dtype="float32", start_loop=False, kv_cache_bytes=64 << 20,
              max_batch_size=32)
    yield llm
    llm.close()


def test_100_seeded_samples_on_a_tiny_model_all_validate(batch32_llm: Any) -> None:
    params = [SamplingParams(max_tokens=250, temperature=1.0, seed=seed, json_schema=SCHEMA) for seed in range(100)]
    outs = _run_all(batch32_llm.engine, [{"role": "user", "content": "A shape, as JSON."}], params)
    for out in outs:
        assert out.finish_reason == "stop", (out.finish_reason, out.text)
        Shape.model_validate_json(out.text)  # raises if the document does not validate
    assert len({o.text for o in outs}) > 50  # seeded samples differ: the grammar constrains, it does not dictate


def test_json_object_and_schema_on_the_default_model(default_llm: Any) -> None:
    prompt = [{"role": "user", "content": "Describe a triangle as JSON."}]
    params = [SamplingParams(max_tokens=300, temperature=0.7, seed=s, json_schema=SCHEMA) for s in range(3)]
    # greedy decoding of a 135M model loops on nested objects; a frequency penalty breaks the loop
    params.append(SamplingParams(max_tokens=300, temperature=0.0, frequency_penalty=1.0, response_format="json"))
    outs = _run_all(default_llm.engine, prompt, params)
    for out in outs[:3]:
        assert out.finish_reason == "stop", out.text
        Shape.model_validate_json(out.text)
    assert outs[3].finish_reason == "stop", outs[3].text
    assert isinstance(json.loads(outs[3].text), dict)


def test_a_schema_the_grammar_cannot_take_is_a_value_error(batch32_llm: Any) -> None:
    with pytest.raises(ValueError, match="json_schema"):
        batch32_llm.engine.submit("Hi", SamplingParams(json_schema={"type": "no-such-type"}))



def test_n_sequences_share_the_prompt_blocks(batch32_llm: Any) -> None:
    """``submit_n``: the first sequence computes the prompt, the others find its full blocks in the prefix cache."""
    engine = batch32_llm.engine
    prompt = list(range(100, 160))  # 60 tokens: three full blocks of 16
    handles = engine.submit_n(prompt, SamplingParams(max_tokens=4, temperature=1.0, seed=7, n=3))
    while engine.has_work():
        engine.step()
    outs = [h.result() for h in handles]
    assert [o.metrics.num_cached_tokens for o in outs[1:]] == [48, 48]
    assert all(len(o.token_ids) == 4 for o in outs)
