"""`bench plan`: the engine's own scheduler on a virtual clock, the fitted step model, and results folders that
the report, select and gate code reads like a measured run's."""

import gc
import json

import numpy as np
import pytest
import yaml
from bench_process import bench

from harness.engine.step_trace import steps_on_run_clock, write_engine_trace
from harness.plan.deployment import deployment_from_args
from harness.plan.simulator import collector_paused, simulate_scenario
from harness.plan.step_model import FittedStepModel, StepShape, band_residuals, fit_step_model, shape_of
from harness.results.folder import RequestRecord, read_records
from harness.results.schema_files import validate_folder
from harness.scenario.chat_trace import SessionTraceConfig, write_session_trace
from harness.scenario.scenario import ScenarioError, load_scenario
from native_engine import scheduler
from native_engine.config import EngineConfig, SchedulerConfig
from native_engine.llm_engine import LLMEngine, LoadedModel
from native_engine.sequence import SamplingParams
from native_engine.tiny_gguf import write_tiny_llama_gguf
from reports.gate import compare, load_rules
from reports.repeats import check_same_scenario, load_run_set
from reports.report import build_report
from reports.select import write_selection

# A step model with stated costs, for the tests of scheduling (what the simulator does with step times,
# not what the step times are): 20 ms a step, 1 ms a prompt token, 2 ms a decoding sequence.
STATED = FittedStepModel(
    {
        "intercept_s": 0.02,
        "per_prefill_token_s": 1e-3,
        "per_prefill_seq_s": 0.0,
        "per_decode_seq_s": 2e-3,
        "per_context_token_s": 0.0,
    },
    0.0,
    0.0,
    {},
    [],
)


def write_scenario(path, body: dict):
    path.write_text(yaml.safe_dump({"name": "plan-test", "seed": 0, **body}))
    return path


