"""`bench plan --search` as a quote (issue 39): each deployment's capacity within the SLOs, its load at the asked
rate, a recommendation with stated headroom, the same at 2x the traffic; `bench select` on the search folder names
the same deployment; Ctrl-C keeps and prints what was simulated; TP sizes without KV room are left out, saying why."""

import functools
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import harness.plan.search as search_module
from harness.cli.app import app
from harness.plan.search import Search, SearchOptions, write_search
from harness.scenario.scenario import load_scenario
from reports.select import select

# Llama-3.1-8B at bf16 on the roofline: 256-token prompts, 24-token answers at 30 req/s. One L4 misses the 60 ms
# TPOT on its decode step alone (72 ms), so L4 runs at TP 2; an H100 carries the load alone.
SCENARIO = """
name: quote-small
backend: {kind: native, model: smollm2, launch: {args: [--max-num-seqs, "32", --max-num-batched-tokens, "2048"]}}
workload: {kind: random, input_tokens: 256, output_tokens: 24, ignore_eos: true}
load: {arrival: poisson, rate: 30, num_requests: 48}
slo: {ttft_ms: 300, tpot_ms: 60}
plan: {model: llama-3.1-8b, step_model: roofline, prices: {L4: 0.5, H100: 3.0}}
seed: 0
"""


@pytest.fixture(scope="module")
def scenario_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("quote") / "s.yaml"
    path.write_text(SCENARIO)
    return path


@pytest.fixture(scope="module")
def searched(scenario_path, tmp_path_factory):
    """The search at 1x and 2x the traffic with 30% headroom, written to its folder."""
    search = Search(load_scenario(scenario_path), tmp_path_factory.mktemp("quote-out"), max_gpus=16, headroom=0.3)
    search.run(1.0)
    search.run(2.0)
    write_search(search)
    return search


def rates_simulated(search, deployment):
    return sorted((e.rate_per_s, e.meets_slo) for e in search.evaluations.values() if e.deployment == deployment)


def test_each_choice_carries_the_rate_with_headroom_and_its_capacity_is_bracketed(searched):
    first, doubled = searched.levels
    # 30 req/s x 1.3 = 39 req/s asked of each deployment; at 2x, 60 x 1.3 = 78
    assert (first.rate_per_s, first.target_rate_per_s) == (30, pytest.approx(39))
    assert (doubled.rate_per_s, doubled.target_rate_per_s) == (60, pytest.approx(78))
    for level in searched.levels:
        assert level.results[0].best is not None  # an H100 carries even 78 req/s of these short requests
        for result in (r for r in level.results if r.best is not None):
            best, cap = result.best, result.capacity
            rates = rates_simulated(searched, best.deployment)
            passing = max(r for r, ok in rates if ok)
            failing = min(r for r, ok in rates if not ok and r > passing)
            # bracketed to 5% of its passing end, the capacity between the two (interpolated on goodput)
            assert failing - passing <= 0.05 * passing
            assert cap.status == "bracketed" and passing <= cap.offered_load <= failing
            # it passed at the target, so its load at the asked rate is at most 1 / 1.3 = 77%
            assert cap.offered_load >= level.target_rate_per_s
            assert level.load_share(result) == pytest.approx(level.rate_per_s / cap.offered_load)
            assert level.load_share(result) <= 1 / 1.3


def test_the_printed_quote_states_headroom_capacity_load_and_the_doubled_traffic(searched):
    text = (searched.out_dir / "search.md").read_text()
    first = searched.levels[0].results[0]
    share = searched.levels[0].load_share(first)
    assert "At 30 req/s (1x load.rate) with 30% headroom (--headroom)" in text
    assert "At 60 req/s (2x load.rate) with 30% headroom" in text
    assert "| capacity req/s | load at 30 req/s |" in text and "| load at 60 req/s |" in text
    assert f"{100 * share:.0f}% busy at 30 req/s (30% headroom asked)" in text
    saved = json.loads((searched.out_dir / "search.json").read_text())
    assert [lv["traffic"] for lv in saved["levels"]] == [1.0, 2.0] and saved["headroom"] == 0.3
    assert saved["levels"][0]["results"][0]["load_share"] == pytest.approx(share)


