"""A square-wave rate: Poisson arrivals at `load.rate` for the first half of every period, at
`load.arrival_options.low_rate` for the second half. It shows what a steady rate hides: a queue built in
the high half has to drain in the low one, so TTFT swings with the phase though the mean rate fits.

    load: {arrival: square_wave, rate: 8, arrival_options: {low_rate: 2, period_s: 60}}

The arrivals are an inhomogeneous Poisson process drawn by time rescaling: unit-rate Poisson times u,
each mapped to the t whose cumulative rate L(t) = u. L is piecewise linear (slope rate, then low_rate),
so its inverse is exact; low_rate 0 gives bursts with silent gaps. A sweep's value replaces the high rate.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from harness.limits import MAX_RATE_PER_S, MAX_SCHEDULE_S
from harness.scenario.arrivals import OpenLoop


class SquareWaveOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    low_rate: float = Field(ge=0, le=MAX_RATE_PER_S)  # requests/s in the second half of each period
    period_s: float = Field(gt=0, le=MAX_SCHEDULE_S)  # seconds of one high half plus one low half


class SquareWave(OpenLoop):
    name = "square_wave"
    options = SquareWaveOptions

    def gaps_s(self, load, n, rng):
        return rng.exponential(1.0, size=n)  # unit-rate time; warp_s puts them on the clock

    def warp_s(self, load, offsets_s):
        wave = self.parsed_options(load)
        half_s = wave.period_s / 2
        high_mass = load.rate * half_s  # expected arrivals in one high half
        periods, within = np.divmod(offsets_s, high_mass + wave.low_rate * half_s)
        in_high = within < high_mass
        # low_rate 0: a period's mass is all high (within < high_mass always), so the division is never used
        low_s = (within - high_mass) / (wave.low_rate or 1.0)
        return periods * wave.period_s + np.where(in_high, within / load.rate, half_s + low_s)

    def mean_rate_per_s(self, load, rate):
        return (rate + self.parsed_options(load).low_rate) / 2
