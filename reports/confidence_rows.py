"""The report's tables of each run's percentile intervals and validity verdict (summary.json percentile_ci and
validity, with the measured window; harness/metrics/confidence.py, validity.py and steady_window.py compute them)."""

from __future__ import annotations

from harness.metrics.confidence import INTERVAL_PERCENTILES, interval_text
from harness.metrics.latencies import INTERVAL_METRICS
from harness.metrics.steady_window import window_text

INTERVAL_COLUMNS = ("run", "metric", "confidence", *INTERVAL_PERCENTILES)
VALIDITY_COLUMNS = ("run", "validity", "reasons", "measured window")


def interval_rows(labelled) -> list[list[str]]:
    """A row per (run, latency): each percentile's interval in ms, or that it is not established; `labelled`:
    (label, RunData) pairs. Runs from before the intervals existed have none."""
    rows = []
    for label, run in labelled:
        ci = run.summary.get("percentile_ci")
        if not ci:
            continue
        for metric in INTERVAL_METRICS:
            cells = [interval_text((ci.get(metric) or {}).get(key)) for key in INTERVAL_PERCENTILES]
            rows.append([label, metric.removesuffix("_ms"), f"{ci['confidence']:.0%}", *cells])
    return rows


def validity_rows(labelled) -> list[list[str]]:
    """A row per run: its verdict, the reasons, and the window its figures were measured over
    (harness/metrics/steady_window.py; "-" for a run from before the window existed)."""
    rows = []
    for label, run in labelled:
        verdict, window = run.summary.get("validity"), run.summary.get("window")
        if verdict:
            rows.append(
                [
                    label,
                    "valid" if verdict["valid"] else "INVALID",
                    "; ".join(verdict["reasons"]) or "-",
                    window_text(window).removeprefix("measured window: ") if window else "-",
                ]
            )
    return rows
