"""Whether a file on the hub will run on this machine, before it is downloaded.

The need is the weights (the bytes to download: the engine runs a GGUF's own blocks, and loads a safetensors
folder at its stored precision or smaller) plus the KV cache at the chosen context, priced by the registry's
formula (:func:`engine.architectures.kv_bytes_per_token`, fp32 on a CPU as the engine's pool is), plus the
runtime's overhead, against the memory available now (psutil). The margin and overhead are the engine's own
(:mod:`engine.loading.recommend`), so the label agrees with what the Models list says after the download.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Final, Literal

import psutil

from engine.architectures import kv_bytes_per_token
from engine.loading.recommend import MARGIN, RUNTIME_OVERHEAD_BYTES

__all__ = ["FITS", "MIN_CONTEXT", "SHORTER", "TOO_LARGE", "Fit", "available_memory", "judge_fit", "kv_per_token"]

FITS: Final = "fits"
SHORTER: Final = "fits with a shorter context"
TOO_LARGE: Final = "too large for this machine"
FitLabel = Literal["fits", "fits with a shorter context", "too large for this machine"]
#: Below this many tokens of context a chat is not worth having; a model that fits only below it is too large.
MIN_CONTEXT = 512
_GIB = 1 << 30


@dataclass(slots=True, frozen=True)
class Fit:
    """A fit verdict: the label, the context it holds (0 when too large), the bytes needed and why."""

    label: FitLabel
    context: int
    need_bytes: int
    available_bytes: int
    reason: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def available_memory() -> int:
    """Memory available to a new process now, in bytes."""
    return int(psutil.virtual_memory().available)


def kv_per_token(config: dict[str, Any] | None) -> int:
    """KV bytes per token of context on a CPU (fp32 pool); 0 when the config does not say (no layers)."""
    if not config:
        return 0
    try:
        return kv_bytes_per_token(config, 4)
    except (TypeError, ValueError, KeyError, ZeroDivisionError):
        return 0


def judge_fit(weights_bytes: int, per_token: int, context: int, available_bytes: int) -> Fit:
    """The label for ``weights_bytes`` of weights and ``context`` tokens at ``per_token`` KV bytes each.

    "fits" when everything fits at ``context``; "fits with a shorter context" when it fits at some context of
    at least :data:`MIN_CONTEXT` tokens (the largest such, a multiple of 256, is given); otherwise "too large".
    With ``per_token`` 0 (no config to price the cache) the weights alone decide, and the reason says so.
    """
    usable = int(available_bytes * MARGIN) - RUNTIME_OVERHEAD_BYTES
    free = f"{available_bytes / _GIB:.1f} GiB available now"
    weights = f"{weights_bytes / _GIB:.2f} GiB of weights"
    if per_token <= 0:
        need = weights_bytes + RUNTIME_OVERHEAD_BYTES
        if weights_bytes <= usable:
            return Fit(FITS, context, need, available_bytes,
                       f"{weights} fit in {free} (the KV cache could not be priced: the repository has no config).")
        return Fit(TOO_LARGE, 0, need, available_bytes, f"{weights} do not fit in {free}.")
    need = weights_bytes + per_token * context + RUNTIME_OVERHEAD_BYTES
    kv = f"a {context}-token KV cache ({per_token * context / _GIB:.2f} GiB)"
    if weights_bytes + per_token * context <= usable:
        return Fit(FITS, context, need, available_bytes, f"{weights} plus {kv} fit in {free}.")
    longest = (usable - weights_bytes) // per_token // 256 * 256 if usable > weights_bytes else 0
    if longest >= MIN_CONTEXT:
        return Fit(SHORTER, int(longest), need, available_bytes,
                   f"{weights} plus {kv} need {need / _GIB:.2f} GiB but only {free}; it fits with {longest} tokens.")
    return Fit(TOO_LARGE, 0, need, available_bytes,
               f"{weights} plus even a {MIN_CONTEXT}-token KV cache do not fit in {free}.")