def native(args: list[str], **extra) -> dict:
    return {"kind": "native", "model": "smollm2", "launch": {"args": args}, **extra}


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A real traced run of the native engine (a tiny random GGUF with SmolLM2's tokenizer)."""
    tmp = tmp_path_factory.mktemp("plan")
    model = write_tiny_llama_gguf(tmp / "tiny.gguf", tokenizer="smollm2")
    body = {
        "backend": native(["--model", str(model), "--max-num-seqs", "4"], trace=True),
        "workload": {"kind": "random", "input_tokens": 48, "output_tokens": 8},
        "load": {"arrival": "poisson", "rate": 20, "num_requests": 16},
        "slo": {"ttft_ms": 60000},
        "telemetry": {"interval_ms": 100, "gpu": False},
    }
    scenario = write_scenario(tmp / "s.yaml", body)
    res = bench("run", scenario, "--output", tmp / "measured", "--allow-client-bound", timeout_s=240)
    assert res.returncode == 0, res.stderr
    return tmp, body


def test_fit_recovers_the_costs_of_steps_it_is_given(tmp_path):
    costs = {
        "intercept_s": 4e-3,
        "multi_token_step_s": 6e-3,  # 2+ token rows: BLAS repacks every weight for a matrix product
        "per_prefill_token_s": 5e-5,
        "per_prefill_seq_s": 1e-3,
        "per_decode_seq_s": 3e-4,
        "per_context_token_s": 2e-7,
        "per_prefill_pair_s": 3e-8,  # prefill attention: a chunk's queries over the positions before them
    }
    steps, t_s = [], 0.0
    for i in range(60):
        chunks = [(i * 37 + 11 * k) % 256 + 1 for k in range(i % 3)]  # prefill tokens per sequence
        starts = [(i * 53 + 97 * k) % 500 for k in range(i % 3)]  # where each chunk starts in its prompt
        pairs = sum(n * start + n * (n + 1) // 2 for n, start in zip(chunks, starts))
        shape = StepShape(sum(chunks), len(chunks), (i * 7) % 17 + 1, (i * 131) % 3000, pairs)
        if i % 4 == 0:  # a lone decoding sequence: one token row, a matrix-vector step
            chunks, starts, shape = [], [], StepShape(0, 0, 1, (i * 131) % 3000)
        dur_s = FittedStepModel(costs, 0.0, 0.0, {}, []).step_time_s(shape)
        steps.append(
            {
                "t_s": t_s,
                "dur_s": dur_s,
                "forward_s": dur_s,
                "prefill_tokens": shape.prefill_tokens,
                "prefill_chunks": chunks,
                "prefill_starts": starts,
                "decode_seqs": shape.decode_seqs,
                "kv_blocks_used": 0,
                "preemptions": 0,
                "prefix_hit_tokens": 0,
                "bytes_read": 0,
                "flops": 0,
                "running": 0,
                "waiting": 0,
                "kv_positions_read": shape.context_tokens,
            }
        )
        t_s += dur_s + 1e-4  # the engine loop's gap between back-to-back steps
    write_engine_trace(tmp_path / "engine_trace.json", steps)
    # client TTFT 50 ms over the engine's queue + prefill: the server's per-request overhead
    rec = RequestRecord(0, 0.0, token_times_s=[0.25], server_timings={"queue_ms": 100.0, "prefill_ms": 100.0})
    (tmp_path / "requests.jsonl").write_text(rec.to_json() + "\n")
    model = fit_step_model([tmp_path])
    for name, value in costs.items():
        assert model.coefficients[name] == pytest.approx(value, rel=0.02, abs=1e-9), name
    assert model.step_gap_s == pytest.approx(1e-4, rel=0.05)
    assert model.request_overhead_s == pytest.approx(0.05)
    assert model.residuals["rms_ms"] < 0.01
    bands = model.residuals["bands"]
    assert sum(b["steps"] for b in bands) == 60 and all(abs(b["bias"]) < 1e-3 for b in bands)


def test_the_step_trace_says_where_each_prefill_chunk_starts(tmp_path):
    """An 80-token prompt in 32-token chunks: the engine's trace says the chunks start at 0, 32 and 64, and the
    fitted model's batch counts each chunk's attention pairs over the positions before it (by hand: 32 x 33 / 2,
    32 x 32 + 528, 16 x 64 + 16 x 17 / 2), as the simulator's replica counts them (harness/plan/replica.py)."""
    engine = LLMEngine(
        EngineConfig(
            kv_cache_tokens=256,
            kv_block_size=4,
            step_trace=True,
            scheduler=SchedulerConfig(max_num_batched_tokens=32),
        ),
        LoadedModel.load(str(write_tiny_llama_gguf(tmp_path / "tiny.gguf"))),
    )
    engine.generate([[5 + i % 200 for i in range(80)]], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    raw = engine.step_trace.as_dict()
    steps = steps_on_run_clock(raw, raw["steps"][0][0])
    assert [s["prefill_starts"] for s in steps] == [[0], [32], [64], []]
    assert [shape_of(s, 4).prefill_pairs for s in steps] == [528, 1552, 1160, 0]


def test_band_residuals_show_where_a_fit_is_biased():
    shapes = [StepShape(0, 0, 1, 50), StepShape(0, 0, 3, 300), StepShape(0, 0, 4, 400), StepShape(64, 1, 2, 200)]
    measured_s = np.array([0.030, 0.060, 0.080, 0.100])
    predicted_s = np.array([0.033, 0.060, 0.060, 0.100])  # 10% high on the lone sequence, 20 ms low on a batch of 4
    bands = {b["band"]: b for b in band_residuals(shapes, measured_s, predicted_s)}
    assert list(bands) == ["decode 1", "decode 2-4", "with prefill"]  # empty bands left out
    assert bands["decode 1"]["bias"] == pytest.approx(0.10)
    assert bands["decode 2-4"]["steps"] == 2 and bands["decode 2-4"]["bias"] == pytest.approx(-0.02 / 0.14)
    assert bands["decode 2-4"]["mape"] == pytest.approx(0.125)
    assert bands["with prefill"]["bias"] == pytest.approx(0.0)


def test_plan_writes_a_run_folder_fitted_to_a_measured_run(measured):
    tmp, body = measured
    scenario = write_scenario(tmp / "plan.yaml", {**body, "plan": {"step_model": {"fitted": ["measured"]}}})
    res = bench("plan", scenario, "--output", tmp / "predicted", timeout_s=240)
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp / "predicted" / "summary.json").read_text())
    assert summary["simulated"] is True
    assert json.loads((tmp / "predicted" / "run.json").read_text())["simulated"] is True
    described = summary["plan"]["step_model"]
    assert described["kind"] == "fitted" and described["sources"] == [str((tmp / "measured").resolve())]
    assert described["residuals"]["steps"] > 10 and described["coefficients"]["intercept_s"] >= 0
    # the fit's range: every fitted step, batches of at most the run's --max-num-seqs 4, prompts of 48 tokens
    fit_range = described["fit_range"]
    assert fit_range["steps"] == described["residuals"]["steps"] and 1 <= fit_range["sequences"][1] <= 4
    assert fit_range["tokens"][1] >= 48 and fit_range["edge"]["decode_seqs"] <= 4
    measured_summary = json.loads((tmp / "measured" / "summary.json").read_text())
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "throughput", "goodput", "phases_ms"):
        assert summary[key] and set(summary[key]) <= set(measured_summary[key]), key
    assert isinstance(summary["diagnosis"], list)
    records = read_records(tmp / "predicted")
    assert len(records) == 16 and all(r.ok and r.output_tokens == 8 for r in records)
    assert summary["phases_ms"]["source"] == measured_summary["phases_ms"]["source"]  # the engine's own account
    assert (tmp / "predicted" / "engine_trace.json").is_file()  # the simulated steps, for the report's timeline
    with pytest.raises(ValueError, match="is a simulated run"):
        fit_step_model([tmp / "predicted"])


