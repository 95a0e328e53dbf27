"""Length and time distributions for scenario fields like `input_tokens` or `think_time_s`.

A scenario writes either a plain number (`input_tokens: 256`) or a mapping
(`input_tokens: {dist: lognormal, mean: 256, std: 64, min: 16, max: 1024}`).
Both become a `Dist`; `Dist.sample` draws token counts, `Dist.sample_s` draws seconds.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

DIST_FORM_HELP = "a number, or a mapping {dist: fixed|uniform|normal|lognormal, mean, std, min, max}"


class Dist(BaseModel):
    """One distribution. `mean`/`std` describe the drawn values themselves, also for lognormal."""

    model_config = ConfigDict(extra="forbid", strict=True)

    dist: Literal["fixed", "uniform", "normal", "lognormal"]
    mean: float | None = None
    std: float | None = Field(default=None, ge=0)
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _check_parameters(self) -> Dist:
        needs = {"fixed": ("mean",), "uniform": ("min", "max"), "normal": ("mean", "std"), "lognormal": ("mean", "std")}
        missing = [name for name in needs[self.dist] if getattr(self, name) is None]
        if missing:
            raise ValueError(f"dist {self.dist} needs {' and '.join(missing)} (form: {DIST_FORM_HELP})")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min:g} is greater than max {self.max:g}")
        if self.dist == "lognormal" and self.mean <= 0:
            raise ValueError(f"lognormal mean must be > 0, got {self.mean:g}")
        return self

    def _draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.dist == "fixed":
            values = np.full(n, self.mean, dtype=np.float64)
        elif self.dist == "uniform":
            values = rng.uniform(self.min, self.max, size=n)
        elif self.dist == "normal":
            values = rng.normal(self.mean, self.std, size=n)
        else:
            # Convert the wanted mean/std of the values into the underlying normal's mu/sigma.
            sigma_sq = math.log1p((self.std / self.mean) ** 2)
            values = rng.lognormal(math.log(self.mean) - sigma_sq / 2, math.sqrt(sigma_sq), size=n)
        low = -np.inf if self.min is None else self.min
        high = np.inf if self.max is None else self.max
        return np.clip(values, low, high)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n token counts: rounded, clipped to [min, max] and to at least 1."""
        return np.maximum(np.rint(self._draw(rng, n)), 1).astype(np.int64)

    def sample_s(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n durations in seconds: clipped to [min, max] and to at least 0."""
        return np.maximum(self._draw(rng, n), 0.0)

    @property
    def expected(self) -> float:
        """The mean before clipping; used to size plans and to describe a scenario."""
        if self.dist == "uniform":
            return (self.min + self.max) / 2
        return float(self.mean)


def dist_from_yaml(value: Any, *, whole_numbers: bool) -> Any:
    """Before-validator: turn `256` into `{dist: fixed, mean: 256}`; pass mappings through to `Dist`."""
    if isinstance(value, (Dist, dict)):
        return value
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if is_number and whole_numbers and float(value).is_integer() and value >= 1:
        return {"dist": "fixed", "mean": value}
    if is_number and not whole_numbers and value >= 0:
        return {"dist": "fixed", "mean": value}
    if whole_numbers:
        raise ValueError(f"must be a whole number of tokens >= 1, or {DIST_FORM_HELP.split(', or ')[1]}")
    raise ValueError(f"must be a number of seconds >= 0, or {DIST_FORM_HELP.split(', or ')[1]}")
