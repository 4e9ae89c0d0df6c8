"""The BERT-family encoder (bert, roberta, xlm-roberta, nomic-bert): token ids to contextual token states, in plain
torch.

The layer math is BERT's as transformers' ``BertModel`` computes it: word + position + token-type embeddings and a
LayerNorm; then per layer self-attention over the whole text (no causal mask, padded keys masked), a residual and
LayerNorm, a GELU MLP, a residual and LayerNorm. RoBERTa-style models differ only in where their position ids
start (after the padding id) and in having one token type. nomic-bert (transformers' ``NomicBertModel``) has no
position table but rotary positions on Q and K (rotate-half, base 1000), no biases, and a SwiGLU MLP
(``down(silu(gate(x)) * up(x))``); its layers are post-norm as BERT's. Q/K/V run as one fused matmul per layer.

Weights are held under llama.cpp's GGUF tensor names (``token_embd``, ``blk.N.attn_qkv``, ``ffn_up``...), one
spelling for every source:

* a safetensors folder under transformers' names, whatever prefix the checkpoint put before them (``bert.``,
  ``roberta.``) and in either LayerNorm spelling (``weight``/``bias`` or the older ``gamma``/``beta``); nomic-bert
  in its original remote-code names (``encoder.layers.N.attn.Wqkv``, ``mlp.fc11``/``fc12``/``fc2``, ``norm1``,
  ``emb_ln``) or transformers' (``layers.N.self_attn.q_proj``, ``mlp.up_proj``...): :func:`read_state`;
* a llama.cpp GGUF file (``bert``, ``nomic-bert``), every tensor dequantized to fp32 at load with the engine's
  block dequantizer (these models are small): :func:`read_gguf_state`.

The pooler head is not read: sentence embeddings pool the token states themselves (``engine/model/embedding.py``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from engine.api import ModelLoadError
from engine.loading.embedding_model import EncoderConfig
from engine.loading.gguf_reader import open_regular, read_tensor_table
from engine.loading.safetensors_reader import safetensors_files

_ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}

_L = r"^(?:encoder\.layers?|layers)\.(\d+)\."
#: transformers' and nomic's parameter names -> llama.cpp's (the suffix ``.weight``/``.bias`` is kept).
_RENAMES = [
    (re.compile(pattern), repl)
    for pattern, repl in (
        (r"^embeddings\.word_embeddings$", "token_embd"),
        (r"^embeddings\.position_embeddings$", "position_embd"),
        (r"^embeddings\.token_type_embeddings$", "token_types"),
        (r"^(?:embeddings\.LayerNorm|emb_ln)$", "token_embd_norm"),
        # BERT
        (_L + r"attention\.self\.query$", r"blk.\1.attn_q"),
        (_L + r"attention\.self\.key$", r"blk.\1.attn_k"),
        (_L + r"attention\.self\.value$", r"blk.\1.attn_v"),
        (_L + r"attention\.output\.dense$", r"blk.\1.attn_output"),
        (_L + r"attention\.output\.LayerNorm$", r"blk.\1.attn_output_norm"),
        (_L + r"intermediate\.dense$", r"blk.\1.ffn_up"),
        (_L + r"output\.dense$", r"blk.\1.ffn_down"),
        (_L + r"output\.LayerNorm$", r"blk.\1.layer_output_norm"),
        # nomic-bert as nomic's remote code names it (what the hub's folders hold)
        (_L + r"attn\.Wqkv$", r"blk.\1.attn_qkv"),
        (_L + r"attn\.out_proj$", r"blk.\1.attn_output"),
        (_L + r"mlp\.fc11$", r"blk.\1.ffn_up"),
        (_L + r"mlp\.fc12$", r"blk.\1.ffn_gate"),
        (_L + r"mlp\.fc2$", r"blk.\1.ffn_down"),
        (_L + r"norm1$", r"blk.\1.attn_output_norm"),
        (_L + r"norm2$", r"blk.\1.layer_output_norm"),
        # nomic-bert as transformers' NomicBertModel names it
        (_L + r"self_attn\.q_proj$", r"blk.\1.attn_q"),
        (_L + r"self_attn\.k_proj$", r"blk.\1.attn_k"),
        (_L + r"self_attn\.v_proj$", r"blk.\1.attn_v"),
        (_L + r"self_attn\.o_proj$", r"blk.\1.attn_output"),
        (_L + r"mlp\.up_proj$", r"blk.\1.ffn_up"),
        (_L + r"mlp\.gate_proj$", r"blk.\1.ffn_gate"),
        (_L + r"mlp\.down_proj$", r"blk.\1.ffn_down"),
        (_L + r"post_attention_layernorm$", r"blk.\1.attn_output_norm"),
        (_L + r"post_mlp_layernorm$", r"blk.\1.layer_output_norm"),
    )
]


def gguf_name(hf_name: str) -> str | None:
    """llama.cpp's name of a transformers/nomic encoder parameter (``gamma``/``beta`` read as ``weight``/``bias``);
    None for a tensor the encoder does not use (the pooler, a masked-LM head)."""
    stem, _, suffix = hf_name.rpartition(".")
    suffix = {"gamma": "weight", "beta": "bias"}.get(suffix, suffix)
    for pattern, repl in _RENAMES:
        renamed, hits = pattern.subn(repl, stem)
        if hits:
            return f"{renamed}.{suffix}"
    return None


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


def encoder_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A folder's tensors (:func:`read_state`) under llama.cpp's names; the ones the encoder does not use dropped."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        renamed = gguf_name(name)
        if renamed is not None:
            out[renamed] = tensor
    return out


def read_gguf_state(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A GGUF encoder's metadata (the vocabulary decoded) and every tensor, dequantized to fp32 in torch's shape.

    Raises:
        ModelLoadError: for a truncated or damaged file, or a tensor type the dequantizer does not know.
    """
    from engine.loading.formats.gguf_blocks import dequantize

    metadata, entries = read_tensor_table(path, arrays=True)
    state: dict[str, torch.Tensor] = {}
    with open_regular(path) as fh:
        for entry in entries:
            rows = max(1, entry.rows)
            fh.seek(entry.offset)
            raw = bytearray(fh.read(entry.nbytes))
            if len(raw) != entry.nbytes:
                raise ModelLoadError(f"{path.name} ended inside tensor {entry.name}; re-download it.")
            data = torch.frombuffer(raw, dtype=torch.uint8).reshape(rows, -1)
            try:
                values = dequantize(entry.kind, data)
            except (NotImplementedError, KeyError, ValueError) as exc:
                raise ModelLoadError(
                    f"{path.name} stores {entry.name} as {entry.kind}, which Hearth cannot read ({exc})."
                ) from None
            state[entry.name] = values.reshape(tuple(reversed(entry.dims)))
    return metadata, state


