"""Which quantization to load a model at, from its config and the memory measured free on this machine.

Called as ``engine.system.hardware.recommend(model, hardware=None, context_length=None)``. Everything is estimated from
the config alone, before any weight is read, with the formulas of the model registry
(``engine.model.architectures``, plain data that this lower layer may read):

* weights = parameter count x bytes per parameter of the level (int4 adds its group scales);
* KV bytes per token = 2 x layers x KV heads x head dim x dtype size (K and V, every layer);
* the KV budget is one full-length context plus a working margin.

The highest precision that fits with a margin wins. On a CPU, bf16 is preferred when the CPU has native bf16
(avx512_bf16 or AMX) or torch has fbgemm's packed fp16 GEMM (bf16 weights converted exactly to fp16, fp32 math:
measured here 3-5x faster than both fp32 and bf16 ``F.linear`` at 1-64 rows, since plain bf16 GEMM runs row by row
without avx512_bf16). Without either, int8 through torch's packed kernel is the fast choice (int8 weight-only GEMV
moves 25-37 GB/s against fp32's ~17 GB/s), and fp32 is kept for models small enough that speed is not the issue.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.api import BYTES_PER_PARAM, Recommendation
from engine.model.architectures import count_parameters, kv_bytes_per_token, ties_embeddings

_GIB = 1 << 30  # the app shows every size in GiB
RUNTIME_OVERHEAD_BYTES = 600_000_000  # CPU: torch, tokenizer, activations, the app itself
GPU_OVERHEAD_BYTES = 400_000_000  # GPU: CUDA context and activation workspace
MARGIN = 0.95  # use at most 95 % of what is free
TIGHT = 0.75  # above 75 % of free memory counts as "tight"
SMALL_MODEL_PARAMS = 200_000_000  # below this, fp32 on a CPU is fast enough and loses nothing

# SmolLM2-135M-Instruct, for estimates before the default model is converted
_DEFAULT_CONFIG = {
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}


def _config_dict(model: Any) -> dict[str, Any]:
    if isinstance(model, dict):
        return model
    if hasattr(model, "to_dict"):
        return dict(model.to_dict())
    if isinstance(model, str) and model.strip().lower() == "default":
        from engine.loading.default_model import is_converted, target_dir

        folder = target_dir()
        return _read_config(folder) if is_converted() else dict(_DEFAULT_CONFIG)
    path = Path(model)
    if path.is_dir():
        return _read_config(path)
    if path.suffix == ".gguf":
        return _gguf_config(path)
    raise ValueError(f"model: {model!r} is not a config, a model folder, a .gguf file or 'default'")


def _gguf_config(path: Path) -> dict[str, Any]:
    """A config built from the GGUF header (layers, heads, context), so the KV cache can be estimated too."""
    from engine.loading.describe import gguf_config  # describe builds on this module: imported when needed
    from engine.loading.gguf_reader import read_gguf_header
    from engine.loading.validate import inspect_model

    inspect_model(path)  # a file the loader refuses raises ModelLoadError, as for folders
    metadata, tensors = read_gguf_header(path)
    return gguf_config(metadata, tensors)


def _read_config(folder: Path) -> dict[str, Any]:
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ValueError(f"model: {folder} has no config.json")
    data: dict[str, Any] = json.loads(config_file.read_text())
    return data.get("text_config", data) if "num_hidden_layers" not in data else data


def _weights_bytes(num_params: int, level: str, cfg: dict[str, Any]) -> int:
    """int8/int4 leave the embedding and lm_head in 16-bit."""
    if level in ("int8", "int4") and "vocab_size" in cfg:
        embed = int(cfg["vocab_size"]) * int(cfg["hidden_size"]) * (1 if ties_embeddings(cfg) else 2)
        return int(embed * 2 + (num_params - embed) * BYTES_PER_PARAM[level])
    return int(num_params * BYTES_PER_PARAM[level])


def _candidates(device: str, hardware: Any, num_params: int) -> list[str]:
    """Levels to try, best first."""
    if device == "cuda":
        gpu = max(hardware.gpus, key=lambda g: g.free_bytes)
        major = compute_capability_major(gpu.compute_capability)
        return ["bf16" if major >= 8 else "fp16", "int8", "int4"]
    if hardware.avx512_bf16 or hardware.amx or _packed_fp16():
        # bf16 weights run at 2 bytes per weight with fp32 math (native bf16, or fbgemm's packed fp16 GEMM)
        return ["bf16", "int8", "int4"]
    if num_params < SMALL_MODEL_PARAMS:
        return ["fp32", "int8", "int4"]
    return ["int8", "int4"]


def compute_capability_major(capability: tuple[int, int] | str | None) -> int:
    """The major CUDA compute capability from what detection reports: a ``(major, minor)`` tuple (pynvml and
    torch), or a "major.minor" string (older callers). None means unknown and counts as 8 (Ampere)."""
    if capability is None:
        return 8
    if isinstance(capability, tuple):
        return int(capability[0])
    return int(str(capability).split(".")[0])


def _packed_fp16() -> bool:
    from engine.system.hardware import fbgemm_fp16_available

    return fbgemm_fp16_available()


@dataclass(slots=True)
class _Budget:
    info: Any
    cfg: dict[str, Any]
    num_params: int
    context: int
    per_token: int
    kv_budget: int
    target: str
    free: int
    where: str
    overhead: int

    @property
    def cache_words(self) -> str:
        """The cache in words: "a 4096-token KV cache", with " for 4 chats" when the pool holds several."""
        chats = self.kv_budget // max(self.per_token * self.context, 1)
        return f"a {self.context}-token KV cache" + (f" for {chats} chats" if chats > 1 else "")

    @property
    def usable(self) -> float:
        return self.free * MARGIN - self.overhead

    def fits(self, weights: int) -> str:
        need = weights + self.kv_budget
        if need > self.usable:
            return "no"
        return "tight" if need > self.free * TIGHT - self.overhead else "yes"


def _budget(model: Any, hardware: Any, context_length: int | None, device: str, num_chats: int = 1) -> _Budget:
    from engine.system import hardware as hw

    info = hardware if hardware is not None else hw.detect()
    cfg = _config_dict(model)
    num_params = count_parameters(cfg)
    model_len = int(cfg.get("max_position_embeddings") or 4096)
    context = min(int(context_length or 4096), model_len)  # the engine clamps the context to the model's own
    per_token = kv_bytes_per_token(cfg)
    use_gpu = device in ("auto", "cuda") and bool(info.gpus) and (info.torch_cuda_available or hardware is not None)
    if use_gpu:
        free = max(g.free_bytes for g in info.gpus)
        where = f"the GPU's {free / _GIB:.1f} GiB free"
    else:
        free = int(info.ram_available_bytes)
        where = f"{free / _GIB:.1f} GiB of free RAM"
    overhead = GPU_OVERHEAD_BYTES if use_gpu else RUNTIME_OVERHEAD_BYTES
    return _Budget(info, cfg, num_params, context, per_token, per_token * context * max(num_chats, 1),
                   "cuda" if use_gpu else "cpu", free, where, overhead)


def estimate(
    model: Any, level: str, hardware: Any = None, context_length: int | None = None, device: str = "auto",
    num_chats: int = 1,
) -> Recommendation:
    """The numbers for loading ``model`` at one given ``level`` ("fp32", "bf16", "fp16", "int8", "int4"), with the
    same estimates as :func:`recommend`; ``fits`` says whether that level fits, ``reason`` in one sentence.
    "auto" gives :func:`recommend`'s answer."""
    from engine.api import check_level

    level = check_level(level)
    if level == "auto":
        return recommend(model, hardware, context_length, device, num_chats)
    b = _budget(model, hardware, context_length, device, num_chats)
    weights = _weights_bytes(b.num_params, level, b.cfg)
    fits = b.fits(weights)
    name = level
    need = weights + b.kv_budget
    if fits == "no":
        why = (f"{name} needs {need / _GIB:.1f} GiB (weights {weights / _GIB:.1f} GiB + {b.cache_words} "
               f"{b.kv_budget / _GIB:.2f} GiB) but only {b.where}; it will not fit.")
    else:
        why = (f"{name} weights ({weights / _GIB:.1f} GiB) plus {b.cache_words} "
               f"({b.kv_budget / _GIB:.2f} GiB) fit in {b.where}.")
    return Recommendation(b.target, level, fits, weights, b.per_token, b.kv_budget, b.free, why, b.num_params,
                          b.context)