def test_simulated_and_measured_folders_load_through_report_select_and_gate(measured, tmp_path):
    tmp, body = measured
    predicted = tmp_path / "predicted"
    spec = write_scenario(tmp / "plan2.yaml", {**body, "plan": {"step_model": {"fitted": ["measured"]}}})
    simulate_scenario(load_scenario(spec), predicted)
    assert (
        len(validate_folder(predicted)) == 3
    )  # run.json, summary.json, requests.jsonl: simulated, each fits its model
    content = build_report([tmp / "measured", predicted], ["measured", "predicted"])
    assert [row[0] for row in content.summary_rows] == ["measured", "predicted"]
    assert "SIMULATED" in content.context_rows[1][-1] and "SIMULATED" not in content.context_rows[0][-1]
    ttft = next(row for row in content.prediction_rows if row[0] == "TTFT p50 ms")
    assert ttft[1] == "measured" and ttft[3] == "predicted" and ttft[5] != "-"
    selection = write_selection([tmp / "measured", predicted], tmp_path / "sel.html", labels=["measured", "predicted"])
    assert selection.recommendation
    # the measured fixture is a 16-request run: too few to establish its p90s, so the gate would skip it as invalid
    base, cur = load_run_set(tmp / "measured", keep_invalid=True), load_run_set(predicted)
    check_same_scenario(base, cur)
    assert compare(base, cur, load_rules(None))


def test_a_scheduler_change_changes_the_simulation(tmp_path, monkeypatch):
    spec = write_scenario(
        tmp_path / "s.yaml",
        {
            "backend": native([]),
            "workload": {"kind": "random", "input_tokens": 64, "output_tokens": 16},
            "load": {"arrival": "poisson", "rate": 4, "num_requests": 20},
            "plan": {"step_model": "roofline"},
        },
    )
    before = simulate_scenario(load_scenario(spec), step_model=STATED)
    real_post_init = scheduler.SchedulerConfig.__post_init__

    def one_sequence_a_step(self):  # as if the engine's default batch were a single sequence
        real_post_init(self)
        self.max_num_seqs = 1

    monkeypatch.setattr(scheduler.SchedulerConfig, "__post_init__", one_sequence_a_step)
    after = simulate_scenario(load_scenario(spec), step_model=STATED)
    assert after.plan.deployment["max_num_seqs"] == 1
    assert after.ttft_ms.p50 > 2 * before.ttft_ms.p50
    assert after.throughput.output_tokens_per_s < before.throughput.output_tokens_per_s


def chat_trace(tmp_path, sessions: int = 6):
    config = SessionTraceConfig(
        sessions=sessions, turns=3, block_tokens=16, system_blocks=2, session_gap_s=1.0, think_time_s=(4.0, 6.0)
    )
    return write_session_trace(config, tmp_path / "trace.jsonl")


def exact_prefix_hits(tmp_path, launch_args: list[str]) -> tuple[int, int]:
    """(later turns whose cached prefix is exactly the previous turn's prompt, later turns)."""
    rows = chat_trace(tmp_path)
    spec = write_scenario(
        tmp_path / "s.yaml",
        {
            "backend": native(launch_args),
            "workload": {"kind": "random", "ignore_eos": True},
            "load": {"arrival": "trace", "trace": "trace.jsonl", "trace_block_size": 16},
            "plan": {"step_model": "roofline"},
        },
    )
    simulate_scenario(load_scenario(spec), tmp_path / "out", step_model=STATED, overwrite=True)
    records = sorted(read_records(tmp_path / "out"), key=lambda r: r.index)
    assert [r.prompt_tokens for r in records] == [row["input_length"] for row in rows]
    previous, exact = {}, 0
    for row, rec in zip(rows, records):
        if row["turn"] > 0:
            # the engine's blocks hold BOS + the trace's blocks less their last token: whole blocks line up
            exact += rec.server_timings["cache_n"] == 16 * len(previous[row["session_id"]])
        previous[row["session_id"]] = row["hash_ids"]
    return exact, sum(row["turn"] > 0 for row in rows)


