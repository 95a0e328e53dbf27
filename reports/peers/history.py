"""Peer files in `bench history add` and `bench select`: a peer file's identity in the history (hash of the file, its
tool and version, the time the tool says it ran or the file's own), and the reason no SLO verdict is stated for a
run with no per-request samples (a summary-only file, or one where every request failed)."""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from pathlib import Path

from harness.results.schema import RunInfo
from reports.peers import find_peer_file, load_peer
from reports.run_files import scenario
from reports.run_identity import RunIdentity, runner_kind, scenario_hash


def identify_peer(path: Path, run_info: RunInfo, runner: str | None = None) -> RunIdentity:
    """A peer file's identity: its bytes' hash (the same file added twice is one run), the tool as the engine
    column's qualifier, the file's modification time as when it finished (the tools' own dates differ in form)."""
    file = find_peer_file(path)
    peer = load_peer(file)
    digest = hashlib.sha256(file.read_bytes()).hexdigest()
    finished = datetime.fromtimestamp(file.stat().st_mtime, timezone.utc)
    return RunIdentity(
        run_id=digest[:20],
        scenario_name=scenario(run_info.scenario).name or "?",
        scenario_hash=scenario_hash(run_info.scenario),
        runner_kind=runner_kind(run_info, runner),
        host=None,
        engine=run_info.backend.kind,
        engine_version=f"{peer.tool} {peer.version}",
        model=run_info.backend.model,
        harness_version=None,
        finished_at=finished.isoformat(timespec="milliseconds"),
    )


def no_samples_reason(records: list, summary) -> str | None:
    """Why no SLO verdict can be stated for a run, or None when it has per-request samples: the share of requests
    within an SLO needs the requests, and a tool's percentile says nothing of a share at another limit."""
    if records:
        return None
    completed = summary.requests.completed if summary.requests else 0
    if not completed:
        return "not established: no request completed (every one failed), so no latency to judge"
    ttft = summary.ttft_ms.p99 if summary.ttft_ms else None
    own = f"; its own TTFT p99 {ttft:,.0f} ms" if ttft is not None else ""
    return f"not established: the file holds the tool's figures only, no per-request samples{own}"
