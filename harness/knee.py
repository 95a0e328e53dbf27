"""A point's verdict near the knee: final only when its attainment's confidence interval lies on one side of the
target; until then the point is run again and judged on its requests pooled over the runs (docs/tune.md).

Near a configuration's capacity one run's attainment is a coin toss: 27 of 30 requests met at one try, 30 of 30
at the next, so a search (or a dense sweep) that trusts one run moves its capacity by a grid step from run to
run. The share met is judged by its one-sided Clopper-Pearson bounds at `confidence` (harness/confidence.py):
certainly passed when the lower bound reaches the attainment, certainly failed when the upper bound is below
it, else uncertain. An uncertain point gets another run at the same load (its own seed: fresh arrivals and
prompts), up to `repeats` more; the verdict is then on the pooled share. Both `bench tune` and the dense sweep
of benchmarks/tune_cost.py use this rule, so both estimate the same quantity: the attainment of a run of
`num_requests` requests at that load.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.confidence import share_lower_bound, share_upper_bound

KNEE_CONFIDENCE = 0.9  # without slo.confidence; at 30 requests a point of 30 met passes for certain


@dataclass(frozen=True)
class Tally:
    """Requests of one load pooled over its runs: how many were judged and how many met the SLOs."""

    met: int = 0
    judged: int = 0

    def plus(self, met: int, judged: int) -> Tally:
        return Tally(self.met + met, self.judged + judged)

    @property
    def fraction(self) -> float:
        return self.met / self.judged if self.judged else 0.0


def knee_confidence(slo_confidence: float | None) -> float:
    """The scenario's slo.confidence when it sets one, else KNEE_CONFIDENCE."""
    return slo_confidence if slo_confidence is not None else KNEE_CONFIDENCE


def certain(tally: Tally, attainment: float, confidence: float) -> bool:
    """True when the pooled share's interval lies wholly above or below the target (nothing judged: nothing
    another run of the same could settle either, so certain too)."""
    if tally.judged == 0:
        return True
    if share_lower_bound(tally.met, tally.judged, confidence) >= attainment:
        return True
    return share_upper_bound(tally.met, tally.judged, confidence) < attainment


def passes(tally: Tally, attainment: float, slo_confidence: float | None) -> bool:
    """The pooled verdict: the share met against the attainment, or its lower bound with slo.confidence (as
    `bench run` judges a sweep's points)."""
    if slo_confidence is not None:
        return share_lower_bound(tally.met, tally.judged, slo_confidence) >= attainment
    return tally.fraction >= attainment
