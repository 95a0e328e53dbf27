"""Capacity under SLOs: the highest offered load at which enough requests still meet their SLOs.

A point "meets the SLOs" when its goodput fraction (share of measured requests that completed
within every SLO) is at least `attainment`. The capacity is the load where the line between the
last passing point and the first failing one crosses `attainment`: points past the first
failure are not trusted, because a system that failed once at a lower load is not safe there.
"""
from __future__ import annotations

from dataclasses import dataclass

from reports.load import SweepPoint

DEFAULT_ATTAINMENT = 0.9


@dataclass
class SloCapacity:
    offered_load: float | None  # requests/s (rate sweep) or requests in flight (concurrency sweep)
    requests_per_s: float | None  # achieved throughput there
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


def point_goodput(point: SweepPoint, slo: dict | None) -> float:
    """The point's goodput fraction under `slo` (ms), or under the SLOs it was run with."""
    if slo is None:
        return float(point.run.summary.get("goodput", {}).get("fraction", 0.0))
    return point.run.goodput_fraction(slo)


def max_rate_meeting_slo(points: list[SweepPoint], slo: dict | None = None,
                         attainment: float = DEFAULT_ATTAINMENT) -> SloCapacity:
    if not 0 < attainment <= 1:
        raise ValueError(f"attainment: {attainment!r} is not valid; give a fraction in (0, 1], e.g. 0.9")
    if not points:
        raise ValueError("points: empty; a sweep needs at least one point")
    pts = sorted(points, key=lambda p: p.offered_load)
    fractions = [point_goodput(p, slo) for p in pts]
    first_fail = next((i for i, f in enumerate(fractions) if f < attainment), None)
    if first_fail == 0:
        return SloCapacity(None, None, None, attainment, "none")
    if first_fail is None:
        last = pts[-1]
        return SloCapacity(last.offered_load, _throughput(last, "requests_per_s"),
                           _throughput(last, "output_tokens_per_s"), attainment, "at_least")
    lo, hi = pts[first_fail - 1], pts[first_fail]
    f_lo, f_hi = fractions[first_fail - 1], fractions[first_fail]
    w = (f_lo - attainment) / (f_lo - f_hi)  # f_lo >= attainment > f_hi, so 0 <= w < 1

    def between(a: float, b: float) -> float:
        return a + w * (b - a)
    return SloCapacity(between(lo.offered_load, hi.offered_load),
                       between(_throughput(lo, "requests_per_s"), _throughput(hi, "requests_per_s")),
                       between(_throughput(lo, "output_tokens_per_s"), _throughput(hi, "output_tokens_per_s")),
                       attainment, "bracketed")


def _throughput(point: SweepPoint, key: str) -> float:
    return float(point.run.summary.get("throughput", {}).get(key, 0.0))
