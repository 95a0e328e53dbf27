"""The client's measured capacity (harness/client/capacity.py): a real run records it, the next `workers: auto`
sizes from it, and a file that cannot be read is a warning and the planning figure, never a crash."""

import json
from pathlib import Path

import pytest
from bench_process import bench
from groundtruth_server import GroundTruthConfig, GroundTruthProcess, gt_request

from harness.client.capacity import (
    CAPACITY_FILE_ENV,
    KEEP_LAST,
    MIN_MEASURED_TOKENS,
    PLANNING_FIGURE,
    WORKER_CPU_SHARE,
    capacity_file,
    load_capacity,
    machine_key,
    record_capacity,
)
from harness.client.workers import client_bound_advice, resolve_workers, workers_needed
from harness.metrics.latencies import summarize
from harness.results.schema import Summary
from harness.runs.run import Reporter, run_scenario, sizing_info
from harness.scenario.scenario import load_scenario

# ~99,000 streamed tokens/s planned: 1,001 requests of 99 tokens over one second
BUSY_PLAN = [gt_request(i, i * 0.001, 99) for i in range(1001)]


@pytest.fixture(scope="module")
def gt():
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=2, itl_ms=0.5)) as server:
        yield server


def _summary(**fields) -> Summary:
    """A summary of no requests with the client's account given."""
    account = {"client_bound": True, "client_bound_reasons": [], "interrupted": False}
    account |= {"incomplete": False, "incomplete_reasons": [], "lost_workers": []}
    return Summary(**dict(summarize([])), **(account | fields))


def test_a_run_records_its_client_capacity_and_the_next_auto_sizes_from_it(gt, tmp_path, own_client_capacity_file):
    path = tmp_path / "s.yaml"
    path.write_text(
        f"name: cap\nbackend: {{kind: openai, url: '{gt.url}', model: gt}}\n"
        "workload: {kind: random, input_tokens: 8, output_tokens: 64}\n"
        "load: {arrival: closed, concurrency: 16, num_requests: 160, workers: auto}\n"
    )
    reporter = Reporter()
    first = run_scenario(load_scenario(path), tmp_path / "one", reporter=reporter)
    assert (
        "workers: auto chose 1 client process(es) (5,000 streamed tokens/s each, a planning figure)" in reporter.lines
    )
    assert first.run_info.workers_sizing.source == "planning figure" and first.run_info.workers == 1
    measured = first.summary.client_capacity_measured
    assert measured.tokens == 160 * 64 and measured.cpu_s == pytest.approx(first.summary.client_cpu_s, abs=1e-4)
    stored = json.loads(own_client_capacity_file.read_text())["machines"]
    client = first.run_info.stamps.used
    assert stored[machine_key(client)]["measurements"] == [measured.model_dump()]
    second = run_scenario(load_scenario(path), tmp_path / "two")
    sizing = second.run_info.workers_sizing
    assert sizing.source == "measured" and sizing.measurements == 1
    assert sizing.tokens_per_cpu_s == round(measured.tokens / measured.cpu_s)
    assert sizing.file == str(own_client_capacity_file) and second.summary.workers_sizing == sizing
    assert len(json.loads(own_client_capacity_file.read_text())["machines"][machine_key(client)]["measurements"]) == 2


