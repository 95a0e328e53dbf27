"""Prefix cache as a radix tree over paged KV blocks (SGLang's RadixCache, at block granularity).

A node is an edge of whole blocks: the token ids of each block and the id of the block holding
their KV. A path from the root spells a cached prefix; children are keyed by the tokens of their
first block. A lookup walks the tree and returns the longest cached prefix.

Whole blocks only. A block's KV is shared by pointing at it, so a match that ended inside a
block would first need the matched part copied into a fresh block (copy-on-write). Like SGLang
with page_size > 1, a match is rounded down to whole blocks: at most block_size - 1 tokens of a
partly matching block are recomputed, and no KV is ever copied.

Reference counts are the block manager's per-block counts (sequences holding the block). A
sequence holds every block on its path from the root (insert() stops where the tree holds other
block ids for the same tokens), so counts never grow going down a path and every unreferenced
block can be reached by peeling leaves. Eviction takes the tail block of the least recently
released leaf whose tail is unreferenced, one block at a time; a leaf left empty is removed and
its parent may become the next leaf.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

from native_engine.sequence import Sequence


@dataclass(eq=False)
class Node:
    parent: Node | None
    block_tokens: list[bytes] = field(default_factory=list)  # each block's key (block_manager.block_keys)
    block_ids: list[int] = field(default_factory=list)
    children: dict[bytes, Node] = field(default_factory=dict)
    last_access: int = 0  # a tick of the cache's clock: when a block of it was last released
    removed: bool = False


class RadixCache:
    def __init__(self, blocks: list, block_size: int):
        self.blocks = blocks  # the block manager's Block list; only ref_count is read
        self.block_size = block_size
        self.root = Node(None)
        self.node_of: dict[int, Node] = {}  # cached block id -> the node holding it
        self.num_evictable = 0  # cached blocks no sequence holds
        self._clock = itertools.count(1)
        self._order = itertools.count()  # tie-break in the heap
        # Candidate leaves as (last_access, order, node); an entry is checked when popped.
        self._heap: list[tuple[int, int, Node]] = []

    def holds(self, block_id: int) -> bool:
        return block_id in self.node_of

    # ---- lookup and insertion -------------------------------------------------------------
    # Both read seq.block_keys, its blocks' token ids packed as bytes: the block manager grows them to the blocks
    # asked for before it calls either (BlockManager._update_block_hashes).
    def match(self, seq: Sequence, max_blocks: int) -> list[int]:
        """Block ids of the longest cached prefix of seq, at most max_blocks. No side effects."""
        keys = seq.block_keys
        hit: list[int] = []
        node = self.root
        while len(hit) < max_blocks:
            child = node.children.get(keys[len(hit)])
            if child is None:
                break
            for key, block_id in zip(child.block_tokens, child.block_ids):
                i = len(hit)
                if i == max_blocks or keys[i] != key:
                    return hit
                hit.append(block_id)
            node = child
        return hit

    def insert(self, seq: Sequence, num_blocks: int) -> None:
        """Cache the first num_blocks blocks of seq (full, KV computed, seq.block_table[i] holds block i).

        Stops where the tree holds another block id for the same tokens: another sequence computed
        that prefix at the same time. Its blocks stay; seq's copies are freed with seq.
        """
        keys, ids = seq.block_keys[:num_blocks], seq.block_table[:num_blocks]
        node, i = self.root, 0
        while i < num_blocks:
            child = node.children.get(keys[i])
            if child is None:
                if node is self.root or node.children:
                    child = Node(node, last_access=next(self._clock))
                    node.children[keys[i]] = child
                else:
                    child = node
                child.block_tokens += keys[i:]  # a fresh child, or the leaf seq ends at grows
                child.block_ids += ids[i:]
                for block_id in ids[i:]:
                    self.node_of[block_id] = child
                return
            j = 0
            while j < len(child.block_ids) and i < num_blocks and child.block_tokens[j] == keys[i]:
                if child.block_ids[j] != ids[i]:
                    return
                i, j = i + 1, j + 1
            if j < len(child.block_ids):
                if i == num_blocks:
                    return  # seq's blocks end inside this edge: all cached already
                self._split(child, j)
            node = child

    def _split(self, node: Node, j: int) -> None:
        """Cut node's edge after its first j blocks; the rest becomes its only child."""
        lower = Node(
            node,
            block_tokens=node.block_tokens[j:],
            block_ids=node.block_ids[j:],
            children=node.children,
            last_access=node.last_access,
        )
        for child in lower.children.values():
            child.parent = lower
        for block_id in lower.block_ids:
            self.node_of[block_id] = lower
        node.block_tokens, node.block_ids = node.block_tokens[:j], node.block_ids[:j]
        node.children = {lower.block_tokens[0]: lower}
        self._push(lower)

    # ---- reference counts and eviction ------------------------------------------------------
    def released(self, block_id: int) -> None:
        """A cached block's reference count fell to 0."""
        self.num_evictable += 1
        node = self.node_of[block_id]
        node.last_access = next(self._clock)
        self._push(node)

    def release(self, block_ids: list[int]) -> list[int]:
        """Blocks whose reference count fell to 0, in order: the cached ones are released; returns the others,
        which the block manager frees."""
        uncached = []
        for block_id in block_ids:
            if block_id in self.node_of:
                self.released(block_id)
            else:
                uncached.append(block_id)
        return uncached

    def reclaimed(self, block_id: int) -> None:
        """A cached block with reference count 0 is taken by a sequence again (a hit)."""
        self.num_evictable -= 1

    def evict(self) -> int:
        """Drop the least recently released unreferenced tail block; returns its id, now uncached."""
        while True:
            access, _, node = heapq.heappop(self._heap)  # num_evictable > 0 guarantees an entry
            if access == node.last_access and self._is_evictable_leaf(node):
                break
        block_id, key = node.block_ids.pop(), node.block_tokens.pop()
        del self.node_of[block_id]
        self.num_evictable -= 1
        if node.block_ids:
            self._push(node)
        else:
            node.removed = True
            del node.parent.children[key]  # an emptied node's last block was its first
            self._push(node.parent)
        return block_id

    def _is_evictable_leaf(self, node: Node) -> bool:
        return (
            not node.removed
            and node is not self.root
            and not node.children
            and bool(node.block_ids)
            and self.blocks[node.block_ids[-1]].ref_count == 0
        )

    def _push(self, node: Node) -> None:
        if self._is_evictable_leaf(node):
            heapq.heappush(self._heap, (node.last_access, next(self._order), node))
        if len(self._heap) > 2 * len(self.node_of) + 64:  # drop stale entries now and then
            self._heap = [e for e in self._heap if e[0] == e[2].last_access and self._is_evictable_leaf(e[2])]
            heapq.heapify(self._heap)
