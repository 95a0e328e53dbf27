"""A load's verdict near the knee: the majority of its runs, each run judged on its own requests (docs/tune.md).

Near a configuration's capacity one run's verdict moves by ~10% of load from run to run, and the requests of one
run are not independent: one stall of the engine delays every request queued behind it, so a stalled run misses
14 of 30 and a binomial interval over its requests calls that failure certain. Pooling such a run with the
next ones carries its misses into their verdict. So a load is judged by its runs: each run passes or fails on
its own share met (as `bench run` judges a sweep's point), and the load's verdict is what most of its runs
said, a stalled run outvoted rather than pooled.

Which loads get more runs: the two the capacity is read between (the bracket's ends), since a far point's
verdict does not move with one stall. Each end is run until one verdict holds a majority of the `1 + repeats`
runs it may get: with `repeats: 2`, a second run confirms the first and a third breaks their tie. Both
`bench tune` (harness/tune/search.py) and the dense sweep of benchmarks/tune_cost.py use this rule, so both
estimate the same quantity: the verdict most runs of `num_requests` requests give at that load.
"""

from __future__ import annotations

from harness.metrics.confidence import share_lower_bound


def run_passes(met: int, judged: int, attainment: float, slo_confidence: float | None) -> bool:
    """One run's verdict: its share met against the attainment, or with slo.confidence the share's lower
    bound (as `bench run` judges a sweep's points)."""
    if judged == 0:
        return False
    if slo_confidence is not None:
        return share_lower_bound(met, judged, slo_confidence) >= attainment
    return met / judged >= attainment


def majority_passed(verdicts: list[bool]) -> bool:
    """The load's verdict: passed when more of its runs passed than failed (a tie fails: the capacity is then
    not raised on a coin toss)."""
    return sum(verdicts) * 2 > len(verdicts)


def settled(verdicts: list[bool], max_runs: int) -> bool:
    """True when no further run could change the majority: one verdict holds more than half of `max_runs`, or
    the load has had all its runs."""
    held = max(sum(verdicts), len(verdicts) - sum(verdicts))
    return held * 2 > max_runs or len(verdicts) >= max_runs
