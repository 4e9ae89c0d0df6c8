"""Llama-family models built without transformers' modeling code, from safetensors folders and GGUF files.

The fused decoder (``engine/model/llama.py``) reads an HF causal LM's parameters and calls only its embedding and
rotary modules, so for the types it runs this module builds a small model with the same attribute names
(``model.layers[i].self_attn.q_proj``, ``model.norm``, ``lm_head``...) and fills it straight from the files.
Importing transformers' Llama modeling and config code pulls in ``torch.distributed``, and transformers itself is
a heavy import; a warm start should pay for neither, so this path imports none of it: the config is
:class:`ModelConfig`, and the tokenizer, where the folder has a plain ``tokenizer.json``,
:class:`engine.loading.tokenizer.Tokenizer`.

* **safetensors**: the tensors are read into the skeleton in the load dtype (``load_state_dict(assign=True)``).
* **GGUF**: config and tokenizer are converted once (:mod:`engine.loading.gguf_convert`) and cached in the data folder
  (:func:`engine.system.paths.cache_dir`); tensors are named and ordered by the registry's GGUF layout
  (:mod:`engine.architectures`: llama's permuted Q/K rows are put back in HF order) and dequantized by
  :func:`engine.loading.formats.gguf_blocks.dequantize` (bitwise as ``gguf``'s numpy code computes them). Nothing
  passes through transformers' GGUF loader.

The rotary embedding computes cos/sin exactly as transformers' ``LlamaRotaryEmbedding`` does, so the fused path
stays token-identical to HF ``generate``; scaled rope types ("linear", "llama3", "yarn") take their frequencies from
transformers' rope functions. Rope types that change with the sequence length ("dynamic", "longrope") and anything
unexpected fall back to transformers (:func:`supports`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from engine.api import ModelLoadError
from engine.architectures import (
    ARCHITECTURES,
    GgufLayout,
    attention_shape,
    execution_path,
    ties_embeddings,
)
from engine.loading.content_key import content_key
from engine.loading.default_model import MARKER_FILENAME
from engine.loading.formats import FLOAT_TYPES
from engine.loading.formats.gguf_blocks import dequantize
from engine.loading.gguf_reader import read_regular_text
from engine.loading.gguf_weights import GgufWeights
from engine.loading.safetensors_reader import safetensors_files
from engine.loading.shape import check_config_values
from engine.loading.tokenizer import Tokenizer, is_plain
from engine.system.paths import cache_dir, ensure_private_dir

log = logging.getLogger("engine")

#: Rope types whose frequencies do not change at run time.
_STATIC_ROPE = ("default", "linear", "llama3", "yarn")
_CACHE_VERSION = "3"


# --- the skeleton ----------------------------------------------------------------------------------------------
# Parameters start on the meta device, uninitialized (no init kernels run: torch's meta-device init pulls in
# torch._dynamo), and are replaced by the file's tensors in build().
def _meta(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, device="meta"), requires_grad=False)


class _Norm(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = _meta(size)


class _Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.weight = _meta(out_features, in_features)
        self.bias = _meta(out_features) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight, self.bias)


class _Attention(nn.Module):
    """Q/K/V/O projections; the fused path has Q/K/V biases only on "qkv" types and never an O bias."""

    def __init__(self, config: Any, hidden: int, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        bias = ARCHITECTURES[config.model_type].attention_bias == "qkv"
        self.q_proj = _Linear(hidden, heads * head_dim, bias=bias)
        self.k_proj = _Linear(hidden, kv_heads * head_dim, bias=bias)
        self.v_proj = _Linear(hidden, kv_heads * head_dim, bias=bias)
        self.o_proj = _Linear(heads * head_dim, hidden, bias=False)
        if ARCHITECTURES[config.model_type].qk_norm == "head":
            self.q_norm, self.k_norm = _Norm(head_dim), _Norm(head_dim)


class _Mlp(nn.Module):
    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = _Linear(hidden, inter, bias=False)
        self.up_proj = _Linear(hidden, inter, bias=False)
        self.down_proj = _Linear(inter, hidden, bias=False)


class _Layer(nn.Module):
    def __init__(self, config: Any, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        hidden = int(config.hidden_size)
        self.self_attn = _Attention(config, hidden, heads, kv_heads, head_dim)
        self.mlp = _Mlp(hidden, int(config.intermediate_size))
        self.input_layernorm, self.post_attention_layernorm = _Norm(hidden), _Norm(hidden)


class RotaryEmbedding(nn.Module):
    """cos/sin as transformers' ``LlamaRotaryEmbedding.forward`` computes them (same ops, same order)."""

    def __init__(self, config: Any, head_dim: int) -> None:
        super().__init__()
        rope = dict(config.rope_parameters)
        if rope.get("rope_type", "default") == "default":
            dim = int(head_dim * float(rope.get("partial_rotary_factor", 1.0)))
            inv_freq = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
            self.attention_scaling = 1.0
        else:
            from transformers import PretrainedConfig
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            fields = config.to_dict()
            model_type = fields.pop("model_type")
            hf_config = PretrainedConfig(**fields)
            hf_config.model_type = model_type  # type: ignore[misc]  # the generic class leaves it empty
            inv_freq, self.attention_scaling = ROPE_INIT_FUNCTIONS[rope["rope_type"]](hf_config, None)
        self.inv_freq: torch.Tensor
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


