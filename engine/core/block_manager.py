"""Paged KV-cache bookkeeping: block tables, prefix sharing by chained hashes, LRU eviction.

No tensors live here; the model runner owns the KV pool and reads the block tables this module fills.
Block 0 is reserved as an always-zero block that padded attention reads point at.

Full blocks are shared by reference. A prompt whose next tokens match only the start of a cached block (the same
prompt sent again, after its reply filled the block that held the prompt's last tokens) gets those tokens' KV
copied into a block of its own, through the runner's ``copy_kv``: cached blocks are never written, so a copy is
the only way to reuse part of one. A finished request's last block, never full, stays cached too, holding its
tokens so far: the next turn of a chat copies them rather than computing up to a block's worth again.

Free blocks are handed out lowest id first, so the blocks ever written are the ids below a high-water mark
(``num_touched_blocks``). Once that reaches ``resident_blocks``, a new block evicts the least recently used cached
prefix rather than take a block never written; only when nothing is cached does the pool grow further. This bounds
what finished requests' prefixes keep in memory (an 8B model's fp32 pool can reach 12 GB otherwise), and reuses
pages that are already in memory: a block's first writes fault its pages in, which took 0.9-1.7 s per 256 MB of an
8B prefill's KV on a 2-core EPYC VM (docs/BENCHMARKS.md).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from engine.api import NULL_BLOCK
from engine.core.sequence import Sequence


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    token_ids: tuple[int, ...] = ()
    parent: int | None = None  # the chained hash of the block before it (None for a first block)


def chain_hash(parent: int | None, token_ids: tuple[int, ...]) -> int:
    """Hash of a full block, chained over every block before it."""
    return hash((parent, token_ids))


class BlockManager:
    """Allocates fixed-size KV blocks to sequences and shares full blocks with equal prefixes.

    A block is in exactly one of three states: used (``ref_count > 0``), cached (unreferenced but holding a
    registered prefix hash, kept in LRU order for reuse), or free.
    """

    #: (source block, destination block, tokens): copies the first tokens' KV of one block into another.
    #: The engine sets it to the runner's; without it only full blocks are shared.
    copy_kv: Callable[[int, int, int], None] | None = None

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 resident_blocks: int | None = None) -> None:
        if num_blocks < 2:
            raise ValueError(f"the KV cache needs at least 2 blocks, got {num_blocks}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.blocks[NULL_BLOCK].ref_count = 1  # never handed out
        self._free: list[int] = list(range(num_blocks - 1, 0, -1))  # pop() gives low ids first
        # blocks below this id have been handed out (the null block is written at start): above the never-written
        # ones in ``_free`` sit only blocks given back, so its top is never written exactly when it is >= this
        self.num_touched_blocks = NULL_BLOCK + 1
        #: blocks ever written beyond which a cached prefix is evicted rather than a never-written block taken
        self.resident_blocks = num_blocks if resident_blocks is None else max(1, resident_blocks)
        self._cached: OrderedDict[int, None] = OrderedDict()  # unreferenced hashed blocks, LRU first
        self._hash_to_block: dict[int, int] = {}
        self._children: dict[int | None, set[int]] = {}  # parent hash -> registered blocks that follow it
        self.num_prefix_queried_tokens = 0
        self.num_prefix_hit_tokens = 0

    # --- queries -------------------------------------------------------------------------------------------
    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now: free plus evictable cached ones."""
        return len(self._free) + len(self._cached)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def num_used_blocks(self) -> int:
        return self.num_usable_blocks - self.num_free_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # --- admission -----------------------------------------------------------------------------------------
    def _match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks covering the longest full-block prefix of ``seq``, keeping one token to compute."""
        if not self.enable_prefix_caching:
            return []
        matched: list[int] = []
        parent: int | None = None
        max_blocks = (len(seq.token_ids) - 1) // self.block_size
        for i in range(max_blocks):
            tokens = tuple(seq.token_ids[i * self.block_size : (i + 1) * self.block_size])
            h = chain_hash(parent, tokens)
            block_id = self._hash_to_block.get(h)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            matched.append(block_id)
            parent = h
        return matched

    def _match_partial(self, seq: Sequence, matched: list[int]) -> tuple[int, int]:
        """A registered block that follows ``matched`` and starts with ``seq``'s next tokens (keeping one token to
        compute): ``(block id, tokens that match)``, or ``(NULL_BLOCK, 0)``.

        A cached source is held while the block it is copied into is taken; when no other block is left for that,
        the tokens are recomputed instead. This does not depend on how many tokens follow, so that
        ``can_allocate`` and ``allocate`` agree.
        """
        if self.copy_kv is None or not self.enable_prefix_caching:
            return NULL_BLOCK, 0
        start = len(matched) * self.block_size
        wanted = seq.token_ids[start : min(start + self.block_size, len(seq.token_ids) - 1)]
        parent = self.blocks[matched[-1]].hash if matched else None
        best, best_len = NULL_BLOCK, 0
        for block_id in self._children.get(parent, ()):
            tokens = self.blocks[block_id].token_ids
            n = 0
            while n < min(len(wanted), len(tokens)) and tokens[n] == wanted[n]:
                n += 1
            if n > best_len:
                best, best_len = block_id, n
        if best_len and self.blocks[best].ref_count == 0:
            others = self.num_free_blocks - 1 - sum(1 for b in matched if self.blocks[b].ref_count == 0)
            if others < 1:
                return NULL_BLOCK, 0
        return best, best_len

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        matched = self._match_prefix(seq)
        num_cached = sum(1 for b in matched if self.blocks[b].ref_count == 0)
        _, num_copied = self._match_partial(seq, matched)
        first_new = len(matched) * self.block_size + num_copied
        target = max(first_new + num_new_tokens, first_new + 1)
        needed = self.blocks_needed(target) - len(matched)
        return needed <= self.num_free_blocks - num_cached

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Give ``seq`` its cached prefix blocks plus room for ``num_new_tokens`` more tokens."""
        assert not seq.block_table, "sequence already holds blocks"
        matched = self._match_prefix(seq)
        for block_id in matched:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                self._cached.pop(block_id)
            block.ref_count += 1
            seq.block_table.append(block_id)
            seq.block_hashes.append(block.hash)  # type: ignore[arg-type]
        seq.num_cached_tokens = len(matched) * self.block_size
        source, num_copied = self._match_partial(seq, matched)
        if num_copied:
            seq.block_table.append(self._copy_of(source, num_copied))
            seq.num_cached_tokens += num_copied
        seq.num_computed_tokens = seq.num_cached_tokens
        seq.num_hashed_blocks = len(matched)
        self.num_prefix_queried_tokens += len(seq.token_ids)
        self.num_prefix_hit_tokens += seq.num_cached_tokens
        self.ensure_slots(seq, seq.num_computed_tokens + num_new_tokens)

    def _copy_of(self, source: int, num_tokens: int) -> int:
        """A new block holding the KV of ``source``'s first ``num_tokens`` tokens; ``source`` is held meanwhile, so
        that taking the new block cannot evict it."""
        block = self.blocks[source]
        if block.ref_count == 0:
            self._cached.pop(source)
        block.ref_count += 1
        try:
            target = self._take_block()
            assert self.copy_kv is not None
            self.copy_kv(source, target, num_tokens)
        finally:
            block.ref_count -= 1
            if block.ref_count == 0:
                self._cached[source] = None  # just used: the most recent end of the LRU order
        return target

    # --- growth --------------------------------------------------------------------------------------------
    def can_grow(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(num_tokens) - len(seq.block_table) <= self.num_free_blocks

    def ensure_slots(self, seq: Sequence, num_tokens: int) -> None:
        """Make sure ``seq`` owns blocks for its first ``num_tokens`` tokens."""
        while len(seq.block_table) < self.blocks_needed(num_tokens):
            seq.block_table.append(self._take_block())

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Give back the blocks past ``seq``'s first ``num_tokens`` tokens (a rejected speculative draft's).

        Those blocks were taken by ``ensure_slots`` for tokens that are gone, so nothing shares or hashed them.
        """
        keep = max(self.blocks_needed(num_tokens), seq.num_hashed_blocks)
        while len(seq.block_table) > keep:
            block_id = seq.block_table.pop()
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count == 0 and block.hash is None, "a trimmed block must be private and unhashed"
            self._free.append(block_id)

    def _take_block(self) -> int:
        fresh = bool(self._free) and self._free[-1] >= self.num_touched_blocks
        if self._free and not (fresh and self._cached and self.num_touched_blocks >= self.resident_blocks):
            block_id = self._free.pop()
        elif self._cached:
            block_id, _ = self._cached.popitem(last=False)  # evict least recently used
            self._forget(self.blocks[block_id])
        else:
            raise RuntimeError("KV cache exhausted: the scheduler must check can_grow/can_allocate first")
        self.blocks[block_id].ref_count = 1
        self.num_touched_blocks = max(self.num_touched_blocks, block_id + 1)
        return block_id

    def register_full_blocks(self, seq: Sequence) -> None:
        """Publish the hashes of blocks whose KV is now fully computed, so later requests can share them."""
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        while seq.num_hashed_blocks < num_full:
            i = seq.num_hashed_blocks
            parent = seq.block_hashes[i - 1] if i else None
            tokens = tuple(seq.token_ids[i * self.block_size : (i + 1) * self.block_size])
            h = chain_hash(parent, tokens)
            block = self.blocks[seq.block_table[i]]
            if block.hash is None and h not in self._hash_to_block:
                block.hash, block.token_ids, block.parent = h, tokens, parent
                self._hash_to_block[h] = block.block_id
                self._children.setdefault(parent, set()).add(block.block_id)
            seq.block_hashes.append(h)
            seq.num_hashed_blocks += 1

    # --- release -------------------------------------------------------------------------------------------
    def free(self, seq: Sequence) -> None:
        """Drop ``seq``'s references at once; hashed blocks stay reusable until evicted, and so does the block that
        holds its last computed tokens (see ``_keep_partial``)."""
        self._keep_partial(seq)
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.hash is not None and self._hash_to_block.get(block.hash) == block_id:
                    self._cached[block_id] = None
                else:
                    block.hash, block.token_ids = None, ()
                    self._free.append(block_id)
        seq.block_table.clear()
        seq.block_hashes.clear()
        seq.num_hashed_blocks = 0
        seq.num_computed_tokens = 0
        seq.num_draft_computed = 0  # a draft model's KV lived in these blocks' slots too

    def _keep_partial(self, seq: Sequence) -> None:
        """Register the block past ``seq``'s last full one, which holds its last computed tokens, as a cached block
        of that many tokens, so that a later prompt starting with them copies them (``_match_partial``) instead of
        computing them again: the next turn of a chat, or a prompt sent again after a reply shorter than the rest of
        its block. It is never shared by reference (``_match_prefix`` takes only full blocks), and it is skipped where
        a registered block after the same prefix already starts with its tokens."""
        if self.copy_kv is None or not self.enable_prefix_caching:
            return
        i, n = divmod(seq.num_computed_tokens, self.block_size)
        if not n or i >= len(seq.block_table) or seq.num_hashed_blocks != i:
            return
        block = self.blocks[seq.block_table[i]]
        if block.ref_count != 1 or block.hash is not None:
            return
        parent = seq.block_hashes[i - 1] if i else None
        tokens = tuple(seq.token_ids[i * self.block_size : i * self.block_size + n])
        if any(self.blocks[b].token_ids[:n] == tokens for b in self._children.get(parent, ())):
            return
        h = chain_hash(parent, tokens)
        if h in self._hash_to_block:
            return
        block.hash, block.token_ids, block.parent = h, tokens, parent
        self._hash_to_block[h] = block.block_id
        self._children.setdefault(parent, set()).add(block.block_id)

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (for example after the KV dtype changes)."""
        while self._cached:
            block_id, _ = self._cached.popitem(last=False)
            self._forget(self.blocks[block_id])
            self._free.append(block_id)
        self._hash_to_block.clear()
        self._children.clear()

    def _forget(self, block: Block) -> None:
        """Unregister a cached block's prefix: it is about to hold other tokens."""
        if block.hash is not None and self._hash_to_block.get(block.hash) == block.block_id:
            del self._hash_to_block[block.hash]
            siblings = self._children.get(block.parent)
            if siblings is not None:
                siblings.discard(block.block_id)
                if not siblings:
                    del self._children[block.parent]
        block.hash, block.token_ids, block.parent = None, (), None

    @property
    def prefix_cache_hit_rate(self) -> float:
        if not self.num_prefix_queried_tokens:
            return 0.0
        return self.num_prefix_hit_tokens / self.num_prefix_queried_tokens