def recommend(
    model: Any, hardware: Any = None, context_length: int | None = None, device: str = "auto",
    num_chats: int = 1,
) -> Recommendation:
    """Recommend a device and quantization level for ``model`` (a path, "default", a config or a dict).

    The KV cache is sized as the engine sizes it: ``context_length`` tokens for each of ``num_chats`` concurrent
    chats (the engine's ``max_batch_size``)."""
    b = _budget(model, hardware, context_length, device, num_chats)
    info, cfg, num_params, context = b.info, b.cfg, b.num_params, b.context
    per_token, kv_budget, target, free, where = b.per_token, b.kv_budget, b.target, b.free, b.where
    overhead, usable = b.overhead, b.usable
    order = _candidates(target, info, num_params)
    for level in order:
        weights = _weights_bytes(num_params, level, cfg)
        need = weights + kv_budget
        if need <= usable:
            fits = "tight" if need > free * TIGHT - overhead else "yes"
            name = level
            why = (
                f"{name} weights ({weights / _GIB:.1f} GiB) plus {b.cache_words} ({kv_budget / _GIB:.2f} GiB) "
                f"fit in {where}"
            )
            if level != order[0]:
                first = order[0]
                why += f"; {first} would need {_weights_bytes(num_params, order[0], cfg) / _GIB:.1f} GiB"
            elif target == "cpu" and level == "fp32":
                why += "; the model is small, so full precision costs little speed"
            return Recommendation(
                target, level, fits, weights, per_token, kv_budget, free, why + ".", num_params, context
            )
    smallest = order[-1]
    weights = _weights_bytes(num_params, smallest, cfg)
    return Recommendation(
        target,
        smallest,
        "no",
        weights,
        per_token,
        kv_budget,
        free,
        f"Even at {smallest} the model needs {(weights + kv_budget) / _GIB:.1f} GiB "
        f"(weights {weights / _GIB:.1f} GiB + KV cache {kv_budget / _GIB:.2f} GiB) but only {where}; "
        "close other programs, shorten the context, or choose a smaller model.",
        num_params,
        context,
    )
