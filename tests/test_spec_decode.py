"""Speculative decoding: the n-gram proposer, verification logits, the rejection rule (chi-square),
KV rollback, metrics, flag errors, and greedy output equal with speculation on and off."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_same_tokens_up_to_near_tie
from prometheus_client import generate_latest
from scipy.stats import chisquare

from native_engine.block_manager import BlockManager
from native_engine.llm_engine import EngineConfig, LLMEngine, LoadedModel
from native_engine.metrics import EngineMetrics
from native_engine.model_runner import ModelRunner, SeqChunk
from native_engine.sampler import sample_with_drafts
from native_engine.scheduler import SchedulerConfig
from native_engine.sequence import SamplingParams, Sequence
from native_engine.spec_decode import SpeculativeConfig, propose_ngram

FIXTURE = Path(__file__).parent / "fixtures" / "reference_greedy.json"


def engine_for(loaded, k=None, kv_cache_tokens=4096, **scheduler):
    spec = SpeculativeConfig(num_speculative_tokens=k, ngram_max=3, ngram_min=1) if k else None
    return LLMEngine(
        EngineConfig(kv_cache_tokens=kv_cache_tokens, scheduler=SchedulerConfig(**scheduler), speculative=spec), loaded
    )


def metric(engine, name):
    lines = engine.metrics.render().decode().splitlines()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(name)}


# ---- proposer -----------------------------------------------------------------------------
def test_proposer_takes_the_longest_then_most_recent_match():
    #        0  1  2  3  4  5  6  7  8  9 10 11
    tokens = [5, 1, 2, 9, 8, 2, 7, 6, 1, 2, 3, 1, 2]
    # suffix [1, 2] occurs at 1..2 and 8..9 (longest n=2; [3,1,2] is not earlier); the later one wins
    assert propose_ngram(tokens, 3, ngram_min=1, ngram_max=3) == [3, 1, 2]
    assert propose_ngram(tokens, 1, ngram_min=1, ngram_max=3) == [3]
    # a 3-gram match beats a more recent 2-gram one
    tokens = [4, 1, 2, 7, 7, 1, 2, 8, 4, 1, 2]
    assert propose_ngram(tokens, 2, ngram_min=2, ngram_max=3) == [7, 7]
    assert propose_ngram(tokens, 2, ngram_min=2, ngram_max=2) == [8, 4]


def test_proposer_needs_ngram_min_tokens_of_match():
    tokens = [1, 2, 3, 4, 9, 4]
    assert propose_ngram(tokens, 3, ngram_min=1, ngram_max=3) == [9, 4]
    assert propose_ngram(tokens, 3, ngram_min=2, ngram_max=3) == []
    assert propose_ngram([1, 2, 3], 3, ngram_min=1, ngram_max=3) == []
    assert propose_ngram(tokens, 0, ngram_min=1, ngram_max=3) == []


@pytest.mark.parametrize(
    "kwargs, flag",
    [
        (dict(num_speculative_tokens=0), "--num-speculative-tokens"),
        (dict(num_speculative_tokens=17), "--num-speculative-tokens"),
        (dict(ngram_max=0), "--ngram-max"),
        (dict(ngram_min=5, ngram_max=4), "--ngram-min"),
        (dict(method="eagle"), "--speculative"),
    ],
)
def test_bad_speculative_settings_name_the_flag(kwargs, flag):
    with pytest.raises(ValueError, match=flag):
        SpeculativeConfig(**kwargs)


def test_drafts_must_fit_the_step_budget():
    with pytest.raises(ValueError, match="--num-speculative-tokens.*--max-num-batched-tokens 4"):
        EngineConfig(
            scheduler=SchedulerConfig(max_num_batched_tokens=4), speculative=SpeculativeConfig(num_speculative_tokens=4)
        )


def test_serve_rejects_k_out_of_range_at_startup():
    done = subprocess.run(
        [sys.executable, "-m", "native_engine", "serve", "--speculative", "ngram", "--num-speculative-tokens", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "--num-speculative-tokens: must be in [1, 16], got 0" in done.stderr


# ---- verification pass ------------------------------------------------------------------------
def test_all_logits_rows_equal_one_token_steps(tiny):
    """Verification rows (through the few-rows weight copies) equal the logits of one-token steps."""
    config, weights = tiny.config, tiny.weights
    ids = np.random.default_rng(0).integers(3, config.vocab_size, 11).tolist()
    table = list(range(4))[::-1]  # 16 positions in non-contiguous blocks; block 7 is the neighbour's
    stepwise = ModelRunner(config, weights, num_kv_blocks=8, kv_block_size=4)
    stepwise.forward([SeqChunk(ids[:7], 0, table, False)])
    expected = [stepwise.forward([SeqChunk([t], 7 + j, table, True)])[0] for j, t in enumerate(ids[7:])]
    verify = ModelRunner(config, weights, num_kv_blocks=8, kv_block_size=4, few_rows_weights=True)
    verify.forward([SeqChunk(ids[:7], 0, table, False)])
    other = SeqChunk(ids[:3], 0, [7], True)  # a batch neighbour with one logits row
    rows = verify.forward([SeqChunk(ids[7:], 7, table, True, all_logits=True), other])
    assert rows.shape[0] == 4 + 1
    np.testing.assert_allclose(rows[:4], np.stack(expected), rtol=1e-4, atol=1e-4)


def test_trim_frees_the_tail_blocks_only():
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = Sequence("r", list(range(9)), SamplingParams())
    assert bm.allocate(seq, 9 + 5)  # 9 tokens + 5 drafts: 4 blocks
    assert len(seq.block_table) == 4
    head = seq.block_table[:3]
    bm.trim(seq, 10)  # 10 tokens kept: 3 blocks
    assert seq.block_table == head and bm.num_free_blocks == 5


# ---- rejection rule ----------------------------------------------------------------------------
def processed(logits_row, temperature, top_k):
    p = np.exp((logits_row - logits_row.max()) / temperature)
    p[np.argsort(-p)[top_k:]] = 0.0
    return p / p.sum()


def test_rejection_sampling_keeps_the_target_distribution():
    """Each emitted token is distributed as the target's (processed) p: the first as p0, the second,
    given the first draft was kept, as p1, and the bonus after both drafts as p2 — whatever the draft."""
    rng = np.random.default_rng(7)
    vocab, n = 6, 8000
    base = (rng.standard_normal((3, vocab)) * 1.5).astype(np.float32)
    params = dict(temperature=0.8, top_k=5)
    p = [processed(row, 0.8, 5) for row in base]
    draft = [int(np.argsort(-p[0])[1]), int(np.argsort(-p[1])[0])]  # second-likeliest, then likeliest
    seqs = [Sequence(f"r{i}", [1], SamplingParams(max_tokens=8, seed=i, **params)) for i in range(n)]
    out = sample_with_drafts(np.tile(base, (n, 1)), seqs, [draft] * n)
    assert all(1 <= len(o) <= 3 and o[:-1] == draft[: len(o) - 1] for o in out)

    def check(samples, expected):
        counts = np.bincount(samples, minlength=vocab)
        assert counts[expected == 0].sum() == 0  # top_k's cut token is never emitted
        keep = expected > 0
        expected_counts = expected[keep].astype(np.float64) / expected[keep].sum(dtype=np.float64) * len(samples)
        assert chisquare(counts[keep], expected_counts).pvalue > 1e-3

    check(np.array([o[0] for o in out]), p[0])
    check(np.array([o[1] for o in out if len(o) > 1]), p[1])
    check(np.array([o[2] for o in out if len(o) > 2]), p[2])
    # the draft is kept as often as the target would have picked it
    assert abs(np.mean([len(o) > 1 for o in out]) - p[0][draft[0]]) < 0.02


def test_greedy_rows_keep_the_argmax_chain():
    logits = np.zeros((4, 5), dtype=np.float32)
    logits[[0, 1, 2, 3], [3, 1, 4, 2]] = 1.0  # argmax chain 3, 1, 4, 2
    greedy = Sequence("g", [1], SamplingParams(temperature=0.0))
    assert sample_with_drafts(logits.copy(), [greedy], [[3, 1, 4]]) == [[3, 1, 4, 2]]  # all kept + bonus
    assert sample_with_drafts(logits.copy(), [greedy], [[3, 0, 4]]) == [[3, 1]]  # correction at 1
    assert sample_with_drafts(logits[:1].copy(), [greedy], [[]]) == [[3]]


# ---- the engine --------------------------------------------------------------------------------
def test_tiny_model_greedy_same_with_speculation_through_preemption(tiny):
    prompts = [tiny.tokenizer.encode(f"request number {i} says hello") for i in range(6)]
    greedy = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    expected = [r.token_ids for r in engine_for(tiny).generate(prompts, greedy)]
    spec = engine_for(tiny, k=5, kv_cache_tokens=256)  # 16 blocks of 16 for 6 x ~70 tokens: preemption
    got = [r.token_ids for r in spec.generate(prompts, greedy)]
    for prompt, g, e in zip(prompts, got, expected, strict=True):
        assert_same_tokens_up_to_near_tie(tiny, prompt, greedy, g, e)
    assert spec.scheduler.num_preemptions > 0
    assert spec.block_manager.num_free_blocks == spec.block_manager.num_blocks
    m = metric(spec, "native:spec_decode")
    accepted = m['native:spec_decode_num_accepted_tokens_total{model_name="smollm2"}']
    drafted = m['native:spec_decode_num_draft_tokens_total{model_name="smollm2"}']
    per_pos = [
        m[f'native:spec_decode_num_accepted_tokens_per_pos_total{{model_name="smollm2",position="{j}"}}']
        for j in range(5)
    ]
    assert 0 < accepted <= drafted and sum(per_pos) == accepted
    assert per_pos == sorted(per_pos, reverse=True)  # position j is only reached past position j-1
    generated = metric(spec, "native:generation_tokens_total")
    assert sum(generated.values()) == sum(len(g) for g in got)


def test_stop_token_inside_an_accepted_run_ends_the_output_there(tiny):
    prompt = tiny.tokenizer.encode("tokens")
    [full] = engine_for(tiny).generate([prompt], SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    stop_id = full.token_ids[7]
    first = full.token_ids.index(stop_id)
    spec = engine_for(tiny, k=6)
    [stopped] = spec.generate(
        [prompt], SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, stop_token_ids=[stop_id])
    )
    assert stopped.token_ids == full.token_ids[: first + 1] and stopped.finish_reason == "stop"
    [capped] = spec.generate([prompt], SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True))
    assert capped.token_ids == full.token_ids[:9] and capped.finish_reason == "length"
    assert spec.block_manager.num_free_blocks == spec.block_manager.num_blocks


@pytest.mark.slow
def test_greedy_output_identical_with_speculation_on_and_off_on_the_reference_prompts(one_blas_thread):
    fixture = json.loads(FIXTURE.read_text())
    model = LoadedModel.load("smollm2")
    passage = "Paged attention stores the key and value cache in fixed-size blocks shared between requests."
    copy_prompt = model.tokenizer.encode(
        model.tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Repeat this sentence exactly: {passage}"}], add_generation_prompt=True
        )
    )
    prompts = [case["prompt_ids"] for case in fixture["cases"]] + [copy_prompt]
    greedy = SamplingParams(max_tokens=fixture["new_tokens"], temperature=0.0, ignore_eos=True)
    spec = LLMEngine(EngineConfig(kv_cache_tokens=4096, speculative=SpeculativeConfig(num_speculative_tokens=4)), model)
    on = spec.generate(prompts, greedy)  # all in one batch, next to each other's prefill chunks
    # Without speculation the engine gives the reference's ids (test_engine, test_model_runner); here
    # the reference stands in for the off run, and the copy prompt (not in it) runs off as well.
    for case, r in zip(fixture["cases"], on[:-1], strict=True):
        assert_same_tokens_up_to_near_tie(model, case["prompt_ids"], greedy, r.token_ids, case["greedy_ids"])
    [off] = engine_for(model).generate([copy_prompt], greedy)
    assert_same_tokens_up_to_near_tie(model, copy_prompt, greedy, on[-1].token_ids, off.token_ids)
    assert passage[:40] in on[-1].text
    assert sum(metric(spec, "native:spec_decode_num_accepted_tokens_total").values()) >= 10


async def test_server_streams_accepted_runs_and_serves_the_spec_metrics(tiny):
    import aiohttp

    from native_engine.server import start_server

    engine = engine_for(tiny, k=4)
    runner, port = await start_server(engine, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{port}"
    body = {"prompt": "the stream test", "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(url + "/v1/completions", json=body) as resp:
                whole = (await resp.json())["choices"][0]["text"]
            async with http.post(url + "/v1/completions", json={**body, "stream": True}) as resp:
                events = [e[len("data: ") :] for e in (await resp.text()).split("\n\n") if e]
            async with http.get(url + "/metrics") as resp:
                page = await resp.text()
    finally:
        await runner.cleanup()
    chunks = [json.loads(e)["choices"][0]["text"] for e in events[:-1]]
    assert "".join(chunks) == whole and events[-1] == "[DONE]"
    assert len(chunks) < 40  # accepted drafts arrive several tokens to a chunk
    for name in (
        "spec_decode_num_drafts_total",
        "spec_decode_num_draft_tokens_total",
        "spec_decode_num_accepted_tokens_total",
        "spec_decode_num_accepted_tokens_per_pos_total",
    ):
        assert f"native:{name}{{" in page
    accepted = [line for line in page.splitlines() if line.startswith("native:spec_decode_num_accepted_tokens_total")]
    assert float(accepted[0].rsplit(" ", 1)[1]) > 0


# ---- the harness side ---------------------------------------------------------------------------
def test_repeat_workload_prompts_hold_the_passage_to_copy():
    from harness.scenario.scenario import Scenario
    from harness.scenario.tokenizer_source import LocalTokenizer
    from harness.scenario.workload import REPEAT_INSTRUCTION, build_schedule

    tokenizer = LocalTokenizer("smollm2")
    scenario = Scenario.model_validate(
        {
            "name": "t",
            "backend": {"kind": "openai", "url": "http://127.0.0.1:9", "model": "smollm2"},
            "workload": {"kind": "repeat", "input_tokens": 40, "output_tokens": 48},
            "seed": 3,
            "load": {"arrival": "closed", "concurrency": 1, "num_requests": 4, "warmup_requests": 0},
        }
    )
    plan = build_schedule(scenario, tokenizer)
    passages = []
    for r in plan.requests:
        assert r.prompt.startswith(REPEAT_INSTRUCTION) and r.prompt.endswith("\n\nRepeated text:")
        assert r.prompt_tokens == len(tokenizer.encode(r.prompt)) and r.output_tokens == 48
        passage = r.prompt[len(REPEAT_INSTRUCTION) : -len("\n\nRepeated text:")]
        assert len(tokenizer.encode(passage)) - tokenizer.added_tokens == 40
        passages.append(passage)
    assert len(set(passages)) == 4


def page(drafts, drafted, accepted, prefix="native:"):
    return "\n".join(
        [
            f"# TYPE {prefix}spec_decode_num_drafts counter",
            f'{prefix}spec_decode_num_drafts_total{{model_name="m"}} {drafts}',
            f"# TYPE {prefix}spec_decode_num_draft_tokens counter",
            f'{prefix}spec_decode_num_draft_tokens_total{{model_name="m"}} {drafted}',
            f"# TYPE {prefix}spec_decode_num_accepted_tokens counter",
            f'{prefix}spec_decode_num_accepted_tokens_total{{model_name="m"}} {accepted}',
            "",
        ]
    )


def values(text):
    from harness.engine.server_metrics import parse_page

    return {name: value for name, value, labels in parse_page(text)[1] if not labels}


def window_series(*pages):
    """read_schema()-like series of pages scraped at t = 0, 1, 2, ..."""
    from harness.engine.server_metrics import parse_page

    series = {}
    for t, text in enumerate(pages):
        for name, value, labels in parse_page(text)[1]:
            if not labels:
                series.setdefault(name, []).append((float(t), value))
    return series


@pytest.mark.parametrize("prefix", ["native:", "vllm:", "llamacpp:"])
def test_acceptance_over_the_window_comes_from_counter_differences(prefix):
    from harness.engine.server_metrics import window_speculative

    # warm-up before the window (t=0 -> 1) is left out: 50 drafts, 200 drafted, 100 accepted in [1, 2]
    series = window_series(page(2, 8, 2, prefix), page(10, 40, 30, prefix), page(60, 240, 130, prefix))
    assert window_speculative(series, 1.0, 2.0).model_dump(exclude_unset=True) == {
        "draft_tokens": 200,
        "accepted_tokens": 100,
        "acceptance_rate": 0.5,
        "drafts": 50,
        "mean_acceptance_length": 3.0,
    }
    no_drafts = window_speculative(window_series(page(60, 240, 130, prefix), page(60, 240, 130, prefix)), 0.0, 1.0)
    assert no_drafts.model_dump(exclude_unset=True) == {}


def test_sglang_acceptance_is_its_gauge_averaged_over_the_window_and_says_so():
    from harness.engine.server_metrics import window_speculative

    gauge = '# TYPE sglang:spec_accept_rate gauge\nsglang:spec_accept_rate{{model_name="m"}} {}\n'
    series = window_series(gauge.format(0.1), gauge.format(0.6), gauge.format(0.8))
    out = window_speculative(series, 1.0, 2.0)
    assert out.acceptance_rate == pytest.approx(0.7) and "gauge" in out.source
    assert window_speculative(window_series(gauge.format(0.0)), 0.0, 1.0).model_dump(exclude_unset=True) == {}


def test_a_disaggregated_worker_with_speculation_has_both_metric_families():
    # a worker's KV-transfer families once left the spec_decode ones built with their labels: start-up raised
    page = generate_latest(EngineMetrics("m", 2, kv_transfer=True).registry).decode()
    assert 'native:kv_transfer_bytes_total{direction="send",model_name="m"} 0.0' in page
    assert 'native:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="1"} 0.0' in page
