"""The router's prefix tree and its policies (pure logic, no servers)."""

import os
import random

import pytest

from native_engine.router_prefix_tree import PrefixTree
from native_engine.routing_policy import CacheAwareConfig, Policy, prompt_text


def test_tree_match_is_the_longest_prefix_sent_to_a_live_replica_and_its_latest_sender():
    """Against the definition, over every prompt sent: short texts of two letters make many shared prefixes,
    edge splits and texts that end inside an edge."""
    rng = random.Random(5)
    tree, sent = PrefixTree(), []  # (text, tenant) in the order sent
    for _ in range(80):
        text, tenant = "".join(rng.choice("ab") for _ in range(rng.randint(1, 10))), rng.choice("xyz")
        tree.insert(text, tenant)
        sent.append((text, tenant))
    for alive in ({"x", "y", "z"}, {"x", "y"}, {"z"}):
        for _ in range(60):
            query = "".join(rng.choice("ab") for _ in range(rng.randint(1, 12)))
            shared = [(len(os.path.commonprefix([text, query])), tenant) for text, tenant in sent if tenant in alive]
            longest = max(n for n, _ in shared)
            latest = [tenant for n, tenant in shared if n == longest][-1] if longest else None
            assert tree.match(query, alive) == (longest, latest), (query, alive)


def test_tree_matches_the_longest_prefix_and_splits_edges():
    tree = PrefixTree()
    tree.insert("system: be brief. user: hello", "a")
    tree.insert("system: be brief. user: bye", "b")
    assert tree.match("system: be brief. user: hello again", {"a", "b"}) == (len("system: be brief. user: hello"), "a")
    assert tree.match("system: be brief. user: bye now", {"a", "b"}) == (len("system: be brief. user: bye"), "b")
    # the shared part is held by both; the one that used it last wins it
    matched, holder = tree.match("system: be brief. user: what", {"a", "b"})
    assert matched == len("system: be brief. user: ") and holder == "b"
    assert tree.match("unrelated", {"a", "b"}) == (0, None)
    # a dead tenant is not matched
    assert tree.match("system: be brief. user: hello", {"b"}) == (len("system: be brief. user: "), "b")
    # tenant sizes count each character it holds once
    assert tree.chars_of == {"a": len("system: be brief. user: hello"), "b": len("system: be brief. user: bye")}


def test_tree_forgets_a_tenant_and_evicts_least_recent_leaves():
    tree = PrefixTree()
    tree.insert("shared prefix / old question", "a")
    tree.insert("shared prefix / new question", "a")
    tree.insert("shared prefix / other", "b")
    tree.evict(max_chars=len("shared prefix / new question"))
    assert tree.chars_of["a"] == len("shared prefix / new question")
    assert tree.match("shared prefix / old question", {"a"})[0] == len("shared prefix / ")
    assert tree.match("shared prefix / new question", {"a"})[0] == len("shared prefix / new question")
    tree.remove_tenant("a")
    assert tree.chars_of["a"] == 0 and tree.match("shared prefix / new question", {"a", "b"}) == (
        len("shared prefix / "),
        "b",
    )
    tree.remove_tenant("b")
    assert tree.root.children == {}


def test_round_robin_skips_replicas_that_are_down():
    policy = Policy("round_robin", ["0", "1", "2"])
    picks = [policy.choose("x", {}, {"0", "1", "2"}).replica for _ in range(6)]
    assert picks == ["0", "1", "2", "0", "1", "2"]
    assert {policy.choose("x", {}, {"0", "2"}).replica for _ in range(4)} == {"0", "2"}
    with pytest.raises(LookupError):
        policy.choose("x", {}, set())


def test_least_load_picks_fewest_in_flight():
    policy = Policy("least_load", ["0", "1", "2"])
    assert policy.choose("x", {"0": 3, "1": 1, "2": 2}, {"0", "1", "2"}).replica == "1"
    assert policy.choose("x", {"0": 3, "1": 1, "2": 2}, {"0", "2"}).replica == "2"


def test_cache_aware_follows_the_prefix_until_load_is_imbalanced():
    policy = Policy(
        "cache_aware",
        ["0", "1"],
        CacheAwareConfig(cache_threshold=0.5, balance_abs_threshold=4, balance_rel_threshold=1.5),
    )
    up = {"0", "1"}
    doc = "a long shared document " * 4
    first = policy.choose(doc + "question one", {}, up)
    assert first.reason == "cache_miss"
    # a new prompt with no match goes to the replica with the smaller tree (the other one)
    other = policy.choose("something else entirely", {}, up)
    assert other.reason == "cache_miss" and other.replica != first.replica
    # same document: the replica that saw it, even if it is a little busier
    load = {first.replica: 4, other.replica: 0}
    again = policy.choose(doc + "question two", load, up)
    assert (again.replica, again.reason) == (first.replica, "cache_hit") and again.matched_chars >= len(doc)
    # imbalanced (5 - 0 > 4 and 5 > 1.5 * 0): the least loaded one, prefix or not
    load = {first.replica: 5, other.replica: 0}
    assert policy.choose(doc + "question three", load, up).reason == "imbalanced"
    # both conditions are needed: 10 - 6 = 4 is not over the absolute margin
    assert policy.choose(doc + "question four", {first.replica: 10, other.replica: 6}, up).reason == "cache_hit"
    # a prompt matching less than cache_threshold of itself is a miss
    assert policy.choose(doc[:10] + "x" * 100, {}, up).reason == "cache_miss"
    # the holder went down: its prefixes are forgotten (the imbalanced pick above still holds the document)
    policy.replica_lost(first.replica)
    assert policy.tree.match(doc, {first.replica}) == (0, None)
    assert policy.choose(doc + "question five", {}, up).replica == other.replica


def test_prompt_text_of_completions_and_chats():
    assert prompt_text({"prompt": "hi"}) == prompt_text({"prompt": ["hi"]}) == "hi"
    assert prompt_text({"prompt": [5, 6]}) == "5,6,"
    turn1 = prompt_text({"messages": [{"role": "user", "content": "hi"}]})
    turn2 = prompt_text(
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "yo"},
                {"role": "user", "content": [{"type": "text", "text": "more"}]},
            ]
        }
    )
    assert turn2.startswith(turn1) and "more" in turn2
    assert prompt_text({"prompt": 5}) == ""
    with pytest.raises(ValueError, match="--router-policy"):
        Policy("random", ["0"])
