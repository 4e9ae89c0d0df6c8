"""Block tables, prefix sharing, reference counts and LRU eviction, without a model."""

from __future__ import annotations

import pytest

from engine.api import NULL_BLOCK, SamplingParams
from engine.core.block_manager import BlockManager
from engine.core.sequence import Sequence


def _seq(tokens: list[int], rid: str = "r") -> Sequence:
    return Sequence(rid, list(tokens), SamplingParams())


def _compute_all(bm: BlockManager, seq: Sequence) -> None:
    seq.num_computed_tokens = len(seq.token_ids)
    bm.register_full_blocks(seq)


def test_allocate_gives_enough_blocks_and_never_the_null_block() -> None:
    bm = BlockManager(num_blocks=10, block_size=4)
    seq = _seq(list(range(10)))
    bm.allocate(seq, 10)
    assert len(seq.block_table) == 3
    assert NULL_BLOCK not in seq.block_table
    assert bm.num_used_blocks == 3
    bm.free(seq)
    assert bm.num_used_blocks == 0


def test_second_request_with_same_prefix_shares_full_blocks() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    first = _seq(list(range(10)), "a")
    bm.allocate(first, 10)
    _compute_all(bm, first)
    second = _seq(list(range(8)) + [99, 98, 97], "b")
    bm.allocate(second, 3)
    assert second.num_cached_tokens == 8
    assert second.block_table[:2] == first.block_table[:2]
    assert bm.blocks[first.block_table[0]].ref_count == 2
    assert bm.num_prefix_hit_tokens == 8


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    first = _seq(list(range(8)), "a")
    bm.allocate(first, 8)
    _compute_all(bm, first)
    bm.free(first)
    again = _seq(list(range(8)), "b")
    bm.allocate(again, 8)
    assert again.num_cached_tokens == 4  # the last block is recomputed to get logits
    assert again.num_computed_tokens == 4


def test_blocks_are_not_shared_before_their_kv_is_computed() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    first = _seq(list(range(12)), "a")
    bm.allocate(first, 12)
    first.num_computed_tokens = 4  # chunked prefill: only the first block is done
    bm.register_full_blocks(first)
    second = _seq(list(range(12)) + [5], "b")
    bm.allocate(second, 13)
    assert second.num_cached_tokens == 4


def test_freed_prefix_blocks_stay_cached_until_evicted_lru() -> None:
    bm = BlockManager(num_blocks=5, block_size=2)  # 4 usable blocks
    a = _seq([1, 2, 3, 4, 5], "a")
    bm.allocate(a, 5)
    _compute_all(bm, a)
    bm.free(a)
    assert bm.num_used_blocks == 0
    assert bm.num_cached_blocks == 2
    b = _seq([9, 9, 9, 9, 9, 9, 9], "b")  # needs all 4 blocks: evicts the cached ones
    assert bm.can_allocate(b, 7)
    bm.allocate(b, 7)
    assert bm.num_cached_blocks == 0
    c = _seq([1, 2, 3, 4, 5], "c")
    bm.free(b)
    bm.allocate(c, 5)
    assert c.num_cached_tokens == 0  # the prefix was evicted


def test_cannot_allocate_beyond_the_pool() -> None:
    bm = BlockManager(num_blocks=3, block_size=4)
    seq = _seq(list(range(12)))
    assert not bm.can_allocate(seq, 12)
    with pytest.raises(ValueError):
        BlockManager(num_blocks=1, block_size=4)


class _Copies:
    """Stands in for the runner's KV pool: records each copy and checks its source still holds its tokens."""

    def __init__(self, bm: BlockManager) -> None:
        self.bm = bm
        self.done: list[tuple[int, int, int, tuple[int, ...]]] = []

    def __call__(self, source: int, target: int, num_tokens: int) -> None:
        self.done.append((source, target, num_tokens, self.bm.blocks[source].token_ids))


def _replied(bm: BlockManager, prompt: list[int], reply: list[int], rid: str) -> Sequence:
    """A request whose prompt and reply were computed and freed: its full blocks stay cached."""
    seq = _seq(prompt, rid)
    bm.allocate(seq, len(prompt))
    seq.token_ids += reply
    bm.ensure_slots(seq, len(seq.token_ids))
    _compute_all(bm, seq)
    bm.free(seq)
    return seq


