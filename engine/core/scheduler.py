"""Iteration-level continuous batching: who runs in the next step, and with how many tokens.

Each step has a token budget. Running sequences go first (a decode costs one token, an unfinished prefill takes
a chunk of what is left of the budget), then waiting sequences are admitted in priority order while the batch
has room. When blocks run out, the least urgent running sequence is preempted and later recomputed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.api import EngineConfig
from engine.core.block_manager import BlockManager
from engine.core.sequence import Sequence, SequenceStatus

#: the share of recent arrivals within the window of the one before from which an idle engine waits to batch
BURST_SHARE = 1 / 3


@dataclass(slots=True)
class ScheduledBatch:
    """One step's work: each sequence with the number of tokens it computes now."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    #: per sequence, how many of its new tokens are a speculative draft to verify (0 for most)
    num_draft_tokens: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.seqs)

    def add(self, seq: Sequence, num_tokens: int, num_draft: int = 0) -> None:
        self.seqs.append(seq)
        self.num_new_tokens.append(num_tokens)
        self.num_draft_tokens.append(num_draft)
        if num_draft:
            self.num_decode_tokens += num_tokens
        elif num_tokens == 1 and seq.num_computed_tokens == len(seq.token_ids) - 1 and seq.num_generated_tokens:
            self.num_decode_tokens += 1
        else:
            self.num_prefill_tokens += num_tokens


class Scheduler:
    """Owns the ``waiting`` and ``running`` lists and the block manager's admission decisions."""

    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.block_manager = block_manager
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        #: Knobs the concurrency controller turns (engine/core/controller.py); start at the configured limits.
        self.max_running = config.max_batch_size
        self.token_budget = config.max_num_batched_tokens
        self.window_scale = 1.0
        #: moving share of arrivals that came within ``max_wait_ms`` of the one before (see ``batch_window_s``)
        self._burst_share = 0.0
        self._last_arrival: float | None = None

    # --- queue -----------------------------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        now = time.monotonic()
        if self._last_arrival is not None:
            close = now - self._last_arrival <= self.config.max_wait_ms / 1000.0
            self._burst_share = 0.8 * self._burst_share + 0.2 * close
        self._last_arrival = now
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def abort(self, request_id: str) -> Sequence | None:
        for queue in (self.running, self.waiting):
            for seq in queue:
                if seq.request_id == request_id:
                    queue.remove(seq)
                    self.finish(seq)
                    return seq
        return None

    def finish(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.FINISHED
        self.block_manager.free(seq)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    # --- batching window -------------------------------------------------------------------------------------
    def batch_window_s(self) -> float:
        """How long an idle engine waits to gather a batch.

        Adaptive: when requests come in bursts (a third or more of recent arrivals within ``max_wait_ms`` of the
        one before, as when several clients send at once, however long the pauses between bursts), the first of a
        burst waits up to that long, so that the rest share its first step instead of waiting a whole step for the
        next one. When they come one at a time, waiting would only add latency, so the window is 0. (A moving
        average of the gaps themselves, used before, let each pause between bursts close the window for the next
        burst: eight streams' first tokens at 8B took one step more.)
        """
        if self._burst_share < BURST_SHARE:
            return 0.0
        return self.window_scale * self.config.max_wait_ms / 1000.0

    def admission_delay_s(self, now: float | None = None) -> float:
        """Seconds to hold back admission now (0 means admit)."""
        if self.running or not self.waiting or len(self.waiting) >= self.max_running:
            return 0.0
        now = time.monotonic() if now is None else now
        oldest = min(seq.arrival_time for seq in self.waiting)
        return max(0.0, oldest + self.batch_window_s() - now)

    # --- scheduling ------------------------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.token_budget
        self._make_room_for_urgent()
        self.running.sort(key=lambda s: s.sort_key)
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if self._add_speculative(batch, seq, budget):
                budget -= batch.num_new_tokens[-1]
                i += 1
                continue
            num_new = min(seq.num_uncomputed_tokens, budget)
            while not self.block_manager.can_grow(seq, seq.num_computed_tokens + num_new):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is seq:
                    break
            else:
                self.block_manager.ensure_slots(seq, seq.num_computed_tokens + num_new)
                batch.add(seq, num_new)
                budget -= num_new
                i += 1
                continue
            break  # seq itself was preempted: nothing behind it can run either

        if self.admission_delay_s() > 0:
            return batch
        self.waiting.sort(key=lambda s: s.sort_key)
        while self.waiting and budget > 0 and len(self.running) < self.max_running:
            seq = self.waiting[0]
            # the prefix cache may cover the start of the prompt; size the first chunk after the cached part
            if not self.block_manager.can_allocate(seq, min(len(seq.token_ids), budget)):
                break
            self.waiting.pop(0)
            self.block_manager.allocate(seq, 0)
            num_new = min(seq.num_uncomputed_tokens, budget)
            self.block_manager.ensure_slots(seq, seq.num_computed_tokens + num_new)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            batch.add(seq, num_new)
            budget -= num_new
        return batch

    def _add_speculative(self, batch: ScheduledBatch, seq: Sequence, budget: int) -> bool:
        """Schedule a decode with room for the draft it wants verified, if budget and free blocks allow it.

        A draft never preempts anyone: without room the sequence decodes one token as usual.
        """
        num_draft = seq.num_spec_wanted
        seq.num_spec_wanted = 0
        num_new = 1 + num_draft
        if not num_draft or seq.num_uncomputed_tokens != 1 or num_new > budget:
            seq.draft_token_ids = []
            return False
        if not self.block_manager.can_grow(seq, seq.num_computed_tokens + num_new):
            seq.draft_token_ids = []
            return False
        self.block_manager.ensure_slots(seq, seq.num_computed_tokens + num_new)
        batch.add(seq, num_new, num_draft)
        return True

    def _make_room_for_urgent(self) -> None:
        """A waiting request more urgent than a running one takes its place when the batch is full.

        This is what keeps the app's own chat (priority 0) ahead of the local server's requests: the least
        urgent running sequence is preempted (and recomputed later) rather than the chat waiting behind it.
        """
        if not self.waiting or len(self.running) < self.max_running:
            return
        urgent = min(self.waiting, key=lambda s: s.sort_key)
        while self.running and len(self.running) >= self.max_running:
            victim = max(self.running, key=lambda s: s.sort_key)
            if victim.priority <= urgent.priority:
                return
            self._preempt(victim)

    def _preempt(self, seq: Sequence) -> None:
        """Free ``seq``'s blocks and queue it again; its tokens are recomputed (prefix cache permitting)."""
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.append(seq)

    def postprocess(self, batch: ScheduledBatch) -> None:
        """Advance the computed-token counts after the model ran ``batch``."""
        for seq, num_new, num_draft in zip(batch.seqs, batch.num_new_tokens, batch.num_draft_tokens, strict=True):
            seq.num_computed_tokens += num_new - num_draft  # a draft's tokens count once accepted (accept_draft)
            self.block_manager.register_full_blocks(seq)

    def accept_draft(self, seq: Sequence, num_accepted: int) -> None:
        """After verification: ``num_accepted`` draft tokens (now in ``token_ids``) have valid KV; the rejected
        ones' slots are given back, and only accepted tokens' full blocks publish their hashes."""
        seq.num_computed_tokens += num_accepted
        self.block_manager.register_full_blocks(seq)
        self.block_manager.trim(seq, len(seq.token_ids))
