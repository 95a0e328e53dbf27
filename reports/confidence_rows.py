"""The report's tables of each run's percentile intervals and validity verdict (summary.json percentile_ci and
validity, with the measured window; harness/metrics/confidence.py, validity.py and steady_window.py compute them)."""

from __future__ import annotations

from harness.metrics.confidence import INTERVAL_PERCENTILES, interval_text
from harness.metrics.latencies import INTERVAL_METRICS
from harness.metrics.steady_window import window_text
from harness.results.schema import Interval, Intervals, PercentileCI

INTERVAL_COLUMNS = ("run", "metric", "confidence", *INTERVAL_PERCENTILES)
VALIDITY_COLUMNS = ("run", "validity", "reasons", "measured window")


def latency_intervals(ci: PercentileCI) -> dict[str, Intervals]:
    """Each latency's percentile intervals by its summary.json name, in INTERVAL_METRICS' order (the rows)."""
    by_name = {"ttft_ms": ci.ttft_ms, "itl_ms": ci.itl_ms, "tpot_ms": ci.tpot_ms, "e2e_ms": ci.e2e_ms}
    return {name: by_name[name] for name in INTERVAL_METRICS}


def percentile_intervals(intervals: Intervals) -> list[Interval]:
    """The intervals in INTERVAL_PERCENTILES' order (the table's columns)."""
    by_name = {"p50": intervals.p50, "p90": intervals.p90, "p99": intervals.p99, "p999": intervals.p999}
    return [by_name[name] for name in INTERVAL_PERCENTILES]


def interval_rows(labelled) -> list[list[str]]:
    """A row per (run, latency): each percentile's interval in ms, or that it is not established; `labelled`:
    (label, RunData) pairs. A peer tool's file has none of its own."""
    rows = []
    for label, run in labelled:
        if run.peer is not None:
            continue
        ci = run.summary.percentile_ci
        for metric, intervals in latency_intervals(ci).items():
            cells = [interval_text(interval) for interval in percentile_intervals(intervals)]
            rows.append([label, metric.removesuffix("_ms"), f"{ci.confidence:.0%}", *cells])
    return rows


def validity_rows(labelled) -> list[list[str]]:
    """A row per run with a verdict: the verdict, the reasons, and the window its figures were measured over
    (harness/metrics/steady_window.py)."""
    rows = []
    for label, run in labelled:
        verdict = run.summary.validity
        if verdict is not None:
            window = window_text(run.summary.window).removeprefix("measured window: ")
            rows.append([label, "valid" if verdict.valid else "INVALID", "; ".join(verdict.reasons) or "-", window])
    return rows
