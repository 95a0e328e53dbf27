"""`bench tune` near the knee (harness/knee.py): a point whose attainment's confidence interval holds the target
is run again and judged on its pooled requests; a certain one is not; a repeat's early stop counts the earlier
runs. Against the ground-truth server, with a prompt file whose directives fail a known share of requests."""

import json
import sys
from pathlib import Path

import pytest
from groundtruth_server import GroundTruthConfig, GroundTruthProcess

from harness.confidence import share_lower_bound, share_upper_bound
from harness.early_stop import PointWatch
from harness.knee import Tally, certain, passes
from harness.run import Reporter, run_scenario
from harness.scenario import Scenario, load_scenario
from harness.tune import Tuner

GT_SERVER = Path(__file__).parent / "groundtruth_server.py"


def _prompts(tmp_path: Path, failing: set[int], n: int = 30) -> Path:
    """n prompt rows; the rows in `failing` make the server answer HTTP 500 (a request that misses the SLOs)."""
    path = tmp_path / f"prompts-{len(failing)}.jsonl"
    rows = [f"[gt id={i}{' fail=http_500' if i in failing else ''}] hi" for i in range(n)]
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in rows))
    return path


def _tune(tmp_path: Path, prompts: Path, out: str) -> dict:
    """A TTFT SLO of 5 s: on a loaded machine only the failing rows miss it."""
    command = f"{sys.executable} {GT_SERVER} --port {{port}} --ttft-ms 5 --itl-ms 2"
    path = tmp_path / f"{out}.yaml"
    path.write_text(
        f"""name: knee
backend: {{kind: openai, model: gt, tokenizer: smollm2, launch: {{command: '{command}', ready_timeout_s: 30}}}}
workload: {{kind: file, path: '{prompts}', output_tokens: 2}}
load: {{arrival: constant, num_requests: 30, warmup_requests: 0, workers: 1}}
slo: {{ttft_ms: 5000}}
tune: {{load: {{rate: {{min: 20, max: 25}}}}, probe_requests: 4, repeats: 2}}
"""
    )
    return Tuner(load_scenario(path), tmp_path / out, Reporter(), resume=False, workers="1").run()


def test_the_share_bounds_decide_when_a_verdict_is_certain():
    assert share_upper_bound(30, 30, 0.9) == 1.0
    assert share_upper_bound(27, 30, 0.9) == pytest.approx(1 - share_lower_bound(3, 30, 0.9))
    assert certain(Tally(30, 30), 0.9, 0.9)  # lower bound 0.1 ** (1 / 30) = 0.926
    assert not certain(Tally(27, 30), 0.9, 0.9) and not certain(Tally(29, 30), 0.9, 0.9)
    assert certain(Tally(24, 30), 0.9, 0.9)  # upper bound 0.891
    assert not certain(Tally(81, 90), 0.9, 0.9)  # still 0.9 exactly: more runs narrow it, never past the target
    # the verdict at the cap: the share met, or with slo.confidence its lower bound (as `bench run` judges a point)
    assert passes(Tally(81, 90), 0.9, None) and not passes(Tally(80, 90), 0.9, None)
    assert not passes(Tally(81, 90), 0.9, 0.9) and passes(Tally(30, 30), 0.9, 0.9)


def test_an_uncertain_point_is_run_again_and_judged_on_its_pooled_requests(tmp_path):
    # 3 of 30 fail (rows 0, 10, 20): exactly the 90% target, so no run settles it; the last row meets its SLO,
    # so no run stops early either (its 27th success is its last request)
    doc = _tune(tmp_path, _prompts(tmp_path, {0, 10, 20}), "uncertain")
    points = [t for t in doc["trials"] if t["kind"] == "point"]
    loads = sorted({t["offered_load"] for t in points})
    assert loads and all(20 <= load <= 25 for load in loads)
    for load in loads:
        runs = [t for t in points if t["offered_load"] == load]
        assert [t["repeat"] for t in runs] == [0, 1, 2]  # the first run and both repeats, at the same load
        assert [(t["met"], t["judged"]) for t in runs] == [(27, 30)] * 3
        assert all(t["stopped_early"] is None for t in runs)
        assert runs[-1]["goodput_fraction"] == pytest.approx(81 / 90) and runs[-1]["passed"] is True
    assert doc["configurations"][0]["capacity"]["status"] == "at_least"


def test_a_certain_point_is_not_run_again(tmp_path):
    doc = _tune(tmp_path, _prompts(tmp_path, set()), "certain")
    points = [t for t in doc["trials"] if t["kind"] == "point"]
    assert points and all(t["repeat"] == 0 and t["passed"] for t in points)
    # stopped at 27 of 27 met: the share's lower bound (0.918 at 90%) is past the target
    assert all(t["stopped_early"]["reason"] == "verdict_met" and t["met"] == t["judged"] == 27 for t in points)


def test_a_repeat_stops_on_the_pooled_plan(tmp_path):
    """Earlier runs of the load met 20 of 30: with this run's 30 the plan is 60, of which at most 6 may miss;
    10 have, so the first record settles it, although this run alone (all requests met) would pass."""
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=5, itl_ms=2)) as gt:
        scenario = Scenario.model_validate(
            {
                "name": "repeat",
                "backend": {"kind": "openai", "url": gt.url, "model": "gt"},
                "workload": {"input_tokens": 8, "output_tokens": 2},
                "load": {"arrival": "constant", "rate": 40, "num_requests": 30, "warmup_requests": 0, "workers": 1},
                "slo": {"ttft_ms": 5000},
            }
        )
        watch = PointWatch({"ttft_ms": 5000}, 0.9, saturation=False, prior=Tally(met=20, judged=30))
        result = run_scenario(scenario, tmp_path / "run", watch=watch)
    stop = result.summary["stopped_early"]
    assert stop["reason"] == "verdict_missed" and stop["passed"] is False
    assert stop["planned_requests"] == 60 and stop["missed"] == 10 and stop["after_requests"] == 31
    assert result.summary["requests"]["measured"] < 30
