"""How often the over-saturation stop (harness/runs/early_stop.py) fails a knee run that would pass run whole.

Synthetic 30-request runs at 7.5 req/s, constant arrivals, TTFT SLO 1 s, attainment 0.9 (3 may miss), as
benchmarks/tune_cost.py runs the native engine: TTFT = 0.3 s + (a - 0.3 s) x g(send time) + N(0, sd), where g
either settles (1 - exp(-t / tau): the queue fills, then holds; tau 1-3 s) or grows without end (t / 3 s),
a in 0.85-1.6 s, sd 0.05-0.15 s, 30 seeds each. Each run is watched as harness/tune/tune.py watches a trial;
counted: runs that pass whole (at most 3 of 30 miss) but were stopped as over-saturated, and failing runs the
stop ended before their verdict was certain. Two rules for the TTFT line the stop projects to the SLO: the
least-squares slope (the rule before), and the slope's one-sided 99% lower bound (the rule now).

  PYTHONPATH=. python benchmarks/early_stop_knee.py

Measured 2026-12-02 (deterministic): of 1,031 runs that pass whole, the least-squares slope stopped 25 as
over-saturated, the lower bound 6; of 1,129 failing runs they stopped 960 and 766 early (the rest ended at
their certain verdict, the 4th miss).
"""

from __future__ import annotations

import bisect
import math
import random
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.results.folder import RequestRecord  # noqa: E402
from harness.runs.early_stop import PointWatch, fit_line  # noqa: E402

RATE, N, SLO_S, ALLOWED = 7.5, 30, 1.0, 3


class LeastSquaresWatch(PointWatch):
    """The rule before: the fitted TTFT line itself projected to the SLO."""

    def _fails_on(self, t_slope_low: float) -> bool:
        slope, _, intercept = fit_line(*zip(*self._ttft), 0.99)
        crossing_s = (self.limit_s - intercept) / slope
        late = len(self._sends_s) - bisect.bisect_right(self._sends_s, crossing_s)
        return late > ALLOWED


def watched(watch: PointWatch, ttfts_s: list[float]) -> str | None:
    watch.begin([SimpleNamespace(is_warmup=False, intended_offset_s=i / RATE) for i in range(N)])
    for i, ttft_s in enumerate(ttfts_s):
        sent_s = i / RATE
        first_s = sent_s + ttft_s
        if watch.observe(
            RequestRecord(i, sent_s, token_times_s=[first_s, first_s + 0.05], end_s=first_s + 0.05, output_tokens=2)
        ):
            return watch.decision.reason
    return None


def runs():
    for a in (0.85, 0.9, 0.95, 1.1, 1.3, 1.6):
        for tau in (1.0, 2.0, 3.0, None):
            for sd in (0.05, 0.1, 0.15):
                for seed in range(30):
                    noise = random.Random(seed)
                    grow = (lambda t: t / 3) if tau is None else (lambda t, tau=tau: 1 - math.exp(-t / tau))
                    yield [0.3 + (a - 0.3) * grow(i / RATE) + noise.gauss(0, sd) for i in range(N)]


def main() -> None:
    counts = {name: {"pass_stopped": 0, "fail_stopped": 0} for name in ("least squares", "lower bound")}
    passing = failing = 0
    for ttfts_s in runs():
        passes = sum(t > SLO_S for t in ttfts_s) <= ALLOWED
        passing, failing = passing + passes, failing + (not passes)
        for name, watch_class in (("least squares", LeastSquaresWatch), ("lower bound", PointWatch)):
            if watched(watch_class({"ttft_ms": 1e3 * SLO_S}, 0.9), ttfts_s) == "over_saturated":
                counts[name]["pass_stopped" if passes else "fail_stopped"] += 1
    for name, c in counts.items():
        print(
            f"{name:14} passing runs stopped as over-saturated: {c['pass_stopped']} of {passing}; "
            f"failing runs stopped early: {c['fail_stopped']} of {failing}"
        )


if __name__ == "__main__":
    main()
