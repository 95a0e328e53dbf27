"""The router's approximate picture of what each replica has cached: one radix tree over prompt text,
each node tagged with the replicas ("tenants") that were sent a prompt running through it.

Approximate, as in SGLang's router: it records where prompts were routed, not what a replica's KV
cache still holds, so it needs no tokenizer and no messages from the replicas. Text, not token ids:
the same text makes the same tokens, and matching characters is cheap.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(eq=False)
class Node:
    text: str = ""  # the edge label leading here
    parent: Node | None = None
    children: dict[str, Node] = field(default_factory=dict)  # by first character of the edge
    last_used: dict[str, float] = field(default_factory=dict)  # tenant -> last time a prompt passed here


def common_prefix_len(a: str, b: str) -> int:
    """Characters a and b share at their start. Bisection over slice comparisons (done in C): a prompt of
    tens of thousands of characters is compared in ~log2(n) slices instead of a Python step a character."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PrefixTree:
    def __init__(self) -> None:
        self.root = Node()
        self.chars_of: dict[str, int] = {}  # tenant -> characters of the tree it holds (its "cache size")

    def add_tenant(self, tenant: str) -> None:
        self.chars_of.setdefault(tenant, 0)

    def insert(self, text: str, tenant: str) -> None:
        """Record that `text` was sent to `tenant`: every node along it now holds that tenant."""
        now = time.monotonic()
        self.add_tenant(tenant)
        node, at = self.root, 0  # text[at:] is what is left below node (an offset: no copy of the rest)
        self.root.last_used[tenant] = now
        while at < len(text):
            child = node.children.get(text[at])
            if child is None:
                child = Node(text=text[at:], parent=node)
                node.children[text[at]] = child
            elif not text.startswith(child.text, at):
                shared = common_prefix_len(child.text, text[at : at + len(child.text)])
                child = self._split(child, shared)
            if tenant not in child.last_used:
                self.chars_of[tenant] += len(child.text)
            child.last_used[tenant] = now
            node, at = child, at + len(child.text)

    def _split(self, child: Node, at: int) -> Node:
        """Cut child's edge after `at` characters; returns the new upper node (same tenants)."""
        upper = Node(text=child.text[:at], parent=child.parent, last_used=dict(child.last_used))
        child.parent.children[upper.text[0]] = upper
        child.text, child.parent = child.text[at:], upper
        upper.children[child.text[0]] = child
        return upper

    def match(self, text: str, alive: set[str]) -> tuple[int, str | None]:
        """Longest prefix of `text` some alive tenant holds: (characters matched, that tenant).
        Where several hold it, the one that used it last (of the deepest node reached)."""
        everyone = alive.issuperset(self.chars_of)  # the usual case: no tenant to leave out
        node, at, last = self.root, 0, None
        while at < len(text):
            child = node.children.get(text[at])
            if child is None or not (child.last_used if everyone else any(t in alive for t in child.last_used)):
                break
            last = child
            if not text.startswith(child.text, at):
                at += common_prefix_len(child.text, text[at : at + len(child.text)])
                break
            node, at = child, at + len(child.text)
        if last is None:
            return at, None
        used = last.last_used
        return at, max(used if everyone else [t for t in used if t in alive], key=used.get)

    def remove_tenant(self, tenant: str) -> None:
        """Forget a replica wholly (it restarted or died: its cache is gone)."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            node.last_used.pop(tenant, None)
            stack.extend(node.children.values())
            if not node.last_used:
                self._drop(node)
        self.root.last_used.pop(tenant, None)
        self.chars_of[tenant] = 0

    def evict(self, max_chars: int) -> None:
        """Take each tenant down to max_chars by removing it from its least recently used leaves,
        as a replica's own cache evicts its least recently used blocks."""
        for tenant, size in self.chars_of.items():
            while size > max_chars:
                leaves = [
                    n
                    for n in self._nodes()
                    if tenant in n.last_used and not any(tenant in c.last_used for c in n.children.values())
                ]
                if not leaves:
                    break
                leaf = min(leaves, key=lambda n: n.last_used[tenant])  # its parent may be the next leaf
                del leaf.last_used[tenant]
                size -= len(leaf.text)
                if not leaf.last_used:
                    self._drop(leaf)
            self.chars_of[tenant] = size

    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _drop(self, node: Node) -> None:
        if node.parent is not None and node.parent.children.get(node.text[0]) is node:
            del node.parent.children[node.text[0]]
