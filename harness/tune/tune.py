"""`bench tune`: each configuration of the scenario's `tune.space`, launched once, searched for the highest
load that meets the SLOs (harness/tune/search.py), every trial stopped early where it can (harness/runs/early_stop.py).

OUT/tune.json is the manifest and the result, rewritten as each trial starts and ends: every configuration
(launch_args, status, capacity with its bracket), every trial (its folder, load, verdict, cost, whether and why
it stopped early), the recommended configuration with its margin, and what the search cost next to a dense
sweep of the same grid. Trials live in OUT/<configuration>/: probe-<kind>-<load>/ and point-NNN-<kind>-<load>/
(one run folder each), beside the engine's log. Each configuration folder also gets a sweep.json and OUT a
candidates.json, so `bench report OUT/<configuration>` and `bench select OUT` read a tune folder as they read a
sweep and a `candidates:` run.

Near the knee a load is judged by its runs (harness/metrics/knee.py): the bracket's two ends are run again, up to
`tune.repeats` more times each, until their runs' majority is settled; each run is judged on its own requests.

`--resume` replays a finished trial from tune.json instead of running it again (the search is deterministic
given its points) and reruns the one that was cut. Ctrl-C or SIGTERM mark the running trial interrupted,
write tune.json and stop the engine.

Across configurations: the whole grid when there are at most `tune.full_grid_max`; more are pruned by
successive halving on the probe: every configuration gets its short probe, and only the best third by the
probe's throughput (an upper bound of what it can carry within SLOs) is searched.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from harness.engine.launcher import BackendUnreachable
from harness.engine.prefix_reset import reset_prefix_cache
from harness.engine.session import EngineSession, engine_session
from harness.metrics.knee import run_passes
from harness.metrics.latencies import active_slo
from harness.results.folder import (
    ResultsError,
    point_dir_name,
    read_model,
    read_records,
    write_candidates,
    write_json,
    write_manifest,
)
from harness.results.schema import (
    Candidate,
    PercentileBound,
    StopDecision,
    Summary,
    SweepPoint,
    TuneCapacity,
    TuneManifest,
)
from harness.runs.candidates import short_reason
from harness.runs.early_stop import PointWatch
from harness.runs.run import Reporter, Terminated, run_scenario
from harness.scenario.scenario import Scenario, ScenarioError
from harness.scenario.tokenizer_source import TokenizerError
from harness.scenario.tuning import config_name, judge_percentiles, launch_args
from harness.tune.search import Measured, search_capacity
from harness.tune.summary import HALVING_KEEP, capacity_text, trial_line, tune_document

TUNE_MANIFEST = "tune.json"


@dataclass
class TrialRow:
    config: str
    seq: int  # its place in the configuration's search, probe first
    kind: str  # probe | point
    offered_load: float
    dir: str  # relative to OUT
    status: str = "pending"  # pending | running | completed | failed | interrupted
    passed: bool | None = None
    goodput_fraction: float | None = None
    requests: int = 0  # measured requests recorded
    requests_per_s: float = 0.0
    completion_per_s: float | None = None  # completed per second, first completion to last (completion_rate)
    output_tokens_per_s: float = 0.0
    output_tokens_per_s_per_accelerator: float = 0.0
    tokens_per_s_per_user: float | None = None  # 1 / TPOT: the interactivity of the Pareto chart
    wall_s: float = 0.0
    stopped_early: StopDecision | None = None
    seconds_saved: float | None = None  # an early stop's estimate of the run it did not need
    client_bound: bool = False
    prefix_cache: str = ""  # what resetting the engine's prefix cache before the trial did
    percentiles: dict[str, PercentileBound] | None = None  # tune.percentile_slo's bounds, by "metric.percentile"
    reason: str = ""
    repeat: int = 0  # 0: a load's first run; n: its n-th run again (a bracket end confirmed: harness/metrics/knee.py)
    met: int = 0  # this run's requests that met the SLOs, of the `judged` ones its verdict counted
    judged: int = 0

    def measured(self) -> Measured:
        return Measured(
            self.offered_load,
            bool(self.passed),
            self.goodput_fraction or 0.0,
            self.requests_per_s,
            exact=self.stopped_early is None,
            completion_per_s=self.completion_per_s,
        )


@dataclass
class ConfigRow:
    name: str
    setting: dict
    launch_args: list[str]
    accelerators: int
    status: str = "pending"  # pending | running | completed | failed | interrupted | pruned | budget
    reason: str = ""
    engine_start_s: float = 0.0
    capacity: TuneCapacity | None = None
    predicted: TuneCapacity | None = None  # with a plan: block, the same search on `bench plan`'s simulation
    trials: list[TrialRow] = field(default_factory=list, repr=False)


def accelerators_of(setting: dict) -> int:
    """Engine replicas x tensor-parallel ranks a configuration occupies (1 unless its flags say more)."""
    count = 1
    for flag in ("--data-parallel", "--data-parallel-size", "--tensor-parallel-size", "--dp", "--tp"):
        value = setting.get(flag)
        if isinstance(value, (int, str)) and str(value).isdigit():
            count *= max(1, int(value))
    return count


class Tuner:
    def __init__(
        self,
        scenario: Scenario,
        out_dir: Path,
        reporter: Reporter,
        resume: bool,
        workers: str | None,
        after_trial: Callable[[float], None] | None = None,
    ):
        """`after_trial(load)`: called after each trial run (not one replayed by --resume), with its load; the
        engine is idle then (benchmarks/tune_cost.py runs a dense sweep's points there, against the same launch)."""
        self.scenario, self.tune, self.out = scenario, scenario.tune, Path(out_dir)
        self.reporter, self.workers, self.after_trial = reporter, workers, after_trial
        self.kind = self.tune.load.kind
        settings = self.tune.configurations()
        self.configs = [ConfigRow(config_name(s), s, launch_args(s), accelerators_of(s)) for s in settings]
        self.method = "grid" if len(self.configs) <= self.tune.full_grid_max else "successive_halving"
        self.done: dict[tuple[str, int], TrialRow] = self._previous() if resume else {}
        self.started = time.monotonic()
        self.status = "running"

    # ---- the search ------------------------------------------------------------------------
    def run(self) -> TuneManifest:
        self.out.mkdir(parents=True, exist_ok=True)
        self.save()
        survivors = self.configs
        if self.method == "successive_halving":
            for c in self.configs:
                self._search(c, probe_only=True)
            scored = sorted((c for c in self.configs if self._score(c) is not None), key=lambda c: -self._score(c))
            survivors = scored[: max(1, math.ceil(len(self.configs) * HALVING_KEEP))]
            why = "predicted capacity" if self.scenario.plan is not None else "probe's throughput"
            for c in self.configs:
                if c not in survivors and c.status != "failed":
                    c.status, c.reason = "pruned", f"its {why} was not in the best third"
        for c in survivors:
            self._search(c, probe_only=False)
        self.status = "budget" if any(c.status == "budget" for c in self.configs) else "completed"
        return self.save()

    def _score(self, c: ConfigRow) -> float | None:
        """Successive halving's rank: bench plan's predicted capacity with a plan: block, else the probe's
        throughput."""
        if self.scenario.plan is not None:
            return c.predicted.offered_load if c.predicted is not None else None
        probe = c.trials[0] if c.trials else None
        return probe.requests_per_s if probe is not None and probe.status == "completed" else None

    def _search(self, c: ConfigRow, probe_only: bool) -> None:
        c.trials, c.status = [], "running"
        self.save()
        bounds = self.tune.load.bounds
        if self.scenario.plan is not None and c.predicted is None:
            c.predicted = self._predicted(c)
        start = c.predicted.offered_load if c.predicted is not None else None
        with ExitStack() as stack:
            session: list[EngineSession] = []

            def measure(load: float, probe: bool) -> Measured | None:
                if probe_only and not probe:
                    return None
                row = self._trial(c, load, probe, stack, session)
                return None if row is None else row.measured()

            try:
                result = search_capacity(
                    measure,
                    self.kind,
                    bounds.min,
                    bounds.max,
                    self.tune.attainment,
                    self.tune.precision,
                    self.tune.max_points,
                    start=start,
                    max_runs=1 + self.tune.repeats,
                )
            except (BackendUnreachable, TokenizerError, TrialFailed) as e:
                c.status, c.reason = "failed", short_reason(str(e))
                self.reporter.warning(f"configuration {c.name} failed: {e}")
                self.save()
                return
            except BaseException:
                c.status = "interrupted"
                raise
            finally:
                self.save()
        if probe_only:
            c.status = "pending"
            return
        c.capacity = self._capacity(result)
        c.status = "budget" if result.status == "budget" else "completed"
        self.reporter.info(f"  {c.name}: capacity {capacity_text(c.capacity, self.kind)}")
        self.save()

    def _predicted(self, c: ConfigRow) -> TuneCapacity:
        """The search run on `bench plan`'s simulation of this configuration (no engine, no requests sent);
        its capacity is where the measured search starts. A deployment the planner cannot model falls back
        to the probe, with the reason kept."""
        from harness.plan.simulator import (
            simulate_scenario,  # the planner only where a plan: block asks
        )

        def measure(load: float, probe: bool) -> Measured:
            summary = simulate_scenario(self._point_scenario(c, load, probe))
            fraction = summary.goodput.fraction
            return Measured(load, fraction >= self.tune.attainment, fraction, summary.throughput.requests_per_s)

        bounds = self.tune.load.bounds
        try:
            result = search_capacity(
                measure,
                self.kind,
                bounds.min,
                bounds.max,
                self.tune.attainment,
                self.tune.precision,
                2 * self.tune.max_points,
            )
        except ScenarioError as e:
            self.reporter.warning(f"{c.name}: bench plan cannot simulate it ({e}); the search starts from a probe")
            return TuneCapacity(offered_load=None, error=str(e))
        predicted = self._capacity(result)
        self.reporter.info(f"{c.name}: bench plan predicts {capacity_text(predicted, self.kind)}")
        return predicted

    def predict(self) -> list[TuneCapacity]:
        """`--dry-run` with a plan: block: bench plan's predicted capacity of each configuration (nothing launched;
        each is said through the reporter as it comes)."""
        for c in self.configs:
            c.predicted = self._predicted(c)
        return [c.predicted for c in self.configs]

    def _capacity(self, result) -> TuneCapacity:
        """Where the line between the bracket's two attainments crosses the target (harness.metrics.slo_capacity's
        rule)."""
        by_load = {p.offered_load: p for p in result.points}
        lo, hi = result.lo, result.hi
        # each end's runs, in order: the majority of these is its verdict (harness/metrics/knee.py)
        votes = [None if end is None else [r.passed for r in by_load[end].runs] for end in (lo, hi)]
        load = rps = None
        if lo is not None and hi is not None:
            a, b = by_load[lo], by_load[hi]
            gap = a.goodput_fraction - b.goodput_fraction
            # a point failed by its slopes alone may show a fraction above the target: then no interpolation
            crosses = gap > 0 and b.goodput_fraction < self.tune.attainment
            w = min(max((a.goodput_fraction - self.tune.attainment) / gap, 0.0), 1.0) if crosses else 0.0
            load, rps = lo + w * (hi - lo), a.requests_per_s + w * (b.requests_per_s - a.requests_per_s)
        elif lo is not None:
            load, rps = lo, by_load[lo].requests_per_s
        return TuneCapacity(
            offered_load=load,
            status=result.status,
            bracket=[lo, hi],
            bracket_runs_passed=votes,
            requests_per_s=rps,
            points=len(result.points),
        )

    # ---- one trial -------------------------------------------------------------------------
    def _trial(
        self,
        c: ConfigRow,
        load: float,
        probe: bool,
        stack: ExitStack,
        session: list[EngineSession],
    ) -> TrialRow | None:
        """One run, judged on its own requests; `repeat` counts the earlier runs of the same load."""
        seq = len(c.trials)
        kind = "probe" if probe else "point"
        repeat = sum(1 for t in c.trials if t.kind == kind and math.isclose(t.offered_load, load))
        name = f"probe-{self.kind}-{load:g}" if probe else point_dir_name(seq - 1, self.kind, load)
        old = self.done.get((c.name, seq))
        if old is not None and old.status == "completed" and old.kind == kind and math.isclose(old.offered_load, load):
            c.trials.append(old)  # resumed: this trial finished before
            return old
        if self._spent():
            return None
        row = TrialRow(c.name, seq, kind, load, f"{c.name}/{name}", repeat=repeat)
        c.trials.append(row)
        if not session:
            session.append(self._start_engine(c, stack))
        shutil.rmtree(self.out / row.dir, ignore_errors=True)  # a cut trial's partial folder
        row.prefix_cache = reset_prefix_cache(session[0], dict(self.scenario.backend.headers))
        row.status = "running"
        self.save()
        self.reporter.info(f"{c.name}: {kind} at {self.kind} {load:g}")
        begun = time.monotonic()
        try:
            result = run_scenario(
                self._point_scenario(c, load, probe, repeat),
                self.out / row.dir,
                workers=self.workers,
                session=session[0],
                reporter=self.reporter,
                watch=self._watch(probe),
            )
        except BaseException:
            row.status = "interrupted"
            raise
        finally:
            row.wall_s = time.monotonic() - begun
        self._fill(row, result, c.accelerators)
        self.save()
        if result.interrupted_by:
            raise Terminated() if result.interrupted_by == "SIGTERM" else KeyboardInterrupt()
        if row.status == "failed":
            raise TrialFailed(f"{row.dir}: {row.reason}")
        self.done[(c.name, seq)] = row
        self.reporter.info("  " + trial_line(row, self.kind))
        if self.after_trial is not None:
            self.after_trial(load)
        return row

    def _start_engine(self, c: ConfigRow, stack: ExitStack) -> EngineSession:
        begun = time.monotonic()
        scenario = self._point_scenario(c, self.tune.load.bounds.min, probe=False)
        (self.out / c.name).mkdir(parents=True, exist_ok=True)
        session = stack.enter_context(engine_session(scenario, self.out / c.name / "engine.log", self.reporter.info))
        c.engine_start_s += time.monotonic() - begun
        return session

    def _point_scenario(self, c: ConfigRow, load: float, probe: bool, repeat: int = 0) -> Scenario:
        """A repeat draws its own arrivals and prompts (seed + repeat): pooled runs are independent samples."""
        s = self.scenario
        update = {"concurrency": int(load)} if self.kind == "concurrency" else {"rate": load}
        if probe:
            update.update(num_requests=self.tune.probe_requests, warmup_requests=0)
        backend = s.backend
        if backend.launch is not None:
            backend = backend.model_copy(
                update={"launch": backend.launch.model_copy(update={"args": [*backend.launch.args, *c.launch_args]})}
            )
        load_spec = s.load.model_copy(update=update)
        return s.model_copy(update={"backend": backend, "load": load_spec, "tune": None, "seed": s.seed + repeat})

    def _watch(self, probe: bool) -> PointWatch | None:
        if probe or not self.tune.early_stop:
            return None  # a probe measures throughput: it runs to its end
        slo = active_slo(self.scenario.slo.model_dump())
        # with slo.confidence a pass is judged on the share's lower bound, which the share met cannot prove early
        can_pass = not self.tune.percentile_slo and self.scenario.slo.confidence is None
        return PointWatch(slo, self.tune.attainment, can_pass=can_pass)

    def _fill(self, row: TrialRow, result, accelerators: int) -> None:
        s = result.summary
        problems = ([result.engine_exit] if result.engine_exit else []) + list(result.incomplete_reasons)
        row.status = "failed" if problems else "interrupted" if result.interrupted_by else "completed"
        row.reason = "; ".join(problems)
        thr = s.throughput
        row.requests, row.requests_per_s = s.requests.measured, thr.requests_per_s
        row.output_tokens_per_s = thr.output_tokens_per_s
        row.output_tokens_per_s_per_accelerator = thr.output_tokens_per_s / accelerators
        tpot = s.tpot_ms.mean
        row.tokens_per_s_per_user = 1000 / tpot if tpot else None
        row.client_bound = result.client_bound
        row.completion_per_s = completion_rate(result.out_dir)
        if row.kind == "probe":
            row.requests_per_s = row.completion_per_s or row.requests_per_s
        self._judge(row, s)

    def _judge(self, row: TrialRow, s: Summary) -> None:
        """This run's verdict and share met, on its own requests (a load's verdict is its runs' majority)."""
        measured = s.requests.measured
        good = round(s.goodput.fraction * measured)
        stop = row.stopped_early = s.stopped_early
        if stop:  # the watch's counts
            row.met, row.judged = stop.met, stop.after_requests
        else:
            row.met, row.judged = good, measured
        if stop:  # the verdict it proved; the fraction is its bound
            row.passed = stop.passed
            bound = stop.met if stop.passed else stop.planned_requests - stop.missed
            row.goodput_fraction = bound / stop.planned_requests
            if stop.reason == "over_saturated":  # failed by its slopes; what it measured, at most the bound
                row.goodput_fraction = min(good / max(1, measured), row.goodput_fraction)  # the cut ones missed
            remaining = stop.planned_requests - stop.after_requests
            row.seconds_saved = remaining / row.requests_per_s if row.requests_per_s > 0 else None
        else:
            row.goodput_fraction = row.met / row.judged if row.judged else 0.0
            row.passed = run_passes(row.met, row.judged, self.tune.attainment, self.scenario.slo.confidence)
        if self.tune.percentile_slo:  # judged on what the point measured (a stopped point has failed already)
            row.percentiles = judge_percentiles(self.tune.percentile_slo, s)
            row.passed = row.passed and all(b.met for b in row.percentiles.values())

    # ---- budget, manifest, resume ------------------------------------------------------------
    def _spent(self) -> bool:
        budget, rows = self.tune.budget, [t for c in self.configs for t in c.trials if t.status != "pending"]
        if budget.runs is not None and len(rows) >= budget.runs:
            return True
        if budget.requests is not None and sum(t.requests for t in rows) >= budget.requests:
            return True
        return budget.minutes is not None and (time.monotonic() - self.started) / 60 >= budget.minutes

    def _previous(self) -> dict[tuple[str, int], TrialRow]:
        manifest: TuneManifest | None = read_model(self.out / TUNE_MANIFEST)
        if manifest is None:
            raise ResultsError(f"--resume: {self.out} holds no {TUNE_MANIFEST}; run without --resume to start")
        if manifest.scenario != self.scenario.resolved_dict():
            raise ResultsError(
                f"--resume: the scenario changed since {self.out / TUNE_MANIFEST} was written; "
                f"resume with the same scenario and --set options, or tune into a new --output"
            )
        rows = [TrialRow(**dict(t)) for t in manifest.trials]
        return {(t.config, t.seq): t for t in rows if t.status == "completed"}

    def save(self) -> TuneManifest:
        doc = tune_document(self)
        write_json(self.out / TUNE_MANIFEST, doc)
        self._write_sweep_views()
        return doc

    def _write_sweep_views(self) -> None:
        """sweep.json per configuration and candidates.json over them: what `bench report`/`select` read."""
        candidates = []
        for c in self.configs:
            points = [t for t in c.trials if t.kind == "point" and t.status != "pending"]
            if not (self.out / c.name).is_dir():
                continue
            rows = [
                SweepPoint(
                    index=t.seq - 1,
                    offered_load=t.offered_load,
                    dir=Path(t.dir).name,
                    status=t.status,
                    client_bound=t.client_bound,
                )
                for t in points
            ]
            write_manifest(self.out / c.name, self.kind, self.scenario.resolved_dict(), rows)
            done = any(t.status == "completed" for t in points)
            candidates.append(
                Candidate(
                    name=c.name,
                    dir=c.name,
                    launch_args=c.launch_args,
                    accelerators=c.accelerators,
                    status="completed" if done else c.status,
                    reason=c.reason,
                    client_bound=any(t.client_bound for t in points),
                )
            )
        write_candidates(self.out, self.scenario.resolved_dict(), candidates)


def completion_rate(run_dir: Path) -> float | None:
    """Requests completed per second between the first completion and the last: a saturated engine's throughput
    without the one request's latency that a short run's window adds (completed / window is far lower)."""
    ends = sorted(r.end_s for r in read_records(run_dir) if r.ok and not r.is_warmup and r.end_s is not None)
    return (len(ends) - 1) / (ends[-1] - ends[0]) if len(ends) > 2 and ends[-1] > ends[0] else None


class TrialFailed(Exception):
    """A trial whose engine exited or whose records are missing: its configuration cannot be searched on."""
