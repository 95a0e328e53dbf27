"""The results store: every recorded run's identity and per-run statistics in one SQLite file.

Why SQLite (Python's own sqlite3): one file that CI can cache or upload, no server, no new dependency,
and a history of nightly runs is small (a few hundred values a run). DuckDB would add a 30 MB package
for queries this size does not need.

A run is one entry however often it is added (reports/run_identity.py says who a run is). Runs added
together form a batch (one nightly job's repeats; `--batch`, by default one per `bench history add`): a
batch is one point of a series, its value the mean of its runs' values (geometric when all are positive,
as the gate compares runs). A series is one scenario hash on one kind of runner.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from harness.metrics.validity import skip_reason
from harness.results.folder import ResultsError
from reports.load import RunData, load_peer_run, load_run
from reports.peers import find_peer_file
from reports.peers.history import identify_peer
from reports.run_identity import HistoryError, RunIdentity, check_complete, identify, revision
from reports.run_values import run_values

SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,      -- hash of run.json + summary.json: the same run is one entry
    batch TEXT NOT NULL,          -- runs recorded together; one point of a series
    scenario_name TEXT, scenario_hash TEXT NOT NULL, runner_kind TEXT NOT NULL, host TEXT,
    commit_sha TEXT, branch TEXT, engine TEXT, engine_version TEXT, model TEXT, harness_version TEXT,
    finished_at TEXT NOT NULL,    -- UTC, ISO 8601: when summary.json was written
    added_at TEXT NOT NULL, path TEXT);
CREATE TABLE IF NOT EXISTS metrics (
    run_id TEXT NOT NULL REFERENCES runs(run_id), name TEXT NOT NULL,
    value REAL, samples INTEGER,  -- samples behind the value (None for summary.json figures)
    PRIMARY KEY (run_id, name));
CREATE INDEX IF NOT EXISTS runs_by_series ON runs (scenario_hash, runner_kind, finished_at);
"""


@dataclass
class Night:
    """One point of a series: a batch of runs of one scenario on one kind of runner."""

    batch: str
    finished_at: str
    commit: str | None
    branch: str | None
    run_ids: list[str]
    values: dict[str, float | None] = field(default_factory=dict)  # metric -> mean over the batch's runs
    samples: dict[str, int] = field(default_factory=dict)  # metric -> fewest samples behind a run's value


def connect(db: str | Path, create: bool = False) -> sqlite3.Connection:
    db = Path(db)
    if not create and not db.is_file():
        raise HistoryError(f"{db}: no history file here; `bench history add RUN_DIR --db {db}` creates it")
    db.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(db)
    try:
        conn.executescript(SCHEMA)
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except sqlite3.DatabaseError as e:
        conn.close()
        raise HistoryError(f"{db}: not a history file ({e})") from None
    if row is None:
        conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        conn.commit()
    elif int(row[0]) != SCHEMA_VERSION:
        conn.close()
        raise HistoryError(f"{db}: history schema {row[0]}, this bench reads {SCHEMA_VERSION}; use a new file")
    return conn


@dataclass
class AddResult:
    added: list[Path]
    already: list[Path]
    skipped: list[tuple[Path, str]] = field(default_factory=list)  # invalid runs left out, and why


@dataclass(kw_only=True)
class _BatchStamp:
    """What every run added together is recorded with."""

    batch: str
    commit: str | None
    branch: str | None
    added_at: str  # UTC, ISO 8601


