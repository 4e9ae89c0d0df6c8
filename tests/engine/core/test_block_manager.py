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
