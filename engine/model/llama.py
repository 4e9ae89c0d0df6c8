"""The fused Llama-family decoder (llama, mistral, qwen2, qwen3): our own layer loop over the HF weights.

Q/K/V and gate/up projections are fused into single matmuls. On a small model most of a decode step is per-op
overhead, so fewer, larger ops are what make a single stream fast. Which configs run here is decided by
:func:`engine.architectures.execution_path`.

Weights are built into one :class:`_Stack`, in the model dtype. Each linear layer comes from a builder
(``engine/model/kernels.py``) that may hold more than one kernel for it and pick one per step size by measurement
(``engine/model/autotune.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from engine.architectures import attention_shape
from engine.loading.native import is_stand_in, stand_in
from engine.model.attention import AttentionContext, paged_attention
from engine.model.autotune import Kernel
from engine.model.cuda_graphs import GraphedDecode
from engine.model.kv_cache import NULL_BLOCK, KVCache
from engine.model.layer_spec import LayerShape, LayerWeights, linear_spec
from engine.model.native import EXTENSION, NativeDecode, native_problem
from engine.model.quantization import DenseLinear

#: ``linear(role, names, weight, bias)``: role is qkv/o/gate_up/down/lm_head, names the HF parameters fused in it
LinearFactory = Callable[[str, list[str], torch.Tensor, torch.Tensor | None], Kernel]


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as HF's LlamaRMSNorm defines it, in torch's fused kernel (fp32 statistics)."""
    return F.rms_norm(x, weight.shape, weight, eps)


def _signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """``sin`` with its first half negated, so that :func:`_rotate` needs no negation per layer."""
    half = sin.shape[-1] // 2
    return torch.cat((sin[..., :half].neg(), sin[..., half:]), dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding in HF's rotate-half layout, for queries and keys at once ([T, heads, D]).

    HF's ``x * cos + cat(-x2, x1) * sin`` as ``x * cos + cat(x2, x1) * signed_sin``: bitwise the same (a sign
    moves from one factor to the other), in two ops fewer.
    """
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), signed_sin)


def _row_slots(ctx: AttentionContext, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The KV slots each token row of a step reads, [rows, longest] (padding past a row's length is never read),
    and how many: a decode reads its sequence's slots; token i of a prefill chunk (or a draft being verified) the
    slots of its context up to itself."""
    lens: list[int] = list(ctx.decode_lens or [])[: ctx.num_decode]
    parts: list[torch.Tensor] = []
    if ctx.num_decode:
        assert ctx.decode_slots is not None
        parts.append(ctx.decode_slots)
    for chunk in ctx.prefills:
        s, n, length = chunk.start, chunk.num_tokens, chunk.context_len
        context = ctx.slot_mapping[s : s + n] if chunk.slots is None else chunk.slots
        parts.append(context[None, :].expand(n, -1))
        lens.extend(range(length - n + 1, length + 1))
    if len(parts) == 1:
        table = parts[0]
    else:
        longest = max(p.shape[1] for p in parts)
        table = torch.zeros(rows, longest, dtype=torch.long, device=ctx.slot_mapping.device)
        at = 0
        for p in parts:
            table[at : at + p.shape[0], : p.shape[1]] = p
            at += p.shape[0]
    return table, torch.tensor(lens, dtype=torch.long)


@dataclass(slots=True)
class _FusedLayer:
    input_norm: torch.Tensor
    qkv: Kernel
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o: Kernel
    post_norm: torch.Tensor
    gate_up: Kernel
    down: Kernel


@dataclass(slots=True)
class _LayerNorms:
    """A decoder layer's norm weights, to build fused layers of any dtype from."""

    input_norm: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    post_norm: torch.Tensor

    @classmethod
    def of(cls, layer: Any) -> _LayerNorms:
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
        linear: LinearFactory,
        index: int,
        qkv: torch.Tensor,
        qkv_bias: torch.Tensor | None,
        o: torch.Tensor,
        gate_up: torch.Tensor,
        down: torch.Tensor,
    ) -> _FusedLayer:
        def names(kind: str, *projs: str) -> list[str]:
            return [f"model.layers.{index}.{kind}.{p}_proj.weight" for p in projs]

        return _FusedLayer(
            self.input_norm,
            linear("qkv", names("self_attn", "q", "k", "v"), qkv, qkv_bias),
            self.q_norm,
            self.k_norm,
            linear("o", names("self_attn", "o"), o, None),
            self.post_norm,
            linear("gate_up", names("mlp", "gate", "up"), gate_up, None),
            linear("down", names("mlp", "down"), down, None),
        )


