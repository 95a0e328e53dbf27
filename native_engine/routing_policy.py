"""Which replica gets a request: round_robin, least_load, or cache_aware (SGLang's router rule).

cache_aware, as sgl-router's CacheAwarePolicy decides:
  1. the load is imbalanced when BOTH  max - min > balance_abs_threshold  AND  max > balance_rel_threshold * min
     (load: requests in flight per replica); then the least loaded replica gets it ("imbalanced");
  2. otherwise the replica holding the longest prefix of the prompt in the approximate tree gets it, if
     that prefix is more than cache_threshold of the prompt ("cache_hit");
  3. otherwise the replica whose tree is smallest (most room in its cache) gets it ("cache_miss").
Either way the prompt is then recorded under the chosen replica. Defaults are sgl-router's
CacheAwareConfig defaults (0.5, 32, 1.1); its Python launcher has used 0.3, 64 and 1.5.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from native_engine.config import CacheAwareConfig  # defined with the other settings; imported from here too
from native_engine.router_prefix_tree import PrefixTree

POLICIES = ("round_robin", "least_load", "cache_aware")


@dataclass
class Decision:
    replica: str
    reason: str  # round_robin | least_load | imbalanced | cache_hit | cache_miss
    matched_chars: int = 0  # cache_aware: prefix of the prompt the chosen replica was sent before


class Policy:
    def __init__(self, name: str, replicas: list[str], cache_aware: CacheAwareConfig | None = None) -> None:
        if name not in POLICIES:
            raise ValueError(f"--router-policy must be one of {', '.join(POLICIES)}, got {name!r}")
        self.name, self.replicas = name, list(replicas)
        self.config = cache_aware or CacheAwareConfig()
        self._turn = itertools.count()
        self.tree = PrefixTree()
        for r in self.replicas:
            self.tree.add_tenant(r)

    def choose(self, prompt_text: str, load: dict[str, int], up: set[str]) -> Decision:
        """load: requests in flight per replica; up: replicas that may take requests (not empty)."""
        candidates = self.replicas if up.issuperset(self.replicas) else [r for r in self.replicas if r in up]
        if not candidates:
            raise LookupError("no replica is up")
        if self.name == "round_robin":
            return Decision(candidates[next(self._turn) % len(candidates)], "round_robin")
        loads = [load.get(r, 0) for r in candidates]
        least = candidates[loads.index(min(loads))]  # the first of the least loaded
        if self.name == "least_load":
            return Decision(least, "least_load")
        decision = self._cache_aware(prompt_text, loads, candidates, least)
        self.tree.insert(prompt_text, decision.replica)
        return decision

    def _cache_aware(self, text: str, loads: list[int], candidates: list[str], least: str) -> Decision:
        """loads: of each candidate, in order."""
        c = self.config
        most, fewest = max(loads), min(loads)
        if most - fewest > c.balance_abs_threshold and most > c.balance_rel_threshold * fewest:
            return Decision(least, "imbalanced")
        matched, holder = self.tree.match(text, set(candidates))
        if holder is not None and text and matched / len(text) > c.cache_threshold:
            return Decision(holder, "cache_hit", matched)
        sizes = [self.tree.chars_of.get(r, 0) for r in candidates]
        smallest = candidates[sizes.index(min(sizes))]
        return Decision(smallest, "cache_miss", matched if holder == smallest else 0)

    def replica_lost(self, replica: str) -> None:
        """Its KV cache is gone: what the tree says it holds is no longer true."""
        self.tree.remove_tenant(replica)

    def evict(self) -> None:
        self.tree.evict(self.config.max_tree_chars)


def prompt_text(body: dict) -> str:
    """The text cache_aware matches on: a completion's prompt (token ids as text), or a chat's messages
    in order, so that turn n+1 of a conversation extends turn n's text."""
    if "messages" in body and isinstance(body["messages"], list):
        parts = []
        for m in body["messages"]:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            parts.append(f"<{m.get('role') if isinstance(m, dict) else ''}>{content or ''}")
        return "".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, list):
        return "".join(f"{t}," for t in prompt)
    return prompt if isinstance(prompt, str) else ""
