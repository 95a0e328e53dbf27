"""What `bench tune` writes and prints from its search (harness/tune/tune.py): tune.json's document, the recommendation
with its margin, the search's cost beside a dense sweep's, the console lines and `--dry-run`'s plan."""

from __future__ import annotations

import math

from harness.metrics.latencies import active_slo
from harness.results.schema import (
    DenseCost,
    Recommendation,
    SearchCost,
    TuneCapacity,
    TuneConfiguration,
    TuneCost,
    TuneManifest,
    TuneTrial,
)
from harness.scenario.scenario import Scenario
from harness.scenario.tuning import config_name, launch_args

HALVING_KEEP = 1 / 3  # successive halving: the share of configurations searched after the probe


def tune_document(tuner) -> TuneManifest:
    """tune.json from a harness.tune.tune.Tuner: each configuration (its trials apart), each trial."""
    configs = [TuneConfiguration.model_validate(c, from_attributes=True) for c in tuner.configs]
    trials = [TuneTrial.model_validate(t, from_attributes=True) for c in tuner.configs for t in c.trials]
    tune = tuner.tune
    return TuneManifest(
        status=tuner.status,
        kind=tuner.kind,
        unit=unit(tuner.kind),
        attainment=tune.attainment,
        slo=active_slo(tuner.scenario.slo.model_dump()),
        percentile_slo=tune.percentile_slo,
        method=tuner.method,
        method_why=method_why(tuner.method, len(tuner.configs), tune.full_grid_max),
        configurations=configs,
        trials=trials,
        recommended=recommend(tuner.configs),
        cost=TuneCost(search=search_cost(trials, configs), dense_sweep=dense_cost(tuner)),
        scenario=tuner.scenario.resolved_dict(),
    )


def unit(kind: str) -> str:
    return "requests/s" if kind == "rate" else "requests in flight"


def method_why(method: str, n: int, grid_max: int) -> str:
    if method == "grid":
        return f"{n} configuration(s), at most tune.full_grid_max = {grid_max}: every one is searched"
    return (
        f"{n} configurations, more than tune.full_grid_max = {grid_max}: successive halving on the probe "
        f"(each gets a short probe; the best third by its throughput is searched)"
    )


def recommend(configs: list) -> Recommendation | None:
    """The configuration with the highest capacity, and by how much it leads the next one."""
    ranked = sorted(
        (c for c in configs if c.capacity and c.capacity.offered_load is not None),
        key=lambda c: -c.capacity.offered_load,
    )
    if not ranked:
        return None
    best = ranked[0].capacity
    out = Recommendation(
        name=ranked[0].name,
        launch_args=ranked[0].launch_args,
        capacity=best.offered_load,
        bracket=best.bracket,
        next=None,
        margin=None,
        separated=None,
    )
    if len(ranked) > 1:
        runner_up = ranked[1].capacity
        out.next, out.margin = ranked[1].name, best.offered_load / runner_up.offered_load - 1
        best_lo, next_hi = best.bracket[0], runner_up.bracket[1]
        # brackets apart: the ranking holds whatever the true capacities inside them are
        out.separated = best_lo is not None and next_hi is not None and best_lo >= next_hi
    return out


def search_cost(trials: list[TuneTrial], configs: list[TuneConfiguration]) -> SearchCost:
    ran = [t for t in trials if t.status != "pending"]
    seconds = sum(t.wall_s for t in ran) + sum(c.engine_start_s for c in configs)
    return SearchCost(
        runs=len(ran),
        repeats=sum(1 for t in ran if t.repeat),  # runs again of a bracket end (harness/metrics/knee.py)
        requests=sum(t.requests for t in ran),
        minutes=seconds / 60,
        seconds_saved_by_early_stops=sum(t.seconds_saved or 0.0 for t in ran),
    )


def dense_grid(kind: str, lo: float, hi: float, precision: float) -> list[float]:
    """The loads a dense sweep would run to know the capacity to the search's precision: steps of 1 + precision."""
    n = math.ceil(math.log(hi / lo) / math.log(1 + precision)) + 1
    grid = [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]
    return sorted({float(round(x)) for x in grid}) if kind == "concurrency" else grid


