"""Decode steps replayed from CUDA graphs, one graph per batch bucket and context bucket.

On a GPU, a small model's decode step is some twenty kernel launches per layer, each a few microseconds of host
work for a few microseconds of GPU work: the step is bound by the launches, not by the GPU. A CUDA graph records
the whole step (embedding, every layer, the final norm and the lm_head) once and replays it with one launch.

A graph's tensors are fixed, so a step copies its inputs into the graph's static buffers (:class:`StaticInputs`:
token ids, positions, the slot each token writes, the slots it reads and the additive attention mask) and reads
the logits back from its static output. A step of ``t`` decodes runs in the graph of the smallest batch bucket
``B >= t`` (:func:`batch_bucket`) over the smallest context bucket ``L`` that holds its longest context
(:func:`context_bucket`); keys past a row's own length are masked. The ``B - t`` padding rows read and write the
null block's first slot, and their mask lets them see that slot, so every value in the graph stays finite and a
real row gives the slot zero weight.

Graphs are captured lazily, the first time a step lands in a (B, L) pair, into one memory pool they all share (the
steps replay one after another on one stream). Steps with a prefill chunk, more rows than the largest bucket or a
longer context than the largest one run eager, as does deterministic mode. A capture that fails (a kernel that
waits on the host, as bitsandbytes' LLM.int8 outlier search does) turns graphs off for the model, with the reason
logged; the step that found it runs eager.

Without ``capture`` (on a CPU, for the tests) the same static buffers and padding run eagerly: that is how the
padding and bucketing arithmetic is checked against HF ``generate`` on machines without a GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.model.attention import AttentionContext

log = logging.getLogger("engine")

#: Batch sizes a graph is captured for; a step takes the smallest that holds its rows.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: The smallest context bucket; above it they double, up to the engine's longest context.
MIN_CONTEXT = 128

#: ``step(ids, positions, context) -> logits of every row``, the fused decoder's whole decode step
StepFn = Callable[[torch.Tensor, torch.Tensor, AttentionContext], torch.Tensor]


def batch_bucket(rows: int, max_batch: int) -> int | None:
    """The graph batch size for a step of ``rows`` decodes, or None when no graph holds that many."""
    for size in BATCH_BUCKETS:
        if size >= rows:
            return min(size, max_batch) if rows <= max_batch else None
    return None


def context_bucket(length: int, max_context: int) -> int | None:
    """The graph context length for a step whose longest context is ``length`` tokens, or None past the largest.

    Powers of two from :data:`MIN_CONTEXT`; the largest bucket is ``max_context`` itself.
    """
    if length > max_context:
        return None
    size = MIN_CONTEXT
    while size < length:
        size *= 2
    return min(size, max_context)


@dataclass(slots=True)
class StaticInputs:
    """The fixed tensors one graph reads, B rows over a context of L slots."""

    ids: torch.Tensor  # [B] token ids
    positions: torch.Tensor  # [B]
    slot_mapping: torch.Tensor  # [B] slot each row's new K/V goes to
    slots: torch.Tensor  # [B, L] slots each row reads
    mask: torch.Tensor  # [B, 1, 1, L] additive: 0 where a row sees the key, -inf past its length
    null_slot: int

    @classmethod
    def padding(cls, rows: int, length: int, null_slot: int, mask_dtype: torch.dtype,
                device: torch.device) -> StaticInputs:
        """Buffers that hold B padding rows (the state a graph is captured in)."""
        def longs(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.long, device=device)

        mask = torch.zeros(rows, 1, 1, length, dtype=mask_dtype, device=device)
        inputs = cls(longs(rows), longs(rows), longs(rows), longs(rows, length), mask, null_slot)
        inputs.fill(0, None, None, None, None)
        return inputs

    def fill(self, rows: int, ids: torch.Tensor | None, positions: torch.Tensor | None,
             slot_mapping: torch.Tensor | None, ctx: AttentionContext | None) -> None:
        """Put a step of ``rows`` decodes in the first rows; every other row becomes padding."""
        self.ids[rows:].zero_()
        self.positions[rows:].zero_()
        self.slot_mapping[rows:].fill_(self.null_slot)
        self.slots.fill_(self.null_slot)
        self.mask.fill_(float("-inf"))
        self.mask[rows:, ..., 0] = 0  # a padding row sees the null slot only: finite, and unseen by real rows
        if rows == 0:
            return
        assert ids is not None and positions is not None and slot_mapping is not None and ctx is not None
        assert ctx.decode_slots is not None
        length = ctx.decode_slots.shape[1]
        self.ids[:rows].copy_(ids)
        self.positions[:rows].copy_(positions)
        self.slot_mapping[:rows].copy_(slot_mapping)
        self.slots[:rows, :length].copy_(ctx.decode_slots)
        if ctx.decode_mask is None:
            self.mask[:rows, ..., :length] = 0
        else:
            self.mask[:rows, ..., :length].copy_(ctx.decode_mask)

    def context(self) -> AttentionContext:
        """The attention context the graph's step runs with: every row a decode over its ``L`` slots."""
        return AttentionContext(
            slot_mapping=self.slot_mapping,
            num_decode=self.ids.shape[0],
            decode_slots=self.slots,
            decode_mask=self.mask,
            prefills=[],
        )