def test_auto_follows_the_stored_capacity_per_client_path_over_the_last_runs(tmp_path):
    warnings = []
    record_capacity("loop", 50_000, 1.0, 2.0, "r1", warnings)  # 50,000 per CPU-second: 20,000 tokens/s a process
    capacity = load_capacity("loop", warnings)
    assert capacity.tokens_per_s_per_worker == pytest.approx(50_000 * WORKER_CPU_SHARE)
    assert workers_needed(BUSY_PLAN, None, None, capacity) == 5  # 99,099 tokens/s / 20,000
    assert resolve_workers("auto", BUSY_PLAN, None, None, cpu_count=64, capacity=capacity) == 5
    assert resolve_workers("auto", BUSY_PLAN, None, None, cpu_count=4, capacity=capacity) == 3  # one core kept
    assert resolve_workers("auto", BUSY_PLAN, None, None, cpu_count=64) == 20  # the planning figure: 5,000 each
    record_capacity("loop", 450_000, 1.0, 2.0, "r2", warnings)  # the median of 50,000 and 450,000
    faster = load_capacity("loop", warnings)
    assert faster.tokens_per_cpu_s == pytest.approx(250_000) and faster.measurements == 2
    assert resolve_workers("auto", BUSY_PLAN, None, None, cpu_count=64, capacity=faster) == 1
    assert load_capacity("kernel", warnings) is PLANNING_FIGURE  # the other client path has no measurement yet
    assert record_capacity("loop", 10, 0.001, 2.0, "tiny", warnings) is None  # too little CPU to mean anything
    # a quiet run (0.05 of a core: a quickstart's 42 tokens/s) measures the client's fixed costs, not its capacity
    assert record_capacity("loop", 20_000, 1.0, 20.0, "quiet", warnings) is None
    for i in range(KEEP_LAST):
        record_capacity("loop", 100_000, 1.0, 2.0, f"slow{i}", warnings)
    slow = load_capacity("loop", warnings)  # only the last KEEP_LAST runs count
    assert slow.tokens_per_cpu_s == pytest.approx(100_000) and slow.measurements == KEEP_LAST
    assert resolve_workers("auto", BUSY_PLAN, None, None, cpu_count=64, capacity=slow) == 3  # 99,099 / 40,000
    assert warnings == []
    advice = client_bound_advice(_summary(workers=1, workers_needed=25, workers_sizing=sizing_info(slow)), 2)
    assert (
        "25 client processes (40,000 streamed tokens/s each: 0.4 of a core at the 100,000 tokens per CPU-second "
        f"measured here (the median of {KEEP_LAST} run(s)))"
        in advice
        and "--workers" not in advice
    )
    enough = client_bound_advice(_summary(workers=1, workers_needed=1, workers_sizing=sizing_info(slow)), 2)
    assert "a client process here plans 40,000 streamed tokens/s each: 0.4 of a core at the 100,000" in enough


def test_runs_of_fewer_than_the_minimum_tokens_never_enter_the_cache(own_client_capacity_file):
    # the fault kit's runs: 12-16 tokens in 0.17-0.21 CPU-s, busy enough (short) and over MIN_CPU_S, kept before
    assert record_capacity("loop", 16, 0.19, 0.5, "fault-kit", []) is None
    assert record_capacity("loop", MIN_MEASURED_TOKENS - 1, 0.5, 1.0, "almost", []) is None
    assert not own_client_capacity_file.exists() and load_capacity("loop", []) is PLANNING_FIGURE
    assert record_capacity("loop", MIN_MEASURED_TOKENS, 0.5, 1.0, "enough", []).tokens == MIN_MEASURED_TOKENS
    assert load_capacity("loop", []).tokens_per_cpu_s == pytest.approx(2 * MIN_MEASURED_TOKENS)


def test_small_runs_an_earlier_version_kept_are_passed_over_and_dropped_at_the_next_write(own_client_capacity_file):
    tiny = [
        {"tokens": 12 + i, "cpu_s": 0.17, "tokens_per_cpu_s": 70.6, "at": "t", "run": f"fault{i}"} for i in range(5)
    ]
    own_client_capacity_file.write_text(
        json.dumps({"format": 1, "machines": {machine_key("loop"): {"measurements": tiny}}})
    )
    warnings = []
    assert load_capacity("loop", warnings) is PLANNING_FIGURE and warnings == []
    record_capacity("loop", 40_000, 1.0, 2.0, "real", warnings)
    stored = json.loads(own_client_capacity_file.read_text())["machines"][machine_key("loop")]["measurements"]
    assert [m["run"] for m in stored] == ["real"] and warnings == []


def test_an_outlier_does_not_move_the_estimate(own_client_capacity_file):
    for i, tokens in enumerate([40_000, 44_000, 38_000]):
        record_capacity("loop", tokens, 1.0, 2.0, f"r{i}", [])
    before = own_client_capacity_file.read_bytes()
    assert load_capacity("loop", []).tokens_per_cpu_s == pytest.approx(40_000)  # the median
    warnings = []
    # a big run whose client spent its CPU on something else: 20,000 tokens in 4 CPU-seconds, 5,000 per CPU-second
    odd = record_capacity("loop", 20_000, 4.0, 8.0, "odd", warnings)
    assert odd.tokens_per_cpu_s == 5_000  # what this run measured (summary.json), not kept
    (warning,) = warnings
    assert "5,000 tokens per CPU-second" in warning and "40,000" in warning and "not kept" in warning
    assert str(own_client_capacity_file) in warning
    assert own_client_capacity_file.read_bytes() == before
    assert load_capacity("loop", []).tokens_per_cpu_s == pytest.approx(40_000)
    # a low run within a quarter of the median is kept, and moves the median only to its neighbour's figure
    record_capacity("loop", 12_000, 1.0, 2.0, "low", [])
    assert load_capacity("loop", []).tokens_per_cpu_s == pytest.approx((38_000 + 40_000) / 2)


