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
from pydantic import BaseModel

from harness.metrics.latencies import request_latency
from harness.results.folder import RequestRecord, ResultsError, read_model, read_records, versions
from harness.results.schema import RunInfo, ScenarioRecord, Stats, Summary, TokenCountRecord

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
        row["ttft_ms"] = lat.ttft_s * 1e3 if lat and lat.ttft_s is not None else None
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
        report = llmd_report(run_dir).model_dump(exclude_none=True)  # the report leaves out what it lacks
        out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
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


class Statistics(BaseModel):
    """A distribution as the report writes it (our latencies' Stats in its units)."""

    units: str
    mean: float
    stddev: float
    min: float
    p50: float
    p90: float
    p95: float
    p99: float
    p99p9: float
    max: float


class Quantiles(BaseModel):
    """A distribution the report computes from the records, at its quantiles."""

    units: str
    mean: float
    stddev: float
    min: float
    p0p1: float
    p1: float
    p5: float
    p10: float
    p25: float
    p50: float
    p75: float
    p90: float
    p95: float
    p99: float
    p99p9: float
    max: float


class Rate(BaseModel):
    units: str
    mean: float


class SequenceLength(BaseModel):
    distribution: str
    value: int | float
    std_dev: float | None = None
    min: float | None = None
    max: float | None = None


class RequestCounts(BaseModel):
    total: int
    failures: int
    input_length: Quantiles | None = None
    output_length: Quantiles | None = None


class Latency(BaseModel):
    time_to_first_token: Statistics | None = None
    time_per_output_token: Statistics | None = None
    inter_token_latency: Statistics | None = None
    request_latency: Statistics | None = None
    normalized_time_per_output_token: Quantiles | None = None


class TokenThroughput(BaseModel):
    output_token_rate: Rate
    total_token_rate: Rate
    input_token_rate: Rate
    request_rate: Rate


class Aggregate(BaseModel):
    requests: RequestCounts
    latency: Latency
    throughput: TokenThroughput


class RequestPerformance(BaseModel):
    aggregate: Aggregate


class Results(BaseModel):
    request_performance: RequestPerformance


class ReportTime(BaseModel):
    start: str
    end: str
    duration: str


class ReportRun(BaseModel):
    uid: str
    eid: str
    time: ReportTime
    description: str
    keywords: list[str]


class Metadata(BaseModel):
    label: str | None = None
    cfg_id: str


class Accelerator(BaseModel):
    model: str
    count: int
    parallelism: dict


class ModelName(BaseModel):
    name: str


class EngineStandardized(BaseModel):
    kind: str
    tool: str
    tool_version: str
    role: str
    replicas: int
    model: ModelName
    accelerator: Accelerator


class Native(BaseModel):
    config: dict


class Engine(BaseModel):
    metadata: Metadata
    standardized: EngineStandardized
    native: Native


class LoadStandardized(BaseModel):
    tool: str
    tool_version: str
    parallelism: int
    source: str
    input_seq_len: SequenceLength
    output_seq_len: SequenceLength | None = None
    rate_qps: float | None = None
    concurrency: int | None = None


class Load(BaseModel):
    metadata: Metadata
    standardized: LoadStandardized
    native: Native


class ReportScenario(BaseModel):
    stack: list[Engine]
    load: Load


class BenchmarkReport(BaseModel):
    """An llm-d Benchmark Report v0.2, as far as this harness fills it (a field it lacks, None, is left out)."""

    version: str
    run: ReportRun
    scenario: ReportScenario
    results: Results


def llmd_report(run_dir: Path) -> BenchmarkReport:
    """The run as a Benchmark Report v0.2: run identity and times, the engine and the load, and the measured
    window's aggregate request performance (latencies in s, as the report's example gives them)."""
    run: RunInfo | None = read_model(run_dir / "run.json")
    summary: Summary | None = read_model(run_dir / "summary.json")
    if summary is None:
        raise ResultsError(f"{run_dir}: no summary.json (the run did not finish); run it again")
    if run is None:
        raise ResultsError(f"{run_dir}: no run.json; pass what `bench run --output` wrote")
    records = [r for r in read_records(run_dir) if not r.is_warmup]
    return BenchmarkReport(
        version="0.2",
        run=_run_section(run_dir, run, summary),
        scenario=ReportScenario(stack=[_engine(run)], load=_load(run)),
        results=Results(request_performance=RequestPerformance(aggregate=_aggregate(summary, records))),
    )