def test_a_prompt_sent_again_copies_the_start_of_the_block_its_reply_filled() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    bm.copy_kv = copies = _Copies(bm)
    prompt = list(range(10))  # two full blocks, then 2 tokens that the reply's tokens 90, 91 fill up
    _replied(bm, prompt, [90, 91, 92], "a")
    registered = dict(bm._hash_to_block)
    again = _seq(prompt, "b")
    assert bm.can_allocate(again, 10)
    bm.allocate(again, 0)
    assert again.num_cached_tokens == again.num_computed_tokens == 9  # only the last token is computed
    assert len(copies.done) == 1
    source, target, num_tokens, tokens = copies.done[0]
    assert (num_tokens, tokens) == (1, (8, 9, 90, 91))
    assert again.block_table[2] == target != source
    assert bm.blocks[source].ref_count == 0 and source in bm._cached  # still cached, unchanged
    assert bm.blocks[target].hash is None  # the copy is the new request's own, hashed once it is full
    assert again.num_hashed_blocks == 2
    assert bm._hash_to_block == registered  # nothing was registered or dropped
    again.token_ids += [77, 78]
    bm.ensure_slots(again, 12)
    _compute_all(bm, again)
    assert bm.blocks[target].hash is not None and bm.blocks[target].token_ids == (8, 9, 77, 78)


def test_the_longest_matching_block_is_copied_and_a_first_block_can_be_one() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    bm.copy_kv = copies = _Copies(bm)
    _replied(bm, [5, 6], [7, 1], "a")  # first block (5, 6, 7, 1)
    _replied(bm, [5, 6, 7], [8], "b")  # first block (5, 6, 7, 8), its first 2 tokens copied from the other
    assert copies.done.pop()[2:] == (2, (5, 6, 7, 1))
    again = _seq([5, 6, 7, 8, 9], "c")
    bm.allocate(again, 0)
    assert again.num_cached_tokens == 4 and copies.done == []  # a full block matches: shared, not copied
    bm.free(again)
    third = _seq([5, 6, 7, 3], "d")
    bm.allocate(third, 0)
    assert third.num_cached_tokens == 3 and len(copies.done) == 1
    assert copies.done[0][2] == 3 and copies.done[0][3][:3] == (5, 6, 7)  # either block has the 3 tokens


def test_copying_never_evicts_its_own_source() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)  # three usable blocks
    bm.copy_kv = copies = _Copies(bm)
    _replied(bm, [1, 2, 3], [4, 5, 6, 7, 8], "a")  # blocks (1, 2, 3, 4) and (5, 6, 7, 8) cached, one free
    filler = _seq([9], "f")
    bm.allocate(filler, 1)  # takes the free block: the copy must evict, and the source is the oldest
    again = _seq([1, 2, 3], "b")
    assert bm.can_allocate(again, 3)
    bm.allocate(again, 0)
    assert again.num_cached_tokens == 2
    assert copies.done[0][3] == (1, 2, 3, 4)  # copied from intact tokens
    assert bm.blocks[copies.done[0][0]].hash is not None  # and the source is still cached
    bm.free(filler)
    bm.free(again)  # the copy, never full, is free again; the source is the one cached block
    late = _seq([1, 2, 3], "c")
    filler = _seq([9, 9, 9, 9, 9], "f")
    bm.allocate(filler, 5)  # takes the two free blocks
    assert bm.num_free_blocks == 1 and bm.can_allocate(late, 3)
    bm.allocate(late, 0)  # the source is the only block left: recomputed, not copied
    assert late.num_cached_tokens == 0 and len(copies.done) == 1


def test_without_a_copy_function_only_full_blocks_are_shared() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    _replied(bm, list(range(10)), [90, 91], "a")
    again = _seq(list(range(10)), "b")
    bm.allocate(again, 0)
    assert again.num_cached_tokens == 8


def test_an_evicted_block_is_no_longer_copied() -> None:
    bm = BlockManager(num_blocks=3, block_size=4)  # two usable blocks
    bm.copy_kv = copies = _Copies(bm)
    _replied(bm, [1, 2], [3, 4], "a")
    other = _seq([7, 7, 7, 7, 7], "x")
    bm.allocate(other, 5)  # evicts (1, 2, 3, 4)
    bm.free(other)
    again = _seq([1, 2], "b")
    bm.allocate(again, 0)
    assert again.num_cached_tokens == 0 and copies.done == []
    assert bm._children == {}


