"""Paged KV cache bookkeeping: physical blocks, per-sequence block tables, and prefix caching.

Two prefix caches, chosen by `prefix_cache`; both reuse whole blocks only:
- "hash" (vLLM's): a full block is keyed by a hash chain, hash(parent block's hash, this block's
  token ids), so a key names the whole prefix up to that block. Unreferenced cached blocks are
  evicted least-recently-freed first; blocks are freed tail-first, so a prefix's tail goes first.
- "radix" (SGLang's): a radix tree of blocks (radix_cache.py); eviction takes unreferenced leaves,
  least recently released first, so a prefix never loses its head while its tail stays.
A cached block no sequence holds (reference count 0) counts as free until its slot is needed.

Prefill tokens computed again (a prefix evicted and met again, or a preempted sequence) are
counted by remembering the chain hashes of the last 8 x num_blocks distinct blocks computed.
"""

from __future__ import annotations

import struct
from collections import OrderedDict, deque
from dataclasses import dataclass

from native_engine.radix_cache import RadixCache
from native_engine.sequence import Sequence

PREFIX_CACHES = ("hash", "radix")


# slots: a replica holds one per KV block (16,384 for 256k tokens; `bench plan` builds them for every replica)
@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None  # hash cache: set once the block is full and its KV computed
    token_ids: bytes = b""  # its key (block_keys): checked on a hit, since hashes can collide


def chain_hash(parent_hash: int | None, key: bytes) -> int:
    # bytes hash with the process's own key (PYTHONHASHSEED): no order here depends on a hash's value, as
    # dicts keep insertion order and no set of hashes is iterated
    return hash((parent_hash, key))  # BlockManager._update_block_hashes has it inline


def block_keys(token_ids: list[int], block_size: int) -> list[bytes]:
    """token_ids cut into blocks of block_size (a shorter tail dropped), each block's ids packed as int64 bytes:
    its key. A cached block keeps its key as long as the cache holds it, and a tuple of the ids kept their int
    objects alive with it (16 objects a block, ~4x the memory; a hit's check read each of them): bytes hold no
    objects and compare by one memcmp."""
    num_tokens = len(token_ids) // block_size * block_size
    packed = struct.pack(f"{num_tokens}q", *token_ids[:num_tokens])
    width = 8 * block_size
    return [packed[i : i + width] for i in range(0, len(packed), width)]


def key_token_ids(key: bytes) -> tuple[int, ...]:
    """A block key's token ids (block_keys' inverse), for reading a cache's state."""
    return struct.unpack(f"{len(key) // 8}q", key)


class HashPrefixCache:
    """vLLM-style prefix cache; same interface as RadixCache."""

    def __init__(self, blocks: list[Block], block_size: int):
        self.blocks, self.block_size = blocks, block_size
        self.evictable: OrderedDict[int, None] = OrderedDict()  # ref 0 with a key, LRU order
        self.hash_to_block_id: dict[int, int] = {}

    @property
    def num_evictable(self) -> int:
        return len(self.evictable)

    def holds(self, block_id: int) -> bool:
        return self.blocks[block_id].block_hash is not None

    def match(self, seq: Sequence, max_blocks: int) -> list[int]:
        hit: list[int] = []
        blocks, hash_to_block_id = self.blocks, self.hash_to_block_id
        # BlockManager.find_cached_prefix made seq's hashes and keys up to max_blocks
        for key, block_hash in zip(seq.block_keys[:max_blocks], seq.block_hashes[:max_blocks]):
            block_id = hash_to_block_id.get(block_hash)
            if block_id is None or blocks[block_id].token_ids != key:
                break
            hit.append(block_id)
        return hit

    def insert(self, seq: Sequence, num_blocks: int) -> None:
        blocks, hash_to_block_id = self.blocks, self.hash_to_block_id
        start = seq.num_keyed_blocks
        for block_id, key, token_ids in zip(
            seq.block_table[start:num_blocks], seq.block_hashes[start:num_blocks], seq.block_keys[start:num_blocks]
        ):
            block = blocks[block_id]
            if block.block_hash is not None or key in hash_to_block_id:
                continue  # another sequence computed the same prefix at the same time; keep theirs
            block.block_hash, block.token_ids = key, token_ids
            hash_to_block_id[key] = block_id

    def released(self, block_id: int) -> None:
        self.evictable[block_id] = None

    def release(self, block_ids: list[int]) -> list[int]:
        """Blocks whose reference count fell to 0, in order: the cached ones become evictable (released);
        returns the others, which the block manager frees."""
        blocks, evictable, uncached = self.blocks, self.evictable, []
        for block_id in block_ids:
            if blocks[block_id].block_hash is None:
                uncached.append(block_id)
            else:
                evictable[block_id] = None
        return uncached

    def reclaimed(self, block_id: int) -> None:
        del self.evictable[block_id]

    def evict(self) -> int:
        block_id, _ = self.evictable.popitem(last=False)
        block = self.blocks[block_id]
        if self.hash_to_block_id.get(block.block_hash) == block_id:
            del self.hash_to_block_id[block.block_hash]
        block.block_hash, block.token_ids = None, b""
        return block_id