def add_runs(
    db: str | Path,
    paths,
    batch: str | None = None,
    commit: str | None = None,
    branch: str | None = None,
    runner: str | None = None,
    rules=None,
    keep_invalid: bool = False,
) -> AddResult:
    """Records each run (all of them or, if any is refused, none). `rules`: GateRules whose metrics are
    stored besides the standard set (reports.run_values). An invalid run (summary.json validity) is skipped,
    with its reasons in `skipped`, unless `keep_invalid`."""
    paths = [Path(p) for p in paths]
    for p in paths:
        if find_peer_file(p) is None:  # a peer tool's file is complete as the tool wrote it
            check_complete(p)
    commit, branch = revision(commit, branch)
    stamp = _BatchStamp(
        batch=batch or datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ"),
        commit=commit,
        branch=branch,
        added_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
    result = AddResult([], [])
    conn = connect(db, create=True)
    try:
        with conn:  # one transaction: all the runs or none
            for p in paths:
                run = _load(p)
                why = None if keep_invalid else skip_reason(run.summary)
                if why is not None:
                    result.skipped.append((p, why))
                    continue
                ident = identify_peer(p, run.run_info, runner) if run.peer else identify(p, run.run_info, runner)
                if not _insert_run(conn, ident, stamp, p):
                    result.already.append(p)
                    continue
                conn.executemany(
                    "INSERT INTO metrics VALUES (?,?,?,?)",
                    [(ident.run_id, name, value, n) for name, (value, n) in run_values(run, rules).items()],
                )
                result.added.append(p)
    finally:
        conn.close()
    return result


def _load(path: Path) -> RunData:
    """The run in `path`; a damaged results folder refuses the whole batch."""
    try:
        return load_peer_run(path) if find_peer_file(path) is not None else load_run(path)
    except ResultsError as e:
        raise HistoryError(str(e)) from None


def _insert_run(conn: sqlite3.Connection, ident: RunIdentity, stamp: _BatchStamp, path: Path) -> bool:
    """Adds the run's row; False when the file already holds this run."""
    cur = conn.execute(
        "INSERT OR IGNORE INTO runs VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (
            ident.run_id,
            stamp.batch,
            ident.scenario_name,
            ident.scenario_hash,
            ident.runner_kind,
            ident.host,
            stamp.commit,
            stamp.branch,
            ident.engine,
            ident.engine_version,
            ident.model,
            ident.harness_version,
            ident.finished_at,
            stamp.added_at,
            str(path.resolve()),
        ),
    )
    return cur.rowcount > 0


def series_keys(db: str | Path) -> list[tuple[str, str, str, int]]:
    """(scenario name, scenario hash, runner kind, runs) of every series in the file, largest first."""
    conn = connect(db)
    try:
        return conn.execute(
            "SELECT scenario_name, scenario_hash, runner_kind, COUNT(*) FROM runs "
            "GROUP BY scenario_hash, runner_kind ORDER BY COUNT(*) DESC"
        ).fetchall()
    finally:
        conn.close()


def metric_names(db: str | Path) -> list[str]:
    conn = connect(db)
    try:
        return [name for (name,) in conn.execute("SELECT DISTINCT name FROM metrics ORDER BY name")]
    finally:
        conn.close()


def nights(db: str | Path, scenario: str, runner: str, metrics, exclude_runs=()) -> list[Night]:
    """The series of one scenario hash on one runner kind, oldest first, each night's metrics averaged over its
    runs; runs in `exclude_runs` (tonight's, when they were already added) are left out."""
    conn = connect(db)
    try:
        rows = conn.execute(
            "SELECT run_id, batch, finished_at, commit_sha, branch FROM runs WHERE scenario_hash = ? "
            "AND runner_kind = ? ORDER BY finished_at, rowid",
            (scenario, runner),
        ).fetchall()
        rows = [r for r in rows if r[0] not in set(exclude_runs)]
        by_batch: dict[str, Night] = {}
        for run_id, batch, finished_at, commit, branch in rows:
            night = by_batch.setdefault(batch, Night(batch, finished_at, commit, branch, []))
            night.run_ids.append(run_id)
        metrics = list(metrics)
        marks = ",".join("?" * len(metrics))
        for night in by_batch.values():
            per_run: dict[str, list] = {m: [] for m in metrics}
            for name, value, n in conn.execute(
                f"SELECT name, value, samples FROM metrics WHERE name IN ({marks}) AND run_id IN "
                f"({','.join('?' * len(night.run_ids))})",
                metrics + night.run_ids,
            ):
                per_run[name].append((value, n))
            for name, vals in per_run.items():
                night.values[name] = batch_value([v for v, _ in vals])
                counts = [n for _, n in vals if n is not None]
                if counts:
                    night.samples[name] = min(counts)
    finally:
        conn.close()
    return list(by_batch.values())


def batch_value(values) -> float | None:
    """The value of a batch of runs: the geometric mean when all are positive, else the mean; None if any is
    missing (a run that measured nothing for it)."""
    if not values or any(v is None for v in values):
        return None
    a = np.asarray(values, dtype=float)
    return float(np.exp(np.log(a).mean())) if (a > 0).all() else float(a.mean())
