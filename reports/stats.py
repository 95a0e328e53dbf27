"""Confidence intervals for the relative change of a statistic between two runs, or two sets of runs.

Each run is resampled on its own (seeded numpy), the statistic computed on both resamples,
and the relative change (current - baseline) / baseline kept; the interval is the percentile
interval of those changes. Percentiles come from per-request samples; throughput-like numbers
come from per-window samples (see `window_rates`).

Samples are given in time order and resampled in blocks of consecutive samples (a moving-block
bootstrap, blocks of about n^(1/3)): neighbouring requests waited in the same queue, so their
latencies move together, and resampling them one by one would make the interval too narrow.

With repeated runs (`run_level_change`), each run's statistic is one sample: see there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

DEFAULT_RESAMPLES = 2000
DEFAULT_CONFIDENCE = 0.95
MAX_CHUNK_CELLS = 4_000_000  # resamples x samples held at once: keeps memory flat on big runs
MAX_BOOTSTRAP_SAMPLES = 50_000  # past this (per-token ITLs of a long run) the interval uses every k-th sample


@dataclass
class RelativeChange:
    baseline: float
    current: float
    change: float  # (current - baseline) / baseline
    ci_low: float
    ci_high: float


def statistic_fn(name: str):
    """'mean' or 'pNN' (e.g. p50, p99, p99.9): a function of a 2-D array, one statistic per row."""
    if name == "mean":
        return lambda a: a.mean(axis=1)
    if name.startswith("p"):
        try:
            q = float(name[1:])
        except ValueError:
            q = -1.0
        if 0 <= q <= 100:
            return lambda a: np.percentile(a, q, axis=1)
    raise ValueError(f"statistic: {name!r} is not valid; use mean or a percentile like p50, p99, p99.9")


def _resampled(samples: np.ndarray, stat, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    n = samples.size
    block = max(1, round(n ** (1 / 3)))
    n_blocks = -(-n // block)
    offsets = np.arange(block)
    out = np.empty(n_resamples)
    step = max(1, MAX_CHUNK_CELLS // n)
    for start in range(0, n_resamples, step):
        rows = min(step, n_resamples - start)
        starts = rng.integers(0, n - block + 1, size=(rows, n_blocks))
        idx = (starts[:, :, None] + offsets).reshape(rows, -1)[:, :n]
        out[start : start + rows] = stat(samples[idx])
    return out


def bootstrap_relative_change(
    baseline,
    current,
    statistic: str = "p50",
    n_resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
) -> RelativeChange:
    base = np.asarray(baseline, dtype=np.float64)
    cur = np.asarray(current, dtype=np.float64)
    base, cur = base[np.isfinite(base)], cur[np.isfinite(cur)]
    if base.size == 0 or cur.size == 0:
        raise ValueError("samples: a run has no samples for this metric")
    stat = statistic_fn(statistic)
    b0, c0 = float(stat(base[None, :])[0]), float(stat(cur[None, :])[0])
    if b0 == 0:
        raise ValueError(f"baseline {statistic} is 0; a relative change is undefined")
    rng = np.random.default_rng(seed)
    # the point estimate uses every sample; the interval's resampling every k-th (time order kept)
    base, cur = (x[:: -(-x.size // MAX_BOOTSTRAP_SAMPLES)] for x in (base, cur))
    b = _resampled(base, stat, n_resamples, rng)
    c = _resampled(cur, stat, n_resamples, rng)
    ok = b != 0
    changes = (c[ok] - b[ok]) / b[ok]
    tail = (1 - confidence) / 2 * 100
    lo, hi = np.percentile(changes, [tail, 100 - tail])
    return RelativeChange(b0, c0, (c0 - b0) / b0, float(lo), float(hi))


def window_rates(
    event_times_s: np.ndarray, weights: np.ndarray | None, start_s: float, end_s: float, n_windows: int
) -> np.ndarray:
    """Events (or weighted events, e.g. tokens) per second in each of n equal windows of [start, end].

    The mean of the windows is the run's rate, and the windows vary as the run did, so
    resampling them gives an interval for a number a run reports only once.
    """
    if end_s <= start_s or n_windows < 1:
        return np.zeros(0)
    edges = np.linspace(start_s, end_s, n_windows + 1)
    counts, _ = np.histogram(event_times_s, bins=edges, weights=weights)
    return counts / (edges[1] - edges[0])


def run_level_change(baseline, current, confidence: float = DEFAULT_CONFIDENCE) -> RelativeChange:
    """The relative change of per-run values (one statistic per run) with a Welch t interval.

    Runs are the unit: each run's value already carries its own sampling noise, and the spread
    between runs adds what a within-run bootstrap cannot see (machine load, caches, the engine's
    start). With 3-5 runs per side a t interval is the honest choice: a bootstrap over 3 runs has
    10 distinct resamples and its percentile interval is too narrow (it treats the sample spread
    as the true one), a hierarchical bootstrap inherits that at its top level, while the t quantile
    widens the interval for the few degrees of freedom there are.
    Positive values are compared on the log scale (change = ratio of geometric means - 1): run-to-run
    noise is multiplicative, and the interval of a ratio is then symmetric. With a zero among them
    (goodput 0, no tokens) it falls back to the difference of means over the baseline mean.
    A side with one run has no spread of its own: it takes the other side's variance (pooled, with
    that side's degrees of freedom). At least one side needs two runs.
    """
    b, c = np.asarray(baseline, dtype=np.float64), np.asarray(current, dtype=np.float64)
    if max(b.size, c.size) < 2 or min(b.size, c.size) < 1:
        raise ValueError(f"runs: need at least one run per side and two on one side (got {b.size} and {c.size})")
    log = bool((b > 0).all() and (c > 0).all())
    x, y = (np.log(b), np.log(c)) if log else (b, c)
    b0, c0 = float(b.mean()), float(c.mean())
    if not log and b0 == 0:
        raise ValueError("baseline mean over runs is 0; a relative change is undefined")
    diff = float(y.mean() - x.mean())
    half = _t_quantile(x, y, confidence) * _standard_error(x, y)
    if log:
        change, lo, hi = np.expm1(diff), np.expm1(diff - half), np.expm1(diff + half)
    else:
        change, lo, hi = diff / b0, (diff - half) / b0, (diff + half) / b0
    return RelativeChange(b0, c0, float(change), float(lo), float(hi))


def _standard_error(x: np.ndarray, y: np.ndarray) -> float:
    if x.size > 1 and y.size > 1:  # Welch: each side its own variance
        return float(np.sqrt(x.var(ddof=1) / x.size + y.var(ddof=1) / y.size))
    var = (x if x.size > 1 else y).var(ddof=1)  # one side is a single run: the other side's variance for both
    return float(np.sqrt(var * (1 / x.size + 1 / y.size)))


def _t_quantile(x: np.ndarray, y: np.ndarray, confidence: float) -> float:
    if x.size > 1 and y.size > 1:
        vx, vy = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
        # Welch-Satterthwaite; with no spread at all the interval is the point and df does not matter
        df = (vx + vy) ** 2 / (vx**2 / (x.size - 1) + vy**2 / (y.size - 1)) if vx + vy > 0 else 1.0
    else:
        df = max(x.size, y.size) - 1.0
    return float(scipy_stats.t.ppf(0.5 + confidence / 2, df))
