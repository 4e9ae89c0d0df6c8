"""Runs the model over a scheduled batch: packs the step's tokens, picks the execution path, returns logits.

Two execution paths share the same KV pool (``kv_cache.py``) and paged attention (``attention.py``); the model
registry (``architectures.py``) says which one a config takes:

* **fused**: our Llama-family decoder (``llama.py``), with fused Q/K/V and gate/up matmuls;
* **HF**: the model's own HF modules over the packed batch, with ``hearth_paged`` attention registered in.

Sequences are packed into one token dimension (no padding): decode tokens first, then prefill chunks.

With ``deterministic`` (on a CPU) a greedy reply does not depend on what else shares a step or on prefix-cache
hits: the fused layers run row-invariant kernels only (``autotune.py``) and attention runs its row-invariant
routine (``attention.invariant_attention``). The HF-module path gets the attention only.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import psutil
import torch

from engine.api import WEIGHT_LEVELS, ModelLoadError
from engine.architectures import execution_path
from engine.loading.gguf_weights import GgufWeights, source_of
from engine.loading.native import BLOCKS_IN_FILE_ATTR, is_stand_in
from engine.model.attention import (
    ATTN_IMPLEMENTATION,
    AttentionContext,
    PrefillChunk,
    register_hf_attention,
    step_context,
)
from engine.model.autotune import Choice, Tuner
from engine.model.cuda_graphs import GraphedDecode
from engine.model.gguf_linear import GgufEmbedding, GgufLinear
from engine.model.kernel_timing import BackgroundTuning
from engine.model.kernels import KernelBuilder
from engine.model.kv_cache import NULL_BLOCK, KVCache
from engine.model.llama import FusedDecoder
from engine.model.native import file_problem
from engine.model.plan_cache import PlanCache
from engine.model.quantization import DenseLinear, Linear, make_linear
from engine.system.memory import keep_freed_heap, step_heap

log = logging.getLogger("engine")

#: Set to "off" to skip kernel measurement: every layer then runs its level's stored kernel. Unset, a shape whose
#: plan is not cached runs untimed and is measured after the load, in the background, for the next load
#: (:meth:`ModelRunner.tune_in_background`); "load" measures it during the load, as the layers are built.
AUTOTUNE_ENV = "HEARTH_AUTOTUNE"
#: Second kernels for a shape (e.g. a dense copy beside int4) may take at most this share of available RAM.
EXTRA_KERNEL_RAM_FRACTION = 0.1


class StepSequence(Protocol):
    """What the runner reads of a scheduled sequence."""

    @property
    def token_ids(self) -> list[int]: ...
    @property
    def block_table(self) -> list[int]: ...
    @property
    def num_computed_tokens(self) -> int: ...


class StepBatch(Protocol):
    """What the runner reads of a step's batch (``engine.core.scheduler.ScheduledBatch``)."""

    @property
    def seqs(self) -> Sequence[StepSequence]: ...
    @property
    def num_new_tokens(self) -> Sequence[int]: ...
    def __len__(self) -> int: ...


class _QuantizedModule(torch.nn.Module):
    """Stands in for an ``nn.Linear`` inside HF modules when the HF-module path is quantized."""

    def __init__(self, linear: Linear) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        return self.linear(x.reshape(-1, shape[-1])).view(*shape[:-1], -1)


