"""Paged attention: each step's new K/V go into the pool, then every token attends over its sequence's slots.

Sequences are packed into one token dimension (no padding): decode tokens first, then prefill chunks. The
runner describes where each token reads and writes in an :class:`AttentionContext`, built once per step and
shared by every layer. The fused decoder calls :func:`paged_attention` directly; HF modules reach it through
the attention function registered as ``hearth_paged``.

**Row-invariant attention** (``AttentionContext.invariant``, deterministic mode): a query's output is bitwise the
same whether it is computed in a long prefill, a short chunk after a prefix-cache hit, or a decode step beside
any other sequences. Torch's SDPA is not: its blocking, and the GEMM panels beneath it, follow the number of
queries and the padded key length. :func:`invariant_attention` computes every query the same way in fp32: keys in
fixed blocks of :data:`KEY_BLOCK` (padding only ever adds exact zeros), query rows padded to a multiple of
:data:`ROW_MULTIPLE` (BLAS kernels handle a partial row block differently), the softmax denominator as an extra
ones column of V, and the blocks summed in sequence order (``cumsum``), so trailing padding changes nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from engine.model.kv_cache import KVCache

ATTN_IMPLEMENTATION = "hearth_paged"


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
    decode_lens: list[int] | None = None  # context length of each decode (read by the invariant routine)
    invariant: bool = False  # compute every query with :func:`invariant_attention`
    #: (first slot, length) when the step has one decode whose slots are one run of the pool: read as a view
    decode_span: tuple[int, int] | None = None


#: Keys are processed in blocks of this many (one fixed GEMM shape per block, whatever the context length).
KEY_BLOCK = 64
#: Query rows per (sequence, KV head) are padded to a multiple of this (full row blocks of the fp32 GEMM).
ROW_MULTIPLE = 4


def paged_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, kv: KVCache, ctx: AttentionContext, scale: float
) -> torch.Tensor:
    """Attention for a packed step. q: [T, H, D]; k, v: [T, KVH, D]. Returns [T, H, D].

    New K/V go into the pool first. Decodes are batched into one SDPA call over their slots (in fp32 on a CPU,
    where torch's bf16 SDPA is slow; the CPU pool is fp32 too, ``kv_cache.resolve_kv_dtype``): a lone decode whose
    slots are one run of the pool reads a view of it, others a gather. Each prefill chunk is one SDPA call, causal
    within the chunk and full over its cached prefix.
    """
    k_pool, v_pool = kv.k[layer], kv.v[layer]
    k_pool.index_copy_(0, ctx.slot_mapping, k.to(kv.dtype))
    v_pool.index_copy_(0, ctx.slot_mapping, v.to(kv.dtype))
    if ctx.invariant:
        return invariant_attention(q, k, v, k_pool, v_pool, ctx, scale)
    nd = ctx.num_decode
    decoded = None
    if nd:
        # on a CPU, decode attention runs in fp32: torch's bf16 attention there is several times slower
        # (docs/BENCHMARKS.md), and the CPU's KV pool is fp32 by default (engine/model/kv_cache.py)
        dt = torch.float32 if q.device.type == "cpu" else q.dtype
        keys = _decode_kv(k_pool, ctx).to(dt).transpose(1, 2)  # [B, KVH, L, D]
        values = _decode_kv(v_pool, ctx).to(dt).transpose(1, 2)
        mask = None if ctx.decode_mask is None else ctx.decode_mask.to(dt)
        if q.device.type == "cpu" and nd > 1:
            # each KV head's query heads as that head's rows (HF's repeat_kv order), so one plain SDPA call reads
            # each head's keys once for all its query heads. That beats SDPA's GQA when several decodes share the
            # step; a lone decode keeps SDPA's GQA, which wins at long contexts (docs/BENCHMARKS.md)
            kvh = keys.shape[1]
            grouped = q[:nd].to(dt).view(nd, kvh, -1, q.shape[-1])
            o = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=mask, scale=scale)
            decoded = o.view(nd, -1, q.shape[-1])
        else:
            o = F.scaled_dot_product_attention(
                q[:nd].unsqueeze(2).to(dt), keys, values, attn_mask=mask, scale=scale, enable_gqa=True
            )
            decoded = o.squeeze(2)
        if nd == q.shape[0]:  # a decode-only step
            return decoded.to(q.dtype)
    out = torch.empty_like(q)
    if decoded is not None:
        out[:nd] = decoded
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


def _decode_kv(pool: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
    """The keys (or values) the step's decodes read, [B, L, KVH, D]: a view where one run holds them all."""
    if ctx.decode_span is not None:
        start, length = ctx.decode_span
        return pool[start : start + length].unsqueeze(0)
    slots = ctx.decode_slots
    assert slots is not None
    return pool.index_select(0, slots.reshape(-1)).view(*slots.shape, *pool.shape[1:])


def invariant_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    ctx: AttentionContext,
    scale: float,
) -> torch.Tensor:
    """:func:`paged_attention` with each query's result independent of the step around it (see the module doc).

    Keys and values are read as stored in the pool (in the KV dtype), also for a chunk that wrote them this step.
    """
    out = torch.empty_like(q)
    nd = ctx.num_decode
    if nd:
        assert ctx.decode_slots is not None and ctx.decode_lens is not None
        qpos = torch.tensor(ctx.decode_lens, device=q.device)[:, None] - 1
        keys, values = k_pool[ctx.decode_slots], v_pool[ctx.decode_slots]
        out[:nd] = blocked_attention(q[:nd, None], keys, values, qpos, scale)[:, 0]
    for chunk in ctx.prefills:
        s, n = chunk.start, chunk.num_tokens
        if chunk.slots is None:
            keys, values = k[s : s + n].to(k_pool.dtype), v[s : s + n].to(v_pool.dtype)
        else:
            keys, values = k_pool[chunk.slots], v_pool[chunk.slots]
        qpos = torch.arange(chunk.context_len - n, chunk.context_len, device=q.device)[None]
        out[s : s + n] = blocked_attention(q[None, s : s + n], keys[None], values[None], qpos, scale)[0]
    return out


