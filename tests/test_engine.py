"""The engine loop: same greedy output alone / batched / chunked / cached / preempted (real
SmolLM2; up to a near tie, tests/helpers.py), and stop handling, aborts and streaming on a tiny random GGUF."""

import asyncio

import pytest
from helpers import assert_same_tokens_up_to_near_tie

from native_engine.engine_thread import EngineThread
from native_engine.llm_engine import EngineConfig, LLMEngine, LoadedModel
from native_engine.scheduler import SchedulerConfig
from native_engine.sequence import SamplingParams

TEXT = (
    "Paged attention stores the key and value cache in fixed-size blocks, so memory is allocated on demand "
    "and shared between requests with a common prefix. Continuous batching admits new requests at every "
    "step instead of waiting for the whole batch, and chunked prefill splits long prompts so that running "
    "streams keep producing tokens while a long prompt is processed."
)


def engine_for(loaded, kv_cache_tokens=4096, prefix_caching=True, **scheduler):
    config = EngineConfig(
        kv_cache_tokens=kv_cache_tokens, enable_prefix_caching=prefix_caching, scheduler=SchedulerConfig(**scheduler)
    )
    return LLMEngine(config, loaded)


@pytest.fixture(scope="module")
def smollm2():
    return LoadedModel.load("smollm2")


@pytest.mark.slow
def test_greedy_output_same_alone_batched_chunked_and_from_prefix_cache(smollm2):
    tok = smollm2.tokenizer
    words = TEXT.split()
    prompts = [tok.encode(" ".join(words[: 3 + 2 * i])) for i in range(16)]  # 3..33 words
    target = 15  # > 32 tokens: 2 chunks
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    alone = engine_for(smollm2, prefix_caching=False, max_num_batched_tokens=1024)
    [reference] = alone.generate([prompts[target]], greedy)
    [reference_4] = alone.generate([prompts[4]], greedy)

    batched = engine_for(smollm2, max_num_batched_tokens=32, max_num_seqs=16)
    params = [
        SamplingParams(max_tokens=3 + i % 4, temperature=0.8, seed=i) if i % 3 == 1 else greedy for i in range(16)
    ]
    params[target] = params[4] = greedy
    assert len(prompts[target]) > 32
    results = batched.generate(prompts, params)
    assert_same_tokens_up_to_near_tie(smollm2, prompts[target], greedy, results[target].token_ids, reference.token_ids)
    assert_same_tokens_up_to_near_tie(smollm2, prompts[4], greedy, results[4].token_ids, reference_4.token_ids)
    assert all(len(r.token_ids) == p.max_tokens for r, p in zip(results, params))

    hits_before = batched.block_manager.prefix_cache_hits_tokens
    [cached] = batched.generate([prompts[target]], greedy)
    assert cached.num_cached_tokens >= 32 and batched.block_manager.prefix_cache_hits_tokens > hits_before
    assert_same_tokens_up_to_near_tie(smollm2, prompts[target], greedy, cached.token_ids, reference.token_ids)


@pytest.mark.slow
def test_preemption_recomputes_to_the_same_greedy_output(smollm2):
    tok = smollm2.tokenizer
    words = TEXT.split()
    prompts = [tok.encode(" ".join(words[5 * i : 5 * i + 22])) for i in range(4)]  # 24-27 tokens each
    # Prompts fill 2 blocks of 16 each (8 in all); crossing 32 tokens needs a 3rd: preemption.
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    roomy = engine_for(smollm2, prefix_caching=False)
    expected = [r.token_ids for r in roomy.generate(prompts, greedy)]
    small = engine_for(smollm2, kv_cache_tokens=128, prefix_caching=False)  # 8 blocks for 12 needed
    got = [r.token_ids for r in small.generate(prompts, greedy)]
    assert small.scheduler.num_preemptions > 0
    for prompt, g, e in zip(prompts, got, expected, strict=True):
        assert_same_tokens_up_to_near_tie(smollm2, prompt, greedy, g, e)
    assert small.block_manager.num_free_blocks == small.block_manager.num_blocks


# The tiny random model's tied embeddings make its logits very peaked (it repeats one token),
# so its tests sample at a high temperature to get varied, still seeded, tokens.
HOT = 8.0


