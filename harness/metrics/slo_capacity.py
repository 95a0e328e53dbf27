"""Capacity under SLOs: the highest offered load at which enough requests still meet their SLOs.

A point "meets the SLOs" when its goodput fraction (share of measured requests that completed
within every SLO) is at least `attainment`; with slo.confidence, when the lower bound of that
share is (summary.json goodput.fraction_low). The capacity is the load where the line between the
last passing point and the first failing one crosses `attainment`: points past the first
failure are not trusted, because a system that failed once at a lower load is not safe there.
`bench run` states it after a sweep; reports draw it (reports/sweep.py feeds this the points it read).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.results.schema import RequestFigures

DEFAULT_ATTAINMENT = 0.9


@dataclass
class LoadPoint:
    offered_load: float  # requests/s (rate sweep) or requests in flight (concurrency sweep)
    goodput_fraction: float
    requests_per_s: float  # achieved throughput there
    output_tokens_per_s: float

    @classmethod
    def from_summary(
        cls, offered_load: float, summary: RequestFigures, goodput_fraction: float | None = None
    ) -> LoadPoint:
        """From a point's summary.json; `goodput_fraction` overrides the one computed under the run's SLOs. A run
        with slo.confidence is judged on its bound (`fraction_low`), not on the point."""
        good = summary.goodput
        fraction = good.fraction if good.fraction_low is None else good.fraction_low
        return cls(
            offered_load,
            float(fraction if goodput_fraction is None else goodput_fraction),
            float(summary.throughput.requests_per_s),
            float(summary.throughput.output_tokens_per_s),
        )


@dataclass
class SloCapacity:
    offered_load: float | None
    requests_per_s: float | None
    output_tokens_per_s: float | None
    attainment: float
    status: str  # "bracketed", "at_least" (every point passed), "none" (the lowest point failed)

    def describe(self, unit: str = "req/s") -> str:
        if self.status == "none":
            return f"no tested load met the SLOs for {self.attainment:.0%} of requests (try lower loads)"
        text = f"{self.offered_load:.3g} {unit}"
        if self.status == "at_least":
            return f"at least {text} (every tested load met the SLOs; sweep higher to find the limit)"
        return f"{text} (interpolated between the last passing and the first failing point)"


def max_load_meeting_slo(points: list[LoadPoint], attainment: float = DEFAULT_ATTAINMENT) -> SloCapacity:
    if not 0 < attainment <= 1:
        raise ValueError(f"attainment: {attainment!r} is not valid; give a fraction in (0, 1], e.g. 0.9")
    if not points:
        raise ValueError("points: empty; a sweep needs at least one point")
    pts = sorted(points, key=lambda p: p.offered_load)
    first_fail = next((i for i, p in enumerate(pts) if p.goodput_fraction < attainment), None)
    if first_fail == 0:
        return SloCapacity(None, None, None, attainment, "none")
    if first_fail is None:
        last = pts[-1]
        return SloCapacity(last.offered_load, last.requests_per_s, last.output_tokens_per_s, attainment, "at_least")
    lo, hi = pts[first_fail - 1], pts[first_fail]
    w = (lo.goodput_fraction - attainment) / (lo.goodput_fraction - hi.goodput_fraction)  # in [0, 1)

    def between(a: float, b: float) -> float:
        return a + w * (b - a)

    return SloCapacity(
        between(lo.offered_load, hi.offered_load),
        between(lo.requests_per_s, hi.requests_per_s),
        between(lo.output_tokens_per_s, hi.output_tokens_per_s),
        attainment,
        "bracketed",
    )
