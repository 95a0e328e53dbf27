"""Arrival processes: rate and burstiness over many draws, and how schedules land in a plan."""

import numpy as np
import pytest

from harness.scenario.arrivals import arrival_process, open_loop, trace_offsets_s
from harness.scenario.scenario import LoadConfig, Scenario, ScenarioError, load_scenario
from harness.scenario.tokenizer_source import ApproximateTokenizer
from harness.scenario.workload import build_schedule

DRAWS = 10_000


def load_of(arrival: str, rate: float, burstiness: float = 1.0, **more) -> LoadConfig:
    return LoadConfig.model_validate({"arrival": arrival, "rate": rate, "burstiness": burstiness, **more})


def open_loop_offsets_s(arrival, rate, burstiness, n, rng, **more):
    return open_loop(arrival).offsets_s(load_of(arrival, rate, burstiness, **more), n, rng)


def gaps_s(arrival, rate, burstiness, n, rng):
    return open_loop(arrival).gaps_s(load_of(arrival, rate, burstiness), n, rng)


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
    poisson, load = open_loop("poisson"), load_of("poisson", 50.0)
    offsets = poisson.offsets_until_s(load, 200.0, np.random.default_rng(0), max_count=100_000)
    assert offsets.max() < 200.0 and offsets.max() > 199.0
    assert abs(len(offsets) / 200.0 - 50.0) / 50.0 < 0.02
    assert poisson.offsets_until_s(load, 200.0, np.random.default_rng(0), max_count=5000) is None


def test_trace_offsets_are_relative_to_the_first_and_scaled():
    offsets = trace_offsets_s([1000.0, 1000.5, 1002.0], time_scale=0.5)
    assert offsets.tolist() == [0.0, 0.25, 1.0]


def test_plan_puts_warmups_first_then_exactly_num_requests():
    plan = build_schedule(
        scenario({"arrival": "poisson", "rate": 5.0, "num_requests": 30, "warmup_requests": 3}), ApproximateTokenizer()
    )
    offsets = [r.intended_offset_s for r in plan.requests]
    assert [r.is_warmup for r in plan.requests] == [True] * 3 + [False] * 30
    assert offsets == sorted(offsets) and offsets[0] == 0.0
    assert [r.index for r in plan.requests] == list(range(33)) and plan.duration_s is None


def test_duration_runs_cover_the_window_after_the_warmups():
    load = {"arrival": "constant", "rate": 4.0, "duration_s": 10.0, "warmup_requests": 2}
    plan = build_schedule(scenario(load), ApproximateTokenizer())
    first_measured_s = plan.requests[2].intended_offset_s
    assert first_measured_s == pytest.approx(0.5)  # two warm-ups at 0 and 0.25 s
    assert plan.duration_s == pytest.approx(first_measured_s + 10.0)
    measured = [r for r in plan.requests if not r.is_warmup]
    assert len(measured) == 40 and all(r.intended_offset_s < plan.duration_s for r in measured)


def test_duration_run_too_long_for_the_cap_says_which_knob_to_turn():
    load = {"arrival": "poisson", "rate": 100.0, "duration_s": 60.0, "max_requests": 500}
    with pytest.raises(ScenarioError, match="load.max_requests: 500 is too small"):
        build_schedule(scenario(load), ApproximateTokenizer())


def test_closed_loop_has_no_schedule():
    plan = build_schedule(
        scenario({"arrival": "closed", "concurrency": 4, "num_requests": 12, "warmup_requests": 2}),
        ApproximateTokenizer(),
    )
    assert len(plan.requests) == 14 and all(r.intended_offset_s is None for r in plan.requests)
    timed = build_schedule(
        scenario({"arrival": "closed", "concurrency": 4, "duration_s": 5.0, "max_requests": 50}), ApproximateTokenizer()
    )
    assert len(timed.requests) == 50 and timed.duration_s == 5.0


def test_prompt_lengths_do_not_move_the_schedule():
    load = {"arrival": "gamma", "rate": 3.0, "burstiness": 0.5, "num_requests": 20}
    short = build_schedule(scenario(load, workload={"input_tokens": 8}), ApproximateTokenizer())
    long = build_schedule(
        scenario(load, workload={"input_tokens": {"dist": "uniform", "min": 50, "max": 90}}), ApproximateTokenizer()
    )
    assert [r.intended_offset_s for r in short.requests] == [r.intended_offset_s for r in long.requests]
    assert [r.prompt for r in short.requests] != [r.prompt for r in long.requests]