def blocked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qpos: torch.Tensor, scale: float
) -> torch.Tensor:
    """Causal attention of G sequences, each query bitwise independent of the others and of padding.

    Args:
        q: [G, n, H, D] queries; k, v: [G, L, KVH, D] keys and values of each sequence (padding past a
            sequence's length must be finite: it is masked).
        qpos: [G, n] the position of each query; it sees keys 0 .. qpos.

    Returns:
        [G, n, H, D] in ``q``'s dtype.
    """
    g, n, h, d = q.shape
    length, kvh = k.shape[1], k.shape[2]
    rep = h // kvh
    rows = n * rep
    padded_rows = -(-rows // ROW_MULTIPLE) * ROW_MULTIPLE
    nb = -(-length // KEY_BLOCK)
    f32, dev = torch.float32, q.device
    qg = torch.zeros(g, kvh, padded_rows, d, dtype=f32, device=dev)
    qg[:, :, :rows] = q.to(f32).view(g, n, kvh, rep, d).permute(0, 2, 1, 3, 4).reshape(g, kvh, rows, d)
    kb = torch.zeros(g, kvh, nb * KEY_BLOCK, d, dtype=f32, device=dev)
    kb[:, :, :length] = k.to(f32).transpose(1, 2)
    vb = torch.zeros(g, kvh, nb * KEY_BLOCK, d + 1, dtype=f32, device=dev)
    vb[:, :, :length, :d] = v.to(f32).transpose(1, 2)
    vb[:, :, :length, d] = 1.0  # the softmax denominator comes out of the same GEMM
    kb = kb.view(g, kvh, nb, KEY_BLOCK, d)
    vb = vb.view(g, kvh, nb, KEY_BLOCK, d + 1)
    scores = torch.matmul(qg[:, :, None], kb.transpose(-1, -2)) * scale  # [G, KVH, nb, rows, KEY_BLOCK]
    pos = torch.zeros(g, padded_rows, dtype=torch.long, device=dev)  # padding rows see key 0 (no NaN)
    pos[:, :rows] = qpos.repeat_interleave(rep, dim=1)
    key = torch.arange(nb * KEY_BLOCK, device=dev).view(nb, 1, KEY_BLOCK)
    hidden = key[None] > pos[:, None, :, None]  # [G, nb, rows, KEY_BLOCK]
    scores = scores.masked_fill(hidden[:, None], float("-inf"))
    top = scores.amax(dim=(2, 4), keepdim=True)
    weights = torch.exp(scores - top)
    parts = torch.matmul(weights, vb)  # [G, KVH, nb, rows, D + 1], one fixed-shape GEMM per key block
    total = parts.cumsum(dim=2)[:, :, -1]  # blocks summed in order: trailing zero blocks change nothing
    o = (total[..., :d] / total[..., d:])[:, :, :rows]
    return o.view(g, kvh, n, rep, d).permute(0, 2, 1, 3, 4).reshape(g, n, h, d).to(q.dtype)


# --- HF modules ----------------------------------------------------------------------------------------------
# HF calls the registered function with its own arguments only, so the step's pool and context travel in a
# thread-local, set around the forward pass by ``step_context``.
_local = threading.local()


@contextmanager
def step_context(kv: KVCache, ctx: AttentionContext) -> Iterator[None]:
    """Make ``kv`` and ``ctx`` the ones ``hearth_paged`` attention uses on this thread, for one step."""
    _local.step = (kv, ctx)
    try:
        yield
    finally:
        _local.step = None


def _hf_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """HF attention-interface adapter: [1, H, T, D] in, [1, T, H, D] out, through ``paged_attention``."""
    kv, ctx = _local.step
    q = query[0].transpose(0, 1)
    k = key[0].transpose(0, 1)
    v = value[0].transpose(0, 1)
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    out = paged_attention(q, k, v, module.layer_idx, kv, ctx, scale)
    return out.unsqueeze(0), None


def register_hf_attention() -> None:
    """Register ``hearth_paged`` with transformers' attention interface."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, _hf_attention)