@dataclass(slots=True)
class _Stack:
    """Everything a fused forward pass reads, in one compute dtype."""

    layers: list[_FusedLayer]
    final_norm: torch.Tensor
    lm_head: Kernel
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        linears = [m for layer in self.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        return sum(m.nbytes for m in linears) + self.lm_head.nbytes


def _stack_rows(weights: list[torch.Tensor]) -> torch.Tensor:
    """The weights stacked along their rows; weights kept in a GGUF file (stand-ins) stack to a stand-in, since
    only their shape is read (the kernel builder takes their blocks from the file)."""
    if any(is_stand_in(w) for w in weights):
        return stand_in((sum(int(w.shape[0]) for w in weights), int(weights[0].shape[1])), weights[0].dtype)
    return torch.cat(weights)


def _frozen(t: torch.Tensor) -> torch.nn.Parameter:
    return torch.nn.Parameter(t, requires_grad=False)


class FusedDecoder:
    """The decoder of an HF Llama-family model, run as fused layers over the paged KV pool.

    Args:
        model: the HF causal LM; its embedding and rotary modules are reused as they are.
        linear: builds one linear layer (see ``LinearFactory`` and ``engine/model/kernels.py``).
        quantized: the linears are quantized; the HF modules' dense weights are then dropped to free memory.
            Otherwise the HF modules are pointed at views of the fused tensors, so nothing is stored twice and
            the HF model stays usable.
        layer_built: ``layer_built(done, total)`` after each layer is built, for a load's progress.
    """

    def __init__(self, model: Any, linear: LinearFactory, quantized: bool,
                 layer_built: Callable[[int, int], None] | None = None) -> None:
        self._inner = model.model
        self._quantized = quantized
        self._config = model.config
        #: native decode steps (one C++ call for every layer), once ``enable_native`` is called
        self.native: NativeDecode | None = None
        #: decode steps replayed from CUDA graphs, once ``enable_graphs`` is called
        self.graphs: GraphedDecode | None = None
        self.num_heads, self.num_kv_heads, self.head_dim = attention_shape(model.config)
        self._q_dim = self.num_heads * self.head_dim
        self._kv_dim = self.num_kv_heads * self.head_dim
        self._scale = self.head_dim**-0.5
        self._eps = float(model.config.rms_norm_eps)
        dtype = next(model.parameters()).dtype
        layers: list[_FusedLayer] = []
        with torch.no_grad():
            for index, layer in enumerate(self._inner.layers):
                attn, mlp = layer.self_attn, layer.mlp
                qkv = _stack_rows([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
                bias = None
                if attn.q_proj.bias is not None:
                    bias = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
                gate_up = _stack_rows([mlp.gate_proj.weight, mlp.up_proj.weight])
                norms = _LayerNorms.of(layer)
                weights = (qkv, bias, attn.o_proj.weight, gate_up, mlp.down_proj.weight)
                layers.append(norms.layer(linear, index, *weights))
                if quantized:
                    for module in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj):
                        module.weight = _frozen(torch.empty(0, dtype=dtype))
                    for module in (mlp.gate_proj, mlp.up_proj, mlp.down_proj):
                        module.weight = _frozen(torch.empty(0, dtype=dtype))
                else:
                    q_dim = attn.q_proj.weight.shape[0]
                    kv_dim = attn.k_proj.weight.shape[0]
                    attn.q_proj.weight = _frozen(qkv[:q_dim])
                    attn.k_proj.weight = _frozen(qkv[q_dim : q_dim + kv_dim])
                    attn.v_proj.weight = _frozen(qkv[q_dim + kv_dim :])
                    inter = mlp.gate_proj.weight.shape[0]
                    mlp.gate_proj.weight = _frozen(gate_up[:inter])
                    mlp.up_proj.weight = _frozen(gate_up[inter:])
                if layer_built is not None:
                    layer_built(index + 1, len(self._inner.layers))
            head = model.lm_head
            final_norm = self._inner.norm.weight
            lm_head = linear("lm_head", ["lm_head.weight"], head.weight, head.bias)
            self._stack = _Stack(layers, final_norm, lm_head, dtype)

    @property
    def lm_head(self) -> Kernel:
        """The kernel of the LM head."""
        return self._stack.lm_head

    def block_types(self) -> list[str]:
        """The GGUF block types the layers run, sorted (the "file" level; empty for other kernels)."""
        kernels = [k for layer in self._stack.layers for k in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        return sorted({s.name for k in [*kernels, self._stack.lm_head] for s in getattr(k, "segments", ())})

    @property
    def extra_bytes(self) -> int:
        """Bytes of weights held outside the HF model's parameters (quantized, packed or dense copies).

        Dense kernels over HF parameters count nothing: the dense layers of an unquantized model and the dense
        lm_head are views of them (``TunedLinear.nbytes`` leaves out such shared kernels too).
        """
        stack = self._stack
        linears = [m for layer in stack.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        total = sum(m.nbytes for m in linears if self._quantized or not isinstance(m, DenseLinear))
        return total + (0 if isinstance(stack.lm_head, DenseLinear) else stack.lm_head.nbytes)

    def forward(
        self, ids: torch.Tensor, pos: torch.Tensor, kv: KVCache, ctx: AttentionContext, keep: torch.Tensor | None
    ) -> torch.Tensor | None:
        """Run every layer over the packed step (writing its K/V); logits of the ``keep`` rows, if any."""
        stack = self._stack
        if self.graphs is not None and ctx.num_decode == ids.shape[0]:
            logits = self.graphs.run(ids, pos, ctx)
            if logits is not None:
                return None if keep is None else logits[keep]
        hidden = None
        decode_only = ctx.num_decode == ids.shape[0] and not ctx.prefills and not ctx.invariant
        if self.native is not None and (decode_only or (self.native.every_step and ctx.invariant)):
            hidden = self._native_layers(self.native, stack, ids, pos, kv, ctx)
        if hidden is None:
            hidden = self._layers(stack, ids, pos, kv, ctx)
        return None if keep is None else stack.lm_head(hidden[keep])

    def hidden_states(self, ids: torch.Tensor, pos: torch.Tensor, kv: KVCache, ctx: AttentionContext) -> torch.Tensor:
        """Every token's final-normed state of a packed step (eager, writing its K/V): what a decoder embedder
        pools (``engine/model/embedding.py``)."""
        return self._layers(self._stack, ids, pos, kv, ctx)

    # --- CUDA graphs (engine/model/cuda_graphs.py) ----------------------------------------------------------------
    def enable_graphs(self, kv: KVCache, max_batch: int, max_context: int, capture: bool = True) -> GraphedDecode:
        """Replay decode-only steps from CUDA graphs from now on (captured lazily per batch and context bucket)."""
        stack = self._stack

        def step(ids: torch.Tensor, pos: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
            return stack.lm_head(self._layers(stack, ids, pos, kv, ctx))

        null_slot = NULL_BLOCK * kv.block_size
        self.graphs = GraphedDecode(step, kv.k.device, stack.dtype, null_slot, max_batch, max_context, capture)
        return self.graphs

    # --- native decode steps (engine/model/native.py) ----------------------------------------------------------
    def enable_native(self, mode: str, kv: KVCache, signature: str, every_step: bool = False) -> str | None:
        """Run decode-only steps natively in ``mode`` from now on (per batch bucket); why not, if they cannot.

        The extension is loaded now, or built in the background on a machine that has no build yet. With
        ``every_step`` (deterministic mode) every step runs natively, from the first: only if it is loaded now.
        """
        problem = native_problem(kv.k.device, kv.dtype) or EXTENSION.start(wait=False)
        if problem == "building" and every_step:
            return "the native step is being built; deterministic mode runs eager until the next load"
        if problem not in (None, "building"):
            return problem
        shape = LayerShape(self._q_dim, self._kv_dim, self.head_dim, self.num_heads, self._eps, self._scale)
        hidden = int(self._stack.final_norm.shape[0])
        layout = (len(self._stack.layers), self.num_kv_heads, self.head_dim)
        self.native = NativeDecode(
            mode, shape, self._native_weights, hidden, self._stack.dtype, layout, self._rotary, self._eager_trial,
            signature, every_step,
        )
        return None

    def _native_layers(
        self, native: NativeDecode, stack: _Stack, ids: torch.Tensor, pos: torch.Tensor, kv: KVCache,
        ctx: AttentionContext,
    ) -> torch.Tensor | None:
        """The layers of a step in one native call (any step in ``every_step`` mode, else decode-only ones);
        None while its bucket runs eager."""
        t = ids.shape[0]
        handle = native.weights_for(t)
        if handle is None:
            return None
        slots, lens = _row_slots(ctx, t)
        x = self._inner.embed_tokens(ids).to(stack.dtype)
        cos, sin = self._rotary(x, pos)
        try:
            x = native.run(handle, x, cos, sin, kv.k, kv.v, ctx.slot_mapping, slots, lens)
        except Exception as exc:  # noqa: BLE001 -- the step reruns eager (rewriting the same K/V slots)
            native.fail(t, exc)
            return None
        return _rms_norm(x, stack.final_norm, self._eps)

    def _native_weights(self, bucket: int) -> list[LayerWeights] | None:
        """Every layer's weights as the native step takes them, for one bucket; None if a kernel has no native form."""
        out = []
        for layer in self._stack.layers:
            kernels = (layer.qkv, layer.o, layer.gate_up, layer.down)
            qkv, o, gate_up, down = [linear_spec(k, bucket, self._stack.dtype) for k in kernels]
            if qkv is None or o is None or gate_up is None or down is None:
                return None
            out.append(LayerWeights(layer.input_norm, qkv, layer.q_norm, layer.k_norm, o, layer.post_norm, gate_up, down))
        return out

    def _eager_trial(self, rows: int, length: int) -> Callable[[], torch.Tensor]:
        """The eager layers of one decode step of ``rows`` sequences, ``length`` tokens each, over a scratch KV pool:
        what ``native="auto"`` times the native step against (on the same shapes)."""
        block = 16
        first = (NULL_BLOCK + 1) * block  # the null block stays untouched
        kv = KVCache(self._config, -(-(first + length + rows) // block), block, torch.float32, torch.device("cpu"))
        kv.k.zero_()
        kv.v.zero_()
        prefix = torch.arange(first, first + length - 1)
        slot_mapping = torch.arange(first + length - 1, first + length - 1 + rows)
        slots = torch.cat([prefix.repeat(rows, 1), slot_mapping[:, None]], dim=1)
        span = (first, length) if rows == 1 else None  # a lone decode reads one run of the pool, as in a real step
        ctx = AttentionContext(slot_mapping, rows, slots, None, [], decode_lens=[length] * rows, decode_span=span)
        x = torch.randn(rows, int(self._stack.final_norm.shape[0])).to(self._stack.dtype)
        cos, sin = self._rotary(x, torch.full((rows,), length - 1, dtype=torch.long))
        return functools.partial(self._decoder_layers, self._stack, x, cos, sin, kv, ctx)

    def _rotary(self, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of each token's position, [T, 1, D]."""
        cos, sin = self._inner.rotary_emb(x, pos[None])
        return cos[0][:, None, :], sin[0][:, None, :]

    def _layers(
        self, stack: _Stack, ids: torch.Tensor, pos: torch.Tensor, kv: KVCache, ctx: AttentionContext
    ) -> torch.Tensor:
        """The eager step: embedding, every decoder layer, final norm."""
        x = self._inner.embed_tokens(ids).to(stack.dtype)
        cos, sin = self._rotary(x, pos)
        return _rms_norm(self._decoder_layers(stack, x, cos, sin, kv, ctx), stack.final_norm, self._eps)

    def _decoder_layers(
        self, stack: _Stack, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: KVCache,
        ctx: AttentionContext,
    ) -> torch.Tensor:
        """Every decoder layer over the packed step's hidden states (writing its K/V): the layer math's one Python
        form, which ``csrc/decode_step.cpp`` mirrors natively."""
        sin = _signed_sin(sin)
        eps, t = self._eps, x.shape[0]
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
            attn = paged_attention(q, k, v, i, kv, ctx, self._scale)
            x = x + layer.o(attn.reshape(t, qd))
            h = _rms_norm(x, layer.post_norm, eps)
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
        return x
