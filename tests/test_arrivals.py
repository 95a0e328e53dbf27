"""Arrival processes: rate and burstiness over many draws, and how schedules land in a plan."""

import numpy as np
import pytest

from harness.arrivals import gaps_s, open_loop_offsets_s, open_loop_offsets_until_s, trace_offsets_s
from harness.scenario import Scenario, ScenarioError
from harness.tokenizer_source import ApproximateTokenizer
from harness.workload import build_plan

DRAWS = 10_000


def scenario(load: dict, seed: int = 0, workload: dict | None = None) -> Scenario:
    return Scenario.model_validate(
        {
            "name": "t",
            "backend": {"kind": "openai", "url": "http://127.0.0.1:8000"},
            "workload": workload or {"kind": "random", "input_tokens": 8, "output_tokens": 4},
            "load": load,
            "seed": seed,
        }
    )


@pytest.mark.parametrize(
    "arrival, rate, burstiness, target_cv",
    [
        ("constant", 5.0, 1.0, 0.0),
        ("poisson", 4.0, 1.0, 1.0),
        ("gamma", 4.0, 0.5, 1 / np.sqrt(0.5)),
        ("gamma", 10.0, 2.0, 1 / np.sqrt(2.0)),
        ("gamma", 2.0, 1.0, 1.0),
    ],
)
def test_rate_and_burstiness_over_many_draws(arrival, rate, burstiness, target_cv):
    # One fixed seed: with 10,000 gaps the rate's standard error is 1% (Poisson) to 1.4% (gamma 0.5),
    # so a 2% bound is about two standard errors; unseeded, it would fail now and then by chance.
    offsets = open_loop_offsets_s(arrival, rate, burstiness, DRAWS + 1, np.random.default_rng(0))
    gaps = np.diff(offsets)
    measured_rate = 1.0 / gaps.mean()
    assert abs(measured_rate - rate) / rate < 0.02
    cv = gaps.std() / gaps.mean()
    assert abs(cv - target_cv) <= 0.05 * max(target_cv, 1e-9)


def test_offsets_start_at_zero_and_never_go_back():
    offsets = open_loop_offsets_s("gamma", 3.0, 0.3, 500, np.random.default_rng(0))
    assert offsets[0] == 0.0 and np.all(np.diff(offsets) >= 0)


def test_burstier_gamma_has_more_short_gaps_and_more_long_ones():
    smooth = gaps_s("gamma", 1.0, 4.0, DRAWS, np.random.default_rng(0))
    bursty = gaps_s("gamma", 1.0, 0.25, DRAWS, np.random.default_rng(0))
    assert (bursty < 0.1).mean() > 5 * (smooth < 0.1).mean()
    assert (bursty > 3.0).mean() > 5 * (smooth > 3.0).mean()


def test_same_seed_same_schedule_other_seed_other_schedule():
    def draw(seed):
        return open_loop_offsets_s("poisson", 2.0, 1.0, 100, np.random.default_rng(seed))

    assert np.array_equal(draw(3), draw(3))
    assert not np.array_equal(draw(3), draw(4))


def test_offsets_until_cover_the_duration_and_stop_before_it():
    offsets = open_loop_offsets_until_s("poisson", 50.0, 1.0, 200.0, np.random.default_rng(0), max_count=100_000)
    assert offsets.max() < 200.0 and offsets.max() > 199.0
    assert abs(len(offsets) / 200.0 - 50.0) / 50.0 < 0.02
    assert open_loop_offsets_until_s("poisson", 50.0, 1.0, 200.0, np.random.default_rng(0), max_count=5000) is None


def test_trace_offsets_are_relative_to_the_first_and_scaled():
    offsets = trace_offsets_s([1000.0, 1000.5, 1002.0], time_scale=0.5)
    assert offsets.tolist() == [0.0, 0.25, 1.0]


def test_plan_puts_warmups_first_then_exactly_num_requests():
    plan = build_plan(
        scenario({"arrival": "poisson", "rate": 5.0, "num_requests": 30, "warmup_requests": 3}), ApproximateTokenizer()
    )
    offsets = [r.intended_offset_s for r in plan.requests]
    assert [r.is_warmup for r in plan.requests] == [True] * 3 + [False] * 30
    assert offsets == sorted(offsets) and offsets[0] == 0.0
    assert [r.index for r in plan.requests] == list(range(33)) and plan.duration_s is None


def test_duration_runs_cover_the_window_after_the_warmups():
    load = {"arrival": "constant", "rate": 4.0, "duration_s": 10.0, "warmup_requests": 2}
    plan = build_plan(scenario(load), ApproximateTokenizer())
    first_measured_s = plan.requests[2].intended_offset_s
    assert first_measured_s == pytest.approx(0.5)  # two warm-ups at 0 and 0.25 s
    assert plan.duration_s == pytest.approx(first_measured_s + 10.0)
    measured = [r for r in plan.requests if not r.is_warmup]
    assert len(measured) == 40 and all(r.intended_offset_s < plan.duration_s for r in measured)


def test_duration_run_too_long_for_the_cap_says_which_knob_to_turn():
    load = {"arrival": "poisson", "rate": 100.0, "duration_s": 60.0, "max_requests": 500}
    with pytest.raises(ScenarioError, match="load.max_requests: 500 is too small"):
        build_plan(scenario(load), ApproximateTokenizer())


def test_closed_loop_has_no_schedule():
    plan = build_plan(
        scenario({"arrival": "closed", "concurrency": 4, "num_requests": 12, "warmup_requests": 2}),
        ApproximateTokenizer(),
    )
    assert len(plan.requests) == 14 and all(r.intended_offset_s is None for r in plan.requests)
    timed = build_plan(
        scenario({"arrival": "closed", "concurrency": 4, "duration_s": 5.0, "max_requests": 50}), ApproximateTokenizer()
    )
    assert len(timed.requests) == 50 and timed.duration_s == 5.0


def test_prompt_lengths_do_not_move_the_schedule():
    load = {"arrival": "gamma", "rate": 3.0, "burstiness": 0.5, "num_requests": 20}
    short = build_plan(scenario(load, workload={"input_tokens": 8}), ApproximateTokenizer())
    long = build_plan(
        scenario(load, workload={"input_tokens": {"dist": "uniform", "min": 50, "max": 90}}), ApproximateTokenizer()
    )
    assert [r.intended_offset_s for r in short.requests] == [r.intended_offset_s for r in long.requests]
    assert [r.prompt for r in short.requests] != [r.prompt for r in long.requests]


def test_closed_multi_turn_by_duration_caps_requests_not_sessions():
    workload = {"kind": "multi_turn", "turns": 4, "input_tokens": 8, "output_tokens": 4}
    load = {"arrival": "closed", "concurrency": 2, "duration_s": 30.0, "max_requests": 10}
    plan = build_plan(scenario(load, workload=workload), ApproximateTokenizer())
    assert len(plan.requests) == 10 and [r.turn_index for r in plan.requests][-2:] == [0, 1]
