"""Capacity under SLOs of a sweep read from disk (the rule itself: harness/metrics/slo_capacity.py)."""

from __future__ import annotations

from harness.metrics.slo_capacity import DEFAULT_ATTAINMENT, LoadPoint, SloCapacity, max_load_meeting_slo
from reports.load import SweepPoint

__all__ = ["DEFAULT_ATTAINMENT", "SloCapacity", "max_rate_meeting_slo", "point_goodput"]


def point_goodput(point: SweepPoint, slo: dict | None, confidence: float | None = None) -> float:
    """The point's goodput fraction under `slo` (ms), or under the SLOs it was run with. Judged on the bound
    when a confidence is given, or when the run was made with slo.confidence (its `fraction_low`)."""
    good = point.run.summary.goodput
    if slo is None and confidence is None:
        return good.fraction if good.fraction_low is None else good.fraction_low
    return point.run.goodput_fraction(slo or point.run.slo, confidence or good.confidence)


def max_rate_meeting_slo(
    points: list[SweepPoint],
    slo: dict | None = None,
    attainment: float = DEFAULT_ATTAINMENT,
    confidence: float | None = None,
) -> SloCapacity:
    return max_load_meeting_slo(
        [LoadPoint.from_summary(p.offered_load, p.run.summary, point_goodput(p, slo, confidence)) for p in points],
        attainment,
    )