def test_one_odd_run_does_not_outvote_one_earlier_run(own_client_capacity_file):
    record_capacity("kernel", 40_000, 1.0, 2.0, "first", [])
    warnings = []
    record_capacity("kernel", 10_000, 1.5, 2.0, "odd", warnings)  # 6,667 per CPU-second
    assert "not kept" in warnings[0] and load_capacity("kernel", []).tokens_per_cpu_s == pytest.approx(40_000)


@pytest.mark.parametrize(
    "content, said",
    [
        ("{not json", "cannot be read"),
        ('{"format": 99, "machines": {}}', "is not in format 1"),
        ("[1, 2]", "is not in format 1"),
    ],
)
def test_a_capacity_file_that_is_not_ours_is_a_warning_and_the_planning_figure(own_client_capacity_file, content, said):
    own_client_capacity_file.write_text(content)
    warnings = []
    assert load_capacity("loop", warnings) is PLANNING_FIGURE
    assert len(warnings) == 1 and str(own_client_capacity_file) in warnings[0] and said in warnings[0]
    assert "delete the file" in warnings[0]
    assert record_capacity("loop", 50_000, 1.0, 2.0, "r", warnings).tokens_per_cpu_s == 50_000
    assert own_client_capacity_file.read_text() == content  # someone's file is never overwritten
    assert "is not kept" in warnings[1]


@pytest.mark.faults
def test_malformed_measurements_are_a_warning_too(own_client_capacity_file):
    own_client_capacity_file.write_text(
        json.dumps({"format": 1, "machines": {machine_key("loop"): {"measurements": [{"tokens": "many"}]}}})
    )
    warnings = []
    assert load_capacity("loop", warnings) is PLANNING_FIGURE and "malformed measurements" in warnings[0]


def test_the_environment_variable_moves_the_file(tmp_path, monkeypatch):
    elsewhere = tmp_path / "a" / "b" / "capacity.json"
    monkeypatch.setenv(CAPACITY_FILE_ENV, str(elsewhere))
    record_capacity("kernel", 30_000, 0.5, 2.0, "r", [])
    assert capacity_file() == elsewhere and load_capacity("kernel", []).tokens_per_cpu_s == pytest.approx(60_000)
    monkeypatch.delenv(CAPACITY_FILE_ENV)
    assert capacity_file().parts[-3:] == (".cache", "llm-serving-bench", "client_capacity.json")


@pytest.fixture(scope="module")
def file_a_module_fixture_records_into():
    return capacity_file()  # a module-scoped fixture starts before the function-scoped own_client_capacity_file


def test_runs_in_module_fixtures_never_record_into_the_users_cache(
    file_a_module_fixture_records_into, own_client_capacity_file
):
    users_cache = Path.home() / ".cache" / "llm-serving-bench"
    assert users_cache not in file_a_module_fixture_records_into.parents
    assert file_a_module_fixture_records_into != own_client_capacity_file  # the session's file, not this test's


def _prompts_scenario(tmp_path, url: str, fails: list[str]) -> Path:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"prompt": f"request {i} [gt id={i}{f' fail={f}' if f else ''}]", "output_tokens": 6}) + "\n"
            for i, f in enumerate(fails)
        )
    )
    path = tmp_path / "s.yaml"
    path.write_text(
        f"name: poison\nbackend: {{kind: openai, url: '{url}', model: gt}}\n"
        f"workload: {{kind: file, path: '{prompts}'}}\n"
        f"load: {{arrival: constant, rate: 50, num_requests: {len(fails)}, workers: 1}}\n"
        "telemetry: {interval_ms: 200, gpu: false}\n"
    )
    return path


