"""Runs the model over a scheduled batch, with attention that reads and writes our paged KV pool.

This is the only engine module that does tensor work besides the sampler. Two execution paths share the
same KV pool and attention code:

* **Fused path** for the Llama family (llama, mistral, qwen2, qwen3): our own decoder loop over the HF
  weights, with the Q/K/V and gate/up projections fused into single matmuls. On a small model most of a
  decode step is per-op overhead, so fewer, larger ops are what make a single stream fast.
* **HF path** for any other causal LM with full attention: the model's own HF modules run over the packed
  batch, and a registered attention function (``hearth_paged``) swaps in our paged attention.

Sequences are packed into one token dimension (no padding): decode tokens first, then prefill chunks.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from engine.api import WEIGHT_LEVELS
from engine.core.block_manager import NULL_BLOCK
from engine.core.scheduler import ScheduledBatch
from engine.model.quantization import (
    DenseLinear,
    Linear,
    PackedFp16Linear,
    fbgemm_fp16_available,
    make_linear,
)

log = logging.getLogger("engine")

FUSED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
ATTN_IMPLEMENTATION = "hearth_paged"
# Steps with at most this many tokens (single-stream decode) read the model-dtype weights: a bf16 GEMV is
# memory-bound and fast. Larger steps use the packed fp16 stack when there is one (bf16 GEMM is slow on CPUs
# without avx512_bf16).
SMALL_STEP_TOKENS = 2

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def kv_bytes_per_token(config: Any, dtype: torch.dtype) -> int:
    """KV bytes one token costs: 2 (K and V) x layers x KV heads x head dim x element size."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    num_kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return 2 * config.num_hidden_layers * num_kv * head_dim * torch.empty((), dtype=dtype).element_size()


@dataclass(slots=True)
class PrefillChunk:
    start: int  # offset of the chunk's first token in the packed batch
    num_tokens: int
    context_len: int  # tokens of the sequence whose KV the chunk attends to, itself included
    slots: torch.Tensor | None  # KV slots of the whole context; None when the chunk is the whole context
    mask: torch.Tensor | None  # bool [num_tokens, context_len] when part of the context was cached


@dataclass(slots=True)
class AttentionContext:
    """Where each token of a step reads and writes KV. Built once per step, shared by every layer."""

    slot_mapping: torch.Tensor  # [T] slot written by each new token
    num_decode: int  # the first num_decode tokens are single-token decodes, one per sequence
    decode_slots: torch.Tensor | None  # [num_decode, max_context] slots read, padded with the null block
    decode_mask: torch.Tensor | None  # additive [num_decode, 1, 1, max_context], or None when unpadded
    prefills: list[PrefillChunk]


_local = threading.local()


class KVCache:
    """The preallocated pool: per layer, K and V as [num_blocks * block_size, kv_heads, head_dim]."""

    def __init__(self, config: Any, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device):
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        num_kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        shape = (config.num_hidden_layers, num_blocks * block_size, num_kv, head_dim)
        # empty, not zeros: untouched pages are never committed on the CPU. Only the null block must be zero.
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        null = slice(NULL_BLOCK * block_size, (NULL_BLOCK + 1) * block_size)
        self.k[:, null].zero_()
        self.v[:, null].zero_()
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


def paged_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, kv: KVCache, ctx: AttentionContext, scale: float
) -> torch.Tensor:
    """Attention for a packed step. q: [T, H, D]; k, v: [T, KVH, D]. Returns [T, H, D].

    New K/V go into the pool first. Decodes are batched into one SDPA call over gathered slots; each prefill
    chunk is one SDPA call, causal within the chunk and full over its cached prefix.
    """
    k_pool, v_pool = kv.k[layer], kv.v[layer]
    k_pool.index_copy_(0, ctx.slot_mapping, k.to(kv.dtype))
    v_pool.index_copy_(0, ctx.slot_mapping, v.to(kv.dtype))
    out = torch.empty_like(q)
    nd = ctx.num_decode
    if nd:
        assert ctx.decode_slots is not None
        keys = k_pool[ctx.decode_slots].to(q.dtype).transpose(1, 2)  # [B, KVH, L, D]
        values = v_pool[ctx.decode_slots].to(q.dtype).transpose(1, 2)
        mask = None if ctx.decode_mask is None else ctx.decode_mask.to(q.dtype)
        o = F.scaled_dot_product_attention(
            q[:nd].unsqueeze(2), keys, values, attn_mask=mask, scale=scale, enable_gqa=True
        )
        out[:nd] = o.squeeze(2)
    for chunk in ctx.prefills:
        s, n = chunk.start, chunk.num_tokens
        if chunk.slots is None:
            keys, values = k[s : s + n], v[s : s + n]
        else:
            keys, values = k_pool[chunk.slots].to(q.dtype), v_pool[chunk.slots].to(q.dtype)
        o = F.scaled_dot_product_attention(
            q[s : s + n].transpose(0, 1).unsqueeze(0),
            keys.transpose(0, 1).unsqueeze(0),
            values.transpose(0, 1).unsqueeze(0),
            attn_mask=chunk.mask,
            is_causal=chunk.mask is None and n > 1,
            scale=scale,
            enable_gqa=True,
        )
        out[s : s + n] = o[0].transpose(0, 1)
    return out


