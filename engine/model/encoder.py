"""The BERT-family encoder (bert, roberta, xlm-roberta): token ids to contextual token states, in plain torch.

The layer math is BERT's as transformers' ``BertModel`` computes it: word + position + token-type embeddings and a
LayerNorm; then per layer self-attention over the whole text (no causal mask, padded keys masked), a residual and
LayerNorm, a GELU MLP, a residual and LayerNorm. RoBERTa-style models differ only in where their position ids
start (after the padding id) and in having one token type. Q/K/V run as one fused matmul per layer.

Weights are read from a safetensors folder under transformers' names, whatever prefix the checkpoint put before
them (``bert.``, ``roberta.``) and in either LayerNorm spelling (``weight``/``bias`` or the older
``gamma``/``beta``). The pooler head is not read: sentence embeddings pool the token states themselves
(``engine/model/embedding.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from engine.api import ModelLoadError
from engine.architectures import EmbeddingArchitecture
from engine.loading.safetensors_reader import safetensors_files

_ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


@dataclass(slots=True)
class _Norm:
    weight: torch.Tensor
    bias: torch.Tensor


@dataclass(slots=True)
class _EncoderLayer:
    qkv: torch.Tensor
    qkv_bias: torch.Tensor
    out: torch.Tensor
    out_bias: torch.Tensor
    attn_norm: _Norm
    up: torch.Tensor
    up_bias: torch.Tensor
    down: torch.Tensor
    down_bias: torch.Tensor
    out_norm: _Norm


def read_state(folder: Path, prefixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors shards, the first of ``prefixes`` that names them stripped."""
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for shard in safetensors_files(folder):
        state.update(load_file(str(shard)))
    for prefix in prefixes:
        if prefix and any(name.startswith(prefix) for name in state):
            return {name.removeprefix(prefix): t for name, t in state.items() if name.startswith(prefix)}
    return state


class Encoder:
    """A BERT-family encoder's weights in one dtype, and its forward pass over a padded batch.

    Args:
        config: config.json's fields.
        arch: the type's embedding registry entry.
        state: the base model's tensors by transformers' names (see :func:`read_state`).
        dtype: the compute dtype.
        where: the folder, named in errors.

    Raises:
        ModelLoadError: for a missing or misshapen weight, or an activation the encoder does not know.
    """

    def __init__(
        self, config: dict[str, Any], arch: EmbeddingArchitecture, state: dict[str, torch.Tensor],
        dtype: torch.dtype, where: Path,
    ) -> None:  # fmt: skip
        self._state, self._where, self.dtype = state, where, dtype
        self.hidden = int(config["hidden_size"])
        self.num_heads = int(config["num_attention_heads"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        act = str(config.get("hidden_act", "gelu"))
        if act not in _ACTIVATIONS:
            raise ModelLoadError(
                f"{where.name} uses the {act} activation, which Hearth's encoder does not run."
            )
        self._act = _ACTIVATIONS[act]
        self.pad_id = int(config.get("pad_token_id") or 0)
        self.position_offset = self.pad_id + 1 if arch.position_offset else 0
        self.word = self._take("embeddings.word_embeddings.weight", (int(config["vocab_size"]), self.hidden))
        self.position = self._take("embeddings.position_embeddings.weight", None)
        self.token_type = self._take("embeddings.token_type_embeddings.weight", None)[0]
        self.embed_norm = self._norm("embeddings.LayerNorm")
        self.layers = [self._layer(i) for i in range(int(config["num_hidden_layers"]))]
        self._state = {}  # the tensors above hold what is used; the rest is let go

    def _take(self, name: str, shape: tuple[int, ...] | None) -> torch.Tensor:
        tensor = self._state.get(name)
        if tensor is None and name.endswith((".weight", ".bias")):  # the older LayerNorm names
            old = name.removesuffix(".weight") + ".gamma" if name.endswith(".weight") else name[:-5] + ".beta"
            tensor = self._state.get(old)
        if tensor is None or (shape is not None and tuple(tensor.shape) != shape):
            problem = "is missing" if tensor is None else f"has shape {tuple(tensor.shape)}, not {shape}"
            raise ModelLoadError(
                f"The weights in {self._where} do not match its config: {name} {problem}. The download is incomplete "
                "or the files come from different models; re-download the model."
            )
        return tensor.to(self.dtype)

    def _norm(self, name: str) -> _Norm:
        return _Norm(self._take(f"{name}.weight", (self.hidden,)), self._take(f"{name}.bias", (self.hidden,)))

    def _layer(self, i: int) -> _EncoderLayer:
        p, h = f"encoder.layer.{i}.", self.hidden
        parts = [f"{p}attention.self.{x}" for x in ("query", "key", "value")]
        qkv = torch.cat([self._take(f"{x}.weight", (h, h)) for x in parts])
        qkv_bias = torch.cat([self._take(f"{x}.bias", (h,)) for x in parts])
        up = self._take(f"{p}intermediate.dense.weight", None)
        inter = int(up.shape[0])
        return _EncoderLayer(
            qkv, qkv_bias,
            self._take(f"{p}attention.output.dense.weight", (h, h)), self._take(f"{p}attention.output.dense.bias", (h,)),
            self._norm(f"{p}attention.output.LayerNorm"),
            up, self._take(f"{p}intermediate.dense.bias", (inter,)),
            self._take(f"{p}output.dense.weight", (h, inter)), self._take(f"{p}output.dense.bias", (h,)),
            self._norm(f"{p}output.LayerNorm"),
        )  # fmt: skip

    @property
    def max_positions(self) -> int:
        """The longest input the position table allows."""
        return int(self.position.shape[0]) - self.position_offset

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Token states [B, L, hidden] of a right-padded batch: ``ids`` [B, L], ``mask`` [B, L] (1 real, 0 pad)."""
        b, n = ids.shape
        positions = torch.arange(n, device=ids.device)[None, :].expand(b, n)
        if self.position_offset:  # RoBERTa: real tokens count from padding id + 1, padding at the padding id
            positions = torch.cumsum(mask, dim=1) * mask + self.pad_id
        x = self.word[ids] + self.position[positions] + self.token_type
        x = F.layer_norm(x, (self.hidden,), self.embed_norm.weight, self.embed_norm.bias, self.eps)
        keys = mask.bool()[:, None, None, :]  # [B, 1, 1, L]: every query sees the real keys of its text
        hd = self.hidden // self.num_heads
        for layer in self.layers:
            q, k, v = F.linear(x, layer.qkv, layer.qkv_bias).view(b, n, 3, self.num_heads, hd).unbind(2)
            attn = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), keys
            )
            attn = F.linear(attn.transpose(1, 2).reshape(b, n, self.hidden), layer.out, layer.out_bias)
            x = F.layer_norm(attn + x, (self.hidden,), layer.attn_norm.weight, layer.attn_norm.bias, self.eps)
            h = F.linear(self._act(F.linear(x, layer.up, layer.up_bias)), layer.down, layer.down_bias)
            x = F.layer_norm(h + x, (self.hidden,), layer.out_norm.weight, layer.out_norm.bias, self.eps)
        return x
