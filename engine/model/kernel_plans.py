"""The kernels each fused shape of a model will run on this CPU, looked up before the model loads: what
:mod:`engine.loading.footprint` counts a load's second kernels by (the packed fp16 copies at bf16 and fp16, the LM
head's int8 copy at int8 and int4).

The candidates are :class:`~engine.model.kernels.KernelBuilder`'s own, and the plan is the one the
:class:`~engine.model.autotune.Tuner` of a load reads from the plan cache for them; where none is cached (or a load
will measure it again) the shape runs its first choice, as a load's untimed plan does.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from engine.api import LEVEL_DTYPES, WEIGHT_LEVELS
from engine.loading.footprint import KernelPlans
from engine.loading.native import stand_in
from engine.model.autotune import Tuner
from engine.model.kernels import KernelBuilder
from engine.model.plan_cache import PlanCache
from engine.model.runner import AUTOTUNE_ENV


def candidates(level: str, role: str, shape: tuple[int, int], native: str = "auto") -> tuple[list[str], str]:
    """The kernels a load at ``level`` offers the tuner for a fused weight of ``role`` and ``(out, in)`` ``shape``
    on this CPU, and the one it runs unmeasured."""
    dtype = getattr(torch, LEVEL_DTYPES[level])
    weight_level = level if level in WEIGHT_LEVELS else None
    builder = KernelBuilder(weight_level, dtype, torch.device("cpu"), "auto", None, None, native)
    if not builder.tunable:
        return ["dense"], "dense"
    builds, preferred, _free = builder._candidates(role, [], stand_in(shape, dtype), None)
    return sorted(builds), preferred


def cached_plans(deterministic: bool = False, native: str = "auto") -> KernelPlans:
    """``plans(level, role, (out, in))`` for the fused decoder on this CPU, from the plan cache as it is now.

    Args:
        deterministic: The load runs in deterministic mode (row-invariant plans, cached under their own keys).
        native: ``EngineConfig.native`` ("off" offers no VNNI kernels).
    """
    cache = PlanCache()
    timed = os.environ.get(AUTOTUNE_ENV, "").strip().lower() not in ("0", "off", "no", "false")

    def plans(level: str, role: str, shape: tuple[int, int]) -> Sequence[str]:
        names, preferred = candidates(level, role, shape, native)
        if (len(names) == 1 and not deterministic) or not timed:
            return [preferred]
        dtype = getattr(torch, LEVEL_DTYPES[level])
        plan = Tuner(dtype, cache, 0, 1, deterministic=deterministic).cached(role, shape, names)
        return [preferred] if plan is None else plan.used

    return plans
