"""How sure a run's headline figures are across repeated runs: each one's mean over the runs with a Student t
confidence interval (docs/confidence.md#repeated-runs-bench-run---repeats-n---until-ci-p).

One run's percentile intervals (harness/metrics/confidence.py) say how well its own samples pin its distribution;
they cannot see what changes from run to run (the arrival process drawn, the engine's state, a busy
neighbour). Repeating the run and treating each run's figure as one sample can: with n runs of mean m and
sample standard deviation s, the true mean lies in m ± t(1 - (1 - c) / 2, n - 1) · s / √n with confidence c,
assuming the runs' figures are independent and roughly normal (a run's median or throughput, an average of
many requests, comes close). AIPerf's --num-profile-runs computes the same interval.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.stats import t as student_t

from harness.results.schema import MeanInterval, Summary


@dataclass(frozen=True)
class Headline:
    unit: str
    read: Callable[[Summary], float | None]


# by summary.json path: the figures a reader quotes first; --until-ci waits for every one of them
HEADLINE_METRICS = {
    "throughput.requests_per_s": Headline("req/s", lambda s: s.throughput.requests_per_s),
    "throughput.output_tokens_per_s": Headline("tok/s", lambda s: s.throughput.output_tokens_per_s),
    "ttft_ms.p50": Headline("ms", lambda s: s.ttft_ms.p50),
    "tpot_ms.p50": Headline("ms", lambda s: s.tpot_ms.p50),
    "itl_ms.p50": Headline("ms", lambda s: s.itl_ms.p50),
    "e2e_ms.p50": Headline("ms", lambda s: s.e2e_ms.p50),
}
MIN_RUNS_TO_STOP = 3  # two runs that agree by chance are common; three rarely (AIPerf waits for 3 too)


def metric_value(summary: Summary, path: str) -> float | None:
    """The headline figure at `path` (`ttft_ms.p50`), None when the run has none."""
    value = HEADLINE_METRICS[path].read(summary)
    return float(value) if value is not None and math.isfinite(value) else None


def mean_interval(values: list[float], confidence: float, unit: str) -> MeanInterval:
    """The values' mean and its Student t interval; the interval's fields are None with fewer than 2 values (no
    spread to judge), relative_half_width None with a zero mean."""
    arr = np.asarray(values, dtype=np.float64)
    interval = MeanInterval(
        unit=unit,
        n=int(arr.size),
        values=[float(v) for v in arr],
        mean=float(arr.mean()) if arr.size else None,
        **dict.fromkeys(("std", "t_critical", "half_width", "low", "high", "relative_half_width")),
    )
    if arr.size < 2:
        return interval
    interval.std = float(arr.std(ddof=1))
    interval.t_critical = float(student_t.ppf(1 - (1 - confidence) / 2, arr.size - 1))
    half = interval.half_width = interval.t_critical * interval.std / math.sqrt(arr.size)
    interval.low, interval.high = interval.mean - half, interval.mean + half
    if interval.mean != 0:
        interval.relative_half_width = half / abs(interval.mean)
    elif half == 0:
        interval.relative_half_width = 0.0
    return interval


def headline_intervals(summaries: list[Summary], confidence: float) -> dict[str, MeanInterval]:
    """Each headline metric's interval over the runs that have it (a run without the figure is left out)."""
    out = {}
    for path, headline in HEADLINE_METRICS.items():
        values = [v for v in (metric_value(s, path) for s in summaries) if v is not None]
        out[path] = mean_interval(values, confidence, headline.unit)
    return out


def converged(intervals: dict[str, MeanInterval], until: float) -> bool:
    """Whether every headline metric some run measured has its interval's half-width within `until` (a share,
    0.05 for 5%) of its mean, from at least MIN_RUNS_TO_STOP runs."""
    judged = [m for m in intervals.values() if m.n]
    return bool(judged) and all(
        m.n >= MIN_RUNS_TO_STOP and m.relative_half_width is not None and m.relative_half_width <= until for m in judged
    )


def widest(intervals: dict[str, MeanInterval]) -> tuple[str, float] | None:
    """The headline metric with the widest relative interval, and that share (None before two runs)."""
    shares = [(k, m.relative_half_width) for k, m in intervals.items() if m.relative_half_width is not None]
    return max(shares, key=lambda kv: kv[1]) if shares else None
