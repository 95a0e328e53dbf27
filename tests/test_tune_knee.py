"""`bench tune` near the knee (harness/metrics/knee.py): a load is judged by its runs' majority, each run on its own
requests; the bracket's two ends are run again (a second run, a third when the two disagree), far points once.
Against the ground-truth server made slow for exactly one run (--ttft-cycle-ms): that run is outvoted."""

import sys
from pathlib import Path

from harness.metrics.knee import majority_passed, run_passes, settled
from harness.runs.run import Reporter
from harness.scenario.scenario import load_scenario
from harness.tune.search import Measured, search_capacity
from harness.tune.tune import Tuner

GT_SERVER = Path(__file__).parent / "groundtruth_server.py"


def test_a_load_is_settled_once_its_majority_cannot_turn():
    assert not settled([True], 3) and not settled([False], 3)  # one run: a second confirms it
    assert settled([True, True], 3) and settled([False, False], 3)
    assert not settled([False, True], 3) and settled([False, True, True], 3)  # a tie: a third breaks it
    assert settled([False], 1) and settled([True, False], 2)  # no runs left: settled whatever they said
    assert majority_passed([False, True, True]) and not majority_passed([True, False, False])
    assert not majority_passed([True, False])  # a tie fails: no capacity raised on a coin toss
    # one run's verdict: its own share met, or with slo.confidence that share's lower bound
    assert run_passes(27, 30, 0.9, None) and not run_passes(26, 30, 0.9, None)
    assert not run_passes(27, 30, 0.9, 0.9) and run_passes(30, 30, 0.9, 0.9) and not run_passes(0, 0, 0.9, None)


def test_the_bracket_ends_are_confirmed_and_a_stalled_run_is_outvoted():
    """A true capacity of 10 (every run below passes, above fails), and the first run at 10 stalls: without
    confirmation the bracket would stop below 10; its second and third runs pass and outvote it."""
    runs: dict[float, int] = {}

    def measure(load, probe):
        runs[load] = runs.get(load, 0) + (not probe)
        stalled = load == 10 and runs[load] == 1
        passed = load <= 10 and not stalled
        return Measured(load, passed, 1.0 if passed else 0.5, min(load, 10.0))

    result = search_capacity(measure, "rate", 2, 12, 0.9, 0.1, 10, start=10, max_runs=3)
    by_load = {p.offered_load: p for p in result.points}
    assert [r.passed for r in by_load[10].runs] == [False, True, True] and by_load[10].passed
    assert result.status == "bracketed" and result.lo == 10 and result.hi / 10 - 1 <= 0.1
    assert [r.passed for r in by_load[result.hi].runs] == [False, False]  # the failing end confirmed
    # only loads that were a bracket's end when the narrowing stopped are run again; the rest once
    assert sum(len(p.runs) == 1 for p in result.points) >= len(result.points) - 3


def test_a_run_slowed_whole_is_outvoted_by_the_loads_other_runs(tmp_path):
    """The ground-truth server's TTFT is 5 ms except for the second run's 30 requests (3 s each, past the 1 s
    SLO): the tune's first point. Pooled, its load would have 60 of 90 met and fail; by runs it passes 2 to 1,
    and every load up to the bound passes. The hook sees every trial's load, in order."""
    cycle = ",".join(["5", "3000"] + ["5"] * 14)  # one step per 30 streaming requests: one run each
    command = f"{sys.executable} {GT_SERVER} --port {{port}} --itl-ms 2 --ttft-cycle-ms {cycle} --cycle-every 30"
    path = tmp_path / "stall.yaml"
    path.write_text(
        f"""name: stall
backend: {{kind: openai, model: gt, tokenizer: smollm2, launch: {{command: '{command}', ready_timeout_s: 30}}}}
workload: {{input_tokens: 8, output_tokens: 2}}
load: {{arrival: constant, num_requests: 30, warmup_requests: 0, workers: 1}}
slo: {{ttft_ms: 1000}}
tune: {{load: {{rate: {{min: 20, max: 25}}}}, probe_requests: 30, repeats: 2, early_stop: false}}
"""
    )
    seen: list[float] = []
    doc = Tuner(load_scenario(path), tmp_path / "out", Reporter(), False, "1", after_trial=seen.append).run()
    assert seen == [t.offered_load for t in doc.trials]
    points = [t for t in doc.trials if t.kind == "point"]
    (slow,) = [t for t in points if not t.passed]  # the one slowed run, and nothing else failed
    assert slow.repeat == 0 and slow.met == 0 and slow.judged == 30
    same = [t for t in points if t.offered_load == slow.offered_load]
    assert [t.passed for t in same] == [False, True, True]
    assert sum(t.met for t in same) / sum(t.judged for t in same) < 0.9  # what pooling would have failed
    capacity = doc.configurations[0].capacity
    assert capacity.status == "at_least" and capacity.offered_load == 25
    # the slowed load, the failing end, was confirmed first and turned: the pass below it is no end to confirm
    assert len(capacity.bracket_runs_passed[0]) >= 2 and doc.cost.search.repeats >= 2


