"""The search of one configuration: the highest load whose points meet the SLOs, by bracketing.

`search_capacity(measure, ...)` asks `measure(load, probe)` for points and returns them. The order:

1. a probe: a short run at the upper bound (rate) or the bounds' geometric middle (concurrency). For
   a rate its achieved throughput is where an engine saturates, an upper bound on what it carries
   within SLOs, so the first point is there (clamped into the bounds).
2. bracketing: a passing point multiplies the load by 1.5, a failing one divides it, until one of each is seen
   (or a bound is reached: the capacity is then "at least max" or "none"); from a load whose runs split, by
   1 + precision instead (it sits at the knee). Down from a failing load that the engine fell behind (it
   completed more than half a precision step less than it was offered), the next load is what it served
   there (its completion rate), between a 1.5 step and a precision step down: an engine offered more than it
   can take completes at its own rate, so the knee is near it.
3. narrowing: the next load is where the line through the bracket's two attainments crosses the target
   (regula falsi on measured attainment), kept inside the middle half of the bracket so each step
   shrinks it; the middle when an end stopped early (its attainment is only a bound); until
   hi/lo - 1 <= precision or max_points loads are measured (one more for each end a confirmation turned).
4. confirming (harness/metrics/knee.py): the bracket's two ends are run again until their runs' majority is settled
   (a second run, a third when the two disagree, at once), the failing end first; an end whose majority turns moves
   the bracket, and the search goes on from 2. A load's verdict is its runs' majority, its attainment and
   throughput their median.

What the order of 3 and 4 saves: a load is confirmed only once narrowing is done, so a passing end that
narrowing moves past is never run again. The failing end goes first because its runs are the cheaper (a run
fails once more than its share missed; it passes only once its share met: 27 of 30), and when it turns to a
pass the passing end below it is no longer an end and needs no confirmation; an end whose majority is already
settled is not run again. A turned end reopens the bracket it closed, so it gives the narrowing one more load
(at most max_points more in all): the search does not stop on max_points with a bracket a confirmation widened.

The search is deterministic given the points it is told, which is what lets `bench tune --resume` replay
finished trials instead of running them again.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from harness.metrics.knee import majority_passed, settled

STEP_FACTOR = 1.5  # bracketing: x1.5 after a pass, /1.5 after a fail (the probe starts it near the knee)
SAFEGUARD = 0.25  # narrowing stays within [lo + 25%, hi - 25%] of the bracket


@dataclass
class Measured:
    """What the search needs from one trial (one run at one load)."""

    offered_load: float
    passed: bool
    goodput_fraction: float  # the share that met the SLOs; for an early-stopped point, the bound it proved
    requests_per_s: float  # achieved throughput
    exact: bool = True  # False: stopped early, so goodput_fraction is only the bound its verdict proved
    completion_per_s: float | None = None  # completed per second, first completion to last: a saturated
    # engine's served rate (harness.tune.tune.completion_rate); None where the run had too few completions


@dataclass
class Point:
    """One load and its runs: the verdict is their majority, the attainment and throughput their median."""

    runs: list[Measured] = field(default_factory=list)

    @property
    def offered_load(self) -> float:
        return self.runs[0].offered_load

    @property
    def passed(self) -> bool:
        return majority_passed([r.passed for r in self.runs])

    @property
    def goodput_fraction(self) -> float:
        return statistics.median(r.goodput_fraction for r in self.runs)

    @property
    def requests_per_s(self) -> float:
        return statistics.median(r.requests_per_s for r in self.runs)

    @property
    def exact(self) -> bool:
        return all(r.exact for r in self.runs)

    @property
    def served_per_s(self) -> float | None:
        """What the engine served at this load: its failing runs' median completion rate (a failing run of a
        saturated engine completes at the engine's rate, whatever was offered); None without one."""
        rates = [r.completion_per_s for r in self.runs if not r.passed and r.completion_per_s]
        return statistics.median(rates) if rates else None

    def settled(self, max_runs: int) -> bool:
        return settled([r.passed for r in self.runs], max_runs)


