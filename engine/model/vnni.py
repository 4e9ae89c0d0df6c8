"""Whether the native extension's AVX512-VNNI kernels may serve here (``engine/model/csrc/vnni.cpp``).

``Int4VnniLinear`` and ``Int8VnniLinear`` (``engine/model/quantization.py``) read torch's own int4 and int8 bytes
with int8-plane activations. They are offered to the tuner (``engine/model/kernels.py``) only where the extension
is loaded, was built for a CPU with AVX512-VNNI and VBMI, and reads torch's layouts as torch lays them out: a probe
matmul of each against torch's own kernel, once per process.
"""

from __future__ import annotations

import logging

import torch

from engine.model.native import EXTENSION, native_problem

log = logging.getLogger("engine")

_UNCHECKED = "unchecked"
_vnni_verdict: str | None = _UNCHECKED
#: the VNNI kernels must agree with torch's kernels on a probe this closely (their activation planes differ by
#: about 1/32000; a different packed layout gives noise, ~100 %)
VNNI_MAX_REL_ERROR = 0.01


def vnni_problem() -> str | None:
    """Why the extension's AVX512-VNNI kernels (``Int4VnniLinear``, ``Int8VnniLinear``) cannot serve here, or None.

    They need the extension loaded (this starts loading or building it), a build for a CPU with AVX512-VNNI and
    VBMI, and torch's packed layouts as they read them: a probe matmul of each must agree with torch's own kernel.
    The verdict is kept for the process, except "being built": a later load asks again.
    """
    global _vnni_verdict
    if _vnni_verdict != _UNCHECKED:
        return _vnni_verdict
    problem = native_problem(torch.device("cpu"), torch.float32) or EXTENSION.start(wait=False)
    if problem == "building":
        return "the native extension is being built (torch's kernels serve until the next load)"
    if problem is None:
        problem = _probe_vnni()
    _vnni_verdict = problem
    if problem is not None:
        log.info("VNNI kernels not offered: %s", problem)
    return problem


def _probe_vnni() -> str | None:
    from engine.model.quantization import Int4Linear, Int4VnniLinear, Int8Linear, Int8VnniLinear

    if not torch.ops.hearth.vnni_available():
        return "this CPU has no AVX512-VNNI and VBMI (or the extension was built without them)"
    gen = torch.Generator().manual_seed(0)
    weight, x = torch.randn(128, 96, generator=gen), torch.randn(3, 96, generator=gen)
    int4, int8 = Int4Linear.quantize(weight), Int8Linear.quantize(weight)
    kernels = (("int4", int4, Int4VnniLinear(int4)), ("int8", int8, Int8VnniLinear(int8)),
               ("int8", int8, Int8VnniLinear(int8, gemv=True)))
    for name, base, kernel in kernels:
        try:
            ref, y = base(x), kernel(x)
        except Exception as exc:  # noqa: BLE001 -- any failure disqualifies the kernels the same way
            return f"the {name} VNNI kernel failed a probe matmul ({type(exc).__name__}: {exc})"
        err = float((y - ref).norm() / ref.norm())
        if not err < VNNI_MAX_REL_ERROR:
            return (
                f"the {name} VNNI kernel disagrees with torch's {name} kernel (relative error {err:.2f}): "
                "torch lays the weights out differently"
            )
    return None
