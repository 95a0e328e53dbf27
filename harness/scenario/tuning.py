"""The scenario's `tune:` block: what `bench tune` searches (harness/tune/tune.py) and what it may spend.

    tune:
      space: {--max-num-seqs: [4, 8, 16], --no-chunked-prefill: [false, true]}
      load: {rate: {min: 0.25, max: 16}}        # or {concurrency: {min: 1, max: 256}}
      budget: {minutes: 30}

`space` maps launch flags to the values tried; every combination is one configuration, its flags added
after backend.launch.args (`true` writes the flag alone, `false` leaves it out, anything else writes
`--flag value`). `load` is the one load dimension searched per configuration, between its bounds.
A configuration "carries" a load when at least `attainment` of its requests meet the scenario's `slo:`,
as `bench run` judges goodput, and every bound of `percentile_slo` holds on the point's measured
distribution: `percentile_slo: {ttft_ms: {p90: 2000}}` is "TTFT p90 <= 2 s" (summary.json's percentile).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from harness.limits import MAX_CONCURRENCY, MAX_RATE_PER_S, MAX_REQUESTS
from harness.results.schema import PercentileBound, Stats, Summary

DEFAULT_ATTAINMENT = 0.9  # the same default as harness.metrics.slo_capacity's
PERCENTILE_METRICS = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")  # summary.json's latency distributions
PERCENTILES = ("p50", "p90", "p95", "p99", "p999")  # the percentiles summary.json keeps of each


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class LoadBounds(_Strict):
    min: float = Field(gt=0)
    max: float = Field(gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> LoadBounds:
        if self.max <= self.min:
            raise ValueError(f"max {self.max:g} must be more than min {self.min:g}, e.g. {{min: 0.5, max: 16}}")
        return self


class TuneLoad(_Strict):
    """One of the two: requests/s for open arrivals, requests in flight for `load.arrival: closed`."""

    rate: LoadBounds | None = None
    concurrency: LoadBounds | None = None

    @model_validator(mode="after")
    def _one_dimension(self) -> TuneLoad:
        if (self.rate is None) == (self.concurrency is None):
            raise ValueError("give exactly one of rate or concurrency, e.g. {rate: {min: 0.25, max: 16}}")
        if self.rate is not None and self.rate.max > MAX_RATE_PER_S:
            raise ValueError(f"rate.max {self.rate.max:g} is more than the limit of {MAX_RATE_PER_S:g} requests/s")
        if self.concurrency is not None and self.concurrency.max > MAX_CONCURRENCY:
            raise ValueError(f"concurrency.max {self.concurrency.max:g} is more than the limit of {MAX_CONCURRENCY}")
        return self

    @property
    def kind(self) -> str:
        return "rate" if self.rate is not None else "concurrency"

    @property
    def bounds(self) -> LoadBounds:
        return self.rate or self.concurrency


class TuneBudget(_Strict):
    """Limits on the whole search; the first one reached ends it (finished trials are kept)."""

    runs: int | None = Field(default=None, ge=1, le=100_000, description="trials")
    requests: int | None = Field(default=None, ge=1, le=MAX_REQUESTS, description="requests")
    minutes: float | None = Field(default=None, gt=0, le=7 * 24 * 60, description="minutes")


class TuneConfig(_Strict):
    space: dict[str, list[Any]] = {}
    load: TuneLoad
    budget: TuneBudget = TuneBudget()
    attainment: float = Field(default=DEFAULT_ATTAINMENT, gt=0, le=1)
    # the probe: a short run at the load's upper bound; its achieved throughput is where the search starts
    probe_requests: int = Field(default=8, ge=1, le=MAX_REQUESTS, description="requests")
    # the search of one configuration ends when its bracket [passing, failing] is this narrow (relative)
    precision: float = Field(default=0.1, gt=0, le=1)
    max_points: int = Field(
        default=6,
        ge=1,
        le=100,
        description="loads per configuration, probe excluded (+1 per end a confirmation turned, at most 2x)",
    )
    # more configurations than this are searched by successive halving instead of the whole grid
    full_grid_max: int = Field(default=8, ge=1, le=10_000, description="configurations")
    early_stop: bool = True  # stop a point when it is over-saturated or its verdict is certain
    # the bracket's two ends are run again, up to this many more times each, until their runs' majority is
    # settled (harness/metrics/knee.py): 2 is a second run, and a third when the two disagree
    repeats: int = Field(default=2, ge=0, le=10, description="runs")
    # metric -> percentile -> most milliseconds, judged on each point's measured distribution
    percentile_slo: dict[str, dict[str, float]] = {}

    @field_validator("percentile_slo", mode="before")
    @classmethod
    def _metrics_and_percentiles(cls, bounds: Any) -> Any:
        if not isinstance(bounds, dict):
            return bounds  # the type check names it
        for metric, limits in bounds.items():
            if metric not in PERCENTILE_METRICS:
                raise ValueError(f"{metric!r} is not a latency; give one of {', '.join(PERCENTILE_METRICS)}")
            if not isinstance(limits, dict) or not limits:
                raise ValueError(f"{metric}: give percentiles and their limits in ms, e.g. {metric}: {{p90: 2000}}")
            for q, limit_ms in limits.items():
                if q not in PERCENTILES:
                    raise ValueError(f"{metric}.{q}: not a percentile summary.json keeps; use {', '.join(PERCENTILES)}")
                ok = isinstance(limit_ms, (int, float)) and not isinstance(limit_ms, bool)
                if not ok or not math.isfinite(limit_ms) or limit_ms <= 0:
                    raise ValueError(f"{metric}.{q}: {limit_ms!r} is not a limit; give milliseconds > 0, e.g. 2000")
        return {m: {q: float(v) for q, v in limits.items()} for m, limits in bounds.items()}

    @field_validator("space")
    @classmethod
    def _flags_and_values(cls, space: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for flag, values in space.items():
            if not flag.startswith("--"):
                raise ValueError(f"{flag!r} is not a launch flag; write it as the engine takes it, e.g. --{flag}")
            if not values:
                raise ValueError(f"{flag}: give at least one value, e.g. {flag}: [4, 8]")
            for v in values:
                if not isinstance(v, (bool, int, float, str)) or (isinstance(v, float) and not math.isfinite(v)):
                    raise ValueError(
                        f"{flag}: {v!r} is not valid; each value is true/false (flag on/off), a number or text"
                    )
            if len({repr(v) for v in values}) != len(values):
                raise ValueError(f"{flag}: {values} lists a value twice; give each once")
        return space

    def configurations(self) -> list[dict[str, Any]]:
        """Every combination of the space's values, in the order written (one empty one for no space)."""
        flags = list(self.space)
        return [dict(zip(flags, combo)) for combo in itertools.product(*(self.space[f] for f in flags))]


