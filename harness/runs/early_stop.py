"""Stopping a point early, from its completed records, when running on cannot change what it tells.

Two reasons, checked on each measured record as it completes (`run_scenario(..., watch=PointWatch(...))`):

- the verdict is certain: a point passes when at least `attainment` of its N planned requests meet the
  SLOs. Once `need = ceil(attainment * N)` have met them it has passed, and once more than `N - need`
  have missed (or failed) it has failed, whatever the rest do.
- over-saturation (open arrivals only), after GuideLLM's over_saturation constraint: the requests
  outstanding (sent by the schedule, not yet finished) and the TTFT both grow through the run. Each is
  fitted by least squares against time; when the one-sided lower confidence bound of both slopes is
  above zero the queue is growing without end and the point has failed. It speaks only once the run has
  missed more than its allowed share of the requests seen so far: near the knee the TTFT of a run at
  constant arrivals drifts up although every request meets the SLO, and such a run passes when run whole.
  And the TTFT line drawn at the slope's lower bound must cross the SLO while more requests are still to
  be sent than may miss.

Each run is watched, and its verdict proved, on its own requests: a load's runs are not pooled
(harness/metrics/knee.py).

The decision lands in summary.json as `stopped_early`; the records written so far stay as they are.
"""

from __future__ import annotations

import bisect
import math

from scipy import stats

from harness.metrics.latencies import meets_slo, request_latency
from harness.results.schema import StopDecision

SATURATION_MIN_SAMPLES = 12  # completions before the slope test may speak
SATURATION_MIN_SPAN_S = 1.0  # seconds of sends the samples must span
SATURATION_CONFIDENCE = 0.99  # one-sided, for each of the two slopes
SATURATION_MIN_GROWTH = 2.0  # requests the outstanding count must grow by over the samples' span


def fit_line(xs: list[float], ys: list[float], confidence: float) -> tuple[float, float, float]:
    """(slope, one-sided lower confidence bound of it, intercept) of the least-squares line through the points."""
    n = len(xs)
    x_mean, y_mean = sum(xs) / n, sum(ys) / n
    sxx = sum((x - x_mean) ** 2 for x in xs)
    if n < 3 or sxx <= 0:
        return 0.0, -math.inf, y_mean
    slope = sum((x - x_mean) * (y - y_mean) for x, y in zip(xs, ys)) / sxx
    intercept = y_mean - slope * x_mean
    residual = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys)) / (n - 2)
    return slope, slope - stats.t.ppf(confidence, n - 2) * math.sqrt(residual / sxx), intercept