class BlockManager:
    def __init__(
        self, num_blocks: int, block_size: int = 16, enable_prefix_caching: bool = True, prefix_cache: str = "hash"
    ):
        if num_blocks < 1:
            raise ValueError("kv_cache_tokens: holds no whole block; give at least block_size tokens")
        if block_size < 1:
            raise ValueError("block_size: must be >= 1")
        if prefix_cache not in PREFIX_CACHES:
            raise ValueError(f"prefix_cache: must be one of {', '.join(PREFIX_CACHES)}, not {prefix_cache!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_block_ids: deque[int] = deque(range(num_blocks))  # uncached: reuse first
        self.cache: HashPrefixCache | RadixCache | None = None
        if enable_prefix_caching:
            self.cache = (RadixCache if prefix_cache == "radix" else HashPrefixCache)(self.blocks, block_size)
        self.prefix_cache_queries_tokens = 0
        self.prefix_cache_hits_tokens = 0
        self.recomputed_prefill_tokens = 0
        self.prefix_cache_evictions = 0  # cached blocks taken back for new KV (reset_prefix_cache not counted)
        self._computed_hashes: OrderedDict[int, None] = OrderedDict()  # the last 8 x num_blocks

    # ---- capacity -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids) + (self.cache.num_evictable if self.cache else 0)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks that only the prefix cache holds: the memory kept for prefixes no running request uses."""
        return self.cache.num_evictable if self.cache else 0

    @property
    def usage(self) -> float:
        """Fraction of blocks held by live sequences (cached-but-unreferenced blocks count as free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- prefix cache lookup --------------------------------------------------------------
    def _update_block_hashes(self, seq: Sequence, num_full_blocks: int) -> None:
        """Grows seq's hash chain, and its blocks' token ids beside it, to num_full_blocks blocks."""
        bs, hashes = self.block_size, seq.block_hashes
        start = len(hashes)
        if num_full_blocks <= start:
            return
        new_keys = block_keys(seq.token_ids[start * bs : num_full_blocks * bs], bs)
        seq.block_keys += new_keys
        parent = hashes[-1] if hashes else None
        for key in new_keys:  # chain_hash, inline: it runs once a block of every prompt
            parent = hash((parent, key))
            hashes.append(parent)

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids holding the longest cached prefix of seq. No side effects.

        At least one token is always left to compute, because the step needs its logits.
        """
        if self.cache is None:
            return []
        max_blocks = (seq.num_tokens - 1) // self.block_size
        self._update_block_hashes(seq, max_blocks)
        return self.cache.match(seq, max_blocks)

    # ---- allocation -----------------------------------------------------------------------
    def allocate(self, seq: Sequence, num_new_tokens: int, cached_block_ids: list[int] = ()) -> bool:
        """Grow seq's block table to cover num_computed + num_new_tokens; all or nothing.

        cached_block_ids (from find_cached_prefix) are only given when seq has no blocks yet;
        they become the head of its table and its computed tokens.
        """
        num_cached = len(cached_block_ids)
        total_tokens = seq.num_computed_tokens + num_cached * self.block_size + num_new_tokens
        num_new_blocks = self.blocks_needed(total_tokens) - len(seq.block_table) - num_cached
        if num_new_blocks <= 0 and not num_cached and seq.block_table:
            return True  # most decode steps: the token fits the last block
        reclaimed = sum(1 for b in cached_block_ids if self.blocks[b].ref_count == 0) if num_cached else 0
        if num_new_blocks > self.num_free_blocks - reclaimed:
            return False
        if not seq.block_table:
            # Counted once per (re)admission, like vLLM: queries and hits in tokens.
            self.prefix_cache_queries_tokens += seq.num_tokens
            self.prefix_cache_hits_tokens += num_cached * self.block_size
            self._count_recomputed(seq, num_cached)
        for block_id in cached_block_ids:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                self.cache.reclaimed(block_id)
            block.ref_count += 1
            seq.block_table.append(block_id)
        seq.num_computed_tokens += num_cached * self.block_size
        if num_new_blocks > 0:
            self._take_free_blocks(seq.block_table, num_new_blocks)
        return True

    def _count_recomputed(self, seq: Sequence, num_cached: int) -> None:
        num_full = seq.num_tokens // self.block_size
        self._update_block_hashes(seq, num_full)
        again = sum(map(self._computed_hashes.__contains__, seq.block_hashes[num_cached:num_full]))
        self.recomputed_prefill_tokens += again * self.block_size

    def _take_free_blocks(self, block_table: list[int], count: int) -> None:
        """Appends count blocks to block_table: uncached free ones first, then evicted cached ones."""
        blocks, free_ids = self.blocks, self.free_block_ids
        for _ in range(count):
            if free_ids:
                block_id = free_ids.popleft()
            else:
                block_id = self.cache.evict()
                self.prefix_cache_evictions += 1
            blocks[block_id].ref_count = 1
            block_table.append(block_id)

    def cache_computed_blocks(self, seq: Sequence) -> None:
        """Offer the blocks of seq that are full and whose KV is now computed to the prefix cache."""
        num_full = seq.num_computed_tokens // self.block_size
        if num_full <= seq.num_keyed_blocks:
            return
        self._update_block_hashes(seq, num_full)
        computed = self._computed_hashes
        for h in seq.block_hashes[seq.num_keyed_blocks : num_full]:
            if h in computed:  # the most recent now (an OrderedDict's insertion of a new key costs ~2 lookups)
                computed.move_to_end(h)
            else:
                computed[h] = None
        while len(computed) > 8 * self.num_blocks:
            computed.popitem(last=False)
        if self.cache is not None:
            self.cache.insert(seq, num_full)
        seq.num_keyed_blocks = num_full

    def reset_prefix_cache(self) -> int:
        """Forgets every cached block no live sequence holds (vLLM's reset_prefix_cache); returns how many.
        Blocks in use keep their keys: they are freed into the cache when their sequence ends."""
        evicted = 0
        while self.cache is not None and self.cache.num_evictable:
            self.free_block_ids.append(self.cache.evict())
            evicted += 1
        self._computed_hashes.clear()  # a prompt computed again after a reset is not a recomputation
        return evicted

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Free the tail blocks of seq beyond those that cover num_tokens (speculative tokens that
        were rejected). Such blocks were allocated fresh for this sequence and never keyed."""
        keep = self.blocks_needed(num_tokens)
        while len(seq.block_table) > keep:
            block_id = seq.block_table.pop()
            self.blocks[block_id].ref_count -= 1
            if self.blocks[block_id].ref_count == 0:
                self.free_block_ids.appendleft(block_id)

    def free(self, seq: Sequence) -> None:
        """Drops seq's references, tail first; a block no sequence holds goes back to the prefix cache (as
        evictable) if it holds it, else to the free list."""
        blocks, unreferenced = self.blocks, []
        for block_id in reversed(seq.block_table):
            block = blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                unreferenced.append(block_id)
        self.free_block_ids.extend(unreferenced if self.cache is None else self.cache.release(unreferenced))
        seq.block_table = []
        seq.num_computed_tokens = 0
        seq.num_keyed_blocks = 0
