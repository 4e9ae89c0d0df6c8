"""Hearth's inference engine: paged KV cache, continuous batching, streaming. No Qt in here.

Public API::

    from engine import LLM, SamplingParams
    llm = LLM("default")
    outs = llm.generate(["Hello"], SamplingParams(max_tokens=32, temperature=0.0))

Names are imported lazily, so tools such as ``python -m engine.default_model`` don't pay for torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.errors import CapacityError, ModelLoadError
    from engine.llm import LLM
    from engine.llm_engine import LLMEngine, RequestHandle, RequestOutput, StepOutput
    from engine.sampling_params import SamplingParams

_EXPORTS = {
    "LLM": "engine.llm",
    "CapacityError": "engine.errors",
    "ModelLoadError": "engine.errors",
    "EngineConfig": "engine.config",
    "LLMEngine": "engine.llm_engine",
    "RequestHandle": "engine.llm_engine",
    "RequestOutput": "engine.llm_engine",
    "StepOutput": "engine.llm_engine",
    "SamplingParams": "engine.sampling_params",
}

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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