def _hf_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """HF attention-interface adapter: [1, H, T, D] in, [1, T, H, D] out, through ``paged_attention``."""
    runner: ModelRunner = _local.runner
    q = query[0].transpose(0, 1)
    k = key[0].transpose(0, 1)
    v = value[0].transpose(0, 1)
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    out = paged_attention(q, k, v, module.layer_idx, runner.kv, runner.ctx, scale)  # type: ignore[arg-type]
    return out.unsqueeze(0), None


def _register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, _hf_attention)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as HF's LlamaRMSNorm defines it, in torch's fused kernel (fp32 statistics)."""
    return F.rms_norm(x, weight.shape, weight, eps)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding in HF's rotate-half layout, for queries and keys at once ([T, heads, D])."""
    half = x.shape[-1] // 2
    rotated = torch.cat((x[..., half:].neg(), x[..., :half]), dim=-1)
    return torch.addcmul(x * cos, rotated, sin)


@dataclass(slots=True)
class _FusedLayer:
    input_norm: torch.Tensor
    qkv: Linear
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o: Linear
    post_norm: torch.Tensor
    gate_up: Linear
    down: Linear


def _packed(weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
    return PackedFp16Linear(weight, bias)


@dataclass(slots=True)
class _LayerNorms:
    """A decoder layer's norm weights, to build fused layers of any dtype from."""

    input_norm: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    post_norm: torch.Tensor

    @classmethod
    def of(cls, layer: torch.nn.Module) -> _LayerNorms:
        attn = layer.self_attn
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        return cls(
            layer.input_layernorm.weight,
            None if q_norm is None else q_norm.weight,
            None if k_norm is None else k_norm.weight,
            layer.post_attention_layernorm.weight,
        )

    def layer(
        self,
        linear: Any,
        qkv: torch.Tensor,
        qkv_bias: torch.Tensor | None,
        o: torch.Tensor,
        gate_up: torch.Tensor,
        down: torch.Tensor,
        dtype: torch.dtype,
    ) -> _FusedLayer:
        def cast(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(dtype)

        return _FusedLayer(
            self.input_norm.to(dtype),
            linear(qkv, qkv_bias),
            cast(self.q_norm),
            cast(self.k_norm),
            linear(o, None),
            self.post_norm.to(dtype),
            linear(gate_up, None),
            linear(down, None),
        )


@dataclass(slots=True)
class _Stack:
    """Everything a fused forward pass reads, in one compute dtype."""

    layers: list[_FusedLayer]
    final_norm: torch.Tensor
    lm_head: Linear
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        linears = [m for layer in self.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        return sum(m.nbytes for m in linears) + self.lm_head.nbytes


class _QuantizedModule(torch.nn.Module):
    """Stands in for an ``nn.Linear`` inside HF modules when the HF-module path is quantized."""

    def __init__(self, linear: Linear) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        return self.linear(x.reshape(-1, shape[-1])).view(*shape[:-1], -1)


class ModelRunner:
    """Owns the model, the KV pool and the per-step tensors."""

    def __init__(
        self,
        model: torch.nn.Module,
        num_blocks: int,
        block_size: int,
        kv_dtype: torch.dtype,
        quantization: str = "dense",
        quant_backend: str = "auto",
    ):
        self.model = model
        self.config = model.config
        param = next(model.parameters())
        self.device = param.device
        self.dtype = param.dtype
        self.block_size = block_size
        self.kv = KVCache(self.config, num_blocks, block_size, kv_dtype, self.device)
        self.ctx: AttentionContext | None = None
        cfg = self.config
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.scale = self.head_dim**-0.5
        self.is_fused = cfg.model_type in FUSED_MODEL_TYPES and not self._has_unsupported_features()
        self.quantization = quantization if quantization in WEIGHT_LEVELS else "dense"
        self._quant_backend = quant_backend
        self._stack: _Stack | None = None  # steps of up to SMALL_STEP_TOKENS tokens (single-stream decode)
        self._batch_stack: _Stack | None = None  # larger steps, when a faster batched kernel exists
        # bf16/fp16 weights on a CPU: batched steps use fbgemm's packed fp16 GEMM in fp32 (see PackedFp16Linear)
        self.packed_fp16 = (
            self.is_fused
            and self.device.type == "cpu"
            and self.dtype in (torch.bfloat16, torch.float16)
            and self.quantization == "dense"
            and fbgemm_fp16_available()
        )
        if self.is_fused:
            self._build_fused()
        else:
            if self.quantization != "dense":
                self._quantize_hf_modules()
            _register_attention()
            model.set_attn_implementation(ATTN_IMPLEMENTATION)
        log.info(
            "model runner: %s path%s, %d KV blocks of %d tokens (%.1f MB, %s)",
            "fused" if self.is_fused else "HF-module",
            " (+ packed fp16 weights for batched steps)" if self._batch_stack is not None else "",
            num_blocks,
            block_size,
            self.kv.nbytes / 1e6,
            kv_dtype,
        )

    def _has_unsupported_features(self) -> bool:
        cfg = self.config
        layer_types = getattr(cfg, "layer_types", None) or []
        if any(t != "full_attention" for t in layer_types):
            return True
        return getattr(cfg, "hidden_act", "silu") != "silu" or bool(getattr(cfg, "mlp_bias", False))

    # --- weights -----------------------------------------------------------------------------------------------
    def _linear(self, weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
        return make_linear(weight, bias, self.quantization, self.device, self._quant_backend)

    def _build_fused(self) -> None:
        """Fuse Q/K/V and gate/up weights (then quantize them, if asked).

        Unquantized, the HF modules are pointed at views of the fused tensors, so nothing is stored twice and
        the HF model stays usable. Quantized, the HF modules' dense weights are dropped to free their memory.
        With fbgemm's packed fp16 GEMM available, a second stack of packed weights serves batched steps.
        """
        inner = self.model.model  # type: ignore[union-attr]
        quantized = self.quantization != "dense"
        layers: list[_FusedLayer] = []
        packed: list[_FusedLayer] = []
        with torch.no_grad():
            for layer in inner.layers:
                attn, mlp = layer.self_attn, layer.mlp
                qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
                bias = None
                if attn.q_proj.bias is not None:
                    bias = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
                gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
                norms = _LayerNorms.of(layer)
                weights = (qkv, bias, attn.o_proj.weight, gate_up, mlp.down_proj.weight)
                layers.append(norms.layer(self._linear, *weights, dtype=self.dtype))
                if self.packed_fp16:
                    packed.append(norms.layer(_packed, *weights, dtype=torch.float32))
                if quantized:
                    for module in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj):
                        module.weight = torch.nn.Parameter(torch.empty(0, dtype=self.dtype), requires_grad=False)
                    for module in (mlp.gate_proj, mlp.up_proj, mlp.down_proj):
                        module.weight = torch.nn.Parameter(torch.empty(0, dtype=self.dtype), requires_grad=False)
                    continue
                q_dim = attn.q_proj.weight.shape[0]
                kv_dim = attn.k_proj.weight.shape[0]
                attn.q_proj.weight = torch.nn.Parameter(qkv[:q_dim], requires_grad=False)
                attn.k_proj.weight = torch.nn.Parameter(qkv[q_dim : q_dim + kv_dim], requires_grad=False)
                attn.v_proj.weight = torch.nn.Parameter(qkv[q_dim + kv_dim :], requires_grad=False)
                inter = mlp.gate_proj.weight.shape[0]
                mlp.gate_proj.weight = torch.nn.Parameter(gate_up[:inter], requires_grad=False)
                mlp.up_proj.weight = torch.nn.Parameter(gate_up[inter:], requires_grad=False)
            head = self.model.lm_head  # type: ignore[union-attr]
            self._stack = _Stack(layers, inner.norm.weight, DenseLinear(head.weight, head.bias), self.dtype)
            if packed:
                self._batch_stack = _Stack(
                    packed, inner.norm.weight.float(), PackedFp16Linear(head.weight, head.bias), torch.float32
                )
        self._q_dim = self.num_heads * self.head_dim
        self._kv_dim = self.num_kv_heads * self.head_dim
        self._eps = float(self.config.rms_norm_eps)

    def _quantize_hf_modules(self) -> None:
        """Swap every ``nn.Linear`` inside the decoder layers for a quantized one (HF-module path)."""
        inner = self.model.model  # type: ignore[union-attr]
        with torch.no_grad():
            for layer in inner.layers:
                for parent in list(layer.modules()):
                    for name, child in list(parent.named_children()):
                        if isinstance(child, torch.nn.Linear):
                            linear = self._linear(child.weight, child.bias)
                            setattr(parent, name, _QuantizedModule(linear))

    @property
    def weights_bytes(self) -> int:
        """Bytes of weights in memory: embedding, norms, head, and the (possibly quantized) decoder layers."""
        seen: set[int] = set()
        total = 0
        for t in list(self.model.parameters()) + list(self.model.buffers()):
            if t.data_ptr() not in seen and t.numel():
                seen.add(t.data_ptr())
                total += t.nbytes
        for module in self.model.modules():
            if isinstance(module, _QuantizedModule):
                total += module.linear.nbytes
        for stack, counted in ((self._stack, self.quantization == "dense"), (self._batch_stack, False)):
            if stack is not None and not counted:  # dense weights are HF parameters, counted above
                total += stack.nbytes
        return total

    # --- step inputs ---------------------------------------------------------------------------------------------
    def _slots(self, block_table: list[int], start: int, end: int) -> list[int]:
        bs = self.block_size
        return [block_table[p // bs] * bs + p % bs for p in range(start, end)]

    def prepare(self, batch: ScheduledBatch) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Build input ids, positions and the attention context; return the rows whose logits are needed.

        Decode sequences are placed first. ``logit_rows`` lists, in batch order, the packed index of each
        sequence's last token when this step completes its known tokens (so a new token is sampled).
        """
        order = sorted(range(len(batch)), key=lambda i: batch.num_new_tokens[i] != 1)
        input_ids: list[int] = []
        positions: list[int] = []
        slot_mapping: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        prefills: list[PrefillChunk] = []
        logit_row = [-1] * len(batch)
        for i in order:
            seq, n = batch.seqs[i], batch.num_new_tokens[i]
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            offset = len(input_ids)
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            slot_mapping.extend(self._slots(seq.block_table, start, end))
            if n == 1 and not prefills:
                decode_tables.append(seq.block_table)
                decode_lens.append(end)
            else:
                prefills.append(self._prefill_chunk(seq.block_table, offset, start, end))
            if end == len(seq.token_ids):
                logit_row[i] = offset + n - 1
        dev = self.device
        decode_slots = decode_mask = None
        if decode_tables:
            decode_slots, decode_mask = self._decode_slots(decode_tables, decode_lens)
        self.ctx = AttentionContext(
            slot_mapping=torch.tensor(slot_mapping, dtype=torch.long, device=dev),
            num_decode=len(decode_tables),
            decode_slots=decode_slots,
            decode_mask=decode_mask,
            prefills=prefills,
        )
        ids = torch.tensor(input_ids, dtype=torch.long, device=dev)
        pos = torch.tensor(positions, dtype=torch.long, device=dev)
        return ids, pos, logit_row

    def _decode_slots(
        self, tables: list[list[int]], lengths: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Slots each decode reads, [B, longest], padded with the null block; and the padding mask, if any.

        Built from block tables with tensor ops, so the Python work grows with blocks, not tokens.
        """
        bs, dev = self.block_size, self.device
        longest = max(lengths)
        num_blocks = -(-longest // bs)
        table = torch.full((len(tables), num_blocks), NULL_BLOCK, dtype=torch.long)
        for row, blocks in enumerate(tables):
            used = blocks[: -(-lengths[row] // bs)]
            table[row, : len(used)] = torch.tensor(used, dtype=torch.long)
        slots = (table[:, :, None] * bs + torch.arange(bs)).view(len(tables), -1)[:, :longest]
        if all(n == longest for n in lengths):
            return slots.to(dev), None
        pad = torch.arange(longest)[None, :] >= torch.tensor(lengths)[:, None]
        slots = slots.masked_fill(pad, NULL_BLOCK * bs)
        mask = torch.zeros(pad.shape, dtype=torch.float32).masked_fill_(pad, float("-inf"))
        return slots.to(dev), mask[:, None, None, :].to(dev)

    def _prefill_chunk(self, block_table: list[int], offset: int, start: int, end: int) -> PrefillChunk:
        n = end - start
        if start == 0:
            return PrefillChunk(offset, n, end, None, None)
        slots, _ = self._decode_slots([block_table], [end])
        slots = slots[0]
        # token i of the chunk sits at position start + i and sees keys 0 .. start + i
        mask = torch.ones(n, end, dtype=torch.bool, device=self.device).tril(start)
        return PrefillChunk(offset, n, end, slots, mask)

    # --- forward -------------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, batch: ScheduledBatch, all_logits: bool = False) -> tuple[torch.Tensor | None, list[int]]:
        """Run one step. Returns logits [rows, vocab] for the sequences in ``rows`` (batch indices).

        With ``all_logits`` (scoring, e.g. perplexity) it returns the logits of every packed token instead.
        """
        ids, pos, logit_row = self.prepare(batch)
        rows = [i for i, r in enumerate(logit_row) if r >= 0]
        keep = torch.tensor([logit_row[i] for i in rows], dtype=torch.long, device=self.device)
        if all_logits:
            rows, keep = list(range(ids.shape[0])), torch.arange(ids.shape[0], device=self.device)
        _local.runner = self
        try:
            if self.is_fused:
                stack = self._stack
                if self._batch_stack is not None and ids.shape[0] > SMALL_STEP_TOKENS:
                    stack = self._batch_stack
                assert stack is not None
                hidden = self._forward_fused(stack, ids, pos)
                logits = stack.lm_head(hidden[keep]) if rows else None
            else:
                logits = self._forward_hf(ids, pos, keep) if rows else None
                if not rows:
                    self._forward_hf(ids, pos, keep[:0])
        finally:
            _local.runner = None
            self.ctx = None
        return logits, rows

    def _forward_hf(self, ids: torch.Tensor, pos: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=ids[None], position_ids=pos[None], use_cache=False, logits_to_keep=keep)
        return out.logits[0]

    def _forward_fused(self, stack: _Stack, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        inner = self.model.model  # type: ignore[union-attr]
        x = inner.embed_tokens(ids).to(stack.dtype)
        cos, sin = inner.rotary_emb(x, pos[None])
        cos, sin = cos[0][:, None, :], sin[0][:, None, :]  # [T, 1, D]
        ctx, eps, t = self.ctx, self._eps, ids.shape[0]
        assert ctx is not None
        qd, kvd, hd, nh = self._q_dim, self._kv_dim, self.head_dim, self.num_heads
        for i, layer in enumerate(stack.layers):
            h = _rms_norm(x, layer.input_norm, eps)
            qkv = layer.qkv(h)
            qk = qkv[:, : qd + kvd].view(t, -1, hd)
            v = qkv[:, qd + kvd :].view(t, -1, hd)
            if layer.q_norm is not None and layer.k_norm is not None:
                qk = torch.cat((_rms_norm(qk[:, :nh], layer.q_norm, eps), _rms_norm(qk[:, nh:], layer.k_norm, eps)), 1)
            qk = _rotate(qk, cos, sin)  # queries and keys in one pass
            q, k = qk[:, :nh], qk[:, nh:]
            attn = paged_attention(q, k, v, i, self.kv, ctx, self.scale)
            x = x + layer.o(attn.view(t, qd))
            h = _rms_norm(x, layer.post_norm, eps)
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
        return _rms_norm(x, stack.final_norm, eps)


def resolve_kv_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    if name == "auto":
        return model_dtype
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"kv_dtype must be auto, float32, bfloat16 or float16, got {name!r}") from None