class PointWatch:
    """Told the plan before the load (`begin`), then each record; `observe` returns True to stop the run."""

    def __init__(
        self,
        slo: dict,
        attainment: float,
        saturation: bool = True,
        verdict: bool = True,
        can_pass: bool = True,
    ):
        """can_pass=False: the point is judged on more than its share met (tune.percentile_slo, slo.confidence),
        so the records can prove it failed but not that it passed."""
        self.slo, self.attainment, self.can_pass = slo, attainment, can_pass
        limit_ms = slo.get("ttft_ms") or slo.get("e2e_ms")  # what a growing queue pushes past
        self.limit_s = limit_ms / 1e3 if limit_ms else None
        self.saturation, self.verdict = saturation, verdict
        self.decision: StopDecision | None = None
        self.planned = 0
        self._sends_s: list[float] = []  # open loop: the schedule's send times, sorted
        self._met = self._missed = 0
        self._ttft: list[tuple[float, float]] = []  # (intended send, TTFT)
        self._outstanding: list[tuple[float, float]] = []  # (completion time, requests outstanding then)

    def begin(self, requests: list) -> None:
        measured = [r for r in requests if not r.is_warmup]
        self.planned = len(measured)
        offsets = [r.intended_offset_s for r in requests if r.intended_offset_s is not None]
        self._sends_s = sorted(offsets) if len(offsets) == len(requests) else []

    def observe(self, rec) -> bool:
        if self.decision is not None or rec.is_warmup or not self.planned:
            return self.decision is not None
        lat = request_latency(rec)
        if lat is not None and meets_slo(lat, self.slo):
            self._met += 1
        else:
            self._missed += 1
        now = rec.end_s if rec.end_s is not None else rec.intended_send_s
        if lat is not None and lat.ttft_s is not None:
            self._ttft.append((rec.intended_send_s, lat.ttft_s))
        if self._sends_s:
            sent = bisect.bisect_right(self._sends_s, now)
            self._outstanding.append((now, sent - (self._met + self._missed)))
        self.decision = (self._certain_verdict(now) if self.verdict else None) or (
            self._over_saturated(now) if self.saturation and self._sends_s else None
        )
        return self.decision is not None

    def _stop(self, reason: str, passed: bool, detail: str, now: float) -> StopDecision:
        return StopDecision(
            reason=reason,
            passed=passed,
            detail=detail,
            after_requests=self._met + self._missed,
            planned_requests=self.planned,
            at_s=now,
            met=self._met,
            missed=self._missed,
            outstanding_per_s=None,
            ttft_s_per_s=None,
        )

    def _certain_verdict(self, now: float) -> StopDecision | None:
        need = math.ceil(self.attainment * self.planned - 1e-9)
        if self.can_pass and self._met >= need and self._met + self._missed < self.planned:
            return self._stop(
                "verdict_met",
                True,
                f"{self._met} of {self.planned} planned requests already met "
                f"the SLOs ({need} needed for {self.attainment:.0%})",
                now,
            )
        allowed = self.planned - need
        if self._missed > allowed and self._met + self._missed < self.planned:
            return self._stop(
                "verdict_missed",
                False,
                f"{self._missed} of {self.planned} planned requests already "
                f"missed the SLOs (at most {allowed} may for {self.attainment:.0%})",
                now,
            )
        return None

    def _over_saturated(self, now: float) -> StopDecision | None:
        if len(self._ttft) < SATURATION_MIN_SAMPLES or len(self._outstanding) < SATURATION_MIN_SAMPLES:
            return None
        if self._missed <= (1 - self.attainment) * (self._met + self._missed) + 1e-9:
            return None  # slopes alone fail no run: at the knee a run whose requests all met them can still pass
        span_s = self._ttft[-1][0] - self._ttft[0][0]
        if span_s < SATURATION_MIN_SPAN_S:
            return None
        q_slope, q_low, _ = fit_line(*zip(*self._outstanding), SATURATION_CONFIDENCE)
        t_slope, t_low, _ = fit_line(*zip(*self._ttft), SATURATION_CONFIDENCE)
        q_span_s = self._outstanding[-1][0] - self._outstanding[0][0]
        if q_low > 0 and t_low > 0 and q_slope * q_span_s >= SATURATION_MIN_GROWTH and self._fails_on(t_low):
            stop = self._stop(
                "over_saturated",
                False,
                f"requests outstanding grow {q_slope:.2f}/s and TTFT "
                f"{1e3 * t_slope:.0f} ms/s (both > 0 at {SATURATION_CONFIDENCE:.0%} confidence, "
                f"over {len(self._ttft)} requests)",
                now,
            )
            stop.outstanding_per_s, stop.ttft_s_per_s = q_slope, t_slope
            return stop
        return None

    def _fails_on(self, t_slope_low: float) -> bool:
        """Growth that matters: the TTFT line at the lower confidence bound of its slope (pivoting on the
        samples' mean) crosses the SLO (TTFT's, else E2E's) early enough that more requests are sent after the
        crossing than may miss. The least-squares slope itself would stop knee runs whose noisy TTFT drifts
        up over a short run, runs that pass when run whole. Without either SLO the slopes alone decide."""
        if self.limit_s is None:
            return True
        sends_s, ttfts_s = zip(*self._ttft)
        mean_send_s, mean_ttft_s = sum(sends_s) / len(sends_s), sum(ttfts_s) / len(ttfts_s)
        crossing_s = mean_send_s + (self.limit_s - mean_ttft_s) / t_slope_low
        late = len(self._sends_s) - bisect.bisect_right(self._sends_s, crossing_s)
        allowed = self.planned - math.ceil(self.attainment * self.planned - 1e-9)
        return late > allowed
