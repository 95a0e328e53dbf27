"""Why `bench select` ranks a candidate where it does, in one line each: its latencies at the highest
tested load that met the SLOs, which SLO it missed first above it, and, for a deployment behind a
router, how the replicas shared that load (reports/replicas.py)."""

from __future__ import annotations

import numpy as np

from harness.metrics.latencies import active_slo, meets_slo, request_latency
from harness.metrics.slo_capacity import SloCapacity
from reports.load import RunData, Sweep, SweepPoint
from reports.peers.history import no_samples_reason
from reports.replicas import replica_view
from reports.sweep import point_goodput

SLO_NAMES = {"ttft_ms": "TTFT", "itl_ms": "ITL", "tpot_ms": "TPOT", "e2e_ms": "E2E"}


def latencies(run: RunData) -> str:
    """TTFT p90 and ITL p50 of a run, in ms."""
    ttft = run.requests["ttft_s"].dropna().to_numpy(dtype=float)
    parts = []
    if ttft.size:
        parts.append(f"TTFT p90 {np.quantile(ttft, 0.9) * 1e3:,.0f} ms")
    if run.itl_s.size:
        parts.append(f"ITL p50 {np.quantile(run.itl_s, 0.5) * 1e3:,.0f} ms")
    return ", ".join(parts) or "no completed request"


def missed_most(run: RunData, slo: dict) -> str:
    """The SLO the most measured requests missed (failed requests miss them all), with how many."""
    lats = [request_latency(r) for r in run.records]
    counts = {key: sum(lat is None or not meets_slo(lat, {key: limit}) for lat in lats) for key, limit in slo.items()}
    key = max(counts, key=counts.get)
    return f"{SLO_NAMES[key]} ({counts[key]} of {len(lats)} requests over {slo[key]:g} ms)"


def judged_goodput(point: SweepPoint, slo: dict, confidence: float | None = None) -> float:
    """The summary's goodput fraction (its steady-state window, as `bench run` and `bench plan --search` judged the
    point) when the SLOs and confidence are the run's own; else recomputed over its records."""
    good = point.run.summary.goodput
    if active_slo(slo) == active_slo(good.slo) and confidence == good.confidence:
        return good.fraction if good.fraction_low is None else good.fraction_low
    return point_goodput(point, slo, confidence)


def why(sw: Sweep, cap: SloCapacity, slo: dict, attainment: float, confidence: float | None = None) -> str:
    unit = "req/s" if sw.load_kind == "rate" else "in flight"
    points = sorted(sw.points, key=lambda p: p.offered_load)
    reason = no_samples_reason(points[0].run.records, points[0].run.summary) if len(points) == 1 else None
    if reason is not None:  # a share within the SLOs needs the requests: none, so no verdict (docs/peers.md)
        return reason
    first_fail = next((p for p in points if judged_goodput(p, slo, confidence) < attainment), None)
    passed = [p for p in points if first_fail is None or p.offered_load < first_fail.offered_load]
    parts = []
    if passed:
        last = passed[-1]
        parts.append(
            f"at {last.offered_load:g} {unit}: {latencies(last.run)}, "
            f"{judged_goodput(last, slo, confidence):.0%} within the SLOs"
        )
    if first_fail is not None:
        parts.append(f"first missed at {first_fail.offered_load:g} {unit}, on {missed_most(first_fail.run, slo)}")
    shown = passed[-1] if passed else points[0]
    view = replica_view(shown.run)
    if view is not None:
        parts.append(
            view.imbalance().removeprefix(f"{view.label}: ").rstrip(".") + f" (at {shown.offered_load:g} {unit})"
        )
    return "; ".join(parts)
