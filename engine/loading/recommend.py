"""Which quantization to load a model at, from its config and the memory measured free on this machine.

Called as ``engine.system.hardware.recommend(model, hardware=None, context_length=None)``; ``model`` is a model
folder, a GGUF file (by its ``.gguf`` name or its magic bytes: Ollama's blobs have no extension), "default" or a
config. Everything is estimated from the config (and a GGUF's header)
alone, before any weight is read, with the formulas of the model registry (``engine.architectures``):

* weights: the loader's rules (:mod:`engine.loading.footprint`): the level's dtype for what stays dense, the
  int8/int4 kernels' own bytes with their scales, and the second kernels the fused decoder holds on a CPU (the LM
  head's int8 copy, the packed fp16 copies of measured plans; ``plans`` says which run);
* KV bytes per token = 2 x layers x KV heads x head dim x dtype size (K and V, every layer; fp32 on a CPU);
* the KV pool is sized as the engine sizes it: whole blocks of a full-length context for each chat, plus the
  null block.

The highest precision that fits with a margin wins. On a CPU, bf16 is preferred when the CPU has native bf16
(avx512_bf16 or AMX) or torch has fbgemm's packed fp16 GEMM (bf16 weights converted exactly to fp16, fp32 math:
faster than both fp32 and bf16 ``F.linear``, since plain bf16 GEMM runs row by row without avx512_bf16 and fp32
reads twice the bytes). Without either, int8 through torch's packed kernel is the fast choice: decode reads every
weight byte once per token, so fewer bytes win, and torch's int8 GEMV streams its weights faster than an fp32 GEMV
does (docs/BENCHMARKS.md). fp32 is kept for models small enough that speed is not the issue.

One exception on a CPU: decoder weights that come from a GGUF file whose linear tensors are all blocks one level's
kernel runs as they are (Q4_0/Q4_1/Q4_K for int4, Q8_0 for int8: :mod:`engine.loading.formats`), given as the GGUF
file's path or as a folder converted from one (the default model's folder, whose marker records its source:
:func:`gguf_source`). bf16 would only hold the file's 4-bit values dequantized, while int4 runs those very values
through torch's int4 packed kernel (``engine/loading/gguf_weights.py``; the converted folder's bf16 copy requantizes
to the same 4-bit codes) at about a third of bf16's bytes per weight, so int4 (int8 for Q8_0) comes first and the
reason says why. On the default model (Q4_1) int4's perplexity is within 1 % of bf16's
(``tests/engine/model/test_quantization.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.api import BYTES_PER_PARAM, EngineConfig, Recommendation
from engine.architectures import GgufLayout, count_parameters, execution_path, gguf_layout, kv_bytes_per_token
from engine.loading import footprint
from engine.loading.footprint import KernelPlans
from engine.loading.formats import FLOAT_TYPES, KERNEL_TYPES, file_level
from engine.loading.gguf_reader import gguf_config, is_gguf_file, read_gguf_header

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
    if path.suffix.lower() == ".gguf" or is_gguf_file(path):
        return _gguf_config(path)
    raise ValueError(f"model: {model!r} is not a config, a model folder, a GGUF file or 'default'")


def _is_gguf(path: Path) -> bool:
    """Whether ``path`` is a GGUF file: by its ``.gguf`` name, or by its magic bytes (Ollama's blobs)."""
    return path.is_file() and (path.suffix.lower() == ".gguf" or is_gguf_file(path))


def _gguf_config(path: Path) -> dict[str, Any]:
    """A config built from the GGUF header (layers, heads, context), so the KV cache can be estimated too."""
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


@dataclass(slots=True)
class FileBlocks:
    """The quantized blocks a model's decoder weights come from, when one CPU level runs them as they are."""

    level: str  # "int4", "int8" or "file"
    kinds: str  # the block types, e.g. "Q4_1"
    file: str  # the GGUF file's name
    nbytes: int = 0  # the file's tensor bytes: what the "file" level holds

    @property
    def words(self) -> str:
        """Why this level, in a clause for the recommendation's reason."""
        if self.level == "file":
            return (f"the weights stay the {self.kinds} blocks of {self.file}, multiplied as they are (int4 or int8 "
                    "would requantize them, bf16 would hold them at two bytes per weight)")
        if self.level == "int4":
            return (f"the decoder's linear weights are {self.kinds} blocks in {self.file}, and int4 runs those "
                    "same 4-bit values, reading about a third of bf16's bytes per weight (bf16 would only hold them "
                    "dequantized)")
        return (f"the decoder's linear weights are {self.kinds} blocks in {self.file}, and int8 runs them at one "
                "byte per weight (bf16 would only hold them dequantized, at two bytes)")


def gguf_source(model: Any) -> Path | None:
    """The GGUF file ``model``'s decoder weights come from: the GGUF file itself (whatever its name), or the file a
    converted folder (the default model's, whose marker records its source) was made from; None for other models
    and for configs."""
    from engine.api import ModelLoadError
    from engine.loading import default_model

    if isinstance(model, str) and model.strip().lower() == "default":
        bundled = default_model.bundled_gguf()
        if bundled is not None:
            return bundled
    elif isinstance(model, str | Path):
        path = Path(model).expanduser()
        if _is_gguf(path):
            return path
        if not path.is_dir() or not default_model.is_converted(path):
            return None
        marker = json.loads((path / default_model.MARKER_FILENAME).read_text(encoding="utf-8"))
        shipped = marker.get("gguf")
        if isinstance(shipped, str) and (path / shipped).is_file():
            return path / shipped  # the bundle's layout: the GGUF beside its converted config
    else:
        return None
    try:
        return default_model.source_gguf_path()
    except ModelLoadError:  # the package is not installed: the blocks cannot be read
        return None


def file_blocks(
    model: Any, cfg: dict[str, Any], block_kernels: bool = True, only_file: bool = False
) -> FileBlocks | None:
    """The level that runs ``model``'s GGUF blocks as they are, or None when none does, or the file's layout (the
    registry's GGUF layouts) or the model's architecture is not one the fused decoder reads blocks for.

    * "file": ``model`` is a GGUF file whose linear tensors are all types the block kernels run
      (:data:`engine.loading.formats.KERNEL_TYPES`, or floats), and ``block_kernels`` says those kernels can run
      here. Chosen where no one packed level runs every block exactly (a Q4_K_M file's Q6_K tensors) or the model
      is large enough that the packed levels' load (every weight dequantized first) costs more than they save.
      ``only_file`` asks only whether "file" can run the model (whatever its size): None when it cannot.
    * "int4"/"int8": the one packed level whose kernel runs every linear tensor's block type
      (:func:`engine.loading.formats.file_level`).
    """
    table = _gguf_table(model) if execution_path(cfg) == "fused" else None
    if table is None:
        return None
    gguf, layout, tensors = table
    kinds = sorted({kind for name, _count, kind, _nbytes in tensors if layout.is_linear(name)})
    nbytes = sum(size for _name, _count, _kind, size in tensors)
    levels = {file_level(kind) for kind in kinds}
    exact = levels.pop() if len(levels) == 1 and None not in levels else None
    loads_the_file = block_kernels and isinstance(model, (str, Path)) and _is_gguf(Path(model))
    in_file = loads_the_file and any(k in KERNEL_TYPES for k in kinds) and all(
        k in KERNEL_TYPES or k in FLOAT_TYPES for k in kinds
    )
    if in_file and (exact is None or _large(cfg) or only_file):
        return FileBlocks("file", " and ".join(kinds), gguf.name, nbytes)
    return None if exact is None or only_file else FileBlocks(str(exact), " and ".join(kinds), gguf.name, nbytes)


def _gguf_table(model: Any) -> tuple[Path, GgufLayout, list[tuple[str, int, str, int]]] | None:
    """The GGUF file ``model``'s weights are read from, its architecture's layout and its tensor table; None when
    there is no such file, it cannot be read, or the registry has no layout for it."""
    from engine.api import ModelLoadError

    gguf = gguf_source(model)
    if gguf is None:
        return None
    try:
        metadata, tensors = read_gguf_header(gguf)
    except (ModelLoadError, OSError, ValueError):
        return None
    layout = gguf_layout(str(metadata.get("general.architecture", "")))
    return None if layout is None else (gguf, layout, tensors)


def _large(cfg: dict[str, Any]) -> bool:
    try:
        return count_parameters(cfg) >= SMALL_MODEL_PARAMS
    except (KeyError, TypeError, ValueError):
        return False


def gguf_kinds(model: Any) -> dict[str, str] | None:
    """The GGUF block type of each HF weight ``model``'s weights are read from (:func:`gguf_source`); None when
    they come from no GGUF file the engine reads itself."""
    table = _gguf_table(model)
    if table is None:
        return None
    _gguf, layout, tensors = table
    names = ((layout.hf_name(name), kind) for name, _count, kind, _nbytes in tensors)
    return {hf: kind for hf, kind in names if hf is not None}


def _weights_bytes(
    num_params: int, level: str, cfg: dict[str, Any], blocks: FileBlocks | None = None, target: str = "cpu",
    plans: KernelPlans | None = None, kinds: dict[str, str] | None = None,
) -> int:
    """What a load at ``level`` holds (:func:`engine.loading.footprint.weights_bytes`); "file" holds the file's
    tensors as they are."""
    if level == "file":
        return blocks.nbytes if blocks is not None else int(num_params * BYTES_PER_PARAM["int8"])
    try:
        return footprint.weights_bytes(cfg, level, target, plans, kinds)
    except (KeyError, TypeError, ValueError):  # a config without the shape (only ``num_parameters``)
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
    chats: int
    plans: KernelPlans | None
    kinds: dict[str, str] | None

    @property
    def cache_words(self) -> str:
        """The cache in words: "a 4096-token KV cache", with " for 4 chats" when the pool holds several."""
        return f"a {self.context}-token KV cache" + (f" for {self.chats} chats" if self.chats > 1 else "")

    @property
    def usable(self) -> float:
        return self.free * MARGIN - self.overhead

    def weights(self, level: str, blocks: FileBlocks | None = None) -> int:
        """The weights a load at ``level`` holds here."""
        return _weights_bytes(self.num_params, level, self.cfg, blocks, self.target, self.plans, self.kinds)

    def fits(self, weights: int) -> str:
        need = weights + self.kv_budget
        if need > self.usable:
            return "no"
        return "tight" if need > self.free * TIGHT - self.overhead else "yes"


def kv_pool_bytes(per_token: int, context: int, num_chats: int, block_size: int | None = None) -> int:
    """The KV pool the engine allocates (``engine/core/llm.py``): whole blocks of ``context`` tokens for each of
    ``num_chats`` chats, plus the null block."""
    size = block_size or EngineConfig().block_size
    return per_token * size * (max(num_chats, 1) * -(-context // size) + 1)


def _budget(
    model: Any, hardware: Any, context_length: int | None, device: str, num_chats: int = 1,
    plans: KernelPlans | None = None, kv_itemsize: int | None = None,
) -> _Budget:
    from engine.system import hardware as hw

    info = hardware if hardware is not None else hw.detect()
    cfg = _config_dict(model)
    num_params = count_parameters(cfg)
    model_len = int(cfg.get("max_position_embeddings") or 4096)
    context = min(int(context_length or 4096), model_len)  # the engine clamps the context to the model's own
    use_gpu = device in ("auto", "cuda") and bool(info.gpus) and (info.torch_cuda_available or hardware is not None)
    # the KV pool is fp32 on a CPU, in the model's dtype on a GPU (kv_cache.py)
    per_token = kv_bytes_per_token(cfg, 4 if not use_gpu else kv_itemsize or 2)
    if use_gpu:
        free = max(g.free_bytes for g in info.gpus)
        where = f"the GPU's {free / _GIB:.1f} GiB free"
    else:
        free = int(info.ram_available_bytes)
        where = f"{free / _GIB:.1f} GiB of free RAM"
    overhead = GPU_OVERHEAD_BYTES if use_gpu else RUNTIME_OVERHEAD_BYTES
    kinds = gguf_kinds(model) if not use_gpu else None
    return _Budget(info, cfg, num_params, context, per_token, kv_pool_bytes(per_token, context, num_chats),
                   "cuda" if use_gpu else "cpu", free, where, overhead, max(num_chats, 1), plans, kinds)


def estimate(
    model: Any, level: str, hardware: Any = None, context_length: int | None = None, device: str = "auto",
    num_chats: int = 1, plans: KernelPlans | None = None,
) -> Recommendation:
    """The numbers for loading ``model`` at one given ``level`` ("fp32", "bf16", "fp16", "int8", "int4"), with the
    same estimates as :func:`recommend`; ``fits`` says whether that level fits, ``reason`` in one sentence.
    "auto" gives :func:`recommend`'s answer. ``plans`` says which kernels the fused shapes run here
    (``engine.model.kernel_plans.cached_plans()``); without it each counts its first choice."""
    from engine.api import LEVEL_DTYPES, check_level

    level = check_level(level)
    if level == "auto":
        return recommend(model, hardware, context_length, device, num_chats, plans=plans)
    kv_itemsize = 4 if LEVEL_DTYPES[level] == "float32" else 2
    b = _budget(model, hardware, context_length, device, num_chats, plans, kv_itemsize)
    blocks = file_blocks(model, b.cfg, only_file=True) if level == "file" else None
    if level == "file" and (blocks is None or b.target != "cpu"):
        why = ("The 'file' precision runs a GGUF file's own blocks on the CPU; this model is not a GGUF file whose "
               "blocks the engine multiplies as they are (choose int4, int8 or bf16).")
        return Recommendation(b.target, level, "no", 0, b.per_token, b.kv_budget, b.free, why, b.num_params,
                              b.context)
    weights = b.weights(level, blocks)
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
    num_chats: int = 1, block_kernels: bool = True, plans: KernelPlans | None = None,
) -> Recommendation:
    """Recommend a device and quantization level for ``model`` (a path, "default", a config or a dict).

    The KV cache is sized as the engine sizes it: ``context_length`` tokens for each of ``num_chats`` concurrent
    chats (the engine's ``max_batch_size``). ``block_kernels`` says whether the native block kernels can run here
    (the "file" level; :func:`file_blocks`); ``plans`` which kernels the fused shapes run here (:func:`estimate`)."""
    b = _budget(model, hardware, context_length, device, num_chats, plans)
    info, cfg, num_params, context = b.info, b.cfg, b.num_params, b.context
    per_token, kv_budget, target, free, where = b.per_token, b.kv_budget, b.target, b.free, b.where
    overhead, usable = b.overhead, b.usable
    order = _candidates(target, info, num_params)
    blocks = file_blocks(model, cfg, block_kernels) if target == "cpu" else None
    if blocks is not None:  # the file's own blocks first, then only smaller levels
        own = b.weights(blocks.level, blocks)
        order = [blocks.level] + [lv for lv in order if lv != blocks.level and b.weights(lv) < own]
    for level in order:
        weights = b.weights(level, blocks)
        need = weights + kv_budget
        if need <= usable:
            fits = "tight" if need > free * TIGHT - overhead else "yes"
            name = level
            why = (
                f"{name} weights ({weights / _GIB:.1f} GiB) plus {b.cache_words} ({kv_budget / _GIB:.2f} GiB) "
                f"fit in {where}"
            )
            if blocks is not None and level == blocks.level:
                why += f"; {blocks.words}"
            elif level != order[0]:
                first = order[0]
                why += f"; {first} would need {b.weights(order[0], blocks) / _GIB:.1f} GiB"
            elif target == "cpu" and level == "fp32":
                why += "; the model is small, so full precision costs little speed"
            return Recommendation(
                target, level, fits, weights, per_token, kv_budget, free, why + ".", num_params, context
            )
    smallest = order[-1]
    weights = b.weights(smallest, blocks)
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