def test_closed_multi_turn_by_duration_caps_requests_not_sessions():
    workload = {"kind": "multi_turn", "turns": 4, "input_tokens": 8, "output_tokens": 4}
    load = {"arrival": "closed", "concurrency": 2, "duration_s": 30.0, "max_requests": 10}
    plan = build_schedule(scenario(load, workload=workload), ApproximateTokenizer())
    assert len(plan.requests) == 10 and [r.turn_index for r in plan.requests][-2:] == [0, 1]


def square_wave_offsets(low_rate: float, n: int) -> np.ndarray:
    options = {"low_rate": low_rate, "period_s": 20.0}
    return open_loop_offsets_s("square_wave", 10.0, 1.0, n, np.random.default_rng(0), arrival_options=options)


def test_square_wave_alternates_between_its_two_rates():
    # 10/s for 10 s, then 2/s for 10 s: 120 arrivals a period, so 12,000 cover 100 periods. Each half's
    # count over 100 periods has a standard error of 1% (high) and 2.2% (low); bounds are ~3 of them.
    offsets = square_wave_offsets(2.0, 12_000)
    phase_s = offsets % 20.0
    periods = offsets[-1] / 20.0
    high_rate = (phase_s < 10.0).sum() / (periods * 10.0)
    low_rate = (phase_s >= 10.0).sum() / (periods * 10.0)
    assert abs(high_rate - 10.0) / 10.0 < 0.03 and abs(low_rate - 2.0) / 2.0 < 0.07
    assert offsets[0] == 0.0 and np.all(np.diff(offsets) >= 0)
    # within a half the gaps are exponential: coefficient of variation ~1
    high_gaps = np.diff(offsets)[(phase_s[1:] < 9.0) & (phase_s[:-1] < 9.0)]
    assert abs(high_gaps.std() / high_gaps.mean() - 1.0) < 0.06


def test_square_wave_with_a_silent_half_sends_nothing_in_it():
    offsets = square_wave_offsets(0.0, 2_000)
    assert np.all(offsets % 20.0 < 10.0) and offsets[-1] > 20.0 * 10


def test_square_wave_duration_run_and_its_mean_rate():
    square = open_loop("square_wave")
    load = load_of("square_wave", 10.0, arrival_options={"low_rate": 2.0, "period_s": 20.0})
    offsets = square.offsets_until_s(load, 2000.0, np.random.default_rng(0), max_count=100_000)
    assert offsets.max() < 2000.0 and abs(len(offsets) / 2000.0 - 6.0) / 6.0 < 0.03
    assert square.mean_rate_per_s(load, 10.0) == 6.0


@pytest.mark.parametrize(
    "load, message",
    [
        ({"arrival": "square_wave", "rate": 4}, "load.arrival_options.low_rate: Field required"),
        (
            {"arrival": "square_wave", "rate": 4, "arrival_options": {"low_rate": 1, "period_s": 0}},
            "load.arrival_options.period_s: Input should be greater than 0",
        ),
        (
            {"arrival": "square_wave", "rate": 4, "arrival_options": {"low_rate": 1, "period_s": 9, "phase": 1}},
            "load.arrival_options.phase: Extra inputs are not permitted (arrival square_wave takes low_rate, period_s)",
        ),
        ({"arrival": "poisson", "rate": 4, "arrival_options": {"low_rate": 1}}, "arrival poisson takes no options"),
        ({"arrival": "sqare_wave", "rate": 4}, "load.arrival: 'sqare_wave' is not an arrival process; known: closed"),
    ],
)
def test_arrival_errors_name_the_field_and_the_fix(tmp_path, load, message):
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: t\nbackend: {kind: openai, url: 'http://127.0.0.1:8000'}\n"
        f"workload: {{input_tokens: 8, output_tokens: 4}}\nload: {load}\n"
    )
    with pytest.raises(ScenarioError) as error:
        load_scenario(path)
    assert message in str(error.value)


def test_a_square_wave_plan_keeps_the_wave_and_sweeps_its_high_rate():
    wave = {"arrival": "square_wave", "arrival_options": {"low_rate": 0.0, "period_s": 4.0}}
    plan = build_schedule(scenario({**wave, "rate": 20.0, "num_requests": 200}), ApproximateTokenizer())
    assert all(r.intended_offset_s % 4.0 < 2.0 for r in plan.requests)
    points = scenario({**wave, "sweep": [5.0, 10.0], "num_requests": 10}).sweep_points()
    assert [p.load.rate for p in points] == [5.0, 10.0] and arrival_process("square_wave").paced_by == "rate"
