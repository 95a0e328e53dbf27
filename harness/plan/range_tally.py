"""How far a plan's steps go past the batches and contexts its step model was fitted on (FitRange): the simulated
steps counted by dimension as they are committed, and said as a warning in the plan's summary and on the console."""

from __future__ import annotations

import bisect

from harness.plan.step_model import FitRange, StepShape
from harness.results.schema import Finding

DIMENSIONS = ("sequences", "tokens", "context_per_sequence")
LABELS = {"sequences": "sequences a step", "tokens": "tokens a step", "context_per_sequence": "context per sequence"}


class RangeTally:
    def __init__(self, fit_range: FitRange) -> None:
        self.fit_range = fit_range
        self.most = {d: getattr(fit_range, d)[1] for d in DIMENSIONS}  # the fitted steps' largest values
        self.steps = 0
        self.beyond = 0  # steps past the range in any dimension
        self.beyond_by = dict.fromkeys(DIMENSIONS, 0)
        self.highest = dict.fromkeys(DIMENSIONS, 0.0)  # the plan's largest value in each

    def step(self, shape: StepShape) -> None:
        """One step as the simulator committed it."""
        seqs = shape.prefill_seqs + shape.decode_seqs
        values = (seqs, shape.prefill_tokens + shape.decode_seqs, shape.context_tokens / seqs if seqs else 0.0)
        self.steps += 1
        past = False
        for dim, value in zip(DIMENSIONS, values):
            if value > self.highest[dim]:
                self.highest[dim] = value
            if value > self.most[dim]:
                self.beyond_by[dim] += 1
                past = True
        self.beyond += past

    def decode_run(self, seqs: int, contexts: list[int], steps: int) -> None:
        """The first `steps` steps of a decode run: `seqs` sequences each, the KV read of each (increasing)."""
        per_sequence = contexts[steps - 1] / seqs
        within = bisect.bisect_right(contexts, self.most["context_per_sequence"], 0, steps, key=lambda c: c / seqs)
        counts = {"sequences": steps * (seqs > self.most["sequences"]), "tokens": steps * (seqs > self.most["tokens"])}
        counts["context_per_sequence"] = steps - within
        for dim, value in zip(DIMENSIONS, (seqs, seqs, per_sequence)):
            self.highest[dim] = max(self.highest[dim], value)
            self.beyond_by[dim] += counts[dim]
        self.steps += steps
        self.beyond += max(counts.values())  # a batch past the range is past it at every step

    def finding(self, extrapolation: str) -> Finding | None:
        """The warning (None when every step stayed within the range): how far, in which dimension, what share."""
        if not self.beyond:
            return None
        r, parts, dimensions = self.fit_range, [], {}
        for dim in DIMENSIONS:
            low, high = getattr(r, dim)
            count = self.beyond_by[dim]
            dimensions[dim] = {
                "fitted": [low, high],
                "highest": self.highest[dim],
                "times": self.highest[dim] / high if high else None,
                "steps": count,
                "share": count / self.steps,
            }
            if count:
                parts.append(
                    f"{LABELS[dim]} up to {self.highest[dim]:,.0f} (fitted {low:,.0f}-{high:,.0f}, "
                    f"{self.highest[dim] / high:.1f}x; {count / self.steps:.0%} of steps)"
                )
        share = self.beyond / self.steps
        return Finding(
            rule="plan_beyond_fitted_range",
            severity="warning",
            message=f"{share:.0%} of the plan's {self.steps:,} steps go past the {r.steps:,} steps the step model "
            f"was fitted on: {'; '.join(parts)}. There it {extrapolation}; measure a run whose steps reach these "
            "sizes to predict them from measurements (docs/planner.md)",
            evidence={"steps": self.steps, "beyond": self.beyond, "share": share, "dimensions": dimensions},
        )
