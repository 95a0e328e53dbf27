"""Scenario files: validation, error messages that name the path and the fix, overrides."""

import json
from pathlib import Path

import pytest
import yaml

from harness.scenario.scenario import DEFAULT_NUM_REQUESTS, Scenario, ScenarioError, apply_override, load_scenario
from harness.scenario.tokenizer_source import ApproximateTokenizer
from harness.scenario.workload import build_schedule

SCENARIOS_DIR = Path(__file__).resolve().parent.parent / "scenarios"
BASE = {
    "name": "t",
    "backend": {"kind": "openai", "url": "http://127.0.0.1:8000"},
    "workload": {"kind": "random", "input_tokens": 32, "output_tokens": 8},
    "load": {"arrival": "poisson", "rate": 4.0, "num_requests": 10},
}


def write(tmp_path: Path, data: dict, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def error_of(tmp_path: Path, overrides: list[str], data: dict = BASE) -> str:
    with pytest.raises(ScenarioError) as caught:
        load_scenario(write(tmp_path, data), overrides)
    return str(caught.value)


@pytest.mark.parametrize("path", sorted(SCENARIOS_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_scenario_validates_and_plans(path):
    scenario = load_scenario(path)
    for point in scenario.sweep_points() or [scenario]:  # a sweep plans each of its points
        plan = build_schedule(point, ApproximateTokenizer())
        warmups = [r for r in plan.requests if r.is_warmup]
        assert plan.requests and all(r.prompt_tokens >= 1 and r.output_tokens >= 1 for r in plan.requests)
        assert plan.requests[: len(warmups)] == warmups  # warm-ups lead the plan
        if point.load.num_requests is not None:
            assert len(plan.requests) - len(warmups) == point.load.num_requests


def test_shipped_scenarios_cover_the_documented_set():
    names = {p.stem for p in SCENARIOS_DIR.glob("*.yaml")}
    assert {"quickstart", "poisson", "closed_loop", "shared_prefix", "multi_turn", "trace_mooncake"} <= names


def test_quickstart_is_small_and_starts_the_native_engine():
    scenario = load_scenario(SCENARIOS_DIR / "quickstart.yaml")
    assert scenario.backend.kind == "native" and scenario.backend.launch is not None
    assert scenario.load.num_requests <= 50 and scenario.workload.input_tokens.expected <= 128


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["workload.kindd=random"], "workload.kindd: unknown key; did you mean 'kind'?"),
        (
            ["workload.input_tokens={dist: normal, mean: 8, sd: 2}"],
            "workload.input_tokens.sd: unknown key; did you mean 'std'?",
        ),
        (["lod.rate=3"], "lod: unknown key; did you mean 'load'?"),
        (  # a key under one of the user's own names (plan.gpus.NAME) is checked against that block's fields
            ["plan.gpus={my-gpu: {memory_gib: 96, hbm_tbs: 4.0, bf16_tflops: 900, interconnect_gb_per_s: 900}}"],
            "plan.gpus.my-gpu.hbm_tbs: unknown key; did you mean 'hbm_tb_per_s'?",
        ),
        (["load.rate=-1"], "load.rate: -1 is not valid: must be > 0 requests/s"),
        (["load.rate=fast"], "load.rate: 'fast' is not valid: must be a valid number"),
        (["load.rate=true"], "load.rate: True is not valid"),
        (["load.num_requests=2.5"], "load.num_requests: 2.5 is not valid: must be a valid integer"),
        (["load.burstiness=0"], "load.burstiness: 0 is not valid: must be > 0"),
        (["load.concurrency=0"], "load.concurrency: 0 is not valid: must be >= 1 requests in flight"),
        (["backend.kind=vlm"], "backend.kind: 'vlm' is not valid: must be 'openai', 'native', 'vllm'"),
        (["backend.url=ftp://host"], "backend.url: 'ftp://host' is not valid: must start with http://"),
        (["backend.url=null"], "backend.url: missing; give the engine's URL, or `launch: {}`"),
        (
            ["workload.input_tokens={dist: gauss, mean: 8}"],
            "workload.input_tokens.dist: 'gauss' is not valid: must be 'fixed'",
        ),
        (
            ["workload.input_tokens={dist: uniform, min: 8}"],
            "workload.input_tokens: {'dist': 'uniform', 'min': 8} is not valid: dist uniform needs max",
        ),
        (["workload.input_tokens={dist: normal, mean: 8, std: 1, min: 9, max: 4}"], "min 9 is greater than max 4"),
        (["workload.input_tokens=0"], "workload.input_tokens: 0 is not valid: must be a whole number of tokens >= 1"),
        (["workload.output_tokens=many"], "workload.output_tokens: 'many' is not valid"),
        (["load.arrival=gamma", "load.rate=null"], "load.rate: missing; arrival gamma needs a rate in requests/s"),
        (["load.arrival=closed"], "load.concurrency: missing; arrival closed needs"),
        (["load.arrival=trace"], "load.trace: missing; arrival trace needs a trace file"),
        (["load.duration_s=30"], "give either load.num_requests or load.duration_s, not both"),
        (
            ["workload.kind=shared_prefix", "workload.prefix_tokens=64"],
            "workload.num_groups: missing; workload.kind shared_prefix needs it",
        ),
        (["workload.turns=3"], "workload.turns: only used when workload.kind is multi_turn (kind is random)"),
        (["workload.kind=file"], "workload.path: missing"),
        (["load.workers=0"], "load.workers: 0 is not valid: must be auto or a whole number of client processes >= 1"),
        (["load.workers=many"], "load.workers: 'many' is not valid: must be auto or a whole number"),
        (["slo.ttft_ms=-5"], "slo.ttft_ms: -5 is not valid: must be > 0 milliseconds"),
        (
            ["backend.replica_metrics={0: '127.0.0.1:8001/metrics'}"],
            "backend.replica_metrics.0: '127.0.0.1:8001/metrics' is not valid: "
            "give the replica's Prometheus page as an http",
        ),
        (
            ["backend.replica_metrics={'replica 0': 'http://127.0.0.1:8001/metrics'}"],
            "backend.replica_metrics: replica name 'replica 0' is not valid; use letters, digits",
        ),
        (
            ["backend.replica_metrics=[http://127.0.0.1:8001/metrics]"],
            "give a mapping of replica name to its Prometheus page",
        ),
    ],
)
def test_bad_values_name_the_path_the_value_and_the_fix(tmp_path, overrides, expected):
    assert expected in error_of(tmp_path, overrides)