def test_from_a_load_whose_runs_split_the_search_steps_by_the_precision():
    """8.27 passes once and then fails twice (a coin toss at the knee): outvoted, it leaves nothing passed, and
    the search steps down by 1 + precision (to 7.52), not by the bracketing factor 1.5 (to 5.51): the capacity
    is within a precision step of a load that splits, and the bracket is then narrow at once."""
    runs: dict[float, int] = {}

    def measure(load, probe):
        runs[load] = runs.get(load, 0) + 1
        passed = load <= 8 or (load == 8.27 and runs[load] == 1)
        return Measured(load, passed, 1.0 if passed else 0.8, min(load, 8.0))

    result = search_capacity(measure, "rate", 2, 20, 0.9, 0.1, 6, start=8.27, max_runs=3)
    by_load = {p.offered_load: p for p in result.points}
    assert [r.passed for r in by_load[8.27].runs] == [True, False, False]
    assert (result.lo, result.hi) == (7.52, 8.27) and 5.51 not in by_load


def _first_run_stalls(capacity: float, stalled_load: float):
    """A scripted engine: every load up to `capacity` passes, except the first run at `stalled_load`."""
    runs: dict[float, int] = {}

    def measure(load, probe):
        runs[load] = runs.get(load, 0) + 1
        passed = load <= capacity and not (load == stalled_load and runs[load] == 1)
        return Measured(load, passed, 1.0 if passed else 0.5, min(load, capacity))

    return measure


def test_the_failing_end_is_confirmed_first_and_a_passing_end_it_passes_is_not_run_again():
    """Every load up to 10.6 passes, and the first run at 10.3 stalls: the bracket closes at [10, 10.3]. The
    failing end is run again first (a failing run is the cheaper); it turns to a pass, so 10 is no longer an
    end and is not confirmed (its confirming run would cost the 27 of 30 a pass needs), nor is 10.3 run again
    once settled."""
    result = search_capacity(_first_run_stalls(10.6, 10.3), "rate", 2, 20, 0.9, 0.1, 6, start=10, max_runs=3)
    by_load = {p.offered_load: p for p in result.points}
    assert [r.passed for r in by_load[10.3].runs] == [False, True, True]
    assert (result.lo, result.hi) == (10.3, 11.2) and [r.passed for r in by_load[11.2].runs] == [False, False]
    assert len(by_load[10].runs) == 1  # confirmed first (the old order), it cost one passing run more


def test_an_end_a_confirmation_turned_gives_the_search_one_more_load():
    """max_points 3: 10 (its first run stalled), 6.67 and 7.5 use them up. Confirming 10 turns it to a pass,
    which leaves nothing failed above it; the turned end gives one more load, 11 (a precision step up from a
    load whose runs split), and the bracket closes at [10, 11] instead of ending 'at least 10'."""
    result = search_capacity(_first_run_stalls(10.0, 10), "rate", 2, 20, 0.9, 0.1, 3, start=10, max_runs=3)
    by_load = {p.offered_load: p for p in result.points}
    assert list(by_load) == [10, 6.67, 7.5, 11] and [r.passed for r in by_load[10].runs] == [False, True, True]
    assert result.status == "bracketed" and (result.lo, result.hi) == (10, 11)


def test_a_load_whose_runs_tie_is_run_again_before_the_search_moves_on():
    """Every load up to 10 passes, but 10's second run stalls: 10 then stands one pass to one fail, which the
    majority counts as a fail. Its third run comes next and decides it (a pass), so the search never steps
    down to 9.09 as if 10 had failed."""
    order: list[float] = []

    def measure(load, probe):
        order.append(load)
        passed = load <= 10 and not (load == 10 and order.count(10) == 2)
        return Measured(load, passed, 1.0 if passed else 0.5, min(load, 10.0))

    result = search_capacity(measure, "rate", 2, 12, 0.9, 0.1, 6, start=10, max_runs=3)
    assert order == [10, 12, 10.5, 10.5, 10, 10]  # the failing end 10.5 confirmed, then 10 twice in a row
    assert result.status == "bracketed" and (result.lo, result.hi) == (10, 10.5)
