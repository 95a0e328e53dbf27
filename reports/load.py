"""Reads results folders (one run, or a sweep of point sub-folders) into typed values and tables for reports.

The folder layout and its files are harness/results/folder.py's (it writes and parses them); run.json and
summary.json become their models (reports/run_files.py: any schema version, and peer tools' files); the rest
become tables: server_metrics.csv (`t_s,name,value,labels`) and telemetry.csv
(`t_s,source,name,value`) share the requests' clock (seconds from the run's t0). Sweep points that
sweep.json does not mark completed (cut by Ctrl-C, failed) are left out, as their partial counts
would pass for a load the engine could not take. Latencies use harness.metrics.latencies, the one implementation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from harness.engine.step_trace import read_engine_trace
from harness.metrics.confidence import share_lower_bound
from harness.metrics.latencies import active_slo, meets_slo, request_latency
from harness.results.folder import (
    RequestRecord,
    ResultsError,
    is_run_dir,
    parse_point_dir,
    point_dirs,
    read_records,
    read_statuses,
)
from harness.results.schema import RunInfo, Summary
from reports.peers import find_peer_file, load_peer
from reports.run_files import PeerNote, peer_run_info, peer_summary, read_run_info, read_summary, scenario

REQUEST_COLUMNS = [
    "index",
    "intended_send_s",
    "actual_send_s",
    "send_s",
    "end_s",
    "ok",
    "error_reason",
    "output_tokens",
    "prompt_tokens",
    "first_token_s",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "max_itl_s",
]
__all__ = ["ResultsError", "RunData", "Sweep", "SweepPoint", "load_peer_run", "load_results", "load_run", "load_sweep"]


@dataclass
class RunData:
    path: Path
    label: str
    run_info: RunInfo
    summary: Summary
    records: list[RequestRecord]  # measured (non-warm-up) requests, as written
    requests: pd.DataFrame  # one row per measured request, latencies in seconds
    itl_s: np.ndarray  # every per-token gap of every completed request
    token_times_s: np.ndarray  # arrival time of each output token (chunk times repeated per token)
    server_metrics: pd.DataFrame | None
    telemetry: pd.DataFrame | None
    warnings: list[str] = field(default_factory=list)  # lines skipped while reading, for the console
    steps: list[dict] = field(default_factory=list)  # the engine's step trace (engine_trace.json), if any
    peer: PeerNote | None = None  # a peer tool's file read as a run (reports/peers): the tool and its differences

    @property
    def slo(self) -> dict:
        return self.summary.goodput.slo or scenario(self.run_info.scenario).slo or {}

    def goodput_fraction(self, slo: dict, confidence: float | None = None) -> float:
        """Share of measured requests that completed within every given SLO (ms); with `confidence`, the lower
        bound of that share (harness.metrics.confidence.share_lower_bound)."""
        slo = active_slo(slo)
        lats = [request_latency(r) for r in self.records]
        good = sum(lat is not None and meets_slo(lat, slo) for lat in lats)
        if confidence is not None:
            return share_lower_bound(good, len(self.records), confidence)
        return good / len(self.records) if self.records else 0.0


@dataclass
class SweepPoint:
    offered_load: float  # requests/s for a rate sweep, requests in flight for a concurrency sweep
    run: RunData


@dataclass
class Sweep:
    path: Path
    label: str
    load_kind: str  # "rate" or "concurrency"
    points: list[SweepPoint]
    left_out: list[str] = field(default_factory=list)  # "point-001-rate-2 (interrupted)": not completed


def load_run(path: str | Path, label: str | None = None) -> RunData:
    path = Path(path)
    if not is_run_dir(path):
        raise ResultsError(f"{path}: no requests.jsonl here; pass a folder written by `bench run --output`")
    warnings: list[str] = []
    every_record = read_records(path, warnings)
    if not every_record:
        log = " (see engine.log)" if (path / "engine.log").is_file() else ""
        raise ResultsError(
            f"{path}: requests.jsonl holds no request: the run never sent one{log}; rerun it or leave this folder out"
        )
    run_info = read_run_info(path)
    # in send order (the file is in completion order): the gate's block bootstrap needs time order
    records = sorted((r for r in every_record if not r.is_warmup), key=lambda r: (r.intended_send_s, r.index))
    run = run_data(path, label or path.name, run_info, read_summary(path, run_info, records), records)
    run.server_metrics, run.telemetry = _read_csv(path / "server_metrics.csv"), _read_csv(path / "telemetry.csv")
    run.warnings = warnings
    if (path / "engine_trace.json").is_file():
        run.steps = read_engine_trace(path / "engine_trace.json")
    return run


def load_peer_run(path: str | Path, label: str | None = None) -> RunData:
    """A peer tool's result file (reports/peers) as a run: the tool's figures as its summary, its requests
    rebuilt as records (reports/run_files.py); `peer` names the tool and the definitions that differ from ours."""
    peer = load_peer(path)
    records = sorted(peer.records, key=lambda r: (r.intended_send_s, r.index))
    run_info = peer_run_info(peer)
    run = run_data(peer.path, label or Path(path).name, run_info, peer_summary(peer, records, run_info), records)
    run.peer = PeerNote(peer.tool, peer.differences)
    run.warnings = peer.warnings
    return run


def run_data(path: Path, label: str, run_info: RunInfo, summary: Summary, records: list[RequestRecord]) -> RunData:
    """The tables of one run's measured records (latencies in seconds)."""
    rows, itl, token_times = [], [], []
    for r in records:
        lat = request_latency(r)
        rows.append(
            {
                "index": r.index,
                "intended_send_s": r.intended_send_s,
                "actual_send_s": r.actual_send_s,
                "send_s": r.intended_send_s + r.cap_wait_s,
                "end_s": r.end_s,
                "ok": r.ok,
                "error_reason": r.error_reason,
                "output_tokens": r.output_tokens,
                "prompt_tokens": r.prompt_tokens,
                "first_token_s": r.token_times_s[0] if r.token_times_s else None,
                "ttft_s": lat.ttft_s if lat else None,
                "tpot_s": lat.tpot_s if lat else None,
                "e2e_s": lat.e2e_s if lat else None,
                "max_itl_s": max(lat.itl_token_s) if lat and lat.itl_token_s else None,
            }
        )
        if lat is not None:
            itl.extend(lat.itl_token_s)
            per_chunk = r.tokens_per_chunk or [1] * len(r.token_times_s)
            token_times.extend(np.repeat(r.token_times_s, per_chunk).tolist())
    requests = pd.DataFrame(rows, columns=REQUEST_COLUMNS)
    # a run with no record (a peer's summary-only file) has object columns: as a mask, "ok" would pick columns
    requests["ok"] = requests["ok"].astype(bool)
    for col in ("ttft_s", "tpot_s", "e2e_s", "max_itl_s", "first_token_s", "end_s", "actual_send_s"):
        if col in requests:
            requests[col] = pd.to_numeric(requests[col], errors="coerce")
    return RunData(
        path,
        label,
        run_info,
        summary,
        records,
        requests,
        np.asarray(itl, dtype=np.float64),
        np.sort(np.asarray(token_times, dtype=np.float64)),
        None,
        None,
    )