def test_trace_hash_ids_share_prefix_blocks_exactly(tmp_path):
    exact, later_turns = exact_prefix_hits(tmp_path, [])
    assert exact == later_turns


def test_cache_aware_routing_keeps_more_sessions_on_their_cached_prefix(tmp_path):
    round_robin, _ = exact_prefix_hits(tmp_path, ["--data-parallel", "2", "--router-policy", "round_robin"])
    cache_aware, later_turns = exact_prefix_hits(tmp_path, ["--data-parallel", "2", "--router-policy", "cache_aware"])
    assert round_robin < cache_aware <= later_turns


def test_closed_loop_keeps_its_requests_in_flight(tmp_path):
    spec = write_scenario(
        tmp_path / "s.yaml",
        {
            "backend": native([]),
            "workload": {"kind": "random", "input_tokens": 32, "output_tokens": 8},
            "load": {"arrival": "closed", "concurrency": 3, "num_requests": 12},
            "plan": {"step_model": "roofline"},
        },
    )
    summary = simulate_scenario(load_scenario(spec), tmp_path / "out", step_model=STATED)
    assert summary.requests.completed == 12
    assert summary.concurrency.max == 3
    # the scheduler stamps admission on the simulator's clock (not perf_counter): the engine's own phases add up
    for rec in read_records(tmp_path / "out"):
        t = rec.server_timings
        assert min(t["queue_ms"], t["prefill_ms"], t["decode_ms"]) >= 0
        e2e_ms = (rec.end_s - rec.intended_send_s) * 1e3
        assert t["queue_ms"] + t["prefill_ms"] + t["decode_ms"] == pytest.approx(e2e_ms)


def test_launch_args_are_read_by_the_engines_own_command_line():
    d = deployment_from_args(
        [
            "--max-num-batched-tokens",
            "512",
            "--no-chunked-prefill",
            "--kv-cache-tokens",
            "4096",
            "--data-parallel",
            "3",
            "--router-policy",
            "least_load",
        ],
        "smollm2",
    )
    assert (d.scheduler.max_num_batched_tokens, d.scheduler.enable_chunked_prefill) == (512, False)
    assert (d.num_kv_blocks, d.replicas, d.router_policy) == (256, 3, "least_load")
    with pytest.raises(ValueError, match="backend.launch.args: No such option: --max-num-seq"):
        deployment_from_args(["--max-num-seq", "4"], "smollm2")


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        ({"step_model": "bogus"}, "plan.step_model: .* must be {fitted: \\[RUN_DIR"),
        ({"step_model": {"fitted": ["nowhere"]}}, "run folder 'nowhere' not found"),
        ({"step_model": {"fitted": ["."], "roofline": {}}}, "give exactly one step model"),
        ({"step_model": "roofline", "replicas": 0}, "plan.replicas: 0 is not valid"),
    ],
)
def test_a_bad_plan_block_names_the_field(tmp_path, plan, message):
    spec = write_scenario(
        tmp_path / "s.yaml", {"backend": native([]), "load": {"arrival": "poisson", "rate": 1}, "plan": plan}
    )
    with pytest.raises(ScenarioError, match=message):
        load_scenario(spec)


def test_a_fitted_run_without_a_step_trace_is_refused(tmp_path):
    (tmp_path / "run").mkdir()
    spec = write_scenario(
        tmp_path / "s.yaml",
        {"backend": native([]), "load": {"arrival": "poisson", "rate": 1}, "plan": {"step_model": {"fitted": ["run"]}}},
    )
    with pytest.raises(ScenarioError, match="has no engine_trace.json; measure the run with backend.trace: true"):
        simulate_scenario(load_scenario(spec))


