"""`load.arrival: offline` (every request due at once, the engine's own pace) and the plan's account of refused
requests: an offline plan holds its requests client-side and hands the engine one whenever its waiting queue has
room, so none is lost to the queue bound (--max-waiting, 1,024 by default); an open loop past that bound gets the
server's 503s, each counted with its reason in the summary and on the console (harness/plan/simulator.py)."""

import pytest
import yaml
from test_plan import STATED  # 20 ms a step, 1 ms a prompt token, 2 ms a decoding sequence

from harness.metrics.explain import explanation_lines
from harness.plan.deployment import deployment_from_args
from harness.plan.simulator import Simulation, prompt_token_ids, run_simulation, simulate_scenario
from harness.results.folder import read_records
from harness.scenario.scenario import ScenarioError, load_scenario
from harness.scenario.tokenizer_source import LocalTokenizer
from harness.scenario.workload import build_schedule


def scenario(tmp_path, load: dict, launch_args: list[str] | None = None, name: str = "s"):
    spec = {
        "name": "offline",
        "seed": 0,
        "backend": {"kind": "native", "model": "smollm2", "launch": {"args": launch_args or []}},
        "workload": {"kind": "random", "input_tokens": 32, "output_tokens": 8},
        "load": load,
        "plan": {"step_model": "roofline"},
    }
    (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(spec))
    return load_scenario(tmp_path / f"{name}.yaml")


def test_offline_sends_every_request_at_zero(tmp_path):
    offline = scenario(tmp_path, {"arrival": "offline", "num_requests": 5, "warmup_requests": 1})
    requests = build_schedule(offline, LocalTokenizer("smollm2")).requests
    assert [r.intended_offset_s for r in requests] == [0.0] * 6


@pytest.mark.parametrize(
    ("load", "message"),
    [
        ({"rate": 4}, "load.rate: arrival offline sends a fixed set of requests at once; leave load.rate out"),
        ({"concurrency": 4}, "load.concurrency: arrival offline .* leave load.concurrency out"),
        ({"duration_s": 10}, "load.duration_s: arrival offline .* give load.num_requests instead"),
        ({"sweep": [1, 2]}, "load.sweep: arrival offline .* leave load.sweep out"),
    ],
)
def test_an_offline_load_refuses_a_pace(tmp_path, load, message):
    with pytest.raises(ScenarioError, match=message):
        scenario(tmp_path, {"arrival": "offline", **load})


def test_an_open_loop_past_the_waiting_bound_counts_its_refusals(tmp_path, capsys):
    # 3,000 requests at 100,000/s all arrive within 30 ms, while the first one's prefill step (alone: it arrived
    # at 0, when the engine was idle) takes 20 + 32 x 1 = 52 ms. So by hand: request 0 runs, requests 1-1,024 wait
    # (the engine's bound), the other 1,975 get 503.
    load = {"arrival": "constant", "rate": 100_000, "num_requests": 3000}
    summary = simulate_scenario(scenario(tmp_path, load), tmp_path / "out", step_model=STATED)
    assert (summary.requests.completed, summary.requests.failed) == (1025, 1975)
    assert summary.failures == {"http_5xx": 1975}
    refused = next(f for f in summary.diagnosis if f.rule == "plan_refused")
    assert refused.evidence["refused"] == 1975 and refused.evidence["requests"] == 3000
    assert refused.evidence["by_reason"] == {"HTTP 503: waiting queue full (--max-waiting)": 1975}
    assert "1,975 of 3,000 requests refused" in refused.message and "load.arrival: offline" in refused.message
    # what bench plan prints: the diagnosis lines (harness/cli/console.py print_summary)
    assert any(line.startswith("[warning] 1,975 of 3,000 requests refused") for line in explanation_lines(summary))
    records = read_records(tmp_path / "out")
    assert sum("waiting queue is full (1024 requests)" in (r.error_detail or "") for r in records) == 1975


def test_an_offline_plan_serves_every_request(tmp_path):
    # the same 3,000 requests, offline: none is lost to the bound, the engine's queue never holds more than it
    summary = simulate_scenario(
        scenario(tmp_path, {"arrival": "offline", "num_requests": 3000}), tmp_path / "out", step_model=STATED
    )
    assert (summary.requests.completed, summary.requests.failed) == (3000, 0)
    assert not [f for f in summary.diagnosis if f.rule == "plan_refused"]
    records = read_records(tmp_path / "out")
    assert len(records) == 3000 and all(r.ok and r.output_tokens == 8 and r.intended_send_s == 0 for r in records)


def token_times(tmp_path, launch_args: list[str], name: str) -> list[list[float]]:
    s = scenario(tmp_path, {"arrival": "offline", "num_requests": 300}, launch_args, name)
    simulate_scenario(s, tmp_path / name, step_model=STATED)
    return [r.token_times_s for r in sorted(read_records(tmp_path / name), key=lambda r: r.index)]


def test_feeding_the_engine_as_it_admits_matches_an_unbounded_queue(tmp_path):
    # a queue of 8 topped up after every step against one that takes all 300 at once: a step admits at most 8
    # (--max-num-seqs), which the topped-up queue holds, in the same order, so every token comes at the same time
    args = ["--max-num-seqs", "8"]
    fed = token_times(tmp_path, [*args, "--max-waiting", "8"], "fed")
    unbounded = token_times(tmp_path, [*args, "--max-waiting", "100000"], "unbounded")
    assert fed == unbounded and len(fed) == 300


def test_offline_across_replicas_gives_each_replica_work(tmp_path):
    launch = ["--data-parallel", "3", "--router-policy", "least_load", "--max-waiting", "4", "--max-num-seqs", "4"]
    s = scenario(tmp_path, {"arrival": "offline", "num_requests": 60}, launch)
    tokenizer = LocalTokenizer("smollm2")
    requests = build_schedule(s, tokenizer).requests
    sim, records = Simulation(deployment_from_args(launch, "smollm2"), STATED), []
    run_simulation(sim, requests, prompt_token_ids(requests, tokenizer), None, records.append, offline=True)
    assert len(records) == 60 and all(r.ok for r in records) and not sim.refused
    # every replica stepped, its queue within its bound
    assert {step["replica"] for step in sim.steps} == {"replica-0", "replica-1", "replica-2"}
    assert max(step["waiting"] for step in sim.steps) <= 4