@dataclass
class SearchResult:
    points: list[Point]  # one per load, probe excluded
    lo: float | None  # highest passing load
    hi: float | None  # lowest failing load above it
    status: str  # bracketed | at_least | none | budget (the budget ran out first)


Measure = Callable[[float, bool], "Measured | None"]  # (load, is_probe) -> point; None: the budget is spent


def start_load(kind: str, lo: float, hi: float, probe: Measured | None) -> float:
    if kind == "rate" and probe is not None and probe.requests_per_s > 0:
        return _round_within(kind, probe.requests_per_s, lo, hi)
    return _round(kind, math.sqrt(lo * hi))


def probe_load(kind: str, lo: float, hi: float) -> float:
    return hi if kind == "rate" else _round(kind, math.sqrt(lo * hi))


def search_capacity(
    measure: Measure,
    kind: str,
    bound_lo: float,
    bound_hi: float,
    attainment: float,
    precision: float,
    max_points: int,
    start: float | None = None,
    max_runs: int = 1,
) -> SearchResult:
    """`start`: the first load (a prediction, `bench plan`'s); without one a probe finds it. `max_runs`: the
    most runs a bracket end gets (1 + tune.repeats); max_points counts loads, not their confirming runs, and
    grows by one for each end a confirmation turned (at most doubled)."""
    if start is None:
        probe = measure(probe_load(kind, bound_lo, bound_hi), True)
        if probe is None:
            return SearchResult([], None, None, "budget")
        start = start_load(kind, bound_lo, bound_hi, probe)
    points: list[Point] = []
    load: float | None = _round_within(kind, start, bound_lo, bound_hi)
    while load is not None:
        run = measure(load, False)
        if run is None:
            return SearchResult(points, *bracket(points), "budget")
        add_run(points, run)
        load = split_load(points, max_runs)
        if load is None and len(points) < max_points + min(turned_ends(points), max_points):
            load = next_load(points, kind, bound_lo, bound_hi, attainment, precision)
        if load is None:
            load = unsettled_end(points, max_runs)
    lo, hi = bracket(points)
    status = "bracketed" if lo is not None and hi is not None else "at_least" if lo is not None else "none"
    return SearchResult(points, lo, hi, status)


def add_run(points: list[Point], run: Measured) -> None:
    """The run joins its load's point (a confirming run), or starts a new one."""
    same = next((p for p in points if math.isclose(p.offered_load, run.offered_load)), None)
    if same is None:
        points.append(Point([run]))
    else:
        same.runs.append(run)


def split_load(points: list[Point], max_runs: int) -> float | None:
    """A load whose runs disagree and whose majority is not settled: its next run decides it, and so which side
    of the bracket it is on. Until then a tie counts as a fail, and the search would step away from a load that
    may yet pass (measured: two loads the search stepped to below a tie, the tie then passing)."""
    for p in points:
        if len({r.passed for r in p.runs}) > 1 and not p.settled(max_runs):
            return p.offered_load
    return None


def turned_ends(points: list[Point]) -> int:
    """Loads whose runs' majority says otherwise than their first run: each moved the bracket once."""
    return sum(1 for p in points if p.runs[0].passed != p.passed)


def unsettled_end(points: list[Point], max_runs: int) -> float | None:
    """A bracket end whose runs' majority could still turn: the load to run again (harness/metrics/knee.py). The
    failing end first: its runs are the cheaper, and if it turns the passing end is no longer one."""
    by_load = {p.offered_load: p for p in points}
    lo, hi = bracket(points)
    for end in (hi, lo):
        if end is not None and not by_load[end].settled(max_runs):
            return end
    return None


