"""Hearth's inference engine: paged KV cache, continuous batching, streaming. No Qt in here.

Public API::

    from engine import LLM, SamplingParams
    llm = LLM("default")
    outs = llm.generate(["Hello"], SamplingParams(max_tokens=32, temperature=0.0))
"""

from engine.config import EngineConfig
from engine.errors import CapacityError, ModelLoadError
from engine.llm import LLM
from engine.llm_engine import LLMEngine, RequestHandle, RequestOutput, StepOutput
from engine.sampling_params import SamplingParams

__all__ = [
    "LLM",
    "CapacityError",
    "EngineConfig",
    "LLMEngine",
    "ModelLoadError",
    "RequestHandle",
    "RequestOutput",
    "SamplingParams",
    "StepOutput",
]
