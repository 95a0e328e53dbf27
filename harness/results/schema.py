"""The results folder's files as typed models: run.json (RunInfo), summary.json (Summary), a line of requests.jsonl
(harness.results.folder.RequestRecord, a dataclass: its check is
results.validate_record), and the manifests of sweeps (sweep.json),
deployment candidates (candidates.json), repeats (repeats.json) and tune (tune.json).

These models are the one definition of what each file holds: ResultWriter validates run.json and summary.json
against them before writing, so a field added to a writer without its model fails the run's tests; docs/schema/
holds the JSON Schema generated from them (harness/results/schema_files.py, `bench schema --write`; tests/test_schema.py
fails when it drifts).

Closed sections (extra keys refused) are the ones this harness defines; open ones (`dict[str, Any]` or
extra="allow") hold what other code names: the engine's metrics by name, the resolved scenario (its own model,
harness/scenario/scenario.py), telemetry sources. Versioning rule (docs/schema/README.md): a field added as optional
raises the minor version; a field removed, renamed, retyped or made required raises the major.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

SCHEMA_VERSION = "1.0"
# what a folder written before the schema (no schema_version key) is read as
PRE_SCHEMA_VERSION = "0"


class Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")


Version = Field(PRE_SCHEMA_VERSION, description='the schema this file follows; "0": written before the schema')

# --- summary.json -----------------------------------------------------------------------------------


class Stats(Closed):
    """One latency's distribution in ms over the measured window; every value null when it had no sample."""

    mean: float | None
    std: float | None
    min: float | None
    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    p999: float | None
    max: float | None


class Requests(Closed):
    measured: int
    completed: int
    failed: int
    warmup: int


class Excluded(Closed):
    ramp_up: int
    drain: int


class Window(Closed):
    """The steady-state window (harness/metrics/steady_window.py); seconds from t0."""

    start_s: float
    end_s: float
    latency_sent_until_s: float
    trimmed: bool
    note: str
    steady_in_flight: float | None = None
    duration_s: float
    rule: str
    excluded: Excluded
    latency_requests: int


class Throughput(Closed):
    requests_per_s: float
    output_tokens_per_s: float
    total_tokens_per_s: float


class Goodput(Closed):
    requests_per_s: float
    fraction: float
    slo: dict[str, Any] = Field(description="the scenario's slo section as resolved (harness/scenario/scenario.py)")
    confidence: float | None = None  # with slo.confidence
    fraction_low: float | None = None


class Partial(Closed):
    requests: int
    output_tokens: int


class Concurrency(Closed):
    mean: float
    max: int


class Interval(Closed):
    """A percentile's confidence interval (harness/metrics/confidence.py); low/high/coverage null when not
    established."""

    established: bool
    samples: int
    samples_needed: int
    low: float | None = None
    high: float | None = None
    coverage: float | None = None


class Intervals(Closed):
    p50: Interval
    p90: Interval
    p99: Interval
    p999: Interval


class PercentileCI(Closed):
    confidence: float
    method: str
    ttft_ms: Intervals
    itl_ms: Intervals
    tpot_ms: Intervals
    e2e_ms: Intervals


class Finding(Open):
    """One diagnosis line (harness/metrics/diagnosis.py); a rule may add its numbers under its own keys."""

    rule: str
    severity: str
    message: str


class Validity(Closed):
    valid: bool
    reasons: list[str]
    thresholds: dict[str, Any]


Section = dict[str, Any] | None


class Summary(Closed):
    """summary.json: the measured requests summarized (harness/metrics.summarize), with the run's account of its
    client, the engine's counters, telemetry and the explanation (harness/metrics/explain.py). Written by `bench run`
    (harness/runs/run.py), a run a signal stopped (run.interrupted_summary) and `bench plan` (simulated: true)."""

    schema_version: str = Version
    requests: Requests
    failures: dict[str, int] = Field(description="failed measured requests by error_reason")
    window_s: float
    window: Window
    run_span_s: float
    throughput: Throughput
    goodput: Goodput
    output_tokens: int
    partial: Partial
    token_count_mismatches: int
    token_count_mismatch_tokens: int
    ttft_ms: Stats
    ttft_answer_ms: Stats
    reasoning_tokens: int
    itl_ms: Stats
    itl_chunk_ms: Stats
    tpot_ms: Stats
    e2e_ms: Stats
    schedule_lag_ms: Stats
    client_lag_ms: Stats
    event_loop_lag_ms: Stats
    concurrency: Concurrency
    percentile_ci: PercentileCI
    client_bound: bool
    client_bound_reasons: list[str]
    interrupted: bool
    incomplete: bool
    incomplete_reasons: list[str]
    lost_workers: list[Any]
    # a measured run's (not a signal's summary, some not a plan's)
    workers: int | None = None
    client_cpu_s: float | None = None
    token_count_method: str | None = None
    workers_needed: int | None = None
    workers_sizing: Section = None
    client_capacity_measured: Section = None
    interrupted_by: Literal["SIGINT", "SIGTERM"] | None = None
    engine_exited: str | None = None
    ray_nodes: list[dict[str, Any]] | None = Field(
        None, description="per Ray node: planned, recorded, completed, failed, lost"
    )
    stopped_early: Section = Field(None, description="harness/runs/early_stop.py's decision, when a watch stopped it")
    telemetry: Section = Field(None, description="derived telemetry figures (harness/engine/observers.py), by name")
    engine_counters: dict[str, float] | None = Field(None, description="engine counter deltas by metric name")
    phases_ms: Section = None
    prefix_cache: Section = None
    speculative: Section = None
    roofline: Section = None
    diagnosis: list[Finding] | None = None
    accuracy: Section = None
    validity: Validity | None = None  # a plan's summary has none
    simulated: bool | None = None  # bench plan
    plan: Section = Field(None, description="bench plan's step model, deployment and counts")


