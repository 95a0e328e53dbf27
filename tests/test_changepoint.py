"""reports/changepoint.py: e-divisive means against its definition, and steps told from drifts on seeded series."""

import itertools

import numpy as np
import pytest

from reports.changepoint import Finding, e_divisive, energy_q, findings


def _q_by_definition(x, tau):
    """Matteson & James (2014), eq. (3)-(4) with alpha = 1, written out pair by pair."""
    a, b = x[:tau], x[tau:]
    between = np.mean([abs(i - j) for i in a for j in b])
    within_a = np.mean([abs(i - j) for i, j in itertools.combinations(a, 2)])
    within_b = np.mean([abs(i - j) for i, j in itertools.combinations(b, 2)])
    return len(a) * len(b) / (len(a) + len(b)) * (2 * between - within_a - within_b)


def test_energy_statistic_matches_its_definition():
    x = np.random.default_rng(3).normal(size=11)
    q = energy_q(x[None, :], min_size=2)[0]
    for tau in range(2, 10):
        assert q[tau] == pytest.approx(_q_by_definition(x, tau))
    assert np.isneginf(q[:2]).all() and np.isneginf(q[10:]).all()  # a side shorter than min_size


def _noisy(levels, sigma, seed):
    return np.asarray(levels) * np.exp(np.random.default_rng(seed).normal(0, sigma, len(levels)))


def test_e_divisive_finds_two_steps_and_nothing_in_noise_or_a_constant():
    x = _noisy([10] * 15 + [13] * 12 + [9] * 10, 0.02, seed=1)
    assert e_divisive(np.log(x)) == [15, 27]
    assert e_divisive(np.log(_noisy([10] * 40, 0.05, seed=2))) == []
    assert e_divisive(np.ones(30)) == []  # goodput 1.0 every night: no change, no division by zero
    assert e_divisive(np.arange(5.0)) == []  # too short for two segments of three


def test_a_step_is_a_step_and_a_ramp_is_a_drift():
    step = findings(_noisy([20] * 20 + [23] * 10, 0.01, seed=4), threshold=0.10)
    assert [(f.kind, f.index) for f in step] == [("step", 20)]
    assert step[0].change == pytest.approx(0.15, abs=0.02) and step[0].before == pytest.approx(20, rel=0.02)
    ramp = findings(_noisy([20] * 20 + [20 * 1.01**k for k in range(1, 11)], 0.005, seed=5), threshold=0.10)
    assert [f.kind for f in ramp] == ["drift"] and 18 <= ramp[0].index <= 21 and ramp[0].end == 29
    assert ramp[0].change == pytest.approx(0.10, abs=0.025)  # where the fitted line is by the last night
    # better is a direction too: a throughput that fell by 15% is found the same way
    assert [f.kind for f in findings(_noisy([50] * 20 + [42.5] * 10, 0.01, seed=6), 0.10)] == ["step"]


def test_small_changes_are_not_findings():
    # a significant but small step (4%, below a 10% threshold) and a drift of 3% in all are not reported
    assert findings(_noisy([20] * 20 + [20.8] * 10, 0.003, seed=7), threshold=0.10) == []
    assert findings(_noisy([20] * 20 + [20 * 1.003**k for k in range(1, 11)], 0.001, seed=8), 0.10) == []


def test_seeded_a_a_series_raise_nothing():
    """100 A/A series of 30 nights with 5% night-to-night noise: at most 2 report anything (measured: 1)."""
    alarms = [k for k in range(100) if findings(_noisy([20] * 30, 0.05, seed=100 + k), threshold=0.10)]
    assert len(alarms) <= 2, alarms


def test_the_same_change_seen_on_another_night_matches():
    step, drift = Finding("step", 20, 29, 20.0, 23.0), Finding("drift", 21, 27, 20.0, 21.4)
    assert step.matches(Finding("step", 21, 30, 20.0, 23.0)) and not step.matches(Finding("step", 22, 30, 20, 23))
    assert step.matches(Finding("drift", 19, 25, 20.0, 21.0))  # first seen as a ramp, then as the step it is
    assert drift.matches(Finding("drift", 24, 30, 20.0, 22.0))  # the fitted start moved by 3: one drift
    assert not drift.matches(Finding("drift", 29, 33, 20.0, 21.0))


def test_only_the_last_nights_are_searched_and_indices_count_from_the_first():
    x = _noisy([20] * 10 + [26] * 100 + [30] * 10, 0.01, seed=9)
    assert [(f.kind, f.index) for f in findings(x, 0.10)] == [("step", 110)]  # the step at 10 is 110 nights old
    assert [(f.kind, f.index) for f in findings(x, 0.10, last=len(x))] == [("step", 10), ("step", 110)]
