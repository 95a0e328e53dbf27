"""Paged block manager: allocation, freeing, prefix-cache hits (hash chain and radix tree), LRU eviction, counters."""

import pytest
from helpers import make_seq, run_prefill

from native_engine.block_manager import PREFIX_CACHES, BlockManager


def test_allocate_covers_tokens_and_free_restores_all_blocks():
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = make_seq(range(10))
    assert bm.allocate(seq, 10)
    assert len(seq.block_table) == 3 and len(set(seq.block_table)) == 3
    assert bm.num_free_blocks == 5
    assert bm.usage == pytest.approx(3 / 8)
    bm.free(seq)
    assert bm.num_free_blocks == 8 and bm.usage == 0.0 and seq.block_table == []


def test_allocate_is_all_or_nothing_when_blocks_run_out():
    bm = BlockManager(num_blocks=3, block_size=4)
    a, b = make_seq(range(8), "a"), make_seq(range(100, 108), "b")
    assert bm.allocate(a, 8)
    assert not bm.allocate(b, 8)
    assert b.block_table == [] and bm.num_free_blocks == 1


def test_decode_grows_table_only_at_block_boundary():
    bm = BlockManager(num_blocks=4, block_size=4)
    seq = make_seq(range(4))
    run_prefill(bm, seq)
    assert len(seq.block_table) == 1
    seq.token_ids.append(99)
    assert bm.allocate(seq, 1)
    assert len(seq.block_table) == 2
    seq.num_computed_tokens += 1
    seq.token_ids.append(98)
    assert bm.allocate(seq, 1)
    assert len(seq.block_table) == 2


@pytest.mark.parametrize("kind", PREFIX_CACHES)
def test_shared_prefix_hits_full_blocks_and_counts_tokens(kind):
    bm = BlockManager(num_blocks=16, block_size=4, prefix_cache=kind)
    first = make_seq(list(range(10)), "a")
    assert run_prefill(bm, first) == []
    second = make_seq(list(range(8)) + [50, 51, 52], "b")
    cached = run_prefill(bm, second)
    assert cached == first.block_table[:2]  # two full shared blocks, not the partial third
    assert second.block_table[:2] == first.block_table[:2]
    assert bm.blocks[cached[0]].ref_count == 2
    assert bm.prefix_cache_queries_tokens == 10 + 11
    assert bm.prefix_cache_hits_tokens == 8


@pytest.mark.parametrize("kind", PREFIX_CACHES)
def test_hit_always_leaves_one_token_to_compute(kind):
    bm = BlockManager(num_blocks=16, block_size=4, prefix_cache=kind)
    run_prefill(bm, make_seq(range(8), "a"))
    again = make_seq(range(8), "b")
    assert len(bm.find_cached_prefix(again)) == 1  # 8 tokens: only the first block may hit


@pytest.mark.parametrize("kind", PREFIX_CACHES)
def test_hit_requires_same_whole_prefix_not_same_block(kind):
    bm = BlockManager(num_blocks=16, block_size=4, prefix_cache=kind)
    run_prefill(bm, make_seq([1, 2, 3, 4, 5, 6, 7, 8, 9], "a"))
    # Same second block, different first block: the chain hash differs, so no hit at all.
    assert bm.find_cached_prefix(make_seq([0, 2, 3, 4, 5, 6, 7, 8, 9], "b")) == []


@pytest.mark.parametrize("kind", PREFIX_CACHES)
def test_freed_blocks_stay_cached_until_evicted_least_recent_first(kind):
    bm = BlockManager(num_blocks=4, block_size=2, prefix_cache=kind)
    a = make_seq([1, 2, 3, 4, 5], "a")  # blocks: [1,2] [3,4] [5]
    run_prefill(bm, a)
    bm.free(a)
    assert bm.num_free_blocks == 4 and bm.usage == 0.0
    assert len(bm.find_cached_prefix(make_seq([1, 2, 3, 4, 9], "x"))) == 2
    # Needs 3 blocks: the uncached one first, then the cached tail [3,4] (freed before the head).
    b = make_seq([7, 7, 8, 8, 9], "b")
    assert bm.allocate(b, 5)
    assert len(bm.find_cached_prefix(make_seq([1, 2, 3, 4, 9], "y"))) == 1


@pytest.mark.parametrize("kind", PREFIX_CACHES)
def test_hit_on_evictable_block_takes_it_out_of_the_free_pool(kind):
    bm = BlockManager(num_blocks=3, block_size=2, prefix_cache=kind)
    a = make_seq([1, 2, 3], "a")
    run_prefill(bm, a)
    bm.free(a)
    b = make_seq([1, 2, 4, 5, 6, 7], "b")  # hits [1,2], needs 2 more blocks: 3 in all
    cached = bm.find_cached_prefix(b)
    assert bm.allocate(b, 4, cached)
    assert bm.num_free_blocks == 0 and b.block_table[0] == cached[0]
    c = make_seq([1, 2, 9], "c")  # the shared block is free to share, but c's own block is not there
    assert not bm.allocate(c, 1, bm.find_cached_prefix(c))
    assert bm.blocks[cached[0]].ref_count == 1


def test_prefix_caching_off_never_hits():
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=False)
    run_prefill(bm, make_seq(range(12), "a"))
    assert run_prefill(bm, make_seq(range(12), "b")) == []
    assert bm.prefix_cache_hits_tokens == 0


def test_bad_sizes_name_the_field():
    with pytest.raises(ValueError, match="kv_cache_tokens"):
        BlockManager(0, 16)
    with pytest.raises(ValueError, match="block_size"):
        BlockManager(4, 0)
    with pytest.raises(ValueError, match="prefix_cache: must be one of hash, radix"):
        BlockManager(4, 4, prefix_cache="trie")