@dataclass(slots=True)
class _Norm:
    weight: torch.Tensor
    bias: torch.Tensor


@dataclass(slots=True)
class _EncoderLayer:
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    out: torch.Tensor
    out_bias: torch.Tensor | None
    attn_norm: _Norm
    up: torch.Tensor
    up_bias: torch.Tensor | None
    gate: torch.Tensor | None  # SwiGLU's gate (nomic-bert); None: a plain MLP
    down: torch.Tensor
    down_bias: torch.Tensor | None
    out_norm: _Norm


class Encoder:
    """A BERT-family encoder's weights in one dtype, and its forward pass over a padded batch.

    Args:
        config: the encoder's shape (``engine.loading.embedding_model.encoder_config``).
        state: the tensors under llama.cpp's names (:func:`encoder_state`, :func:`read_gguf_state`).
        dtype: the compute dtype.
        where: the folder or file, named in errors.

    Raises:
        ModelLoadError: for a missing or misshapen weight, or an activation the encoder does not know.
    """

    def __init__(
        self, config: EncoderConfig, state: dict[str, torch.Tensor], dtype: torch.dtype, where: Path
    ) -> None:
        self._state, self._where, self.dtype = state, where, dtype
        self.num_parameters = 0
        self.hidden, self.num_heads, self.eps = config.hidden, config.heads, config.eps
        if config.activation not in _ACTIVATIONS:
            raise ModelLoadError(
                f"{where.name} uses the {config.activation} activation, which Hearth's encoder does not run."
            )
        self._act = _ACTIVATIONS[config.activation]
        self.pad_id, self.position_offset = config.pad_id, config.position_offset
        self.rope_theta = config.rope_theta
        self.word = self._take("token_embd.weight", (config.vocab_size, self.hidden))
        self.position = None if self.rope_theta is not None else self._take("position_embd.weight", None)
        types = self._take("token_types.weight", None, required=False)
        self.token_type = types[0] if types is not None else torch.zeros(self.hidden, dtype=dtype)
        self.embed_norm = self._norm("token_embd_norm")
        self.layers = [self._layer(i) for i in range(config.layers)]
        self._state = {}  # the tensors above hold what is used; the rest is let go

    def _take(self, name: str, shape: tuple[int, ...] | None, required: bool = True) -> Any:
        tensor = self._state.get(name)
        if tensor is None and not required:
            return None
        if tensor is None or (shape is not None and tuple(tensor.shape) != shape):
            problem = "is missing" if tensor is None else f"has shape {tuple(tensor.shape)}, not {shape}"
            raise ModelLoadError(
                f"The weights in {self._where} do not match its config: {name} (llama.cpp's name) {problem}. The "
                "download is incomplete or the files come from different models; re-download the model."
            )
        self.num_parameters += int(tensor.numel())
        return tensor.to(self.dtype)

    def _bias(self, name: str, size: int) -> torch.Tensor | None:
        """A bias: BERT has one on every projection, nomic-bert none (used wherever the file has one)."""
        return self._take(name, (size,), required=self.rope_theta is None)

    def _norm(self, name: str) -> _Norm:
        return _Norm(self._take(f"{name}.weight", (self.hidden,)), self._take(f"{name}.bias", (self.hidden,)))

    def _layer(self, i: int) -> _EncoderLayer:
        p, h = f"blk.{i}.", self.hidden
        if f"{p}attn_qkv.weight" in self._state:
            qkv = self._take(f"{p}attn_qkv.weight", (3 * h, h))
            qkv_bias = self._bias(f"{p}attn_qkv.bias", 3 * h)
        else:
            qkv = torch.cat([self._take(f"{p}attn_{x}.weight", (h, h)) for x in "qkv"])
            biases = [self._bias(f"{p}attn_{x}.bias", h) for x in "qkv"]
            qkv_bias = None if any(b is None for b in biases) else torch.cat(biases)  # type: ignore[arg-type]
        up = self._take(f"{p}ffn_up.weight", None)
        inter = int(up.shape[0])
        if up.shape != (inter, h):
            self._take(f"{p}ffn_up.weight", (inter, h))
        gate = self._take(f"{p}ffn_gate.weight", (inter, h), required=self.rope_theta is not None)
        return _EncoderLayer(
            qkv, qkv_bias,
            self._take(f"{p}attn_output.weight", (h, h)), self._bias(f"{p}attn_output.bias", h),
            self._norm(f"{p}attn_output_norm"),
            up, self._bias(f"{p}ffn_up.bias", inter), gate,
            self._take(f"{p}ffn_down.weight", (h, inter)), self._bias(f"{p}ffn_down.bias", h),
            self._norm(f"{p}layer_output_norm"),
        )  # fmt: skip

    @property
    def max_positions(self) -> int | None:
        """The longest input the position table allows (None: rotary positions have no table)."""
        return None if self.position is None else int(self.position.shape[0]) - self.position_offset

    def _rotary(self, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [L, head_dim] of positions 0..n-1, as transformers' rotary embedding computes them."""
        hd = self.hidden // self.num_heads
        inv_freq = 1.0 / (
            float(self.rope_theta or 1.0) ** (torch.arange(0, hd, 2, device=device).float() / hd)
        )
        freqs = torch.arange(n, device=device).float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Token states [B, L, hidden] of a right-padded batch: ``ids`` [B, L], ``mask`` [B, L] (1 real, 0 pad)."""
        b, n = ids.shape
        x = self.word[ids] + self.token_type
        if self.position is not None:
            positions = torch.arange(n, device=ids.device)[None, :].expand(b, n)
            if self.position_offset:  # RoBERTa: real tokens count from padding id + 1, padding at pad id
                positions = torch.cumsum(mask, dim=1) * mask + self.pad_id
            x = x + self.position[positions]
        x = F.layer_norm(x, (self.hidden,), self.embed_norm.weight, self.embed_norm.bias, self.eps)
        keys = mask.bool()[:, None, None, :]  # [B, 1, 1, L]: every query sees the real keys of its text
        hd = self.hidden // self.num_heads
        rope = self._rotary(n, ids.device) if self.rope_theta is not None else None
        for layer in self.layers:
            q, k, v = F.linear(x, layer.qkv, layer.qkv_bias).view(b, n, 3, self.num_heads, hd).unbind(2)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, L, hd]
            if rope is not None:
                q, k = self._rotate(q, *rope), self._rotate(k, *rope)
            attn = F.scaled_dot_product_attention(q, k, v, keys, scale=1.0 / math.sqrt(hd))
            attn = F.linear(attn.transpose(1, 2).reshape(b, n, self.hidden), layer.out, layer.out_bias)
            x = F.layer_norm(attn + x, (self.hidden,), layer.attn_norm.weight, layer.attn_norm.bias, self.eps)
            up = F.linear(x, layer.up, layer.up_bias)
            inner = self._act(F.linear(x, layer.gate)) * up if layer.gate is not None else self._act(up)
            h = F.linear(inner, layer.down, layer.down_bias)
            x = F.layer_norm(h + x, (self.hidden,), layer.out_norm.weight, layer.out_norm.bias, self.eps)
        return x