def _run_section(run_dir: Path, run: RunInfo, summary: Summary) -> ReportRun:
    digest = hashlib.sha256((run_dir / "run.json").read_bytes() + (run_dir / "summary.json").read_bytes())
    end = datetime.fromtimestamp((run_dir / "summary.json").stat().st_mtime, timezone.utc)
    span_s = float(summary.run_span_s)
    start = end - timedelta(seconds=span_s)
    name = ScenarioRecord.model_validate(run.scenario).name or run_dir.name
    return ReportRun(
        uid=digest.hexdigest()[:32],
        eid=name,
        time=ReportTime(start=_iso(start), end=_iso(end), duration=f"PT{span_s}S"),
        description=f"llm-serving-bench run {run_dir.name} of scenario {name}",
        keywords=["llm-serving-bench", "simulated" if summary.simulated else "measured"],
    )


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _engine(run: RunInfo) -> Engine:
    backend = run.backend
    return Engine(
        metadata=Metadata(label=f"{backend.kind}-0", cfg_id=_cfg_id(backend.model_dump(exclude_unset=True))),
        standardized=EngineStandardized(
            kind="inference_engine",
            tool=backend.kind,
            tool_version=backend.engine_version or "unknown",
            role="replica",
            replicas=1,
            model=ModelName(name=backend.model or "unknown"),
            # the engine's device is not in run.json; the host machine is where the native engine ran
            accelerator=Accelerator(model=run.host.machine if run.host else "unknown", count=0, parallelism={}),
        ),
        native=Native(config=run.scenario["backend"]),
    )


def _cfg_id(config: dict) -> str:
    return hashlib.md5(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()  # noqa: S324 (an id)


def _load(run: RunInfo) -> Load:
    scenario = ScenarioRecord.model_validate(run.scenario)
    workload, load = scenario.workload, scenario.load
    standardized = LoadStandardized(
        tool="llm-serving-bench",
        tool_version=run.versions.get("harness") or versions()["harness"],
        parallelism=max(int(run.workers or 1), 1),
        source="random" if workload.kind == "random" else "sampled",
        input_seq_len=_seq_len(workload.input_tokens),
        output_seq_len=_seq_len(workload.output_tokens) if workload.output_tokens is not None else None,
        rate_qps=float(load.rate) if load.arrival != "closed" and load.rate else None,
        concurrency=int(load.concurrency) if load.concurrency else None,
    )
    metadata = Metadata(cfg_id=_cfg_id(run.scenario))
    return Load(metadata=metadata, standardized=standardized, native=Native(config=run.scenario))


def _seq_len(tokens: TokenCountRecord | int | None) -> SequenceLength:
    """A workload's token count (an int or a distribution) as the report's SequenceLength."""
    if not isinstance(tokens, TokenCountRecord):
        return SequenceLength(distribution="fixed" if tokens is not None else "other", value=tokens or 0)
    return SequenceLength(
        distribution=_DISTRIBUTIONS.get(tokens.dist, "other"),
        value=tokens.mean or 0,
        std_dev=tokens.std,
        min=tokens.min,
        max=tokens.max,
    )


def _aggregate(summary: Summary, records: list[RequestRecord]) -> Aggregate:
    done = [r for r in records if r.ok]
    lats = [lat for lat in map(request_latency, done) if lat is not None]
    requests = RequestCounts(total=summary.requests.measured, failures=summary.requests.failed)
    if done:
        requests.input_length = _quantiles([r.prompt_tokens for r in done], "count")
        requests.output_length = _quantiles([r.output_tokens for r in done], "count")
    # NTPOT: end-to-end latency over the output tokens, the first included (llm-d's definition)
    ntpot = [lat.e2e_s / r.output_tokens for r, lat in zip(done, lats) if r.output_tokens]
    latency = Latency(
        time_to_first_token=_stats(summary.ttft_ms, "s"),
        time_per_output_token=_stats(summary.tpot_ms, "s/token"),
        inter_token_latency=_stats(summary.itl_ms, "s/token"),
        request_latency=_stats(summary.e2e_ms, "s"),
        normalized_time_per_output_token=_quantiles(ntpot, "s/token") if lats else None,
    )
    tp = summary.throughput
    throughput = TokenThroughput(
        output_token_rate=Rate(units="tokens/s", mean=tp.output_tokens_per_s),
        total_token_rate=Rate(units="tokens/s", mean=tp.total_tokens_per_s),
        input_token_rate=Rate(units="tokens/s", mean=tp.total_tokens_per_s - tp.output_tokens_per_s),
        request_rate=Rate(units="queries/s", mean=tp.requests_per_s),
    )
    return Aggregate(requests=requests, latency=latency, throughput=throughput)


def _stats(stats_ms: Stats, units: str) -> Statistics | None:
    """summary.json's ms figures in seconds; None when the latency had no sample."""
    if stats_ms.mean is None:
        return None
    values = stats_ms.model_dump()
    return Statistics(units=units, **{theirs: values[ours] / 1e3 for ours, theirs in _STAT_NAMES.items()})


def _quantiles(values: list[float], units: str) -> Quantiles:
    arr = np.asarray(values, dtype=np.float64)
    quantiles = dict(zip(_QUANTILES, map(float, np.percentile(arr, list(_QUANTILES.values())))))
    return Quantiles(
        units=units,
        mean=float(arr.mean()),
        stddev=float(arr.std()),
        min=float(arr.min()),
        **quantiles,
        max=float(arr.max()),
    )
