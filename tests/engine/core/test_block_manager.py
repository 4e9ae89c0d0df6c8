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
    assert bm.num_cached_blocks == 3  # two full blocks and the partly filled last one (a tail)
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


def _finished(bm: BlockManager, prompt: list[int], generated: list[int], rid: str) -> Sequence:
    """A request that read ``prompt``, wrote ``generated`` (the last one sampled, never fed back) and ended."""
    seq = _seq(prompt, rid)
    bm.allocate(seq, len(prompt))
    seq.num_computed_tokens = len(prompt)
    bm.register_full_blocks(seq)
    for token in generated:
        seq.token_ids.append(token)
        bm.ensure_slots(seq, len(seq.token_ids))
        seq.num_computed_tokens = len(seq.token_ids) - 1
        bm.register_full_blocks(seq)
    bm.free(seq)
    return seq


def test_a_prompt_sent_again_reads_only_its_last_token() -> None:
    """The finished request's partly filled last block is taken over: of a 10-token prompt (blocks of 4) the
    full blocks give 8 tokens and the tail one more; only the last token is computed again."""
    bm = BlockManager(num_blocks=16, block_size=4)
    first = _finished(bm, list(range(10)), [50, 51], "a")  # computed: 0-9 and 50; the tail holds 8, 9, 50
    assert bm.num_cached_blocks == 3
    again = _seq(list(range(10)), "b")
    assert bm.can_allocate(again, 10)
    bm.allocate(again, 1)  # room for the one token left
    assert again.num_cached_tokens == again.num_computed_tokens == 9
    assert len(again.block_table) == 3 and bm.num_cached_blocks == 0
    assert bm.blocks[again.block_table[2]].ref_count == 1
    assert bm.num_prefix_hit_tokens == 9
    del first


def test_a_tail_is_shared_only_as_far_as_the_tokens_agree_and_by_one_request() -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    _finished(bm, list(range(10)), [50, 51], "a")
    other = _seq(list(range(8)) + [8, 77, 78], "b")  # parts from the tail after one token
    bm.allocate(other, 2)
    assert other.num_cached_tokens == 9
    third = _seq(list(range(10)), "c")  # the tail is in use: only the full blocks are shared
    bm.allocate(third, 2)
    assert third.num_cached_tokens == 8
    assert third.block_table[:2] == other.block_table[:2] and third.block_table[2] != other.block_table[2]
    elsewhere = _seq([7] * 4 + [8, 9, 50], "d")  # the same tokens after other blocks: not that tail
    bm.free(third)
    bm.allocate(elsewhere, 7)
    assert elsewhere.num_cached_tokens == 0 and len(elsewhere.block_table) == 2


def test_tails_go_before_their_blocks_and_with_the_cache() -> None:
    bm = BlockManager(num_blocks=5, block_size=2)  # 4 usable blocks
    _finished(bm, [1, 2, 3, 4, 5], [], "a")  # two full blocks and a tail holding 5
    assert bm.num_cached_blocks == 3
    one = _seq([9, 9], "b")
    bm.allocate(one, 2)  # takes the free block, then evicts the least recently freed: the tail
    bm.allocate(_seq([8, 8], "c"), 2)
    again = _seq([1, 2, 3, 4, 5, 6], "d")
    bm.free(one)
    assert bm.num_cached_blocks == 2
    bm.allocate(again, 2)
    assert again.num_cached_tokens == 4  # the full blocks stayed; the tail was gone
    bm.free(again)
    bm.reset_prefix_cache()
    assert bm.num_cached_blocks == 0 and not bm._tails
    off = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=False)
    _finished(off, list(range(10)), [50], "e")
    assert off.num_cached_blocks == 0