def test_select_on_the_search_folder_names_the_same_deployment_at_the_same_capacity(searched):
    sel = select([searched.out_dir])
    for level in searched.levels:
        chosen = level.results[0]
        ranked = select([searched.out_dir], required_rate=level.target_rate_per_s).ranking
        assert ranked[0] == chosen.best.deployment
        # the same simulations, judged on the same window: the same capacity to the last digit
        engine = next(e for e in sel.engines if e.label == chosen.best.deployment)
        assert engine.capacity.offered_load == pytest.approx(chosen.capacity.offered_load, rel=1e-12)
        assert engine.dollars_per_hour == chosen.best.dollars_per_hour  # priced by its own GPU type
    assert sel.ranking[0] == searched.levels[0].results[0].best.deployment  # the folder's own rate: level 1's
    assert sel.required_rate == pytest.approx(39)
    assert sel.prices == {"L4": 0.5, "H100": 3.0}
    assert "a rerun could swap them" not in sel.recommendation


def test_equal_prices_rank_by_capacity_in_both():
    # one H100 ($3.00) and three L4 at TP 2 ($0.50 x 6 = $3.00) both carry the rate: the search and select both put
    # the one with more capacity first (80 req/s before 70), and a cheaper one that carries it before both
    from harness.metrics.slo_capacity import SloCapacity
    from harness.plan.search import Evaluation, GpuResult, ranking_key
    from reports.select import EngineResult, rank

    def deployment(gpu, tp, replicas, per_hour, capacity):
        best = Evaluation(
            gpu=gpu,
            tensor_parallel=tp,
            replicas=replicas,
            rate_per_s=40,
            meets_slo=True,
            goodput_fraction=1.0,
            goodput_requests_per_s=40,
            output_tokens_per_s=1000,
            slo_margin=0.5,
            dollars_per_hour=per_hour,
            dollars_per_mtok=1.0,
            folder="",
        )
        return GpuResult(gpu, best=best, capacity=SloCapacity(capacity, capacity, 1000, 0.9, "bracketed"))

    results = [deployment("L4", 2, 3, 3.0, 70), deployment("H100", 1, 1, 3.0, 80), deployment("A10", 1, 2, 2.0, 45)]
    assert [r.gpu for r in sorted(results, key=ranking_key)] == ["A10", "H100", "L4"]
    engines = [
        EngineResult(
            r.best.deployment, "vllm", r.capacity, 500.0, 1.0, 3, "rate", dollars_per_hour=r.best.dollars_per_hour
        )
        for r in results
    ]
    assert rank(engines, required_rate=40)[:3] == [engines[2], engines[1], engines[0]]
    # at 50 req/s the A10s no longer carry the rate: they rank after both
    assert rank(engines, required_rate=50)[:2] == [engines[1], engines[0]]


def test_ctrl_c_keeps_and_prints_what_was_simulated(scenario_path, tmp_path, monkeypatch):
    real, calls = search_module.simulate_scenario, []

    def interrupted_on_the_fourth(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(search_module, "simulate_scenario", interrupted_on_the_fourth)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["plan", str(scenario_path), "--search", "--output", str(out)])
    assert result.exit_code == 130, result.output
    assert "Ctrl-C after 3 simulations" in result.output and "| GPU | TP |" in result.output
    saved = json.loads((out / "search.json").read_text())
    assert saved["interrupted"] is True and saved["simulations"] == 3
    assert len(list((out / "simulations").glob("*/point-*/summary.json"))) == 3


