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
    from engine.api import (
        CapacityError,
        EngineConfig,
        ModelLoadError,
        RequestOutput,
        SamplingParams,
        StepOutput,
    )
    from engine.core.llm import LLM
    from engine.core.llm_engine import LLMEngine
    from engine.core.request import RequestHandle

_EXPORTS = {
    "LLM": "engine.core.llm",
    "CapacityError": "engine.api",
    "ModelLoadError": "engine.api",
    "EngineConfig": "engine.api",
    "LLMEngine": "engine.core.llm_engine",
    "RequestHandle": "engine.core.request",
    "RequestOutput": "engine.api",
    "StepOutput": "engine.api",
    "SamplingParams": "engine.api",
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
