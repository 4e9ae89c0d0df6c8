"""What a model's weights take in memory once loaded at a level, from its config alone: the loader's rules as
formulas, so that the figure shown before a load is the one the load reports (``LLM.weights_bytes``).

* Every parameter the level keeps as it is (the embedding, norms, an untied LM head; every weight at fp32, bf16 or
  fp16) is held in the level's dtype (:data:`engine.api.LEVEL_DTYPES`: bf16 at int8 and int4).
* int8 and int4 replace the decoder layers' linear weights with the kernels of ``engine/model/quantization.py``.
  On a CPU: int8 holds a byte per weight and an fp32 scale per row (``Int8Linear``); int4 half a byte and an fp32
  scale and zero per group of 32 weights (``Int4Linear``), so 0.75 bytes a weight; an input width that is not a
  multiple of 32, or a GGUF file's Q8_0 tensors, stay int8 (``engine/model/kernels.py``). On a GPU bitsandbytes
  holds them (``BnbLinear``: LLM.int8's byte per weight and fp32 row scale; NF4's half byte, a byte per 64 and
  its double-quantized statistics).
* The fused decoder on a CPU may hold a second kernel beside a weight (``engine/model/kernels.py``): at int8 and
  int4 the LM head's int8 copy, its first choice before any plan is measured (a measured plan may run the dense
  embedding instead, for free); at bf16 and fp16 the fbgemm packed fp16 copies that measured plans run beside the
  dense weights. Which kernels run is the plans' choice: :data:`KernelPlans` looks them up where they are cached
  (``engine.model.kernel_plans.cached_plans``); without it every shape counts its first choice, as a first load
  runs it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from engine.api import LEVEL_DTYPES
from engine.architectures import attention_shape, count_parameters, execution_path

#: ``plans(level, role, (out, in))``: the kernels a fused layer of that role and shape runs on this CPU, by the
#: names ``engine/model/kernels.py`` gives them ("dense", "fp16_packed", "int8", "int4_vnni", ...).
KernelPlans = Callable[[str, str, tuple[int, int]], Sequence[str]]

#: The fused decoder's linear weights in each layer, by role, and the HF projections fused into each.
DECODER_ROLES: dict[str, tuple[str, ...]] = {
    "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "o": ("self_attn.o_proj",),
    "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "down": ("mlp.down_proj",),
}
INT4_GROUP = 32  # engine/model/quantization.py: INT4_GROUP_SIZE
_FP32 = 4
#: kernels that read another one's bytes and hold none of their own (their ``base``)
_BASE = {"int4_vnni": "int4", "int8_vnni": "int8", "int8_gemv": "int8"}


def _get(cfg: Any, name: str, default: Any = None) -> Any:
    value = cfg.get(name) if isinstance(cfg, Mapping) else getattr(cfg, name, None)
    return default if value is None else value


def linear_shapes(cfg: Any) -> dict[str, tuple[int, int]]:
    """Each fused role's weight as ``(out, in)``: the four of a decoder layer and the LM head."""
    hidden = int(_get(cfg, "hidden_size"))
    heads, kv_heads, head_dim = attention_shape(cfg)
    inter = int(_get(cfg, "intermediate_size", 4 * hidden))
    return {
        "qkv": ((heads + 2 * kv_heads) * head_dim, hidden),
        "o": (hidden, heads * head_dim),
        "gate_up": (2 * inter, hidden),
        "down": (hidden, inter),
        "lm_head": (int(_get(cfg, "vocab_size")), hidden),
    }


def kernel_bytes(name: str, out: int, inp: int) -> int:
    """Bytes one kernel of ``engine/model/quantization.py`` holds for an ``out`` x ``inp`` weight (no bias)."""
    weights = out * inp
    name = _BASE.get(name, name)
    if name in ("int8", "int8_nibbles", "bnb_int8"):  # int8 bytes (or their two nibble halves), fp32 row scales
        return weights + _FP32 * out
    if name == "int4":  # half a byte a weight, an fp32 scale and zero per group
        return weights // 2 + 2 * _FP32 * (weights // INT4_GROUP)
    if name == "fp16_packed":  # fp16 weights, an fp32 bias (zeros when the layer has none)
        return 2 * weights + _FP32 * out
    if name == "bnb_nf4":  # 4-bit codes, a uint8 absmax per 64 weights, fp32 statistics of those per 256
        return weights // 2 + weights // 64 + _FP32 * (-(-weights // (64 * 256))) + _FP32 * (16 + 256)
    if name == "dense":
        return 0  # a view of the weight the model holds anyway
    raise ValueError(f"no size rule for the kernel {name!r}")


def _decoder_kernel(level: str, target: str, inp: int, kinds: Sequence[str]) -> str:
    """The kernel one decoder weight becomes at int8/int4 (``kinds``: the GGUF block types it is read from)."""
    if target == "cuda":
        return "bnb_int8" if level == "int8" else "bnb_nf4"
    if level == "int8" or inp % INT4_GROUP or (kinds and all(k == "Q8_0" for k in kinds)):
        return "int8"
    return "int4"


def first_choice(level: str) -> list[str]:
    """The kernels a fused shape runs before any plan is measured, as far as memory goes: the level's own (the
    LM head's int8 copy at int8/int4; dense weights at the other levels)."""
    return ["int8"] if level in ("int8", "int4") else ["dense"]


def weights_bytes(
    cfg: Any, level: str, target: str = "cpu", plans: KernelPlans | None = None,
    gguf_kinds: Mapping[str, str] | None = None,
) -> int:
    """Bytes of weights a load of ``cfg`` at ``level`` ("fp32", "bf16", "fp16", "int8" or "int4") holds.

    Args:
        cfg: The model's config (a dict from ``config.json`` or a GGUF header).
        level: The quantization level.
        target: "cpu" or "cuda".
        plans: The kernels each fused shape runs (:data:`KernelPlans`); None counts each shape's first choice.
        gguf_kinds: The GGUF block type of each HF weight, when the weights come from a GGUF file (its Q8_0
            tensors stay int8 at int4).
    """
    itemsize = 4 if LEVEL_DTYPES[level] == "float32" else 2
    total = count_parameters(cfg) * itemsize
    shapes = linear_shapes(cfg)
    layers = int(_get(cfg, "num_hidden_layers"))
    quantized = level in ("int8", "int4")
    if quantized:
        for layer in range(layers):
            for role, projections in DECODER_ROLES.items():
                out, inp = shapes[role]
                names = [f"model.layers.{layer}.{p}.weight" for p in projections]
                kinds = [gguf_kinds[n] for n in names if n in gguf_kinds] if gguf_kinds else []
                total += kernel_bytes(_decoder_kernel(level, target, inp, kinds), out, inp) - out * inp * itemsize
    if target != "cpu" or execution_path(cfg) != "fused":
        return total  # only the fused decoder on a CPU holds second kernels
    for role, (out, inp) in shapes.items():
        if quantized and role != "lm_head":
            continue  # a quantized layer's candidates all read the level's one copy, counted above
        runs = first_choice(level) if plans is None else plans(level, role, (out, inp))
        extra = sum(kernel_bytes(name, out, inp) for name in {_BASE.get(name, name) for name in runs})
        total += extra * (1 if role == "lm_head" else layers)  # "dense" is the weight itself: nothing more
    return total
