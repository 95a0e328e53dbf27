"""`bench plan` on a prefill/decode disaggregated deployment (harness/plan/disaggregation.py): each request's
prompt on the least busy prefill replica, its KV over the link, its answer from the least busy decode replica,
the first token out with the decode replica's next step (as native_engine's decode worker returns it), checked
against figures derived by hand from stated step costs and a stated link."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from bench_process import bench

from harness.plan.architectures import load_architecture
from harness.plan.deployment import deployment_from_args
from harness.plan.disaggregation import KVTransfer, measured_transfer, plan_transfer, roofline_transfer
from harness.plan.engine_flags import FlagError, engine_flags
from harness.plan.roofline_model import RooflineStepModel
from harness.plan.search import Search, SearchOptions, write_search
from harness.plan.simulator import Simulation, prompt_token_ids, run_simulation, simulate_scenario
from harness.plan.step_model import FittedStepModel
from harness.results.folder import RequestRecord, ResultWriter, read_records
from harness.results.schema_files import validate_folder
from harness.scenario.gpus import gpu_spec
from harness.scenario.scenario import load_scenario
from harness.scenario.tokenizer_source import LocalTokenizer
from harness.scenario.workload import RequestSpec, build_schedule

# stated step costs: 20 ms a step, 1 ms a prompt token, 2 ms a decoding sequence (nothing else)
STATED = FittedStepModel({"intercept_s": 0.02, "per_prefill_token_s": 1e-3, "per_decode_seq_s": 2e-3}, 0.0, 0.0, {}, [])
# a stated link: 1,000 bytes a token, 1 MB/s, 5 ms latency; a 64-token prompt (4 blocks of 16) takes
# 64 x 1,000 / 1e6 + 0.005 = 0.069 s, a 16-token one 0.016 + 0.005 = 0.021 s
LINK = KVTransfer(bytes_per_token=1000, link_bytes_per_s=1e6, latency_s=0.005, block_size=16, source="stated")
SPLIT_1_1 = ["--disaggregate", "prefill=1,decode=1"]


def request(index: int, prompt_tokens: int, output_tokens: int, at_s: float) -> RequestSpec:
    return RequestSpec(index, "x", None, prompt_tokens, output_tokens, at_s)


def simulate(launch_args: list[str], requests: list[tuple[int, int, float]], fast_forward: bool = True):
    """(simulation, records by index) of requests (prompt tokens, output tokens, send time); prompts of distinct
    token ids, so no prefix is shared."""
    specs = [request(i, p, o, t) for i, (p, o, t) in enumerate(requests)]
    ids = [list(range(1000 * i, 1000 * i + p)) for i, (p, _, _) in enumerate(requests)]
    sim, records = (
        Simulation(deployment_from_args(launch_args, "smollm2"), STATED, fast_forward=fast_forward, transfer=LINK),
        [],
    )
    run_simulation(sim, specs, ids, None, records.append)
    return sim, sorted(records, key=lambda r: r.index)


def test_one_request_waits_for_its_prefill_the_transfer_and_the_decode_replicas_first_step():
    _, [rec] = simulate(SPLIT_1_1, [(64, 4, 0.0)])
    # prefill replica: one step of 64 prompt tokens, 20 + 64 = 84 ms; the transfer 69 ms: at the idle decode
    # replica at 153 ms, admitted there with the prefill's token; its first step (1 decode, 22 ms) ends at 175 ms
    # and returns that token with the step's own: tokens 1 and 2 at 175, 3 at 197, 4 at 219 ms
    assert rec.token_times_s == pytest.approx([0.175, 0.175, 0.197, 0.219])
    ttft_ms = rec.token_times_s[0] * 1e3
    tpot_ms = (rec.token_times_s[-1] - rec.token_times_s[0]) * 1e3 / 3
    assert ttft_ms == pytest.approx(84 + 69 + 22)
    assert tpot_ms == pytest.approx(44 / 3)  # two 22 ms steps over the 3 tokens after the first
    t = rec.server_timings
    assert (t["prefill_ms"], t["kv_transfer_ms"], t["kv_transfer_bytes"], t["kv_transfer_blocks"]) == (
        84.0,
        69.0,
        64_000,
        4,
    )
    assert (rec.output_tokens, rec.finish_reason) == (4, "length")


def test_a_request_goes_to_the_least_busy_decode_replica():
    sim, (first, second) = simulate(["--disaggregate", "prefill=1,decode=2"], [(64, 20, 0.0), (64, 4, 0.0)])
    # the first arrival starts the prefill replica's step alone (20 + 64 = 84 ms), the second prefills next
    # (84-168 ms). The first reaches decode-0 at 153 ms (both idle: the first of them) and decodes there until
    # 175 + 18 x 22 = 571 ms. The second's transfer ends at 237 ms: decode-1 (none in flight, decode-0 one)
    # takes it at once, tokens at 259, 259, 281, 303 ms. On decode-0 it would have waited for the boundary at
    # 241 ms and stepped 24 ms (2 decodes): 265 ms.
    assert first.token_times_s[:3] == pytest.approx([0.175, 0.175, 0.197])
    assert first.token_times_s[-1] == pytest.approx(0.571)
    assert second.token_times_s == pytest.approx([0.259, 0.259, 0.281, 0.303])
    assert {step["replica"] for step in sim.steps} == {"prefill-0", "decode-0", "decode-1"}
    assert all(n == 0 for n in sim.in_flight.values())


def test_a_long_prompt_stalls_the_aggregated_stream_but_not_the_disaggregated_one():
    # a stream (16-token prompt, 200 tokens) from 0 s; a 1,024-token prompt (2 tokens) at 0.1 s
    load = [(16, 200, 0.0), (1024, 2, 0.1)]
    _, (stream, long) = simulate([], load)
    gaps = [b - a for a, b in zip(stream.token_times_s, stream.token_times_s[1:])]
    # colocated: the stream's steps end at 36 (prefill), 58, 80, 102 ms; at 102 the long prompt's first chunk
    # joins, 255 tokens beside the stream's one (the 256-token budget): 20 + 255 + 2 = 277 ms; its 4 chunks of
    # 255 and one of 4 (26 ms): first token at 102 + 4 x 277 + 26 = 1,236 ms
    assert max(gaps) == pytest.approx(0.277)
    assert long.token_times_s[0] == pytest.approx(1.236)

    _, (stream, long) = simulate(SPLIT_1_1, load)
    gaps = [b - a for a, b in zip(stream.token_times_s, stream.token_times_s[1:])]
    # disaggregated: the stream's prefill 36 ms + transfer 21 ms, then decode steps of 22 ms from 57 ms
    # (boundaries 79 + 22k ms); the long prompt prefills alone, 4 steps of 20 + 256 = 276 ms (to 1,204 ms), its
    # 64 blocks cross in 1.024 + 0.005 s (to 2,233 ms); admitted at the next boundary, 79 + 98 x 22 = 2,235 ms,
    # its first token after one step of 2 decodes (24 ms): 2,259 ms. The stream's worst gap is that step.
    assert max(gaps) == pytest.approx(0.024)
    assert min(gaps) == 0.0  # the first token comes with the decode replica's first step's own
    assert long.token_times_s[0] == pytest.approx(2.259)
    assert long.server_timings["prefill_ms"] == pytest.approx(1104.0)


def test_the_prefill_replica_holds_the_blocks_until_the_transfer_has_sent_them():
    # 80 KV tokens a replica: 5 blocks of 16; two 64-token prompts (4 blocks each) at 0, whole prefills
    args = [*SPLIT_1_1, "--kv-cache-tokens", "80", "--no-chunked-prefill"]
    _, (first, second) = simulate(args, [(64, 4, 0.0), (64, 4, 0.0)])
    assert first.token_times_s == pytest.approx([0.175, 0.175, 0.197, 0.219])
    # the second prompt's 4 blocks are free only once the first's transfer ends (153 ms): its prefill 153-237,
    # transfer to 306, the decode replica (done with the first at 219) steps 306-328. Had the blocks been
    # freed at the prefill's end (84 ms), its first token would have come at 84 + 84 + 69 + 22 = 259 ms.
    assert second.token_times_s[0] == pytest.approx(0.328)
    assert second.server_timings["queue_ms"] == pytest.approx(153.0)


def test_fast_forward_gives_the_same_records_on_a_disaggregated_deployment():
    load = [(16 + 8 * (i % 5), 20 + 7 * (i % 3), 0.03 * i) for i in range(12)]
    args = ["--disaggregate", "prefill=1,decode=2", "--max-num-seqs", "4"]
    _, stepped = simulate(args, load, fast_forward=False)
    sim, forwarded = simulate(args, load, fast_forward=True)
    assert sim.fast_forwarded_steps > 0
    assert [r.token_times_s for r in forwarded] == [r.token_times_s for r in stepped]
    assert len(forwarded) == 12 and all(r.ok and r.output_tokens == o for r, (_, o, _) in zip(forwarded, load))


def random_load(input_tokens: int, output_tokens: int, **load) -> dict:
    return {"workload": {"kind": "random", "input_tokens": input_tokens, "output_tokens": output_tokens}, "load": load}


LOADS = {
    # 2 prefill replicas fed from the client as their queues of 3 have room
    "offline": (
        ["prefill=2,decode=1", "--max-num-seqs", "3", "--max-waiting", "3"],
        random_load(40, 24, arrival="offline", num_requests=24),
    ),
    # the decode replica's 24 KV blocks run out: its scheduler preempts
    "preemption": (
        ["prefill=1,decode=1", "--kv-cache-tokens", "384"],
        random_load(48, 40, arrival="poisson", rate=8, num_requests=16),
    ),
    # a finish on a decode replica releases the next request to the prefill replica
    "closed_loop": (["prefill=1,decode=2"], random_load(40, 24, arrival="closed", concurrency=3, num_requests=16)),
    # the prefill's token is the whole answer: it ends on the decode replica at admission
    "one_token": (["prefill=1,decode=1"], random_load(40, 1, arrival="poisson", rate=20, num_requests=16)),
}


@pytest.mark.parametrize("case", LOADS)
def test_every_request_completes_and_fast_forward_changes_nothing(tmp_path, case):
    split, body = LOADS[case]
    args = ["--disaggregate", *split]
    spec = {"name": "d", "seed": 0, "backend": {"kind": "native", "model": "smollm2", "launch": {"args": args}}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({**spec, **body, "plan": {"step_model": "roofline"}}))
    scenario, tokenizer = load_scenario(tmp_path / "s.yaml"), LocalTokenizer("smollm2")
    requests = build_schedule(scenario, tokenizer).requests
    token_ids, offline = prompt_token_ids(requests, tokenizer), scenario.load.arrival == "offline"
    times = {}
    for fast_forward in (True, False):
        sim, records = (
            Simulation(deployment_from_args(args, "smollm2"), STATED, fast_forward=fast_forward, transfer=LINK),
            [],
        )
        run_simulation(sim, requests, token_ids, scenario.load.concurrency, records.append, offline)
        assert len(records) == len(requests) and all(r.ok for r in records) and not sim.refused
        assert [r.output_tokens for r in sorted(records, key=lambda r: r.index)] == [q.output_tokens for q in requests]
        times[fast_forward] = sorted((r.index, r.token_times_s) for r in records)
        preempted = sum(r.scheduler.num_preemptions for r in sim.replicas.values())
        assert (preempted > 0) == (case == "preemption")
    assert times[True] == times[False]


@pytest.mark.parametrize(
    ("args", "replicas", "message"),
    [
        (["--disaggregate", "prefill=0,decode=1"], None, "--disaggregate: got 'prefill=0,decode=1'"),
        (["--disaggregate", "prefill=2"], None, "give the worker counts as prefill=P,decode=D"),
        ([*SPLIT_1_1, "--data-parallel", "2"], None, "--disaggregate: give it or --data-parallel, not both"),
        (SPLIT_1_1, 3, "plan.replicas: 3 and backend.launch.args --disaggregate prefill=1,decode=1"),
    ],
)
def test_a_bad_split_is_refused_naming_the_flag(args, replicas, message):
    with pytest.raises(ValueError, match=message):
        deployment_from_args(args, "smollm2", replicas)


@pytest.mark.parametrize(
    ("kind", "flag"),
    [("vllm", "--kv-transfer-config"), ("sglang", "--disaggregation-mode"), ("trtllm", "--server_role")],
)
def test_other_engines_disaggregation_flags_are_refused_pointing_at_the_native_one(kind, flag):
    with pytest.raises(FlagError, match=f"{flag}: prefill/decode disaggregation is simulated for the native"):
        engine_flags(kind, [flag, "x"], "m")


def test_the_roofline_link_is_the_tensor_parallel_all_reduces():
    # Llama-3.1-8B's KV: 32 layers x 8 KV heads x 128 dims x (K, V) x 2 bytes = 131,072 bytes a token; an H100's
    # NVLink 900 GB/s both ways, so 450 GB/s; 2,048 tokens (128 blocks): 268,435,456 B / 450e9 = 596.5 us + 2 us
    arch, h100 = load_architecture("llama-3.1-8b"), gpu_spec("H100")
    link = roofline_transfer(RooflineStepModel(arch, h100), 16)
    assert (link.bytes_per_token, link.link_bytes_per_s, link.latency_s) == (131_072, 450e9, 2e-6)
    assert link.seconds(2048) == pytest.approx(268_435_456 / 450e9 + 2e-6)
    assert link.seconds(2048) * 1e6 == pytest.approx(598.5, abs=0.1)
    assert link.seconds(2041) == link.seconds(2048)  # whole blocks go
    # at TP 2 each GPU sends its half of the KV heads over its own link: half the time, less the latency
    tp2 = roofline_transfer(RooflineStepModel(arch, h100, tensor_parallel=2), 16)
    assert tp2.bytes_per_token == 65_536


def test_a_fitted_plan_takes_the_handoffs_its_runs_measured(tmp_path):
    # SmolLM2's 46,080 KV bytes a token (30 layers x 3 heads x 64 dims x K, V x float32): one handoff of 1 block
    # (737,280 B, 0.4 + 0.6 ms), one of 2 (1,474,560 B, 1.5 + 0.5 ms): 2,211,840 B over 48 tokens' slots and 3 ms
    writer = ResultWriter(tmp_path / "run")
    for i, (blocks, export_ms, import_ms) in enumerate([(1, 0.4, 0.6), (2, 1.5, 0.5)]):
        timings = {"kv_transfer_bytes": 737_280 * blocks, "kv_transfer_blocks": blocks}
        timings |= {"kv_export_ms": export_ms, "kv_import_ms": import_ms}
        writer.append(RequestRecord(i, 0.0, 0.0, 0.0, token_times_s=[0.1], end_s=0.1, server_timings=timings))
    writer.close()
    link = measured_transfer([tmp_path / "run"], 16)
    assert (link.bytes_per_token, link.latency_s) == (46_080, 0.0)
    assert link.link_bytes_per_s == pytest.approx(2_211_840 / 3e-3)
    fitted = SimpleNamespace(plan=SimpleNamespace(step_model=SimpleNamespace(kind="fitted", fitted=[tmp_path])))
    with pytest.raises(ValueError, match="its runs measured no KV handoff"):
        plan_transfer(fitted, STATED, 16)


def test_a_roofline_plan_writes_the_split_and_its_link_and_completes_every_request(tmp_path):
    spec = {
        "name": "disagg",
        "seed": 0,
        "backend": {
            "kind": "native",
            "model": "smollm2",
            "launch": {"args": ["--disaggregate", "prefill=1,decode=2", "--max-num-batched-tokens", "2048"]},
        },
        "workload": {"kind": "random", "input_tokens": 256, "output_tokens": 16},
        "load": {"arrival": "poisson", "rate": 20, "num_requests": 12},
        "plan": {"step_model": "roofline", "hardware": "H100", "model": "llama-3.1-8b"},
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    summary = simulate_scenario(load_scenario(tmp_path / "s.yaml"), tmp_path / "out")
    [said] = [f for f in summary.diagnosis if f.rule == "plan_disaggregation"]  # printed with the plan
    assert "1 prefill + 2 decode replicas" in said.message and "131,072 bytes a token" in said.message
    assert "450 GB/s + 2 us" in said.message
    split = summary.plan.deployment["disaggregation"]
    assert (split["prefill"], split["decode"], split["kv_transfer"]["link_bytes_per_s"]) == (1, 2, 450e9)
    records = read_records(tmp_path / "out")
    assert len(records) == 12 and all(r.ok and r.output_tokens == 16 for r in records)
    assert all(r.server_timings["kv_transfer_blocks"] == 16 for r in records)  # 256 tokens: 16 blocks
    assert len(validate_folder(tmp_path / "out")) >= 2


# Llama-3.1-8B on one H100 at 30 req/s: one replica meets these SLOs alone (tests/test_plan_search.py's scenario)
SEARCH = """
name: search-splits
backend: {kind: native, model: smollm2, launch: {args: [--max-num-seqs, "32", --max-num-batched-tokens, "2048"]}}
workload: {kind: random, input_tokens: 256, output_tokens: 24, ignore_eos: true}
load: {arrival: poisson, rate: 30, num_requests: 48}
slo: {ttft_ms: 300, tpot_ms: 60}
plan: {model: llama-3.1-8b, step_model: roofline, prices: {H100: 3.0}}
seed: 0
"""


def test_search_compares_the_asked_splits_beside_the_aggregated_choice(tmp_path):
    (tmp_path / "s.yaml").write_text(SEARCH)
    search = Search(
        load_scenario(tmp_path / "s.yaml"), tmp_path / "out", max_gpus=2, headroom=0.0, splits=((1, 1), (1, 2))
    )
    [chosen] = search.run()
    assert (chosen.best.tensor_parallel, chosen.best.replicas) == (1, 1)
    aggregated, one_one, one_two = search.levels[0].splits
    # $3 a GPU-hour x TP 1 x replicas: 1, 1 + 1, 1 + 2
    assert [(t.layout, t.gpus, t.dollars_per_hour) for t in (aggregated, one_one, one_two)] == [
        ("aggregated x1", 1, 3.0),
        ("1:1", 2, 6.0),
        ("1:2", 3, 9.0),
    ]
    for split in (one_one, one_two):
        # the handoff and the decode replica's step are in TTFT; no prompt shares a decode replica's steps
        assert split.ttft_p90_ms > aggregated.ttft_p90_ms and split.tpot_p90_ms < aggregated.tpot_p90_ms
        summary = json.loads(Path(split.folder, "summary.json").read_text())
        assert summary["plan"]["deployment"]["disaggregation"]["decode"] == split.decode
    lines = write_search(search)
    assert "| H100 | 1 | 1:2 | 3 | 9.00 | yes | 100% |" in "\n".join(lines)
    level = json.loads((tmp_path / "out" / "search.json").read_text())["levels"][0]
    assert [t["layout"] for t in level["disaggregated"]] == ["aggregated x1", "1:1", "1:2"]
    assert level["results"][0]["best"]["replicas"] == 1  # the recommendation stays the aggregated one


@pytest.mark.parametrize(("splits", "message"), [("1:0", "'1:0' is not a split"), ("1:1,2", "'2' is not a split")])
def test_a_bad_split_list_is_refused_naming_the_option(splits, message):
    with pytest.raises(ValueError, match=f"--disaggregate-splits: {message}"):
        SearchOptions.parse(64, 600, "30%", "1,2", splits)


def test_splits_are_the_native_engines_and_need_a_search(tmp_path):
    (tmp_path / "s.yaml").write_text(SEARCH)
    scenario = load_scenario(tmp_path / "s.yaml")
    vllm = scenario.model_copy(update={"backend": scenario.backend.model_copy(update={"kind": "vllm"})})
    with pytest.raises(ValueError, match="--disaggregate-splits: backend.kind vllm is not simulated disaggregated"):
        Search(vllm, tmp_path / "out", splits=((1, 1),))
    launch = scenario.backend.launch.model_copy(update={"args": SPLIT_1_1})
    split = scenario.model_copy(update={"backend": scenario.backend.model_copy(update={"launch": launch})})
    with pytest.raises(ValueError, match="--search chooses the replicas; leave --disaggregate out"):
        Search(split, tmp_path / "out")
    res = bench("plan", tmp_path / "s.yaml", "--disaggregate-splits", "1:1", "--output", tmp_path / "o")
    assert res.returncode != 0 and "--disaggregate-splits compares splits in a --search" in res.stderr
