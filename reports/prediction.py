"""Prediction beside measurement: each simulated run (`bench plan`, summary.json `simulated: true`)
set against each measured run of the same report, metric by metric, with the prediction's error."""

from __future__ import annotations

from collections.abc import Callable

from harness.results.schema import Summary

PREDICTION_COLUMNS = ["metric", "measured run", "measured", "simulated run", "predicted", "error %"]
METRICS: tuple[tuple[str, Callable[[Summary], float | None]], ...] = (
    ("TTFT p50 ms", lambda s: s.ttft_ms.p50),
    ("TTFT p90 ms", lambda s: s.ttft_ms.p90),
    ("TPOT p50 ms", lambda s: s.tpot_ms.p50),
    ("ITL p50 ms", lambda s: s.itl_ms.p50),
    ("E2E p50 ms", lambda s: s.e2e_ms.p50),
    ("output tok/s", lambda s: s.throughput.output_tokens_per_s),
    ("goodput req/s", lambda s: s.goodput.requests_per_s),
)


def is_simulated(summary: Summary) -> bool:
    return bool(summary.simulated)


def prediction_rows(runs) -> list[list[str]]:
    """A row per (measured run, simulated run, metric); none unless the report holds both kinds."""
    measured = [r for r in runs if not is_simulated(r.summary)]
    simulated = [r for r in runs if is_simulated(r.summary)]
    rows = []
    for m in measured:
        for s in simulated:
            for name, figure in METRICS:
                actual, predicted = figure(m.summary), figure(s.summary)
                error = 100 * (predicted - actual) / actual if actual and predicted is not None else None
                rows.append(
                    [name, m.label, _fmt(actual), s.label, _fmt(predicted), "-" if error is None else f"{error:+.1f}"]
                )
    return rows


def _fmt(value) -> str:
    return "-" if value is None else f"{value:,.1f}"