def judge_percentiles(percentile_slo: dict[str, dict[str, float]], summary: Summary) -> dict[str, PercentileBound]:
    """Each bound against the point's measured percentile, by "ttft_ms.p90". A metric the point did not measure
    (no request completed) does not meet its bound."""
    out = {}
    for metric, limits in percentile_slo.items():
        # metric and q are names the validator above allowed: a Stats field of the Summary, a field of Stats
        distribution: Stats = getattr(summary, metric)
        for q, limit_ms in limits.items():
            measured = getattr(distribution, q)
            out[f"{metric}.{q}"] = PercentileBound(
                limit_ms=limit_ms, measured_ms=measured, met=measured is not None and measured <= limit_ms
            )
    return out


def launch_args(setting: dict[str, Any]) -> list[str]:
    """The flags one configuration adds to backend.launch.args."""
    args: list[str] = []
    for flag, value in setting.items():
        if value is True:
            args.append(flag)
        elif value is not False:
            args += [flag, _text(value)]
    return args


def config_name(setting: dict[str, Any]) -> str:
    """A folder-safe name: max-num-seqs-8_no-chunked-prefill-on; `default` for an empty space."""
    parts = []
    for flag, value in setting.items():
        word = "on" if value is True else "off" if value is False else _text(value)
        parts.append(f"{flag.lstrip('-')}-{''.join(c if c.isalnum() or c in '.-' else '-' for c in word)}")
    return "_".join(parts) or "default"


def _text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
