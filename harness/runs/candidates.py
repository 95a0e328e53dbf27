"""`candidates:` in a scenario: the same workload, load and SLOs run against each deployment in turn.

Each candidate (harness.scenario.scenario.Candidate: a name and the launch flags that make its deployment,
e.g. `--data-parallel 2 --router-policy cache_aware`) is a whole `bench run` of the scenario, a single
run or a sweep, into OUT/<name>/ with its own engine started and stopped, so no two candidates ever
share the CPU or the accelerators. candidates.json lists them with their status, rewritten as each
starts and ends. A candidate whose engine does not start (a flag this engine lacks) is recorded
`failed` with the reason, and the next one runs: one broken shape does not cost the others.
`bench select OUT` ranks them (reports/select.py); candidates.json is harness/results/folder.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.engine.launcher import BackendUnreachable
from harness.results.folder import CANDIDATES_MANIFEST, ResultsError, write_candidates
from harness.results.schema import Candidate
from harness.runs.run import Reporter, run_scenario
from harness.runs.sweep import capacity_line, run_sweep
from harness.scenario.scenario import Scenario
from harness.scenario.tokenizer_source import TokenizerError


@dataclass
class CandidateStatus:
    name: str
    dir: str  # relative to OUT
    launch_args: list[str]
    accelerators: int
    status: str = "pending"  # pending | running | completed | failed | interrupted
    reason: str = ""  # why it failed
    client_bound: bool = False
    line: str = field(default="", repr=False)  # the console's summary of it


def run_candidates(
    scenario: Scenario,
    out_dir: Path,
    workers: str | None = None,
    overwrite: bool = False,
    reporter: Reporter | None = None,
) -> list[CandidateStatus]:
    """Runs each candidate in turn; Ctrl-C or SIGTERM marks the running one interrupted and stops."""
    reporter = reporter or Reporter()
    out_dir = Path(out_dir)
    if (out_dir / CANDIDATES_MANIFEST).exists() and not overwrite:
        raise ResultsError(
            f"--output: {out_dir} already holds candidates' results ({CANDIDATES_MANIFEST}); choose a "
            f"new folder, or pass --overwrite to replace them"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    pairs = scenario.candidate_scenarios()
    statuses = [CandidateStatus(c.name, c.name, list(c.launch_args), c.accelerators) for c, _ in pairs]
    save = lambda: write_candidates(out_dir, scenario.resolved_dict(), manifest_candidates(statuses))  # noqa: E731
    save()
    for status, (candidate, cand_scenario) in zip(statuses, pairs):
        status.status = "running"
        save()
        reporter.info(f"candidate {candidate.name}: {' '.join(candidate.launch_args) or '(the launch as written)'}")
        try:
            status.line = _run_one(cand_scenario, out_dir / status.dir, workers, overwrite, reporter, status)
        except (BackendUnreachable, TokenizerError) as e:
            status.status, status.reason = "failed", short_reason(str(e))
            reporter.warning(f"candidate {candidate.name} failed: {e}")
        except BaseException:
            status.status = "interrupted"
            raise
        finally:
            save()
        reporter.info(f"  {candidate.name}: {status.status}; {status.line}")
        if status.status == "interrupted":  # a signal cut its load: stop, as a single run would
            break
    return statuses


def manifest_candidates(statuses: list[CandidateStatus]) -> list[Candidate]:
    """candidates.json's rows: each candidate's folder, launch arguments, status and console line."""
    return [Candidate.model_validate(s, from_attributes=True) for s in statuses]


def _run_one(scenario: Scenario, out: Path, workers, overwrite, reporter, status: CandidateStatus) -> str:
    if scenario.load.sweep is not None:
        points = run_sweep(scenario, out, workers, overwrite, reporter)
        status.client_bound = any(p.client_bound for p in points)
        statuses = {p.status for p in points}
        status.status = (
            "completed" if statuses == {"completed"} else "interrupted" if "interrupted" in statuses else "failed"
        )
        if status.status == "failed":
            status.reason = "; ".join(f"{p.dir} {p.status}" for p in points if p.status != "completed")
        return capacity_line(scenario, points)
    result = run_scenario(scenario, out, workers=workers, overwrite=overwrite, reporter=reporter)
    status.client_bound = result.client_bound
    problems = ([result.engine_exit] if result.engine_exit else []) + list(result.incomplete_reasons)
    status.status = "failed" if problems else "interrupted" if result.interrupted_by else "completed"
    status.reason = "; ".join(problems)
    good = result.summary.goodput
    return f"goodput {good.requests_per_s:.2f} req/s ({100 * good.fraction:.0f}% within the SLOs)"


def short_reason(message: str) -> str:
    """The error's first line and, where it quotes the engine's log, that log's last words (typer's
    "No such option: --disaggregate" out of its box)."""
    lines = [line.strip(" │╭╰─╮╯") for line in message.splitlines()]
    first, last = lines[0], next((line for line in reversed(lines[1:]) if line), "")
    return f"{first.removesuffix(' ends with:').removesuffix(';')}: {last}" if last else first
