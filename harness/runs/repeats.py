"""`bench run --repeats N [--until-ci P]`: the scenario run N times, each headline figure's mean across the runs
with its confidence interval (harness/metrics/across_runs.py), stopping early once every interval is narrow enough.

Repeat k is a whole run into OUT/repeat-k/ with seed = the scenario's seed + k - 1: the same distributions
with fresh prompts and arrival times, so the spread covers the draw of the workload too, and no repeat finds
the previous one's prompts in the engine's prefix cache. A launched engine is started once (OUT/engine.log)
and serves every repeat, as a sweep's does. OUT/repeats.json lists each repeat's status and the intervals
over the valid ones, rewritten after every repeat, so a folder cut short keeps every finished repeat usable.
A repeat the validity verdict calls invalid is listed with its reasons and left out of the intervals, as the
gate and the history leave it out (`--keep-invalid` counts it). The folder is one side of `bench gate` as it
is (repeat-k/ are its runs).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from harness.engine.session import engine_session
from harness.metrics.across_runs import MIN_RUNS_TO_STOP, converged, headline_intervals, widest
from harness.metrics.confidence import DEFAULT_CONFIDENCE
from harness.results.folder import RUN_FILES, ResultsError, holds_run, write_json
from harness.results.schema import MeanInterval, Repeat, RepeatsManifest
from harness.runs.run import Reporter, RunResult, run_scenario
from harness.runs.sweep import run_status
from harness.scenario.scenario import Scenario

MANIFEST = "repeats.json"
MAX_REPEATS = 100


@dataclass
class RepeatStatus:
    index: int
    dir: str
    seed: int
    status: str = "pending"  # pending | running | completed | interrupted | failed
    valid: bool | None = None
    reasons: list[str] = field(default_factory=list)  # the validity verdict's, when invalid
    result: RunResult | None = field(default=None, repr=False)


@dataclass
class Repeats:
    statuses: list[RepeatStatus]
    intervals: dict[str, MeanInterval]  # by headline metric (harness/metrics/across_runs.HEADLINE_METRICS)
    stopped: str  # running | converged | all repeats ran | interrupted | failed

    @property
    def last(self) -> RunResult | None:
        return next((s.result for s in reversed(self.statuses) if s.result is not None), None)


def run_repeats(
    scenario: Scenario,
    out_dir: Path,
    repeats: int,
    until_ci: float | None = None,
    workers: str | None = None,
    overwrite: bool = False,
    reporter: Reporter | None = None,
    keep_invalid: bool = False,
) -> Repeats:
    """Runs up to `repeats` repeats against one engine; `until_ci` (a share: 0.05): stop once every headline
    interval's half-width is within it of its mean (after MIN_RUNS_TO_STOP valid repeats). `keep_invalid`: count
    the repeats the validity verdict calls invalid too."""
    reporter = reporter or Reporter()
    out_dir = prepare_repeats_dir(Path(out_dir), overwrite)
    confidence = scenario.slo.confidence or DEFAULT_CONFIDENCE
    statuses = [RepeatStatus(k, f"repeat-{k}", scenario.seed + k - 1) for k in range(1, repeats + 1)]
    state = Repeats(statuses, {}, "running")
    save = lambda: _save(out_dir, scenario, state, repeats, until_ci, confidence, keep_invalid)  # noqa: E731
    save()
    with engine_session(scenario, out_dir / "engine.log", reporter.info) as session:
        for status in statuses:
            status.status = "running"
            save()
            reporter.info(f"repeat {status.index}/{repeats} (seed {status.seed})")
            try:
                one = scenario.model_copy(update={"seed": status.seed})
                status.result = run_scenario(
                    one, out_dir / status.dir, workers=workers, session=session, reporter=reporter
                )
            except KeyboardInterrupt:
                status.status = state.stopped = "interrupted"
                raise
            except BaseException:
                status.status = state.stopped = "failed"
                raise
            finally:
                save()
            _judge(status)
            valid = [s.result.summary for s in statuses if s.status == "completed" and (s.valid or keep_invalid)]
            state.intervals = headline_intervals(valid, confidence)
            done = until_ci is not None and converged(state.intervals, until_ci)
            if status.status != "completed":
                state.stopped = status.status
            elif done:
                state.stopped = "converged"
            elif status.index == repeats:
                state.stopped = "all repeats ran"
            save()
            reporter.info(progress_line(status, state.intervals, until_ci, keep_invalid))
            if state.stopped != "running":
                break
    return state


def _judge(status: RepeatStatus) -> None:
    """A finished repeat's status (as a sweep point's) and its validity."""
    result = status.result
    status.status = run_status(result)
    verdict = result.summary.validity
    status.valid, status.reasons = (verdict.valid, list(verdict.reasons)) if verdict else (True, [])


def prepare_repeats_dir(path: Path, overwrite: bool) -> Path:
    """The repeats folder; one already holding repeats or a run is refused unless `overwrite` (which empties it)."""
    path.mkdir(parents=True, exist_ok=True)
    held = (path / MANIFEST).exists() or holds_run(path) or any(path.glob("repeat-*/requests.jsonl"))
    if held and not overwrite:
        raise ResultsError(
            f"--output: {path} already holds results ({MANIFEST} or repeat-N/ folders); choose a new folder, "
            f"or pass --overwrite to replace them"
        )
    if held:
        for stale in path.glob("repeat-*"):
            shutil.rmtree(stale)
        for name in (MANIFEST, *RUN_FILES):
            (path / name).unlink(missing_ok=True)
    return path


def _save(out_dir: Path, scenario: Scenario, state: Repeats, repeats: int, until_ci, confidence, keep_invalid) -> None:
    manifest = RepeatsManifest(
        scenario=scenario.resolved_dict(),
        max_repeats=repeats,
        until_ci=until_ci,
        confidence=confidence,
        min_runs_to_stop=MIN_RUNS_TO_STOP,
        method="Student t interval of the mean across the completed repeats"
        + (" (invalid ones too: --keep-invalid)" if keep_invalid else " that are valid"),
        keep_invalid=keep_invalid,
        stopped=state.stopped,
        repeats=[Repeat.model_validate(s, from_attributes=True) for s in state.statuses],
        metrics=state.intervals,
    )
    write_json(out_dir / MANIFEST, manifest)


def progress_line(
    status: RepeatStatus, intervals: dict[str, MeanInterval], until_ci: float | None, keep_invalid: bool = False
) -> str:
    """After a repeat: its status and the widest headline interval so far."""
    flag = "" if status.valid else f"; INVALID{', kept' if keep_invalid else ', left out'}: {'; '.join(status.reasons)}"
    wide = widest(intervals)
    spread = f"widest interval {wide[0]} ±{100 * wide[1]:.1f}%" if wide else "intervals need 2 valid repeats"
    target = f" (until ±{100 * until_ci:g}%)" if until_ci is not None else ""
    return f"  repeat {status.index}: {status.status}{flag}; {spread}{target}"