def next_load(
    points: list[Point], kind: str, bound_lo: float, bound_hi: float, attainment: float, precision: float
) -> float | None:
    """The next load to measure, or None when the search is done."""
    lo, hi = bracket(points)
    by_load = {p.offered_load: p for p in points}
    if lo is None:  # nothing passed yet: go down
        lowest = min(by_load)
        return None if lowest <= bound_lo else _step(points, by_load[lowest], -1, kind, (bound_lo, bound_hi), precision)
    if hi is None:  # nothing failed above the passes: go up
        return None if lo >= bound_hi else _step(points, by_load[lo], 1, kind, (bound_lo, bound_hi), precision)
    if hi / lo - 1 <= precision:
        return None
    a = next(p for p in points if p.offered_load == lo)
    b = next(p for p in points if p.offered_load == hi)
    span = hi - lo
    # regula falsi on measured attainments; an early-stopped end only bounds its attainment: bisect then
    interpolate = a.exact and b.exact and a.goodput_fraction > b.goodput_fraction
    w = (a.goodput_fraction - attainment) / (a.goodput_fraction - b.goodput_fraction) if interpolate else 0.5
    guess = lo + min(max(w, SAFEGUARD), 1 - SAFEGUARD) * span
    return _fresh(points, kind, guess, (bound_lo, bound_hi), lo, hi)


def _step(
    points: list[Point], start: Point, direction: int, kind: str, bounds: tuple[float, float], precision: float
) -> float | None:
    """Bracketing's next load from `start`, up (1) or down (-1): x STEP_FACTOR, but only 1 + precision from a
    load whose runs split (its attainment sits on the target: the capacity is within a precision step of it,
    so a STEP_FACTOR step would only have to be narrowed back). Down from a load the engine fell behind at,
    its served rate, between a STEP_FACTOR step and a precision step down. Measured on the native engine: a
    failing run offered 3.58 req/s completed ~3.1, and the three loads a 1.5 step down passed (2.39, 2.69,
    2.84) were each a 28-request run below a knee at 3.1-3.2; one offered 5.19 completed 4.77, and a 1.5 step
    to 3.46 took three passing 55-request runs to climb back to 5.19. A run that kept up (completed what it
    was offered) and failed on latency alone says nothing of the knee: STEP_FACTOR then. Rate searches only:
    a concurrency is requests in flight, not requests per second, and a served rate says nothing of it."""
    split = len({r.passed for r in start.runs}) > 1
    served, offered = start.served_per_s, start.offered_load
    behind = kind == "rate" and served is not None and served < offered * (1 - precision / 2)
    if direction < 0 and not split and behind:
        load = _fresh(points, kind, min(max(served, offered / STEP_FACTOR), offered / (1 + precision)), bounds)
        if load is not None:
            return load
    for factor in (1 + precision, STEP_FACTOR) if split else (STEP_FACTOR,):
        load = _fresh(points, kind, offered * factor**direction, bounds)
        if load is not None:
            return load
    return None


def bracket(points: list[Point]) -> tuple[float | None, float | None]:
    """(highest pass below every fail, lowest fail): a pass above a fail is not trusted
    (harness.metrics.slo_capacity)."""
    fails = [p.offered_load for p in points if not p.passed]
    lowest_fail = min(fails) if fails else None
    passes = [p.offered_load for p in points if p.passed and (lowest_fail is None or p.offered_load < lowest_fail)]
    return (max(passes) if passes else None), lowest_fail


def _fresh(
    points: list[Point],
    kind: str,
    load: float,
    bounds: tuple[float, float],
    lo: float | None = None,
    hi: float | None = None,
) -> float | None:
    """The load rounded for its kind, inside the bounds; None when that is one already measured (no whole
    number left between)."""
    load = _round_within(kind, load, *bounds)
    if kind == "concurrency" and lo is not None and hi is not None and not lo < load < hi:
        return None
    return None if any(math.isclose(p.offered_load, load) for p in points) else load


def _round_within(kind: str, load: float, bound_lo: float, bound_hi: float) -> float:
    """Rounded, and never past a bound: 19.259 rounds to 19.3, so a bound of 19.259 stays 19.259 (a load above
    tune.load's max was measured otherwise)."""
    rounded = _round(kind, _clamp(load, bound_lo, bound_hi))
    return _clamp(rounded, bound_lo, bound_hi) if kind == "rate" else rounded


def _round(kind: str, load: float) -> float:
    return float(max(1, round(load))) if kind == "concurrency" else float(f"{load:.3g}")


def _clamp(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)