class ModelRunner:
    """Owns the model, the KV pool and the per-step tensors.

    ``quantization`` is a level name; only the weight levels ("int8", "int4") change the weights here, every
    other level runs the weights dense, in the dtype the model was loaded at.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        num_blocks: int,
        block_size: int,
        kv_dtype: torch.dtype,
        quantization: str = "fp32",
        quant_backend: str = "auto",
        deterministic: bool = False,
        native: str = "auto",
        layer_built: Callable[[int, int], None] | None = None,
    ):
        self.model = model
        self.config: Any = model.config
        param = next(model.parameters())
        self.device = param.device
        self.dtype = param.dtype
        self.block_size = block_size
        self.kv = KVCache(self.config, num_blocks, block_size, kv_dtype, self.device)
        keep_freed_heap()  # a step's temporaries stay in the heap for the next layer (engine/system/memory.py)
        self.ctx: AttentionContext | None = None
        self.is_fused = execution_path(self.config) == "fused"
        #: "int8" or "int4"; None when the weights stay dense
        self.weight_quantization: str | None = quantization if quantization in WEIGHT_LEVELS else None
        self._quant_backend = quant_backend
        self._native_mode = native  # "off" also keeps int4 layers off the extension's VNNI kernel
        #: row-invariant kernels and attention, so greedy replies repeat whatever shares the step (CPU only)
        self.deterministic = deterministic and self.device.type == "cpu"
        self._native_off = "not enabled"  # why decode steps do not run natively (``enable_native``)
        if deterministic and not self.deterministic:
            log.warning("deterministic mode is implemented for the CPU only; %s replies may vary", self.device)
        self._decoder: FusedDecoder | None = None
        self._tuner: Tuner | None = None  # the load's tuner, while shapes it left untimed wait to be measured
        #: the kernel plans measured (or read from the cache) for this model, for ``python -m engine info``
        self.kernel_choices: list[Choice] = []
        #: how many fused weights came straight from the GGUF file's blocks
        self.weights_from_gguf = 0
        file = self._take_file_blocks(model) if self.weight_quantization == "file" else None
        if self.is_fused:
            builder = self._kernel_builder(model, file)
            self._decoder = FusedDecoder(model, builder, self.weight_quantization is not None, layer_built)
            self.kernel_choices = builder.tuner.choices if builder.tuner is not None else []
            self.weights_from_gguf = builder.from_file
        else:
            if self.weight_quantization is not None:
                self._quantize_hf_modules(layer_built)
            register_hf_attention()
            model.set_attn_implementation(ATTN_IMPLEMENTATION)  # type: ignore[operator]
        log.info(
            "model runner: %s path%s, %d KV blocks of %d tokens (%.1f MB, %s)",
            "fused" if self.is_fused else "HF-module",
            f" ({self.weights_from_gguf} weights from GGUF blocks)" if self.weights_from_gguf else "",
            num_blocks,
            block_size,
            self.kv.nbytes / 1e6,
            kv_dtype,
        )

    def _signature(self) -> str:
        """Names the model and its kernels, for the native step's verdict cache."""
        c = self.config
        level = self.weight_quantization or str(self.dtype)
        if self.weight_quantization == "file" and self._decoder is not None:  # a Q4_0 file is not a Q4_K_M file
            level += " " + "+".join(self._decoder.block_types())
        return f"{c.model_type} {c.hidden_size}x{c.num_hidden_layers} {level}"

    def enable_native(self, mode: str) -> str:
        """Native decode steps in ``mode`` (``EngineConfig.native``); returns how steps run, for the log."""
        if self._decoder is not None:
            self._decoder.native = None
        why: str | None
        if mode == "off":
            why = "native=off"
        elif self._decoder is None:
            why = "the HF-module path"
        elif mode == "auto" and self.dtype == torch.float32 and self.weight_quantization is None:
            why = "fp32 runs torch's own ops, token for token as HF (native='on' runs it natively)"
        else:
            try:
                why = self._decoder.enable_native(mode, self.kv, self._signature(), every_step=self.deterministic)
            except Exception as exc:  # noqa: BLE001 -- a speed-up that cannot start must not stop the model loading
                why = f"the native step did not start ({type(exc).__name__}: {exc})"
            if why is None:
                return self.native_status
        self._native_off = why
        log.info("native decode steps off: %s", why)
        return self.native_status

    @property
    def native_status(self) -> str:
        """How decode steps run natively now: per bucket once decided, or why they do not."""
        native = None if self._decoder is None else self._decoder.native
        return f"eager: {self._native_off}" if native is None else native.status()

    def enable_cuda_graphs(self, max_batch: int, max_context: int, capture: bool = True) -> str:
        """Replay decode steps from CUDA graphs (``EngineConfig.cuda_graphs``); returns how steps run, for the log.

        ``capture=False`` runs the graphs' static buffers and padding eagerly, on any device (tests on a CPU).
        """
        if capture and self.device.type != "cuda":
            return f"no CUDA graphs on {self.device.type}"
        if self._decoder is None:
            return "no CUDA graphs: the HF-module path runs eager"
        if self.deterministic:
            return "no CUDA graphs in deterministic mode"
        self._decoder.enable_graphs(self.kv, max_batch, max_context, capture)
        return "decode steps replayed from CUDA graphs, per batch and context bucket"

    @property
    def cuda_graphs(self) -> GraphedDecode | None:
        """The CUDA-graph replay of decode steps, when ``enable_cuda_graphs`` turned it on."""
        return None if self._decoder is None else self._decoder.graphs

    # --- weights -----------------------------------------------------------------------------------------------
    def _kernel_builder(self, model: torch.nn.Module, file: GgufWeights | None = None) -> KernelBuilder:
        """The fused layers' kernel builder: GGUF blocks where the file has them (``file`` at the "file" level),
        plans measured per shape."""
        tuner = None
        setting = os.environ.get(AUTOTUNE_ENV, "").strip().lower()
        timed = setting not in ("0", "off", "no", "false")
        if timed or self.deterministic:  # deterministic mode checks row invariance even when nothing is timed
            budget = int(psutil.virtual_memory().available * EXTRA_KERNEL_RAM_FRACTION)
            layers = int(self.config.num_hidden_layers)
            cache = PlanCache() if timed else None
            tuner = Tuner(self.dtype, cache, budget, layers, deterministic=self.deterministic, timed=timed,
                          defer=setting != "load")
        self._tuner = tuner
        gguf = file or (source_of(model) if self.weight_quantization is not None and self.device.type == "cpu" else None)
        return KernelBuilder(
            self.weight_quantization, self.dtype, self.device, self._quant_backend, gguf, tuner, self._native_mode
        )

    def tune_in_background(self, busy: Callable[[], bool]) -> BackgroundTuning | None:
        """Measure the shapes this load ran untimed (their plans were not cached) on a thread of their own while
        ``busy()`` is False, caching the plans for the next load; None when there are none."""
        tuner, self._tuner = self._tuner, None
        if tuner is None or not tuner.pending:
            return None
        background = BackgroundTuning(tuner, busy)
        background.start()
        return background

    def _take_file_blocks(self, model: torch.nn.Module) -> GgufWeights:
        """The "file" level: check its kernels can run, and look tokens up in the embedding's own blocks; returns
        the file's weights (whose reads a tied head shares with the embedding)."""
        if not self.is_fused or self.device.type != "cpu" or not getattr(model, BLOCKS_IN_FILE_ATTR, False):
            raise ModelLoadError(
                "The 'file' precision runs a GGUF file's own blocks on the CPU, for Llama-family models read with "
                "their weights left in the file; choose int4, int8 or bf16 for this model."
            )
        problem = file_problem(wait=False)  # LLM has already turned a load during the build to another level
        if problem is not None:
            raise ModelLoadError(
                f"The 'file' precision needs the native block kernels, which cannot run here: {problem}. Choose "
                "int4 or bf16 instead."
            )
        gguf = source_of(model)
        if gguf is None:
            raise ModelLoadError("The GGUF file's tensor layout is not one the engine reads; choose int4 or bf16.")
        inner: Any = model.model
        if is_stand_in(inner.embed_tokens.weight):
            blocks = gguf.blocks(["model.embed_tokens.weight"])[0]
            inner.embed_tokens = GgufEmbedding(blocks, self.dtype)
        return gguf

    def _linear(self, weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
        if self.weight_quantization is None:
            return DenseLinear(weight, bias)
        return make_linear(weight, bias, self.weight_quantization, self.device, self._quant_backend)

    def _quantize_hf_modules(self, layer_built: Callable[[int, int], None] | None = None) -> None:
        """Swap every ``nn.Linear`` inside the decoder layers for a quantized one (HF-module path); ``layer_built(done,
        total)`` after each layer."""
        inner: Any = self.model.model
        with torch.no_grad():
            for index, layer in enumerate(inner.layers):
                for parent in list(layer.modules()):
                    for name, child in list(parent.named_children()):
                        if isinstance(child, torch.nn.Linear):
                            linear = self._linear(child.weight, child.bias)
                            setattr(parent, name, _QuantizedModule(linear))
                if layer_built is not None:
                    layer_built(index + 1, len(inner.layers))

    @property
    def weights_bytes(self) -> int:
        """Bytes of weights in memory: embedding, norms, head, and the (possibly quantized) decoder layers."""
        seen: set[int] = set()
        total = 0
        for t in list(self.model.parameters()) + list(self.model.buffers()):
            if t.data_ptr() not in seen and t.numel() and not is_stand_in(t):
                seen.add(t.data_ptr())
                total += t.nbytes
        for module in self.model.modules():
            if isinstance(module, _QuantizedModule):
                total += module.linear.nbytes
        if self._decoder is not None:
            total += self._decoder.extra_bytes
            head = self._decoder.lm_head
            if isinstance(head, GgufLinear):  # a tied head's blocks are the embedding's, counted above
                total -= sum(b.data.nbytes for b in head.segments if b.data.data_ptr() in seen)
        return total

    # --- step inputs ---------------------------------------------------------------------------------------------
    def _slots(self, block_table: list[int], start: int, end: int) -> list[int]:
        bs = self.block_size
        return [block_table[p // bs] * bs + p % bs for p in range(start, end)]

    def prepare(self, batch: StepBatch) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
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
        span = self._span(decode_tables[0], decode_lens[0]) if len(decode_tables) == 1 else None
        self.ctx = AttentionContext(
            slot_mapping=torch.tensor(slot_mapping, dtype=torch.long, device=dev),
            num_decode=len(decode_tables),
            decode_slots=decode_slots,
            decode_mask=decode_mask,
            prefills=prefills,
            decode_lens=decode_lens,
            invariant=self.deterministic,
            decode_span=span,
        )
        ids = torch.tensor(input_ids, dtype=torch.long, device=dev)
        pos = torch.tensor(positions, dtype=torch.long, device=dev)
        return ids, pos, logit_row

    def _span(self, blocks: list[int], length: int) -> tuple[int, int] | None:
        """(first slot, length) when the first ``length`` tokens of ``blocks`` lie in consecutive blocks.

        Usual for a lone chat: the block manager hands out free blocks lowest first and takes back a finished
        sequence's in reverse, so a sequence, and the next turn after its cached prefix, grow into adjacent blocks.
        """
        n = -(-length // self.block_size)
        first = blocks[0]
        if blocks[n - 1] - first != n - 1 or blocks[:n] != list(range(first, first + n)):
            return None
        return first * self.block_size, length

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
    def run(self, batch: StepBatch, all_logits: bool = False) -> tuple[torch.Tensor | None, list[int]]:
        """Run one step. Returns logits [rows, vocab] for the sequences in ``rows`` (batch indices; a sequence
        verifying a speculative draft, ``batch.num_draft_tokens``, appears once per drafted token plus one).

        With ``all_logits`` (scoring, e.g. perplexity) it returns the logits of every packed token instead.
        """
        ids, pos, logit_row = self.prepare(batch)
        ctx = self.ctx
        assert ctx is not None
        # a speculative draft of d tokens needs the logits of its last d + 1 rows: ``rows`` then repeats its index
        drafts = getattr(batch, "num_draft_tokens", None) or [0] * len(batch)
        picks = [(i, r - drafts[i] + j) for i, r in enumerate(logit_row) if r >= 0 for j in range(drafts[i] + 1)]
        rows = [i for i, _ in picks]
        keep = torch.tensor([r for _, r in picks], dtype=torch.long, device=self.device)
        if all_logits:
            rows, keep = list(range(ids.shape[0])), torch.arange(ids.shape[0], device=self.device)
        try:
            with step_heap():
                if self._decoder is not None:
                    logits = self._decoder.forward(ids, pos, self.kv, ctx, keep if rows else None)
                else:
                    with step_context(self.kv, ctx):
                        logits = self._forward_hf(ids, pos, keep)
                    if not rows:
                        logits = None
        finally:
            self.ctx = None
        return logits, rows

    def _forward_hf(self, ids: torch.Tensor, pos: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=ids[None], position_ids=pos[None], use_cache=False, logits_to_keep=keep)
        return out.logits[0]
