"""Who a run is: its identity in the results history, and whether it is complete enough to keep.

A run is identified by its content (a hash of run.json and summary.json): the same run added twice, or a
copy of it, is one entry. Runs are comparable when they ran the same scenario (`scenario_hash`) on the
same kind of runner (`runner_kind`). The commit and branch come from the caller, GitHub Actions'
variables or the git checkout (`revision`). The finish time is summary.json's modification time: run.json
holds no wall-clock time.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from harness.client.workers import client_bound_advice
from harness.results.folder import ResultsError, read_records
from harness.results.schema import RunInfo, Summary
from reports.run_files import harness_version, read_run_info, read_summary, scenario


class HistoryError(Exception):
    """A history file or a run that cannot be used; the message says why and what to do."""


@dataclass(kw_only=True)
class RunIdentity:
    run_id: str
    scenario_name: str
    scenario_hash: str
    runner_kind: str
    host: str | None
    engine: str | None
    engine_version: str | None
    model: str | None
    harness_version: str | None
    finished_at: str


def scenario_hash(scenario: dict) -> str:
    """The resolved scenario less backend.url (a launched engine's port) and seed (fresh per repeat), unset keys
    dropped (a newer harness lists new options as None): equal for every repeat of one experiment."""

    def clean(value):
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if v is not None}
        return value

    s = clean(scenario)
    s.pop("seed", None)
    s.get("backend", {}).pop("url", None)
    return hashlib.sha256(json.dumps(s, sort_keys=True).encode()).hexdigest()[:12]


def runner_kind(run_info: RunInfo, given: str | None = None) -> str:
    """The kind of machine a run ran on: `given`, else $BENCH_RUNNER_KIND (CI sets its runner label), else the
    run's OS, architecture and CPU count (hostnames of CI runners change every job, so they are not it)."""
    given = given or os.environ.get("BENCH_RUNNER_KIND")
    if given:
        return given
    host = run_info.host
    if host is None:  # a plan's run.json
        return "unknown-unknown-?cpu"
    system = (host.platform or "unknown").split("-")[0]
    return f"{system}-{host.machine or 'unknown'}-{host.cpu_count or '?'}cpu"


def check_complete(path: Path) -> None:
    """Refuses (HistoryError) a run folder that is not one finished, clean `bench run`."""
    if not (path / "requests.jsonl").is_file():
        raise HistoryError(f"{path}: not a run folder (no requests.jsonl); pass a folder written by `bench run`")
    for name, why in (
        ("run.json", "it was not written by `bench run`"),
        ("summary.json", "the run did not finish (killed before its summary); run it again"),
    ):
        if not (path / name).is_file():
            raise HistoryError(f"{path}: no {name}: {why}")
    try:
        run_info, records = read_run_info(path), read_records(path)
        summary = read_summary(path, run_info, [r for r in records if not r.is_warmup])
    except ResultsError as e:
        raise HistoryError(str(e)) from None
    _check_finished(path, run_info, summary, len(records))


def _check_finished(path: Path, run_info: RunInfo, summary: Summary, records: int) -> None:
    """Refuses a run cut short, one whose client fell behind, and one whose records are not those summarized."""
    req = summary.requests
    if summary.interrupted:
        raise HistoryError(
            f"{path}: interrupted (Ctrl-C): {req.completed} requests completed of the "
            f"planned load; its figures are not comparable, run it again"
        )
    if summary.client_bound:
        cpu_count = run_info.host.cpu_count if run_info.host else None
        raise HistoryError(
            f"{path}: client-bound ("
            + "; ".join(summary.client_bound_reasons)
            + "): its latencies include client delay; run it again: "
            + client_bound_advice(summary, cpu_count)
        )
    expected = req.measured + req.warmup
    if records != expected:
        raise HistoryError(
            f"{path}: requests.jsonl has {records} records but summary.json counts {expected}: the "
            f"folder is incomplete or was changed after the run"
        )
    if not req.measured:
        raise HistoryError(f"{path}: no measured requests")


def identify(path: Path, run_info: RunInfo, runner: str | None = None) -> RunIdentity:
    digest = hashlib.sha256((path / "run.json").read_bytes() + (path / "summary.json").read_bytes()).hexdigest()
    backend = run_info.backend
    finished = datetime.fromtimestamp((path / "summary.json").stat().st_mtime, timezone.utc)
    return RunIdentity(
        run_id=digest[:20],
        scenario_name=scenario(run_info.scenario).name or "?",
        scenario_hash=scenario_hash(run_info.scenario),
        runner_kind=runner_kind(run_info, runner),
        host=run_info.host.hostname if run_info.host else None,
        engine=backend.kind,
        engine_version=backend.engine_version,
        model=backend.model,
        harness_version=harness_version(run_info),
        finished_at=finished.isoformat(timespec="milliseconds"),
    )


def revision(commit: str | None = None, branch: str | None = None) -> tuple[str | None, str | None]:
    """The commit and branch runs are recorded under: as given, else GitHub Actions' $GITHUB_SHA and
    $GITHUB_REF_NAME, else the git checkout in the working directory (None outside one)."""

    def git(*args) -> str | None:
        try:
            out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() or None if out.returncode == 0 else None

    commit = commit or os.environ.get("GITHUB_SHA") or git("rev-parse", "HEAD")
    branch = branch or os.environ.get("GITHUB_REF_NAME") or git("rev-parse", "--abbrev-ref", "HEAD")
    return commit, (None if branch == "HEAD" else branch)  # HEAD: a detached checkout, no branch
