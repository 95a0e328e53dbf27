"""`bench export RUN_DIR`: a run's records as one flat table (CSV, Parquet) and the run as an llm-d Benchmark
Report v0.2 (the schema of llm-d/llm-d-benchmark's llmdbenchmark/analysis/benchmark_report/schema_v0_2.py and
br_v0_2_json_schema.json beside it; docs/schema/README.md)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import fields
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from harness.metrics.latencies import request_latency
from harness.results.folder import RequestRecord, ResultsError, read_json, read_records, versions

FORMATS = ("csv", "parquet", "llm-d")
LIST_FIELDS = {f.name for f in fields(RequestRecord) if f.type.startswith("list")}
PARQUET_FIX = "Parquet needs pyarrow: pip install 'llm-serving-bench[parquet]' (or pip install pyarrow)"


def records_table(run_dir: Path) -> pd.DataFrame:
    """One row per request: every record field (lists as JSON text, server_timings as server_timings.NAME
    columns) and its latencies in ms (ttft_ms, tpot_ms, e2e_ms; empty for a failed request)."""
    rows = []
    for rec in read_records(run_dir):
        row = {k: json.dumps(v) if k in LIST_FIELDS else v for k, v in vars(rec).items() if k != "server_timings"}
        row |= {f"server_timings.{k}": v for k, v in rec.server_timings.items()}
        lat = request_latency(rec)
        row["ttft_ms"] = lat.ttft_s * 1e3 if lat else None
        row["tpot_ms"] = lat.tpot_s * 1e3 if lat and lat.tpot_s is not None else None
        row["e2e_ms"] = lat.e2e_s * 1e3 if lat else None
        rows.append(row)
    return pd.DataFrame(rows)


def export(run_dir: Path, fmt: str, out: Path | None = None) -> Path:
    """Writes the export beside the run (records.csv, records.parquet, llm-d_report_v0.2.json) or at `out`."""
    run_dir = Path(run_dir)
    if not (run_dir / "requests.jsonl").is_file():
        raise ResultsError(f"RUN_DIR: {run_dir} holds no requests.jsonl; pass what `bench run --output` wrote")
    if fmt == "llm-d":
        out = out or run_dir / "llm-d_report_v0.2.json"
        out.write_text(json.dumps(llmd_report(run_dir), indent=2) + "\n", encoding="utf-8")
    elif fmt == "csv":
        out = out or run_dir / "records.csv"
        records_table(run_dir).to_csv(out, index=False)
    elif fmt == "parquet":
        try:
            import pyarrow  # noqa: F401  (pandas' Parquet engine)
        except ImportError:
            raise ResultsError(f"--format parquet: {PARQUET_FIX}; or use --format csv") from None
        out = out or run_dir / "records.parquet"
        records_table(run_dir).to_parquet(out, index=False)
    else:
        raise ResultsError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    return out


# --- llm-d Benchmark Report v0.2 --------------------------------------------------------------------

# our Stats keys -> the report's Statistics keys
_STAT_NAMES = {"mean": "mean", "std": "stddev", "min": "min", "p50": "p50", "p90": "p90", "p95": "p95"}
_STAT_NAMES |= {"p99": "p99", "p999": "p99p9", "max": "max"}
_QUANTILES = {"p0p1": 0.1, "p1": 1, "p5": 5, "p10": 10, "p25": 25, "p50": 50, "p75": 75, "p90": 90}
_QUANTILES |= {"p95": 95, "p99": 99, "p99p9": 99.9}
_DISTRIBUTIONS = {"fixed": "fixed", "uniform": "uniform", "normal": "gaussian"}  # others are "other"


def llmd_report(run_dir: Path) -> dict:
    """The run as a Benchmark Report v0.2: run identity and times, the engine and the load, and the measured
    window's aggregate request performance (latencies in s, as the report's example gives them)."""
    run, summary = read_json(run_dir / "run.json"), read_json(run_dir / "summary.json")
    if not summary:
        raise ResultsError(f"{run_dir}: no summary.json (the run did not finish); run it again")
    records = [r for r in read_records(run_dir) if not r.is_warmup]
    return {
        "version": "0.2",
        "run": _run_section(run_dir, run, summary),
        "scenario": {"stack": [_engine(run)], "load": _load(run)},
        "results": {"request_performance": {"aggregate": _aggregate(summary, records)}},
    }


def _run_section(run_dir: Path, run: dict, summary: dict) -> dict:
    digest = hashlib.sha256((run_dir / "run.json").read_bytes() + (run_dir / "summary.json").read_bytes())
    end = datetime.fromtimestamp((run_dir / "summary.json").stat().st_mtime, timezone.utc)
    span_s = float(summary.get("run_span_s") or 0.0)
    start = end - timedelta(seconds=span_s)
    name = run.get("scenario", {}).get("name", run_dir.name)
    return {
        "uid": digest.hexdigest()[:32],
        "eid": name,
        "time": {"start": _iso(start), "end": _iso(end), "duration": f"PT{span_s}S"},
        "description": f"llm-serving-bench run {run_dir.name} of scenario {name}",
        "keywords": ["llm-serving-bench", "simulated" if summary.get("simulated") else "measured"],
    }


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _engine(run: dict) -> dict:
    backend = run.get("backend", {})
    return {
        "metadata": {"label": f"{backend.get('kind', 'engine')}-0", "cfg_id": _cfg_id(backend)},
        "standardized": {
            "kind": "inference_engine",
            "tool": backend.get("kind", "unknown"),
            "tool_version": backend.get("engine_version") or "unknown",
            "role": "replica",
            "replicas": 1,
            "model": {"name": backend.get("model") or "unknown"},
            # the engine's device is not in run.json; the host machine is where the native engine ran
            "accelerator": {"model": run.get("host", {}).get("machine", "unknown"), "count": 0, "parallelism": {}},
        },
        "native": {"config": run.get("scenario", {}).get("backend", {})},
    }


def _cfg_id(config: dict) -> str:
    return hashlib.md5(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()  # noqa: S324 (an id)


def _load(run: dict) -> dict:
    scenario = run.get("scenario", {})
    workload, load = scenario.get("workload", {}), scenario.get("load", {})
    standardized = {
        "tool": "llm-serving-bench",
        "tool_version": run.get("versions", {}).get("harness") or versions()["harness"],
        "parallelism": max(int(run.get("workers") or 1), 1),
        "source": "random" if workload.get("kind") == "random" else "sampled",
        "input_seq_len": _seq_len(workload.get("input_tokens")),
    }
    if workload.get("output_tokens") is not None:
        standardized["output_seq_len"] = _seq_len(workload["output_tokens"])
    if load.get("arrival") != "closed" and load.get("rate"):
        standardized["rate_qps"] = float(load["rate"])
    if load.get("concurrency"):
        standardized["concurrency"] = int(load["concurrency"])
    return {"metadata": {"cfg_id": _cfg_id(scenario)}, "standardized": standardized, "native": {"config": scenario}}


def _seq_len(tokens) -> dict:
    """A workload's token count (an int or a {dist, mean, std, min, max}) as the report's SequenceLength."""
    if not isinstance(tokens, dict):
        return {"distribution": "fixed" if tokens is not None else "other", "value": tokens or 0}
    out = {"distribution": _DISTRIBUTIONS.get(tokens.get("dist"), "other"), "value": tokens.get("mean") or 0}
    for ours, theirs in (("std", "std_dev"), ("min", "min"), ("max", "max")):
        if tokens.get(ours) is not None:
            out[theirs] = tokens[ours]
    return out


def _aggregate(summary: dict, records: list[RequestRecord]) -> dict:
    done = [r for r in records if r.ok]
    lats = [lat for lat in map(request_latency, done) if lat is not None]
    req = summary["requests"]
    requests = {"total": req["measured"], "failures": req["failed"]}
    if done:
        requests["input_length"] = _quantiles([r.prompt_tokens for r in done], "count")
        requests["output_length"] = _quantiles([r.output_tokens for r in done], "count")
    latency = {
        "time_to_first_token": _stats(summary.get("ttft_ms"), "s"),
        "time_per_output_token": _stats(summary.get("tpot_ms"), "s/token"),
        "inter_token_latency": _stats(summary.get("itl_ms"), "s/token"),
        "request_latency": _stats(summary.get("e2e_ms"), "s"),
        # NTPOT: end-to-end latency over the output tokens, the first included (llm-d's definition)
        "normalized_time_per_output_token": _quantiles(
            [lat.e2e_s / r.output_tokens for r, lat in zip(done, lats) if r.output_tokens], "s/token"
        )
        if lats
        else None,
    }
    tp = summary["throughput"]
    throughput = {
        "output_token_rate": {"units": "tokens/s", "mean": tp["output_tokens_per_s"]},
        "total_token_rate": {"units": "tokens/s", "mean": tp["total_tokens_per_s"]},
        "input_token_rate": {"units": "tokens/s", "mean": tp["total_tokens_per_s"] - tp["output_tokens_per_s"]},
        "request_rate": {"units": "queries/s", "mean": tp["requests_per_s"]},
    }
    return {
        "requests": requests,
        "latency": {k: v for k, v in latency.items() if v is not None},
        "throughput": throughput,
    }


def _stats(stats_ms: dict | None, units: str) -> dict | None:
    """summary.json's ms figures in seconds; None when the latency had no sample."""
    if not stats_ms or stats_ms.get("mean") is None:
        return None
    return {"units": units} | {theirs: stats_ms[ours] / 1e3 for ours, theirs in _STAT_NAMES.items()}


def _quantiles(values: list[float], units: str) -> dict:
    arr = np.asarray(values, dtype=np.float64)
    out = {"units": units, "mean": float(arr.mean()), "stddev": float(arr.std()), "min": float(arr.min())}
    out |= {k: float(v) for k, v in zip(_QUANTILES, np.percentile(arr, list(_QUANTILES.values())))}
    return out | {"max": float(arr.max())}
