"""Radix-tree prefix cache through the block manager: whole-block matches, edge splits, reference
counts, eviction of unreferenced leaves least recently released first, recompute counting."""

import pytest
from helpers import make_seq, run_prefill  # the engine's allocate-then-compute, as there

from native_engine.block_manager import BlockManager, key_token_ids


def radix(num_blocks, block_size=2):
    return BlockManager(num_blocks, block_size, prefix_cache="radix")


def edges(node):
    """The tree as nested {first block tokens: (blocks on the edge, children)}."""
    return {key_token_ids(key): (len(child.block_ids), edges(child)) for key, child in node.children.items()}


def test_match_is_longest_whole_block_prefix_and_divergence_splits_the_edge():
    bm = radix(16)
    a = make_seq([1, 2, 3, 4, 5, 6, 7])  # blocks [1,2] [3,4] [5,6] + partial [7]
    run_prefill(bm, a)
    assert edges(bm.cache.root) == {(1, 2): (3, {})}
    # Shares two blocks and half of the third: the half block is recomputed, not copied.
    b = make_seq([1, 2, 3, 4, 5, 9, 9])
    assert run_prefill(bm, b) == a.block_table[:2]
    assert edges(bm.cache.root) == {(1, 2): (2, {(5, 6): (1, {}), (5, 9): (1, {})})}
    assert len(bm.find_cached_prefix(make_seq([1, 2, 3, 4, 5, 9, 9, 9]))) == 3
    assert bm.find_cached_prefix(make_seq([0, 2, 3, 4, 5, 6, 7])) == []  # first block differs


def test_hit_leaves_one_token_and_counts_queries_and_hits():
    bm = radix(16)
    run_prefill(bm, make_seq(range(8), "a"))
    again = make_seq(range(8), "b")
    assert len(run_prefill(bm, again)) == 3  # 8 tokens: 3 of 4 blocks may hit
    assert bm.prefix_cache_queries_tokens == 16 and bm.prefix_cache_hits_tokens == 6


def test_eviction_takes_least_recently_released_leaf_never_a_shared_head():
    bm = radix(6)
    a, b = make_seq([1, 1, 2, 2, 3, 3, 0], "a"), make_seq([1, 1, 2, 2, 4, 4, 0], "b")
    run_prefill(bm, a)
    run_prefill(bm, b)  # shares [1,1] [2,2]; 6 blocks in use
    assert bm.num_free_blocks == 0
    bm.free(a)  # released first: a's leaf [3,3] is the oldest
    bm.free(b)
    assert bm.num_free_blocks == 6 and bm.cache.num_evictable == 4
    assert bm.num_cached_blocks == 4 and bm.prefix_cache_evictions == 0  # the cache's memory, on /metrics
    c = make_seq([9, 9, 9, 9, 9], "c")  # 3 blocks: 2 uncached partial blocks, then one eviction
    assert bm.allocate(c, 5)
    assert bm.num_cached_blocks == 3 and bm.prefix_cache_evictions == 1
    assert len(bm.find_cached_prefix(make_seq([1, 1, 2, 2, 3, 3, 0]))) == 2  # [3,3] went
    assert len(bm.find_cached_prefix(make_seq([1, 1, 2, 2, 4, 4, 0]))) == 3  # b's leaf stays
    d = make_seq([8] * 5, "d")  # 3 more: b's leaf, then the head's tail, then its head
    assert bm.allocate(d, 5)
    assert bm.find_cached_prefix(make_seq([1, 1, 2, 2, 4, 4, 0])) == []
    assert bm.cache.root.children == {} and bm.cache.num_evictable == 0 and bm.num_free_blocks == 0
    assert bm.num_cached_blocks == 0 and bm.prefix_cache_evictions == 4


def test_referenced_blocks_are_never_evicted_and_hits_reclaim_free_slots():
    bm = radix(4)
    a = make_seq([1, 1, 2, 2, 3], "a")
    run_prefill(bm, a)  # holds [1,1] [2,2] [3]
    b = make_seq([1, 1, 2, 2, 5], "b")
    cached = run_prefill(bm, b)  # shares both full blocks, takes the last free one
    assert cached == a.block_table[:2] and bm.blocks[cached[0]].ref_count == 2
    bm.free(a)
    assert bm.num_free_blocks == 1  # a's partial block; the shared ones are still b's
    assert not bm.allocate(make_seq(range(10, 16), "c"), 6)
    bm.free(b)
    assert bm.num_free_blocks == 4 and bm.cache.num_evictable == 2
    d = make_seq([1, 1, 2, 2, 7], "d")
    assert bm.allocate(d, 1, bm.find_cached_prefix(d))  # hit on two unreferenced cached blocks
    assert bm.cache.num_evictable == 0 and bm.num_free_blocks == 1


def test_same_prefix_computed_twice_at_once_keeps_the_first_copy():
    bm = radix(16)
    a, b = make_seq([1, 1, 2, 2, 3], "a"), make_seq([1, 1, 2, 2, 4], "b")
    for seq in (a, b):  # both admitted before either's KV is cached
        assert bm.allocate(seq, 5)
    for seq in (a, b):
        seq.num_computed_tokens = 5
        bm.cache_computed_blocks(seq)
    assert bm.find_cached_prefix(make_seq([1, 1, 2, 2, 9])) == a.block_table[:2]
    bm.free(b)  # b's copies were never cached: straight back to the pool
    assert len(bm.free_block_ids) == 16 - 3 and bm.cache.num_evictable == 0


def test_decode_blocks_join_the_tree_as_they_fill():
    bm = radix(16)
    a = make_seq([1, 1, 2], "a")
    run_prefill(bm, a)
    a.token_ids += [2, 3]  # two decoded tokens: block [2,2] is now full
    assert bm.allocate(a, 2)
    a.num_computed_tokens = 5
    bm.cache_computed_blocks(a)
    assert edges(bm.cache.root) == {(1, 1): (2, {})}  # the leaf grew in place


@pytest.mark.parametrize("kind", ["hash", "radix"])
def test_recomputed_prefill_tokens_count_prefixes_computed_before(kind):
    bm = BlockManager(2, block_size=2, prefix_cache=kind)  # room for one request
    for tokens, recomputed in [
        ([1, 1, 0], 0),  # first time
        ([1, 1, 5], 0),  # a hit
        ([2, 2, 0], 0),  # first time, evicts [1,1]
        ([1, 1, 7], 2),
    ]:  # [1,1] computed a second time
        seq = make_seq(tokens)
        run_prefill(bm, seq)
        bm.free(seq)
        assert bm.recomputed_prefill_tokens == recomputed