def test_past_the_resident_blocks_a_cached_prefix_is_evicted_before_a_never_written_block_is_taken() -> None:
    bm = BlockManager(num_blocks=32, block_size=4, resident_blocks=9)
    first = _seq(list(range(16)), "a")  # blocks 1-4 full, block 5 for the next token
    bm.allocate(first, 17)
    _compute_all(bm, first)
    bm.free(first)  # 1-4 cached (a prefix's last block is the least recently used), 5 free
    assert bm.num_touched_blocks == 6 and bm.num_cached_blocks == 4
    second = _seq(list(range(100, 116)), "b")
    # 5 was written before; 6, 7, 8 were never written but are under the limit; then the LRU cached block
    bm.allocate(second, 17)
    assert second.block_table == [5, 6, 7, 8, 4]
    assert bm.num_touched_blocks == 9 and bm.num_cached_blocks == 3
    third = _seq(list(range(200, 240)), "c")  # 10 blocks: the 3 cached ones first, then never-written ones
    bm.allocate(third, 40)
    assert third.block_table == [3, 2, 1, *range(9, 16)]
    assert bm.num_touched_blocks == 16 and bm.num_cached_blocks == 0


def test_a_block_given_back_is_reused_before_a_never_written_one() -> None:
    bm = BlockManager(num_blocks=32, block_size=4, enable_prefix_caching=False)
    seq = _seq(list(range(10)))
    bm.allocate(seq, 10)
    assert seq.block_table == [1, 2, 3]
    bm.free(seq)
    again = _seq(list(range(10)), "b")
    bm.allocate(again, 10)
    assert sorted(again.block_table) == [1, 2, 3]
    assert bm.num_touched_blocks == 4


def test_without_a_limit_a_never_written_block_is_taken_before_a_cached_prefix_is_evicted() -> None:
    bm = BlockManager(num_blocks=32, block_size=4)
    first = _seq(list(range(16)), "a")
    bm.allocate(first, 17)
    _compute_all(bm, first)
    bm.free(first)
    second = _seq(list(range(100, 116)), "b")
    bm.allocate(second, 17)
    assert second.block_table == [5, 6, 7, 8, 9] and bm.num_cached_blocks == 4


def test_a_finished_requests_last_partial_block_is_copied_by_the_next_turn() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    bm.copy_kv = copies = _Copies(bm)
    _replied(bm, [1, 2, 3, 4, 5], [6, 7], "a")  # one full block, then (5, 6, 7) never filled
    kept = [b for b in bm._cached if bm.blocks[b].token_ids == (5, 6, 7)]
    assert len(kept) == 1 and bm.blocks[kept[0]].parent is not None
    nxt = _seq([1, 2, 3, 4, 5, 6, 7, 8, 9], "b")  # the next turn: the whole first exchange, then more
    bm.allocate(nxt, 0)
    assert nxt.num_cached_tokens == 7 and copies.done[-1][:3] == (kept[0], nxt.block_table[1], 3)
    assert nxt.block_table[1] != kept[0]  # copied, never shared: the next turn writes the rest of its block
    assert nxt.num_hashed_blocks == 1
    short = _seq([1, 2, 3, 4, 5, 9], "c")
    bm.allocate(short, 0)
    assert short.num_cached_tokens == 5  # the start of the kept block that matches


def test_a_partial_block_is_not_kept_where_a_registered_block_already_starts_with_its_tokens() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    bm.copy_kv = _Copies(bm)
    _replied(bm, [1, 2], [3, 4, 5], "a")  # (1, 2, 3, 4) full, then (5,) kept
    before = dict(bm._hash_to_block)
    _replied(bm, [1], [2], "b")  # (1, 2) is the start of the full block: nothing new is registered
    assert bm._hash_to_block == before
    assert sorted(len(bm.blocks[b].token_ids) for b in bm._cached) == [1, 4]


def test_without_a_copy_function_no_partial_block_is_kept() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    _replied(bm, [1, 2, 3, 4, 5], [6], "a")
    assert [bm.blocks[b].token_ids for b in bm._cached] == [(1, 2, 3, 4)]
    assert bm.num_free_blocks == 15