def test_seeded_sampling_survives_preemption_on_tiny_model(tiny):
    prompts = [tiny.tokenizer.encode(f"request number {i} says hello") for i in range(6)]
    params = [SamplingParams(max_tokens=40, temperature=HOT, seed=100 + i, ignore_eos=True) for i in range(6)]
    expected = [r.token_ids for r in engine_for(tiny).generate(prompts, params)]
    small = engine_for(tiny, kv_cache_tokens=160)
    for prompt, p, r, e in zip(prompts, params, small.generate(prompts, params), expected, strict=True):
        assert_same_tokens_up_to_near_tie(tiny, prompt, p, r.token_ids, e)
    assert small.scheduler.num_preemptions > 0
    assert len(set(map(tuple, expected))) == 6


def test_stop_string_cuts_text_and_names_the_stop(tiny):
    engine = engine_for(tiny)
    prompt = tiny.tokenizer.encode("the stop test")
    base = SamplingParams(max_tokens=60, temperature=HOT, seed=3, ignore_eos=True)
    [full] = engine.generate([prompt], base)
    stop = full.text[20:23]
    cut = full.text.find(stop)
    [stopped] = engine.generate(
        [prompt], SamplingParams(max_tokens=60, temperature=HOT, seed=3, ignore_eos=True, stop=[stop, "never-appears"])
    )
    assert stopped.text == full.text[:cut]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stop
    assert full.finish_reason == "length" and len(full.token_ids) == 60


def test_stop_token_ids_and_min_tokens(tiny):
    engine = engine_for(tiny)
    prompt = tiny.tokenizer.encode("tokens")
    [full] = engine.generate([prompt], SamplingParams(max_tokens=30, temperature=HOT, seed=5, ignore_eos=True))
    stop_id = full.token_ids[4]
    first = full.token_ids.index(stop_id)
    [stopped] = engine.generate(
        [prompt], SamplingParams(max_tokens=30, temperature=HOT, seed=5, ignore_eos=True, stop_token_ids=[stop_id])
    )
    assert stopped.token_ids == full.token_ids[: first + 1]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stop_id
    [late] = engine.generate(
        [prompt],
        SamplingParams(
            max_tokens=30, temperature=HOT, seed=5, ignore_eos=True, stop_token_ids=[stop_id], min_tokens=first + 2
        ),
    )
    assert len(late.token_ids) >= first + 2
    assert stop_id not in late.token_ids[: first + 2]


def test_abort_frees_blocks_of_running_and_waiting_requests(tiny):
    engine = engine_for(tiny, max_num_seqs=1)
    prompt = tiny.tokenizer.encode("abort me please, I am a long running request")
    params = SamplingParams(max_tokens=500, ignore_eos=True)
    engine.add_request("running", prompt, params)
    engine.add_request("waiting", prompt, params)
    for _ in range(3):
        engine.step()
    assert engine.block_manager.usage > 0 and len(engine.scheduler.waiting) == 1
    engine.abort_request("running")
    engine.abort_request("waiting")
    engine.step()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert not engine.scheduler.has_work()


async def test_streams_from_the_engine_thread_and_close_aborts(tiny):
    engine = engine_for(tiny)
    engine_thread = EngineThread(engine)
    engine_thread.start(asyncio.get_running_loop())
    try:
        prompt = tiny.tokenizer.encode("stream")
        greedy_12 = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
        stream = engine_thread.open_stream("s1", prompt, greedy_12)
        outs = [out async for out in stream]
        stream.close()
        assert len(outs) == 12 and outs[-1].finished and outs[-1].finish_reason == "length"

        long = engine_thread.open_stream("s2", prompt, SamplingParams(max_tokens=1500, ignore_eos=True))
        await long.__anext__()
        long.close()  # the client went away
        for _ in range(200):
            if engine.block_manager.usage == 0 and not engine.scheduler.has_work():
                break
            await asyncio.sleep(0.01)
        assert engine.block_manager.usage == 0 and not engine.scheduler.has_work()
        generated = engine.metrics.registry.get_sample_value(
            "native:generation_tokens_total", {"model_name": "smollm2"}
        )
        assert 12 < generated < 12 + 1500  # s2 was aborted, not run to the end
    finally:
        engine_thread.stop()