@pytest.mark.faults
@pytest.mark.parametrize("claimed", ["1e12", "1000000000000", "NaN"])
def test_a_server_reporting_absurd_usage_leaves_the_capacity_cache_unchanged(
    gt, tmp_path, monkeypatch, own_client_capacity_file, claimed
):
    # the run's CPU filters off, so only the fix keeps the server's counts out (a failed 0.4 s run once passed them)
    monkeypatch.setattr("harness.client.capacity.MIN_CPU_S", 0.0)
    monkeypatch.setattr("harness.client.capacity.MIN_MEASURED_TOKENS", 1)
    monkeypatch.setattr("harness.client.capacity.MIN_BUSY_CORES", 0.0)
    record_capacity("loop", 40_000, 1.0, 2.0, "earlier", [])
    record_capacity("kernel", 40_000, 1.0, 2.0, "earlier", [])
    before = own_client_capacity_file.read_bytes()
    result = run_scenario(
        load_scenario(_prompts_scenario(tmp_path, gt.url, [f"usage_{claimed}"] * 4)), tmp_path / "out"
    )
    assert result.summary.failures == {"bad_usage": 4} and result.mostly_failed
    assert result.summary.client_capacity_measured is None
    assert own_client_capacity_file.read_bytes() == before


@pytest.mark.faults
def test_only_completed_requests_count_towards_a_kept_measurement(gt, tmp_path, monkeypatch, own_client_capacity_file):
    monkeypatch.setattr("harness.client.capacity.MIN_CPU_S", 0.0)
    monkeypatch.setattr("harness.client.capacity.MIN_MEASURED_TOKENS", 1)
    monkeypatch.setattr("harness.client.capacity.MIN_BUSY_CORES", 0.0)
    result = run_scenario(
        load_scenario(_prompts_scenario(tmp_path, gt.url, ["usage_1e12", "", "", ""])), tmp_path / "out"
    )
    assert result.summary.requests.completed == 3 and not result.mostly_failed
    assert result.summary.client_capacity_measured.tokens == 3 * 6  # not 1e12 + 18
    strict = json.loads(own_client_capacity_file.read_text(), parse_constant=lambda name: pytest.fail(name))
    (entry,) = strict["machines"].values()
    assert [m["tokens"] for m in entry["measurements"]] == [18]


@pytest.mark.faults
def test_a_cache_holding_nonsense_is_ignored_with_a_warning_and_repaired_on_the_next_write(own_client_capacity_file):
    good = {"tokens": 40_000, "cpu_s": 1.0, "tokens_per_cpu_s": 40_000.0, "at": "t", "run": "good"}
    nonsense = [
        {"tokens": 4_000_000_000_000, "cpu_s": 0.4, "tokens_per_cpu_s": 1e13, "at": "t", "run": "1e12"},
        {"tokens": 4, "cpu_s": 0.4, "tokens_per_cpu_s": float("nan"), "at": "t", "run": "nan"},
        {"tokens": -5, "cpu_s": 1.0, "at": "t", "run": "negative"},
        {"tokens": 100, "cpu_s": float("inf"), "at": "t", "run": "inf"},
    ]
    own_client_capacity_file.write_text(
        json.dumps(  # json.dumps writes NaN and Infinity as an old version did
            {"format": 1, "machines": {machine_key("loop"): {"measurements": nonsense + [good]}}}
        )
    )
    warnings = []
    capacity = load_capacity("loop", warnings)
    assert capacity.tokens_per_cpu_s == pytest.approx(40_000) and capacity.measurements == 1
    (warning,) = warnings
    assert str(own_client_capacity_file) in warning and "4 of 5" in warning and "ignored" in warning
    assert load_capacity("kernel", []) is PLANNING_FIGURE
    record_capacity("loop", 20_000, 1.0, 2.0, "next", warnings)
    strict = json.loads(own_client_capacity_file.read_text(), parse_constant=lambda name: pytest.fail(name))
    assert [m["run"] for m in strict["machines"][machine_key("loop")]["measurements"]] == ["good", "next"]
    later = []
    assert load_capacity("loop", later).measurements == 2 and later == []


@pytest.mark.faults
def test_a_tiny_bench_run_leaves_the_capacity_cache_as_it_was(gt, tmp_path, own_client_capacity_file):
    """The fault kit's runs: `bench run` of a few short requests, valid and complete, which the old rules kept as
    this machine's client capacity (~100 tokens per CPU-second) and sized every later run from."""
    record_capacity("loop", 40_000, 1.0, 2.0, "earlier", [])
    record_capacity("kernel", 40_000, 1.0, 2.0, "earlier", [])
    before = own_client_capacity_file.read_bytes()
    scenario = _prompts_scenario(tmp_path, gt.url, [""] * 4)
    res = bench("run", scenario, "--output", tmp_path / "out", "--allow-client-bound")  # the env names the file
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["requests"]["completed"] == 4 and summary.get("client_capacity_measured") is None
    assert own_client_capacity_file.read_bytes() == before
    assert "40,000 tokens per CPU-second measured here" in summary["workers_sizing"]["describe"]
