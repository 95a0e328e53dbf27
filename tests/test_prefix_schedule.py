"""Prefix thrashing and cache-aware scheduling through the whole engine (scheduler, block manager,
model): the seed's 9 -> 2 example, and the same greedy output with radix, hash or no prefix cache."""

import pytest

from native_engine.llm_engine import EngineConfig, LLMEngine, LoadedModel
from native_engine.scheduler import SchedulerConfig
from native_engine.sequence import SamplingParams

BLOCK = 4
PREFIX = {g: list(range(base, base + 4 * BLOCK)) for g, base in (("A", 10), ("B", 40), ("C", 70))}


@pytest.mark.parametrize("prefix_cache", ["hash", "radix"])
@pytest.mark.parametrize("policy, computations, recomputed", [("fcfs", 9, 7), ("lpm", 2, 0)])
def test_seed_example_queue_abcacbabc_with_c_cached(tiny, prefix_cache, policy, computations, recomputed):
    # The cache holds one prefix: 4 prefix blocks + the request's partial block; one request at a time.
    engine = LLMEngine(
        EngineConfig(
            kv_block_size=BLOCK,
            kv_cache_tokens=5 * BLOCK,
            prefix_cache=prefix_cache,
            scheduler=SchedulerConfig(max_num_seqs=1, schedule_policy=policy),
        ),
        tiny,
    )
    params = SamplingParams(max_tokens=1, temperature=0.0)
    engine.generate([PREFIX["C"] + [200, 201]], params)  # C starts in the cache
    queue = "ABCACBABC"
    results = engine.generate([PREFIX[g] + [200 + i, 201] for i, g in enumerate(queue)], params)
    prefix_len = len(PREFIX["A"])
    computed = [g for g, r in zip(queue, results) if r.num_cached_tokens < prefix_len]
    assert len(computed) == computations
    assert all(r.num_cached_tokens in (0, prefix_len) for r in results)
    # Computed again although computed before (the first A and B are new): 7 prefixes with fcfs.
    assert engine.block_manager.recomputed_prefill_tokens == recomputed * prefix_len
    page = engine.metrics.render().decode()
    assert f'native:recomputed_prefill_tokens_total{{model_name="smollm2"}} {float(recomputed * prefix_len)}' in page
    assert f'native:prompt_tokens_cached_total{{model_name="smollm2"}} {float(prefix_len * (9 - computations))}' in page


@pytest.mark.slow
def test_greedy_output_same_with_radix_hash_or_no_prefix_cache_and_either_policy():
    smollm2 = LoadedModel.load("smollm2")
    shared = smollm2.tokenizer.encode(
        "Prefix caching lets requests that start with the same system prompt share "
        "its key and value blocks; a radix tree finds the longest shared prefix. "
    )
    questions = ["What is a block?", "Why share the prefix?", "Who evicts leaves?"]
    prompts = [shared + smollm2.tokenizer.encode(q) for q in questions]
    prompts.append(shared[:20] + smollm2.tokenizer.encode(" A different ending that splits the edge."))
    params = SamplingParams(max_tokens=4, temperature=0.0)
    outputs = {}
    for name, caching, kind, policy in [
        ("off", False, "hash", "fcfs"),
        ("hash", True, "hash", "fcfs"),
        ("radix", True, "radix", "fcfs"),
        ("radix-lpm", True, "radix", "lpm"),
    ]:
        # 16 blocks of 4, under two prompts of ~10 blocks: blocks are evicted (one, in each mode) while the
        # shared prefix stays cached.
        engine = LLMEngine(
            EngineConfig(
                kv_block_size=4,
                kv_cache_tokens=64,
                enable_prefix_caching=caching,
                prefix_cache=kind,
                scheduler=SchedulerConfig(schedule_policy=policy, max_num_seqs=4),
            ),
            smollm2,
        )
        first = engine.generate(prompts[:1], params)  # caches the shared prefix
        rest = engine.generate(prompts[1:] + prompts[:1], params)
        outputs[name] = [r.token_ids for r in first + rest]
        hits = sum(r.num_cached_tokens for r in rest)
        assert (hits > 0) == caching, name
    assert outputs["hash"] == outputs["off"]
    assert outputs["radix"] == outputs["off"]
    assert outputs["radix-lpm"] == outputs["off"]