def test_a_prompt_past_the_context_is_refused_as_the_server_refuses_it(tmp_path):
    spec = write_scenario(
        tmp_path / "s.yaml",
        {
            "backend": native(["--kv-cache-tokens", "256"]),
            "workload": {"kind": "random", "input_tokens": 300, "output_tokens": 8},
            "load": {"arrival": "closed", "concurrency": 1, "num_requests": 4},
            "plan": {"step_model": "roofline"},
        },
    )
    simulate_scenario(load_scenario(spec), tmp_path / "out", step_model=STATED)
    records = read_records(tmp_path / "out")
    assert len(records) == 4  # each refusal frees the closed loop's slot for the next request
    assert all(r.error_reason == "http_4xx" and "max_model_len) is 256" in r.error_detail for r in records)


def host_shared_summary(tmp_path, replicas: int, host: dict) -> dict:
    """A load that keeps every replica stepping, on `replicas` replicas with the plan's host sharing."""
    spec = write_scenario(
        tmp_path / f"s-{replicas}-{len(host)}.yaml",
        {
            "backend": native(["--data-parallel", str(replicas), "--router-policy", "round_robin"]),
            "workload": {"kind": "random", "input_tokens": 32, "output_tokens": 32},
            "load": {"arrival": "closed", "concurrency": 4 * replicas, "num_requests": 16 * replicas},
            "plan": {"step_model": "roofline", **host},
        },
    )
    return simulate_scenario(load_scenario(spec), step_model=STATED)


def test_replicas_sharing_a_hosts_cores_step_slower_when_they_ask_for_more_than_it_has(tmp_path):
    # two engines of a core each and a client of one on 2 cores ask for 3: each step 1.5 times one engine's
    # (which, beside the client alone, asked for 2 and had them)
    shared = {"host_cores": 2, "engine_cores": 1.0, "host_other_cores": 1.0}
    alone = host_shared_summary(tmp_path, 2, {})
    crowded = host_shared_summary(tmp_path, 2, shared)
    roomy = host_shared_summary(tmp_path, 2, {**shared, "host_cores": 3})
    assert crowded.plan.host["host_cores"] == 2 and alone.plan.host is None
    assert crowded.tpot_ms.p50 == pytest.approx(1.5 * alone.tpot_ms.p50, rel=0.05)
    assert crowded.throughput.output_tokens_per_s < alone.throughput.output_tokens_per_s / 1.4
    assert roomy.tpot_ms.p50 == pytest.approx(alone.tpot_ms.p50)  # 3 cores for 3: no slowdown
    # one replica runs as it was calibrated, whatever the host
    one = host_shared_summary(tmp_path, 1, {})
    assert host_shared_summary(tmp_path, 1, shared).tpot_ms.p50 == one.tpot_ms.p50


def test_host_sharing_defaults_to_the_fitted_runs_telemetry(measured):
    from harness.plan.host import host_share
    from harness.scenario.planning import PlanSpec

    tmp, _ = measured
    plan = PlanSpec.model_validate({"step_model": {"fitted": [str(tmp / "measured")]}, "host_cores": 2})
    share = host_share(plan, plan.step_model.fitted)
    assert share.source == "fitted runs"
    assert share.engine_cores > 0 and share.other_cores >= 0
    # a value the plan states wins over the measured one
    stated = host_share(plan.model_copy(update={"engine_cores": 1.25}), plan.step_model.fitted)
    assert stated.engine_cores == 1.25 and stated.other_cores == share.other_cores
    assert host_share(plan.model_copy(update={"host_cores": None}), plan.step_model.fitted) is None


def test_a_plan_pauses_the_garbage_collector_and_gives_it_back_as_it_found_it():
    # a plan's objects live to its end and make almost no cycles: the collector is off inside (its collections cost
    # 13 of 138 CPU-s of a 100,000-request plan) with what was alive set aside, and back as it was after
    seen = []

    @collector_paused()
    def plan(fail: bool = False):
        seen.append((gc.isenabled(), gc.get_freeze_count()))
        if fail:
            raise ValueError("a plan that fails")

    frozen_before, enabled_before = gc.get_freeze_count(), gc.isenabled()
    gc.enable()
    try:
        plan()
        assert not seen[0][0] and seen[0][1] > frozen_before  # off, and the objects alive then frozen
        assert gc.isenabled() and gc.get_freeze_count() == frozen_before
        with pytest.raises(ValueError):
            plan(fail=True)
        assert gc.isenabled() and gc.get_freeze_count() == frozen_before  # given back after a failure too
        # a caller that turned it off and froze its own objects finds both as it left them
        gc.disable()
        gc.freeze()
        frozen = gc.get_freeze_count()
        plan()
        assert not gc.isenabled() and gc.get_freeze_count() >= frozen
    finally:
        if not frozen_before:
            gc.unfreeze()
        if enabled_before:
            gc.enable()