# --- run.json ---------------------------------------------------------------------------------------


class Host(Closed):
    hostname: str
    platform: str
    cpu_count: int | None
    machine: str


class Backend(Closed):
    kind: str
    model: str | None
    url: str | None = None  # a plan has none
    api: str | None = None
    launched: bool | None = None
    engine_version: str | None = None
    engine_pid: int | None = None
    simulated: bool | None = None


class Stamps(Closed):
    setting: str
    used: str
    why_not_kernel: str | None


class RunInfo(Closed):
    """run.json: what ran (resolved scenario, versions, host, engine) and how it was observed. `bench run` writes
    it before the load and again after it with the observers' status; `bench plan` writes it with simulated."""

    schema_version: str = Version
    scenario: dict[str, Any] = Field(description="the resolved scenario (harness/scenario/scenario.py's model)")
    versions: dict[str, str | None] = Field(description="harness, python and library versions by name")
    backend: Backend
    token_count_method: str
    tokenizer: str
    time_unit: str
    host: Host | None = None  # a plan's has none
    stamps: Stamps | None = None
    sampling: Section = None
    workers: int | None = None
    workers_sizing: Section = None
    startup: Section = None
    ray: Section = None
    simulated: bool | None = None
    # after the load: the observers' status (harness/engine/observers.py) and the clock
    profile: Section = None
    engine_trace: Section = None
    server_metrics: Section = None
    telemetry: Section = None
    t0_perf_counter_ns: int | None = None
    telemetry_t0_offset_s: float | None = None


# --- the manifests ----------------------------------------------------------------------------------


class SweepManifest(Closed):
    """sweep.json (harness/results.write_manifest): a sweep's points; each point's run folder is a run."""

    schema_version: str = Version
    kind: Literal["rate", "concurrency"]
    unit: str
    scenario: dict[str, Any]
    points: list[dict[str, Any]]


class CandidatesManifest(Closed):
    """candidates.json (harness/runs/candidates.py): each deployment candidate's run folder and status."""

    schema_version: str = Version
    scenario: dict[str, Any]
    candidates: list[dict[str, Any]]


class RepeatsManifest(Closed):
    """repeats.json (harness/runs/repeats.py): each repeat's status and the intervals across them."""

    schema_version: str = Version
    scenario: dict[str, Any]
    max_repeats: int
    until_ci: float | None
    confidence: float
    min_runs_to_stop: int
    method: str
    keep_invalid: bool
    stopped: str | None
    repeats: list[dict[str, Any]]
    metrics: dict[str, Any]


class TuneManifest(Closed):
    """tune.json (harness/tune_summary.tune_document): each configuration, each trial, the recommendation, cost."""

    schema_version: str = Version
    status: str
    kind: Literal["rate", "concurrency"]
    unit: str
    attainment: float
    slo: dict[str, Any]
    percentile_slo: dict[str, Any] | None
    method: str
    method_why: str
    configurations: list[dict[str, Any]]
    trials: list[dict[str, Any]]
    recommended: Section
    cost: dict[str, Any]
    scenario: dict[str, Any]


MODELS: dict[str, type[BaseModel]] = {
    "run.json": RunInfo,
    "summary.json": Summary,
    "sweep.json": SweepManifest,
    "candidates.json": CandidatesManifest,
    "repeats.json": RepeatsManifest,
    "tune.json": TuneManifest,
}


class SchemaError(ValueError):
    """A results file that does not match its model; the message names the file, the field and the fix."""


def checked(name: str, doc: dict) -> dict:
    """`doc` checked against the model of file `name` and stamped with the current schema_version (in place too,
    so the caller's copy is what the file holds); the stamped copy puts schema_version first."""
    doc["schema_version"] = SCHEMA_VERSION
    stamped = {"schema_version": SCHEMA_VERSION, **doc}
    validate(name, stamped)
    return stamped


def validate(name: str, doc: dict) -> BaseModel:
    """The model of results file `name` read from `doc`; SchemaError naming each field that does not fit."""
    try:
        return MODELS[name].model_validate(doc)
    except ValidationError as e:
        raise SchemaError(f"{name}: {field_errors(e)}") from None


def field_errors(e: ValidationError) -> str:
    return "; ".join(_field_error(err) for err in e.errors()[:8])


def _field_error(err: dict) -> str:
    where = ".".join(map(str, err["loc"])) or "(top)"
    if err["type"] != "extra_forbidden":
        return f"{where}: {err['msg']}"
    return f"{where}: {err['msg']} (add the field to harness/results/schema.py, then `bench schema --write`)"