def test_missing_files_name_the_folder_searched(tmp_path):
    message = error_of(tmp_path, ["load.arrival=trace", "load.trace=traces/day.jsonl"])
    assert message == f"load.trace: file 'traces/day.jsonl' not found (looked in {tmp_path / 'traces'})"
    message = error_of(tmp_path, ["workload={kind: file, path: rows.jsonl}"])
    assert message == f"workload.path: file 'rows.jsonl' not found (looked in {tmp_path})"


def test_relative_paths_resolve_against_the_scenario_folder_not_the_cwd(tmp_path, monkeypatch):
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "t.jsonl").write_text('{"timestamp": 0, "input_length": 4, "output_length": 2}\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    scenario = load_scenario(write(tmp_path, BASE), ["load={arrival: trace, trace: traces/t.jsonl}"])
    assert scenario.load.trace == str(tmp_path / "traces" / "t.jsonl")


def test_request_count_defaults(tmp_path):
    data = {**BASE, "load": {"arrival": "poisson", "rate": 1.0}}
    assert load_scenario(write(tmp_path, data)).load.num_requests == DEFAULT_NUM_REQUESTS
    timed = load_scenario(write(tmp_path, data), ["load.duration_s=20"]).load
    assert timed.num_requests is None and timed.duration_s == 20


def test_plain_numbers_become_fixed_distributions(tmp_path):
    scenario = load_scenario(write(tmp_path, BASE), ["workload.output_tokens={dist: uniform, min: 4, max: 9}"])
    assert scenario.workload.input_tokens.dist == "fixed" and scenario.workload.input_tokens.mean == 32
    assert scenario.workload.output_tokens.dist == "uniform"


def test_overrides_parse_values_as_yaml_and_create_missing_mappings(tmp_path):
    scenario = load_scenario(
        write(tmp_path, BASE),
        [
            "load.rate=8",
            "slo.ttft_ms=300",
            "backend.launch.ready_timeout_s=5",
            "backend.launch.args=[--port, 9]",
            "backend.launch.env={OMP_NUM_THREADS: 2}",
            "seed=7",
            "load.workers=3",
        ],
    )
    assert scenario.load.workers == 3 and load_scenario(write(tmp_path, BASE)).load.workers == "auto"
    assert scenario.load.rate == 8.0 and scenario.slo.ttft_ms == 300 and scenario.seed == 7
    assert scenario.backend.launch.ready_timeout_s == 5 and scenario.backend.launch.args == ["--port", "9"]
    assert scenario.backend.launch.env == {"OMP_NUM_THREADS": "2"}


@pytest.mark.parametrize(
    "override, expected",
    [
        ("load.rate", "override 'load.rate': expected dotted.path=value"),
        ("=3", "expected dotted.path=value"),
        ("load..rate=3", "expected dotted.path=value"),
        ("load.rate.x=1", "override 'load.rate.x=1': load.rate is 4.0, not a mapping"),
        ("load.rate=[1", "override 'load.rate=[1': the value is not valid YAML"),
    ],
)
def test_malformed_overrides_are_rejected(override, expected):
    with pytest.raises(ScenarioError, match="override") as caught:
        apply_override(yaml.safe_load(yaml.safe_dump(BASE)), override)
    assert expected in str(caught.value)


def test_files_that_are_not_scenarios(tmp_path):
    with pytest.raises(ScenarioError, match="not found"):
        load_scenario(tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ScenarioError, match="top level must be a mapping"):
        load_scenario(tmp_path / "list.yaml")
    (tmp_path / "broken.yaml").write_text("load: {rate: [\n")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        load_scenario(tmp_path / "broken.yaml")


def test_name_defaults_to_the_file_stem(tmp_path):
    data = {k: v for k, v in BASE.items() if k != "name"}
    assert load_scenario(write(tmp_path, data, "my_run.yaml")).name == "my_run"


def test_resolved_dict_is_json_and_round_trips(tmp_path):
    scenario = load_scenario(write(tmp_path, BASE), ["load.warmup_requests=2"])
    resolved = json.loads(json.dumps(scenario.resolved_dict()))
    assert resolved["load"]["warmup_requests"] == 2 and resolved["workload"]["input_tokens"]["mean"] == 32
    assert resolved["backend"]["request_timeout_s"] == 600.0  # defaults are spelled out for run.json
    assert Scenario.model_validate(resolved) == scenario


def test_resolved_dict_redacts_secrets(tmp_path):
    scenario = load_scenario(
        write(tmp_path, BASE),
        ["backend.headers={Authorization: Bearer sk-123}", "backend.launch.env={HF_TOKEN: hf_abc, OMP_NUM_THREADS: 2}"],
    )
    resolved = json.dumps(scenario.resolved_dict())
    assert "sk-123" not in resolved and "hf_abc" not in resolved and '"OMP_NUM_THREADS": "2"' in resolved
    assert scenario.backend.headers["Authorization"] == "Bearer sk-123"  # the run itself still sends it