def test_search_options_parse_headroom_and_traffic():
    options = SearchOptions.parse(16, 60.0, "25%", "1, 2,3")
    assert (options.headroom, options.traffic) == (0.25, (1.0, 2.0, 3.0))
    assert SearchOptions.parse(16, 60.0, "0.5", "1").headroom == 0.5
    with pytest.raises(ValueError, match="--headroom"):
        SearchOptions.parse(16, 60.0, "lots", "1")
    with pytest.raises(ValueError, match="--traffic"):
        SearchOptions.parse(16, 60.0, "30%", "1,-2")


CHAT_70B = """
name: chat-70b
backend: {kind: vllm, model: meta-llama/Llama-3.3-70B-Instruct, launch: {}}
workload: {kind: shared_prefix, num_groups: 1, prefix_tokens: 1500, input_tokens: 500, output_tokens: 250}
load: {arrival: poisson, rate: 20, num_requests: 100}
slo: {ttft_ms: 1000, tpot_ms: 50}
plan: {model: llama-3.3-70b, step_model: roofline, hardware: H100, prices: {H100: 2.5}}
seed: 0
"""


def test_tp_sizes_without_kv_room_for_the_load_are_left_out_saying_why(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(CHAT_70B)
    search = Search(load_scenario(path), tmp_path / "out", max_gpus=8, headroom=0.3)
    sizes, notes = search.tensor_parallel_sizes("H100", 26.0)
    # TP 2 on an H100: (0.9 x 81,559 MiB - 70.6e9 B / 2 of weights - 1 GiB) leaves ~5.3 GB a GPU; at 163,840 B a
    # token a GPU (80 layers x 4 KV heads x 128 x 2 x 2 B) a replica holds ~32.6k tokens: 49 sequences of 500 + 125
    # tokens (prompt and half the answer; the 1,500-token prefix held once). At 26 req/s, 250 tokens at >= one
    # decode step each (the roofline's batch-1 step: 35 GB of weights a GPU at 0.7 x 3.35 TB/s, ~15 ms, and more)
    # keep >= 26 x 250 x 0.015 = 98 in flight: over 24 on each of the 4 replicas 8 GPUs allow. TP 4 holds ~790.
    step_ms = search.decode_step_ms("H100", 2)
    assert step_ms > 35e9 / (0.7 * 3.35e12) * 1e3
    assert sizes == [4, 8]
    kv_note = next(n for n in notes if n.startswith("TP 2"))
    assert "holds 49 sequences of 625 tokens" in kv_note and "on each of 4 replicas (--max-gpus 8)" in kv_note
    assert f"at least {26 * 250 * step_ms / 1e3 / 4:.1f} in flight" in kv_note
    holds_each = search.memory("H100", 2).kv_tokens - 1500
    assert holds_each // 625 == 49
    # with 64 GPUs allowed, 32 replicas of TP 2 keep 98 / 32 = 3 (or a few more) each: TP 2 stays in, and its
    # search starts at the fewest replicas whose caches hold what is in flight: ceil(in flight / 49)
    floor = search.kv_floor("H100", 2, 26.0)
    assert floor.holds == 49 and floor.least_replicas == math.ceil(26 * 250 * step_ms / 1e3 / 49) >= 2
    assert Search(load_scenario(path), tmp_path / "out64", max_gpus=64).tensor_parallel_sizes("H100", 26.0)[0] == [
        2,
        4,
        8,
    ]


@pytest.mark.parametrize(
    ("kind", "program", "tp_flag", "dp_flag", "servers"),
    [
        ("vllm", ["vllm", "serve", "meta-llama/Llama-3.1-8B"], "--tensor-parallel-size", "--data-parallel-size", 1),
        (
            "sglang",
            ["python", "-m", "sglang.launch_server", "--model-path", "meta-llama/Llama-3.1-8B"],
            "--tp-size",
            "--dp-size",
            1,
        ),
        ("trtllm", ["trtllm-serve", "meta-llama/Llama-3.1-8B"], "--tp_size", None, 3),
    ],
)
def test_the_launch_command_is_in_the_engines_own_flags(kind, program, tp_flag, dp_flag, servers, tmp_path):
    from harness.plan.engine_flags import read_flags
    from harness.plan.launch_command import launch_plan

    text = SCENARIO.replace("kind: native, model: smollm2", f"kind: {kind}, model: m").replace(
        '--max-num-seqs, "32", --max-num-batched-tokens, "2048"', ""
    )
    text = text.replace("launch: {args: []}", "launch: {}").replace("prices:", "kv_cache_dtype: fp8, prices:")
    scenario = load_scenario(write_text(tmp_path, text))
    launch = launch_plan(scenario, tensor_parallel=2, replicas=3)
    # the model by its repository: plan.model llama-3.1-8b's config.json is meta-llama/Llama-3.1-8B's
    assert launch.program == program and launch.servers == servers
    assert launch.args[:2] == [tp_flag, "2"] and (dp_flag is None or launch.args[2:4] == [dp_flag, "3"])
    # read back as the engine reads them (harness/plan/engine_flags.py): TP 2, 3 data-parallel ranks, fp8 KV
    read = read_flags(kind, launch.args, launch.model).values
    assert read["tensor_parallel"] == 2 and read.get("data_parallel", 3 if dp_flag is None else None) == 3
    if kind != "trtllm":  # trtllm-serve takes the KV dtype in its options file
        assert read["kv_cache_dtype"] == "fp8"


def write_text(tmp_path, text: str, name: str = "s.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_search_prints_each_recommendation_as_a_launch_command_and_writes_its_scenarios(searched):
    text = (searched.out_dir / "search.md").read_text()
    first, doubled = (level.results[0].best for level in searched.levels)
    assert f"Launch for 30 req/s on {first.gpus} x {first.gpu}: `bench serve" in text
    assert f"Launch for 60 req/s on {doubled.gpus} x {doubled.gpu}:" in text
    run = load_scenario(searched.out_dir / "deploy" / f"quote-small-{doubled.deployment}-run.yaml")
    # measured at the level's rate for as long as the plan simulated: 60 req/s, 48 x 2 = 96 requests
    assert run.plan is None and (run.load.rate, run.load.num_requests) == (60, 96)
    assert run.backend.launch.args[-4:] == ["--max-num-seqs", "32", "--max-num-batched-tokens", "2048"]
    assert f"bench run {searched.out_dir / 'deploy'}" in text


def test_llama_3_3_70b_is_llama_3_1_70bs_architecture_under_its_own_name():
    from dataclasses import replace

    from harness.plan.architectures import load_architecture

    alias, base = load_architecture("llama-3.3-70b"), load_architecture("llama-3.1-70b")
    assert replace(alias, name=base.name, source=base.source) == base
    assert alias.name == "llama-3.3-70b" and "meta-llama/Llama-3.3-70B-Instruct" in alias.source
    assert load_architecture("meta-llama/Llama-3.1-8B-Instruct").n_layers == 32  # a repository id of an alias
    with pytest.raises(ValueError, match="aliases: llama-3.3-70b"):
        load_architecture("llama-9")


def test_a_plans_report_says_prediction_and_names_the_model_it_simulated(tmp_path):
    from harness.plan.simulator import simulate_scenario
    from reports.load import load_run
    from reports.prediction import assumption_notes, model_text, prediction_title

    text = CHAT_70B.replace("num_requests: 100", "num_requests: 12").replace(
        "hardware: H100,", "hardware: H100, tensor_parallel: 4,"
    )
    simulate_scenario(load_scenario(write_text(tmp_path, text)), tmp_path / "run")
    run = load_run(tmp_path / "run")
    assert prediction_title("Benchmark report: run", [run]).startswith("PREDICTION (simulated by bench plan")
    # the 70B model's name, not backend.model's spelling alone
    assert model_text(run) == "vllm simulating llama-3.3-70b (backend.model meta-llama/Llama-3.3-70B-Instruct)"
    (note,) = assumption_notes([("a", run), ("b", run)])  # one note for one deployment
    assert note.startswith("PREDICTION, not a measurement (a, b): model llama-3.3-70b")
    for assumed in (
        "GPU H100-SXM",
        "TP 4 x 1 replica(s)",
        f"step model roofline: mfu {run.summary.plan.step_model['coefficients']['mfu']:g}, mbu ",
        "request_ms 10 (stated)",
        "max_num_seqs 1024 (profile default)",
    ):
        assert assumed in note, assumed


# issue 39's customer question: Llama-3.1-8B for a chat product, ~20 req/s at peak, 2,000-token prompts sharing a
# 1,500-token system prompt, ~250-token answers, TTFT p90 < 1 s, TPOT p90 < 50 ms (docs/planner.md, "A quote").
CUSTOMER = """
name: chat-8b
backend: {kind: vllm, model: meta-llama/Llama-3.1-8B-Instruct, launch: {}}
workload: {kind: shared_prefix, num_groups: 1, prefix_tokens: 1500, input_tokens: 500, output_tokens: 250}
load: {arrival: poisson, rate: 20, num_requests: 200}
slo: {ttft_ms: 1000, tpot_ms: 50}
plan: {model: llama-3.1-8b, step_model: roofline, prices: {H100: 2.5}}
seed: 0
"""


def test_the_customer_question_is_answered_by_one_command(tmp_path):
    out = tmp_path / "out"
    scenario = write_text(tmp_path, CUSTOMER)
    result = CliRunner().invoke(app, ["plan", str(scenario), "--search", "--output", str(out)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    saved = json.loads((out / "search.json").read_text())
    first, doubled = (level["results"][0] for level in saved["levels"])
    # the deployment, its capacity and load with the headroom asked, the 2x table, the launch command
    gpus = first["best"]["tensor_parallel"] * first["best"]["replicas"]
    assert f"Recommended: {gpus} x H100" in text
    assert f"{100 * first['load_share']:.0f}% busy at 20 req/s (30% headroom asked)" in text
    assert first["load_share"] <= 1 / 1.3 and doubled["load_share"] <= 1 / 1.3
    assert "At 40 req/s (2x load.rate) with 30% headroom" in text and "| load at 40 req/s |" in text
    tp = first["best"]["tensor_parallel"]
    assert f"`vllm serve meta-llama/Llama-3.1-8B-Instruct --tensor-parallel-size {tp}" in text
    run = load_scenario(out / "deploy" / f"chat-8b-H100-tp{tp}-x{first['best']['replicas']}-run.yaml")
    assert run.backend.kind == "vllm" and run.plan is None and run.load.rate == 20
    tune = load_scenario(out / "deploy" / f"chat-8b-H100-tp{tp}-x{first['best']['replicas']}-tune.yaml").tune
    # vLLM's batch limit around its profile default, rates from half the asked 20 req/s to twice the capacity
    assert tune.space == {"--max-num-seqs": [128, 256, 512, 1024]} and tune.load.rate.min == 10
    assert tune.load.rate.max == pytest.approx(2 * first["capacity_per_s"], rel=0.01)
    # and bench select on the same folder names the same deployment
    assert select([out]).ranking[0] == f"H100-tp{tp}-x{first['best']['replicas']}"


# vLLM's CPU build lives in a venv of its own (its torch pin, ../shared/engines/README.md): the parser runs there
VLLM_PYTHON = os.environ.get("VLLM_PYTHON") or str(Path.home() / ".cache/llm-serving-bench/venv-vllm/bin/python")
PARSE_WITH_VLLM = """
import json, sys
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:  # vLLM before the utils split
    from vllm.utils import FlexibleArgumentParser
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser  # vLLM 0.32 (`vllm serve`'s, cli/serve.py)
except ImportError:  # vLLM before the launchers move
    from vllm.entrypoints.openai.cli_args import make_arg_parser
args = make_arg_parser(FlexibleArgumentParser()).parse_args(json.loads(sys.argv[1]))  # `vllm serve`'s own
print(json.dumps({k: args.__dict__.get(k) for k in ("model_tag", "tensor_parallel_size", "data_parallel_size",
                                                      "kv_cache_dtype")}))
"""


@functools.cache
def vllm_python() -> str | None:
    """A python that imports vLLM: this one, or VLLM_PYTHON / the cached venv; None: none here."""
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    if not Path(VLLM_PYTHON).is_file():
        return None
    found = subprocess.run(
        [VLLM_PYTHON, "-c", "import importlib.util as u; print(u.find_spec('vllm') is not None)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return VLLM_PYTHON if found.stdout.strip() == "True" else None


@pytest.mark.skipif(vllm_python() is None, reason=f"vLLM is not installed here (nor at {VLLM_PYTHON})")
def test_the_vllm_command_passes_vllms_own_argument_parser(tmp_path):
    from harness.plan.launch_command import launch_plan

    scenario = load_scenario(write_text(tmp_path, CUSTOMER.replace("prices:", "kv_cache_dtype: fp8, prices:")))
    launch = launch_plan(scenario, tensor_parallel=2, replicas=3)
    assert launch.program[:2] == ["vllm", "serve"]
    parsed = subprocess.run(
        [vllm_python(), "-c", PARSE_WITH_VLLM, json.dumps([launch.model, *launch.args])],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert parsed.returncode == 0, parsed.stderr[-2000:]  # argparse exits 2 naming a flag it does not know
    args = json.loads(parsed.stdout.strip().splitlines()[-1])
    assert (args["model_tag"], args["tensor_parallel_size"], args["data_parallel_size"]) == (launch.model, 2, 3)
    assert args["kv_cache_dtype"] == "fp8"


def test_bench_report_reads_the_search_folder_as_a_prediction(searched):
    from reports.report import build_report

    content = build_report([searched.out_dir])
    chosen = {r.best.deployment for level in searched.levels for r in level.results if r.best is not None}
    # each chosen deployment is a sweep of the rates it was simulated at, titled and noted as a prediction
    assert {section.sweep.label for section in content.sweeps} == chosen
    assert content.title.startswith("PREDICTION (simulated by bench plan, not measured): Benchmark report:")
    assert content.notes[0].startswith("PREDICTION, not a measurement (") and "GPU " in content.notes[0]


def test_a_closed_loop_is_searched_at_its_own_load_saying_there_is_no_capacity(tmp_path):
    text = SCENARIO.replace(
        "load: {arrival: poisson, rate: 30, num_requests: 48}",
        "load: {arrival: closed, concurrency: 8, num_requests: 24}",
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["plan", str(write_text(tmp_path, text)), "--search", "--output", str(out)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "not paced by a rate, so no capacity, headroom or traffic levels" in text
    saved = json.loads((out / "search.json").read_text())
    assert len(saved["levels"]) == 1 and saved["levels"][0]["rate_per_s"] is None and saved["headroom"] == 0
    best = saved["levels"][0]["results"][0]["best"]
    assert best["folder"].endswith("point-000-concurrency-8") and saved["levels"][0]["results"][0]["load_share"] is None
    assert select([out]).ranking  # bench select reads it too


def test_overwrite_leaves_no_point_of_the_previous_search(scenario_path, tmp_path):
    out = tmp_path / "out"
    stale = out / "simulations" / "H100-tp1-x1" / "point-009-rate-999"
    stale.mkdir(parents=True)
    (stale / "requests.jsonl").write_text("")  # a point of an earlier search, at a rate this one never ran
    Search(load_scenario(scenario_path), out, max_gpus=2, overwrite=True, headroom=0.0)
    assert not (out / "simulations").exists()