def load_sweep(path: str | Path, label: str | None = None) -> Sweep:
    path = Path(path)
    dirs = point_dirs(path) if path.is_dir() else []
    if not dirs:
        raise ResultsError(f"{path}: no point-NNN-rate-R/ or point-NNN-concurrency-C/ sub-folders with results")
    statuses = read_statuses(path)
    left_out = [f"{d.name} ({statuses[d.name]})" for d in dirs if statuses.get(d.name, "completed") != "completed"]
    dirs = [d for d in dirs if statuses.get(d.name, "completed") == "completed"]
    if not dirs:
        raise ResultsError(f"{path}: no completed sweep point (sweep.json: {', '.join(left_out)}); rerun the sweep")
    points, kinds = [], set()
    for d in dirs:
        _, kind, value = parse_point_dir(d.name)
        kinds.add(kind)
        points.append(SweepPoint(value, load_run(d, label=f"{kind} {value:g}")))
    if len(kinds) > 1:
        raise ResultsError(f"{path}: mixes rate and concurrency points; a sweep varies one of them")
    points.sort(key=lambda p: p.offered_load)
    return Sweep(path, label or path.name, kinds.pop(), points, left_out)


def load_results(paths, labels: list[str] | None = None) -> tuple[list[RunData], list[Sweep]]:
    """Each path is a run folder or a sweep folder; labels (optional) name them in order."""
    labels = list(labels or [])
    if labels and len(labels) != len(paths):
        raise ResultsError(f"--label: got {len(labels)} labels for {len(paths)} results folders; give one per folder")
    runs, sweeps = [], []
    for i, p in enumerate(paths):
        p, label = Path(p), (labels[i] if labels else None)
        if find_peer_file(p) is not None:  # another tool's result file (reports/peers)
            runs.append(load_peer_run(p, label))
            continue
        if p.is_file():
            load_peer(p)  # no reader takes it: refused naming the closest tool and the keys it lacks
        if not p.is_dir():
            raise ResultsError(
                f"{p}: not a folder, nor a peer tool's result file; pass a results folder written by "
                f"`bench run --output`, or a result file of a tool docs/peers.md lists"
            )
        if is_run_dir(p):
            runs.append(load_run(p, label))
        else:
            sweeps.append(load_sweep(p, label))
    _unique_labels(runs + sweeps)
    return runs, sweeps


def _unique_labels(items) -> None:
    """Two folders named alike (a/run, b/run) get their parent's name in front, so plots tell them apart."""
    seen: dict[str, int] = {}
    for it in items:
        seen[it.label] = seen.get(it.label, 0) + 1
    for it in items:
        if seen[it.label] > 1:
            it.label = f"{it.path.parent.name}/{it.path.name}"


def _read_csv(path: Path) -> pd.DataFrame | None:
    if not path.is_file() or path.stat().st_size == 0:
        return None
    try:
        frame = pd.read_csv(path)
    except (ValueError, UnicodeDecodeError) as e:
        raise ResultsError(f"{path}: not a readable CSV ({e}); the run may have been cut while writing it") from None
    # samplers append some rows late (computed at stop), so order by time here
    return frame.sort_values("t_s", kind="stable").reset_index(drop=True) if len(frame) else None