class _Inner(nn.Module):
    def __init__(self, config: Any, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        vocab, hidden = int(config.vocab_size), int(config.hidden_size)
        self.embed_tokens = nn.Embedding(vocab, hidden, _weight=torch.empty(vocab, hidden, device="meta"))
        self.layers = nn.ModuleList(_Layer(config, heads, kv_heads, head_dim)
                                    for _ in range(int(config.num_hidden_layers)))  # fmt: skip
        self.norm = _Norm(int(config.hidden_size))


class NativeCausalLM(nn.Module):
    """The parameters of a Llama-family causal LM under HF's names; run by the fused decoder only."""

    def __init__(self, config: Any, generation_config: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.config = config
        #: the folder's generation_config.json (its end-of-sequence ids may be more than config.json names)
        self.generation_config = SimpleNamespace(**(generation_config or {}))
        heads, kv_heads, head_dim = attention_shape(config)
        self.model = _Inner(config, heads, kv_heads, head_dim)
        self.lm_head = _Linear(int(config.hidden_size), int(config.vocab_size), bias=False)
        self.model.rotary_emb = RotaryEmbedding(config, head_dim)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("a natively loaded model runs through the engine's fused decoder only")


# --- config and tokenizer --------------------------------------------------------------------------------------
def _rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """``rope_parameters`` as transformers 5 standardizes them (legacy ``rope_theta``/``rope_scaling`` folded in)."""
    rope = config.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope:
        return dict(rope)
    scaling = dict(config.get("rope_scaling") or {})
    scaling.setdefault("rope_type", scaling.pop("type", "default"))
    return {"rope_theta": float(config.get("rope_theta", 10000.0)), **scaling}


def supports(config: dict[str, Any], fmt: str) -> bool:
    """Whether this module can build the model (else the loader uses transformers)."""
    if fmt not in ("safetensors", "gguf") or execution_path(config) != "fused":
        return False
    return _rope_parameters(config).get("rope_type", "default") in _STATIC_ROPE


class ModelConfig(SimpleNamespace):
    """config.json's fields as attributes, as an HF config object carries them (what the engine reads of one)."""

    model_type: str

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def make_config(config: dict[str, Any]) -> ModelConfig:
    """The config.json fields with the defaults transformers' Llama-family configs fill in."""
    fields = dict(config)
    fields["rope_parameters"] = _rope_parameters(config)
    fields.pop("rope_scaling", None)
    fields.setdefault("rms_norm_eps", 1e-6)
    fields.setdefault("tie_word_embeddings", ARCHITECTURES[fields["model_type"]].tie_word_embeddings)
    fields.setdefault("attention_bias", False)
    fields.setdefault("mlp_bias", False)
    return ModelConfig(**fields)


def load_tokenizer(folder: Path) -> Any:
    """The folder's tokenizer: :class:`Tokenizer` for a plain ``tokenizer.json`` (no transformers), else
    transformers' AutoTokenizer."""
    if is_plain(folder):
        return Tokenizer(folder)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def read_config(folder: Path) -> dict[str, Any]:
    config = json.loads(read_regular_text(folder / "config.json"))
    if not isinstance(config, dict):
        raise ModelLoadError(f"{folder / 'config.json'} is not a JSON object. Re-download the model.")
    return config


def gguf_side_folder(path: Path) -> Path:
    """The config.json and tokenizer of a GGUF file: shipped beside it, else converted once
    (:func:`engine.loading.gguf_convert.write_side_files`) and cached in the data folder.

    "Shipped beside it" means the folder's ``.hearth-converted.json`` names the file under ``"gguf"`` (the bundle
    lays out the default model so, see ``packaging/hearth.spec``).
    """
    try:
        marker = json.loads(read_regular_text(path.parent / MARKER_FILENAME))
    except (OSError, ValueError):
        marker = None
    if isinstance(marker, dict) and marker.get("gguf") == path.name and (path.parent / "config.json").is_file():
        return path.parent
    # named by the file's content, not its path: a copy of the same file (under another app's folder) finds it
    key = hashlib.sha256(f"{_CACHE_VERSION}|{content_key(path)}".encode()).hexdigest()
    folder = cache_dir() / "gguf" / key[:32]
    if (folder / "config.json").is_file() and (folder / "tokenizer_config.json").is_file():
        return folder
    from engine.loading.gguf_convert import write_side_files

    ensure_private_dir(cache_dir())
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".converting-", dir=folder.parent))
    try:
        write_side_files(path, tmp)
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("converted the config and tokenizer of %s into %s", path.name, folder)
    return folder