@dataclass(slots=True)
class _Graph:
    inputs: StaticInputs
    graph: torch.cuda.CUDAGraph | None  # None: replayed eagerly (``capture=False``)
    logits: torch.Tensor | None  # the graph's static output; None when eager


class GraphedDecode:
    """The decode steps of one model, replayed from CUDA graphs per (batch bucket, context bucket).

    Args:
        step: runs the whole decode step over static inputs and returns every row's logits.
        device: where the model and the KV pool live.
        mask_dtype: the attention mask's dtype (the model's compute dtype).
        null_slot: a slot of the reserved null block, which padding rows read and write.
        max_batch: the engine's largest batch; larger decode steps run eager.
        max_context: the engine's longest context; longer ones run eager.
        capture: record CUDA graphs (False: run the same static buffers eagerly, for tests on a CPU).
        warmup: eager runs before a capture (on a side stream, as CUDA graphs need).
    """

    def __init__(self, step: StepFn, device: torch.device, mask_dtype: torch.dtype, null_slot: int,
                 max_batch: int, max_context: int, capture: bool = True, warmup: int = 2) -> None:
        self._step = step
        self.device = device
        self._mask_dtype = mask_dtype
        self._null_slot = null_slot
        self.max_batch = max_batch
        self.max_context = max_context
        self.capture = capture
        self._warmup = warmup
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        #: why graphs were turned off after a failed capture, or None
        self.disabled_reason: str | None = None
        #: decode steps replayed from a graph
        self.num_replays = 0
        #: run every step eager while set (the benchmark's graphs-off rounds), keeping the captured graphs
        self.paused = False

    @property
    def captured(self) -> list[tuple[int, int]]:
        """The (batch, context) pairs that hold a graph."""
        return sorted(self._graphs)

    def run(self, ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext) -> torch.Tensor | None:
        """Every row's logits [rows, vocab] for a decode-only step, from its graph; None when it must run eager."""
        if self.paused or self.disabled_reason is not None or ctx.decode_slots is None or ctx.prefills \
                or ctx.invariant:
            return None
        rows = ids.shape[0]
        batch = batch_bucket(rows, self.max_batch)
        length = context_bucket(ctx.decode_slots.shape[1], self.max_context)
        if batch is None or length is None:
            return None
        entry = self._graphs.get((batch, length))
        if entry is None:
            entry = self._record(batch, length)
            if entry is None:
                return None
        entry.inputs.fill(rows, ids, positions, ctx.slot_mapping, ctx)
        self.num_replays += 1
        if entry.graph is None:
            inputs = entry.inputs
            return self._step(inputs.ids, inputs.positions, inputs.context())[:rows]
        with torch.cuda.device(self.device):
            entry.graph.replay()
        assert entry.logits is not None
        return entry.logits[:rows]

    def _record(self, batch: int, length: int) -> _Graph | None:
        """Capture the graph of one (batch, context) pair; None, with graphs off from now on, if that fails."""
        inputs = StaticInputs.padding(batch, length, self._null_slot, self._mask_dtype, self.device)
        if not self.capture:
            entry = _Graph(inputs, None, None)
        else:
            try:
                entry = self._capture(inputs)
            except Exception as exc:  # noqa: BLE001 -- any kernel that cannot be captured: the model runs eager
                self.disabled_reason = f"{type(exc).__name__}: {exc}"
                log.warning("CUDA graphs off for this model, decode steps run eager (%s)", self.disabled_reason)
                return None
            log.info("captured the decode step as a CUDA graph: %d rows, %d-token context", batch, length)
        self._graphs[(batch, length)] = entry
        return entry

    def _capture(self, inputs: StaticInputs) -> _Graph:
        def step() -> torch.Tensor:
            return self._step(inputs.ids, inputs.positions, inputs.context())

        with torch.cuda.device(self.device):  # capture on the model's GPU, whichever is current
            current = torch.cuda.current_stream()
            side = torch.cuda.Stream()
            side.wait_stream(current)
            with torch.cuda.stream(side):  # warm-up runs allocate their workspaces outside the graph
                for _ in range(self._warmup):
                    step()
            current.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                logits = step()
        return _Graph(inputs, graph, logits)