def dense_cost(tuner) -> DenseCost:
    tune, load = tuner.tune, tuner.scenario.load
    grid = dense_grid(tuner.kind, tune.load.bounds.min, tune.load.bounds.max, tune.precision)
    per_point = load.num_requests + load.warmup_requests
    requests = len(grid) * per_point * len(tuner.configs)
    if tuner.kind == "rate":  # each point's schedule at least; a saturated one takes longer
        seconds = len(tuner.configs) * sum(per_point / r for r in grid)
    else:  # at the search's own seconds per request
        ran = [t for c in tuner.configs for t in c.trials if t.status == "completed"]
        per_request = sum(t.wall_s for t in ran) / max(1, sum(t.requests for t in ran))
        seconds = requests * per_request
    return DenseCost(
        points_per_configuration=len(grid),
        runs=len(grid) * len(tuner.configs),
        requests=requests,
        minutes_at_least=seconds / 60,
    )


def capacity_text(cap: TuneCapacity | None, kind: str) -> str:
    if cap is None or cap.offered_load is None:
        return "none: no load tried met the SLOs" if cap is not None and cap.status == "none" else "not known"
    lo, hi = cap.bracket
    where = f"between {lo:g} and {hi:g}" if lo is not None and hi is not None else f"every load up to {lo:g} passed"
    prefix = "at least " if cap.status == "at_least" else ""
    return f"{prefix}{cap.offered_load:.3g} {unit(kind)} ({where})"


def trial_line(row, kind: str) -> str:
    verdict = "pass" if row.passed else "FAIL"
    line = (
        f"{row.kind} {kind} {row.offered_load:g}: {verdict}, goodput {100 * (row.goodput_fraction or 0):.0f}%, "
        f"{row.requests_per_s:.2f} req/s, {row.requests} requests in {row.wall_s:.1f} s"
    )
    if row.repeat:
        line += f" (run {row.repeat + 1} of this load: its verdict is its runs' majority)"
    for name, bound in (row.percentiles or {}).items():
        if not bound.met:
            measured = "not measured" if bound.measured_ms is None else f"{bound.measured_ms:.0f} ms"
            line += f"; {name} {measured} > {bound.limit_ms:g} ms"
    if row.stopped_early:
        saved = f", ~{row.seconds_saved:.1f} s saved" if row.seconds_saved else ""
        line += f"; stopped early ({row.stopped_early.reason}{saved})"
    return line


def plan_lines(scenario: Scenario) -> list[str]:
    """`--dry-run`: the configurations, the search's bounds and its worst-case cost."""
    tune, load = scenario.tune, scenario.load
    kind, bounds = tune.load.kind, tune.load.bounds
    settings = tune.configurations()
    method = "grid" if len(settings) <= tune.full_grid_max else "successive_halving"
    searched = len(settings) if method == "grid" else max(1, math.ceil(len(settings) * HALVING_KEEP))
    per_point = load.num_requests + load.warmup_requests
    mid = math.sqrt(bounds.min * bounds.max)
    # per configuration: at most 2 x max_points loads (each end a confirmation turned adds one), each at most
    # 1 + repeats runs
    runs = 2 * tune.max_points * (1 + tune.repeats)
    worst_requests = len(settings) * tune.probe_requests + searched * runs * per_point
    seconds = len(settings) * tune.probe_requests / bounds.max + searched * runs * per_point / mid
    lines = [f"{len(settings)} configuration(s); {method_why(method, len(settings), tune.full_grid_max)}"]
    lines += [f"  {config_name(s)}: {' '.join(launch_args(s)) or '(the launch as written)'}" for s in settings]
    lines.append(
        f"each: one engine start, a probe of {tune.probe_requests} requests, then up to {tune.max_points} "
        f"points of {per_point} requests between {kind} {bounds.min:g} and {bounds.max:g} "
        f"(one more for each end a confirmation turned, up to {2 * tune.max_points}) "
        f"(until the bracket is within {tune.precision:.0%}), the bracket's two ends each run up to "
        f"{tune.repeats} more times until their runs' majority is settled"
    )
    estimate = f"at most {len(settings) + searched * runs} runs, {worst_requests} requests"
    if kind == "rate":  # open arrivals: a schedule's span is known; a closed loop's depends on the engine
        estimate += f", about {seconds / 60:.1f} minutes of load (+ engine starts; early stops cut it)"
    dense = dense_grid(kind, bounds.min, bounds.max, tune.precision)
    lines.append(
        estimate + f"; a dense sweep to the same precision: {len(dense) * len(settings)} runs, "
        f"{len(dense) * len(settings) * per_point} requests"
    )
    budget = {k: v for k, v in tune.budget.model_dump().items() if v is not None}
    lines.append("budget: " + (", ".join(f"{k} {v:g}" for k, v in budget.items()) or "none"))
    return lines