# --- weights ---------------------------------------------------------------------------------------------------
def _safetensors_state(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for shard in safetensors_files(folder):
        state.update(load_file(str(shard)))
    return state


#: Set on a model whose GGUF block tensors were left in the file (``keep_blocks``): their parameters are zero-size
#: stand-ins of the right shape, and the engine's block kernels read the file (``engine/model/gguf_linear.py``).
BLOCKS_IN_FILE_ATTR = "hearth_blocks_in_file"


def stand_in(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A tensor of ``shape`` that holds one element (every stride 0): the place of a weight kept in the file."""
    return torch.zeros((), dtype=dtype).expand(shape)


def is_stand_in(t: torch.Tensor) -> bool:
    """Whether ``t`` is a :func:`stand_in` (a weight kept in the file), not real values."""
    return t.dim() > 0 and t.numel() > 1 and all(s == 0 for s in t.stride())


def _gguf_state(path: Path, config: Any, dtype: torch.dtype, keep_blocks: bool = False) -> dict[str, torch.Tensor]:
    """Every tensor of the file by HF name, dequantized; with ``keep_blocks``, quantized 2-D tensors stay in the
    file as :func:`stand_in` tensors (norms, biases and float tensors are read)."""
    weights = GgufWeights(path, config)
    # a fused type's file whose layout the registry does not list is read with the Llama-family names, unpermuted
    layout = weights.layout or GgufLayout()
    state: dict[str, torch.Tensor] = {}
    for tensor in weights.entries:
        name = layout.hf_name(tensor.name)
        if name is None:
            continue
        shape = tuple(reversed(tensor.dims))
        if keep_blocks and len(shape) == 2 and tensor.kind not in FLOAT_TYPES:
            state[name] = stand_in(shape, dtype)
            continue
        state[name] = dequantize(tensor.kind, weights.rows(name, tensor), dtype).reshape(shape)
    return state


def build(
    config: Any, state: dict[str, torch.Tensor], dtype: torch.dtype, where: Path, generation: dict[str, Any] | None = None
) -> NativeCausalLM:
    """The skeleton filled with ``state`` (cast to ``dtype``); a missing or misshapen tensor raises."""
    layers = {name.split(".")[2] for name in state if name.startswith("model.layers.")}
    if int(config.num_hidden_layers) > len(layers):  # before the skeleton: each layer costs Python objects
        raise ModelLoadError(
            f"The weights in {where} do not match its config: it claims {config.num_hidden_layers} layers but the "
            f"weights hold {len(layers)}. The download is incomplete or the files come from different models; "
            "re-download the model."
        )
    model = NativeCausalLM(config, generation)
    tied = ties_embeddings(config)
    expected = {name: p.shape for name, p in model.named_parameters()}
    if tied or "lm_head.weight" not in state:
        expected.pop("lm_head.weight")
    missing = sorted(set(expected) - set(state))
    wrong = sorted(n for n in expected if n in state and tuple(state[n].shape) != tuple(expected[n]))
    if missing or wrong:
        problem = f"{len(missing)} weight(s) missing (e.g. {missing[0]})" if missing else \
            f"{len(wrong)} weight(s) with the wrong shape (e.g. {wrong[0]})"  # fmt: skip
        raise ModelLoadError(
            f"The weights in {where} do not match its config: {problem}. The download is incomplete or the files "
            "come from different models; re-download the model."
        )
    model.load_state_dict(
        {n: state[n] if is_stand_in(state[n]) else state[n].to(dtype) for n in expected}, strict=False, assign=True
    )
    if "lm_head.weight" not in expected:
        model.lm_head.weight = model.model.embed_tokens.weight  # type: ignore[assignment]  # a Parameter too
    return model


def load(
    path: Path, fmt: str, dtype: torch.dtype, keep_blocks: bool = False
) -> tuple[NativeCausalLM, Any, Any]:
    """Model, tokenizer and config of a safetensors folder or a GGUF file (see :func:`supports`). With
    ``keep_blocks`` (GGUF only) the quantized weights stay in the file (:data:`BLOCKS_IN_FILE_ATTR`)."""
    side = gguf_side_folder(path) if fmt == "gguf" else path
    fields = read_config(side)
    check_config_values(fields, path, "The file is damaged or comes from different models; re-download it.")
    config = make_config(fields)
    tokenizer = load_tokenizer(side)
    state = _gguf_state(path, config, dtype, keep_blocks) if fmt == "gguf" else _safetensors_state(path)
    try:
        generation = json.loads(read_regular_text(side / "generation_config.json"))
    except (OSError, ValueError):
        generation = None
    with torch.no_grad():
        model = build(config, state, dtype, path, generation if isinstance(generation, dict) else None)
    del state
    if keep_blocks and fmt == "gguf":
        setattr(model, BLOCKS_IN_FILE_ATTR, True)
    return model, tokenizer, config
