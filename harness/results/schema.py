"""The results folder's files as typed models: run.json (RunInfo), summary.json (Summary), a line of requests.jsonl
(harness.results.folder.RequestRecord, a dataclass: its check is
results.validate_record), and the manifests of sweeps (sweep.json),
deployment candidates (candidates.json), repeats (repeats.json) and tune (tune.json).

These models are the one definition of what each file holds, and the values the harness passes around: summarize
returns the summary's first part (RequestFigures), the run fills the rest of its Summary where each part is known,
and the writer (harness/results/folder.write_json) writes the fields a writer set, checked against the model, so a
key a run never reached stays out of the file as it always did. docs/schema/ holds the JSON Schema generated from
them (harness/results/schema_files.py, `bench schema --write`; tests/test_schema.py fails when it drifts).

Closed sections (extra keys refused) are the ones this harness defines; open ones (`dict[str, Any]` or
extra="allow") hold what other code names: the engine's metrics by name, the resolved scenario (its own model,
harness/scenario/scenario.py), telemetry sources. Versioning rule (docs/schema/README.md): a field added as optional
raises the minor version; a field removed, renamed, retyped or made required raises the major.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# 1.1: a request's embedded_items and model, the summary's items_per_s and by_model; 1.2: a request's turn_kind and
# parent_session_id, the summary's by_turn_kind (agentic sessions); 1.3: a request's image_count and image_bytes, the
# summary's by_modality (workload.images)
SCHEMA_VERSION = "1.3"
# what a folder written before the schema (no schema_version key) is read as
PRE_SCHEMA_VERSION = "0"


class Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")


Version = Field(PRE_SCHEMA_VERSION, description='the schema this file follows; "0": written before the schema')

# --- summary.json: the measured requests (harness/metrics/latencies.py) ----------------------------


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
    # inputs embedded or documents scored per second (backend.api: embeddings, rerank); None: a generating API
    items_per_s: float | None = None


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


class ModelFigures(Closed):
    """One group of a run's requests: a side of a workload.mix (summary.json `by_model`) or a turn kind of an agentic
    workload (`by_turn_kind`): its requests, and its latencies over the run's own measured window (the requests of
    the group sent inside it), from each request's intended send time."""

    requests: int
    completed: int
    failed: int
    requests_per_s: float  # its completions inside the window, per second of the window
    ttft_ms: Stats
    itl_ms: Stats
    tpot_ms: Stats
    e2e_ms: Stats


class ModalityFigures(ModelFigures):
    """The text or the image requests of a run with workload.images (summary.json `by_modality`): a group's figures,
    with the prompt tokens the server's usage counted (a vision engine counts each image's tokens in them) and the
    images the group sent."""

    prompt_tokens_mean: float | None  # over its completed requests; null when none completed
    images: int
    image_bytes: int  # the image files' bytes (sent base64: 4/3 as many)


class RequestFigures(Closed):
    """The measured requests summarized (harness/metrics/latencies.summarize): summary.json's first part, the
    same for a measured, a stopped and a simulated run."""

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
    # workload.mix: each model's figures by name (a key only where the run had a mix)
    by_model: dict[str, ModelFigures] | None = None
    # workload.kind agentic: each turn kind's figures (user, tool_result, subagent, merge, subagent_task)
    by_turn_kind: dict[str, ModelFigures] | None = None
    # workload.images: the text and the image requests' figures apart (a key only where some request sent images)
    by_modality: dict[str, ModalityFigures] | None = None
    itl_ms: Stats
    itl_chunk_ms: Stats
    tpot_ms: Stats
    e2e_ms: Stats
    schedule_lag_ms: Stats
    client_lag_ms: Stats
    event_loop_lag_ms: Stats
    concurrency: Concurrency
    percentile_ci: PercentileCI


# --- summary.json: the run's account of its client, engine and verdict ------------------------------


class WorkersSizing(Closed):
    """What `workers: auto` took as one client process's share (harness/client/capacity.py), and its source."""

    source: str = Field(description='"measured" or "planning figure"')
    tokens_per_s_per_worker: int
    tokens_per_cpu_s: int | None = Field(description="measured on this machine; null for the planning figure")
    measurements: int
    file: str | None = Field(description="the client capacity file the measurements came from")
    describe: str


class CapacityMeasurement(Closed):
    """One run's measurement of its client (harness/client/capacity.record_capacity)."""

    tokens: int
    cpu_s: float
    tokens_per_cpu_s: float
    at: str = Field(description="UTC time, ISO 8601")
    run: str = Field(description="the run folder")


class StopDecision(Closed):
    """Why a watch stopped the load early (harness/runs/early_stop.py); counts of measured requests."""

    reason: str = Field(description="verdict_met | verdict_missed | over_saturated")
    passed: bool = Field(description="the point's verdict: does the load meet the SLOs?")
    detail: str
    after_requests: int = Field(description="measured records seen when it stopped")
    planned_requests: int
    at_s: float = Field(description="the run's clock when it stopped")
    met: int
    missed: int
    outstanding_per_s: float | None = Field(description="over_saturated: the growth of requests outstanding")
    ttft_s_per_s: float | None = Field(description="over_saturated: the growth of TTFT, s per s of sends")


class CpuSeconds(Closed):
    plan: float
    simulation: float


class PlanAccount(Closed):
    """bench plan's account of a simulated run (harness/plan/simulator.py)."""

    step_model: dict[str, Any] = Field(description="the step model's own description (harness/plan/step_model.py)")
    request_overhead_s: float
    deployment: dict[str, Any] = Field(description="the simulated deployment's scheduler settings")
    host: dict[str, Any] | None = None
    preemptions: int
    engine_steps: int
    fast_forwarded_steps: int
    sequence_steps: int
    cpu_s: CpuSeconds


class Telemetry(Open):
    """Derived telemetry figures over the measured window (harness/engine/telemetry/derived.py); each null where
    its inputs were not sampled, the whole section empty with telemetry off."""

    window_s: list[float] | None = None
    gpu_dram_active_mean: float | None = None
    gpu_tensor_active_mean: float | None = None
    gpu_energy_j: float | None = None
    energy_per_output_token_j: float | None = None
    engine_read_bytes_per_s: float | None = None
    engine_flops_per_s: float | None = None
    memory_bandwidth_ceiling_bytes_per_s: float | None = None
    memory_bandwidth_ceiling_source: str | None = None
    mbu: float | None = None
    dram_bandwidth_util_mean: float | None = None
    dram_bandwidth_util_source: str | None = None
    engine_cpu_percent_mean: float | None = None
    host_cpu_percent_mean: float | None = None
    engine_rss_bytes_max: float | None = None


class RayNodeCounts(Closed):
    """One Ray node's share of the load (harness/client/ray/shards.py): planned = completed + failed once the run
    has ended; run.json's `ray` has the node's clock beside them."""

    node_ip: str
    node_id: str
    planned: int
    recorded: int
    completed: int
    failed: int
    actor_lost_failures: int
    lost: str | None = Field(description="why the actor was lost; null: it was not")


class PhaseStats(Closed):
    """One part of the requests' time in ms; a part the engine's histograms gave has its mean only."""

    mean: float
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    max: float | None = None
    count: int | None = None


class TtftShare(Closed):
    """Each part's mean over the mean TTFT; `other`: what no part explains."""

    queue: float | None = None
    prefill: float | None = None
    client_lag: float | None = None
    concurrency_wait: float | None = None
    connect_send: float | None = None
    other: float | None = None


class Phases(Closed):
    """Where the requests' time went (harness/metrics/phases.py): the engine's phases and the client's parts."""

    requests: int | None = None
    source: str | None = Field(None, description="per request (the engine's timings) or per run (its histograms)")
    requests_with_engine_timings: int | None = None
    reason: str | None = Field(None, description="why the engine's phases are missing")
    queue: PhaseStats | None = None
    prefill: PhaseStats | None = None
    decode: PhaseStats | None = None
    client_lag: PhaseStats | None = None
    concurrency_wait: PhaseStats | None = None
    connect_send: PhaseStats | None = None
    ttft: PhaseStats | None = None
    ttft_share: TtftShare | None = None
    main_ttft_part: str | None = None


class PrefixCache(Closed):
    """The prefix cache over the measured window, from the engine's counters."""

    hit_rate: float
    hit_tokens: float
    queried_tokens: float
    source: str


class Speculative(Closed):
    """Speculative decoding over the measured window; empty without speculation."""

    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    acceptance_rate: float | None = None
    drafts: int | None = None
    mean_acceptance_length: float | None = None
    source: str | None = None


class Ceilings(Closed):
    """The roofline's two ceilings: measured on this CPU, or a GPU's published peaks."""

    source: str
    load_average: float | None = None
    cpu_count: int | None = None
    flops_per_s: float
    bytes_per_s: float
    ridge_flop_per_byte: float
    note: str | None = None


class RooflinePoint(Closed):
    """Where one kind of step sits against the ceilings (harness/metrics/roofline.place)."""

    bytes_per_s: float
    flops_per_s: float
    bandwidth_fraction: float
    compute_fraction: float
    intensity_flop_per_byte: float | None
    ridge_flop_per_byte: float
    seconds: float
    bound: Literal["memory", "compute"]
    steps: int | None = None


class GpuCounters(Closed):
    """What the GPU itself counted (NVML GPM / DCGM): shares of time its DRAM and tensor pipes were active."""

    dram_active: float
    tensor_active: float
    line: str


class Roofline(Closed):
    """The roofline placement (harness/metrics/roofline.py); `reason` alone when it cannot be placed."""

    reason: str | None = None
    ceilings: Ceilings | None = None
    basis: str | None = None
    points: dict[str, RooflinePoint] | None = Field(None, description="by step kind: decode, prefill, mixed, ...")
    hardware: GpuCounters | None = None
    line: str | None = None


class Finding(Open):
    """One diagnosis line (harness/metrics/diagnosis.py); `evidence`: the rule's numbers by name."""

    rule: str
    severity: Literal["critical", "warning", "info"]
    message: str
    evidence: dict[str, Any] = Field(default_factory=dict)


class Accuracy(Closed):
    """A known-answer task's accuracy (harness/scenario/answers.py) with its exact interval."""

    scored: int
    correct: int
    share: float
    low: float
    high: float
    confidence: float
    method: str


class Thresholds(Closed):
    """The limits the validity verdict judged by (harness/metrics/validity.py)."""

    max_failed_share: float
    max_token_mismatch_share: float
    required_percentiles: list[str]
    judged_latencies: list[str]
    min_window_e2e: float


class Validity(Closed):
    valid: bool
    reasons: list[str]
    thresholds: Thresholds


class Summary(RequestFigures):
    """summary.json: the measured requests summarized (harness/metrics/latencies.summarize), with the run's
    account of its client, the engine's counters, telemetry and the explanation (harness/metrics/explain.py).
    Written by `bench run` (harness/runs/run.py), a run a signal stopped (run.interrupted_summary) and
    `bench plan` (simulated: true). A key a run did not reach is left out (the writer writes the fields set)."""

    simulated: bool | None = None  # bench plan
    client_bound: bool
    client_bound_reasons: list[str]
    interrupted: bool
    # a measured run's (not a signal's summary, some not a plan's)
    workers: int | None = None
    client_cpu_s: float | None = None
    token_count_method: str | None = None
    workers_needed: int | None = None
    workers_sizing: WorkersSizing | None = None
    incomplete: bool
    incomplete_reasons: list[str]
    lost_workers: list[Any]
    interrupted_by: Literal["SIGINT", "SIGTERM"] | None = None
    engine_exited: str | None = None
    client_capacity_measured: CapacityMeasurement | None = None
    ray_nodes: list[RayNodeCounts] | None = None
    stopped_early: StopDecision | None = None
    plan: PlanAccount | None = Field(None, description="bench plan's step model, deployment and counts")
    telemetry: Telemetry | None = None
    engine_counters: dict[str, float] | None = Field(None, description="engine counter deltas by metric name")
    phases_ms: Phases | None = None
    prefix_cache: PrefixCache | None = None
    speculative: Speculative | None = None
    roofline: Roofline | None = None
    diagnosis: list[Finding] | None = None
    accuracy: Accuracy | None = None
    validity: Validity | None = None  # a plan's summary has none

    # --- run.json ---------------------------------------------------------------------------------------

    @classmethod
    def of_requests(cls, figures: RequestFigures, **account: Any) -> Summary:
        """A summary of the requests' `figures` whose run flagged nothing (not client-bound, interrupted or
        incomplete, no worker lost) where `account` does not say otherwise; `account`'s other fields are set too."""
        unflagged = {
            "client_bound": False,
            "client_bound_reasons": [],
            "interrupted": False,
            "incomplete": False,
            "incomplete_reasons": [],
            "lost_workers": [],
        }
        return cls(**dict(figures), **(unflagged | account))


class Host(Closed):
    hostname: str
    platform: str
    cpu_count: int | None
    machine: str


class Backend(Closed):
    kind: str
    url: str | None = None  # a plan has none
    model: str | None
    api: str | None = None
    launched: bool | None = None
    engine_version: str | None = None
    engine_pid: int | None = None
    simulated: bool | None = None


class Stamps(Closed):
    setting: str
    used: str
    why_not_kernel: str | None


class Sampling(Closed):
    """What the run sent to sample its answers (harness/scenario/sampling.py)."""

    fields: dict[str, Any] = Field(description="the sampling fields sent with every request")
    greedy: bool
    default: str


class FirstRequest(Closed):
    """The engine's first request (harness/engine/startup.first_request): the run that sent it, its latencies and
    the run's median TTFT beside them."""

    run: str = Field(description="the run folder's name")
    ok: bool
    ttft_ms: float | None = Field(None, description="null: no token came")
    e2e_ms: float | None = None
    run_median_ttft_ms: float | None = None


class Startup(Closed):
    """An engine bench launched: its start-up cost (harness/engine/startup.py). `first_request` joins it after the
    load of the run that sent the engine's first request; a sweep's later points carry the same block."""

    launch_to_ready_s: float
    engine_build_s: float | None = Field(None, description="the engine-build step its log reports; absent: none")
    first_request: FirstRequest | None = Field(None, description="null: no request was sent")


class RayNode(Closed):
    """One Ray node's client actor (harness/client/ray/shards.py): where it ran, its clock against the driver's
    (null before it was measured) and, after the load, its counts."""

    node_id: str
    node_ip: str
    pid: int | None
    host: str | None
    planned: int
    recorded: int
    completed: int
    failed: int
    actor_lost_failures: int
    lost: str | None = Field(description="why the actor was lost; null: it was not")
    clock_offset_s: float | None = Field(description="the actor's clock minus the driver's")
    clock_uncertainty_s: float | None = Field(description="the offset holds within ± this (half the min round trip)")
    round_trip_min_s: float | None
    cpu_s: float | None = Field(description="the actor process's CPU time over the run; null: it did not end well")


class RayClients(Closed):
    """run.json's `ray`: the Ray cluster the load was sent from, each node's clock and, after the load, counts."""

    address: str
    t0_wall_clock_ns: int | None = Field(description="the driver's wall clock at t0; null before the load")
    max_clock_uncertainty_s: float
    clock_method: str
    nodes: list[RayNode]


class ProfileStatus(Closed):
    """backend.profile: how the engine's profiler answered its start and stop requests."""

    start_http_status: int | None = Field(description="null: the request failed (see error)")
    error: str | None = Field(None, description="why the profiler did not start; then no stop request is sent")
    stop_http_status: int | None = None


class EngineTraceStatus(Closed):
    """backend.trace: whether engine_trace.json was written, and why not."""

    written: bool
    reason: str | None = None
    steps: int | None = None
    dropped: int | None = None


class ServerMetricsStatus(Closed):
    """The Prometheus scraper's account (harness/engine/server_metrics.py): server_metrics.csv's rows and why none."""

    sampled: bool
    url: str | None = None
    scrapes: int | None = None
    failures: int | None = None
    reason: str | None = Field(None, description="why nothing was sampled")
    last_error: str | None = Field(None, description="with some scrapes failed: the last failure")
    replicas: int | None = Field(None, description="a router's replicas, each scraped on its own page")
    replica_failures: int | None = None


class TelemetryStatus(Closed):
    """The telemetry recorder's account (harness/engine/telemetry/): the sources in telemetry.csv and why not others."""

    sampled: list[str]
    not_sampled: dict[str, str] = Field(description="why each source was not sampled, by source")
    errors: dict[str, str] = Field(description="a source's failed samples or stuck sampler, by source")


class TokenCountRecord(BaseModel):
    """A workload's token count as the resolved scenario writes it (harness/scenario/distributions.py)."""

    dist: str | None = None
    mean: float | None = None
    std: float | None = None
    min: float | None = None
    max: float | None = None


class BackendRecord(BaseModel):
    kind: str | None = None
    model: str | None = None
    tokenizer: str | None = None


class WorkloadRecord(BaseModel):
    kind: str | None = None
    input_tokens: TokenCountRecord | int | None = None
    output_tokens: TokenCountRecord | int | None = None
    prefix_tokens: int | None = None


class LoadRecord(BaseModel):
    arrival: str | None = None
    rate: float | None = None
    concurrency: int | None = None


class ScenarioRecord(BaseModel):
    """The resolved scenario as run.json records it (RunInfo.scenario), read back for the parts the harness's
    readers use. Leniently: its own model (harness/scenario/scenario.py) checks the machine it runs on, and an
    older run's scenario may lack what a newer one has."""

    name: str | None = None
    backend: BackendRecord = BackendRecord()
    workload: WorkloadRecord = WorkloadRecord()
    load: LoadRecord = LoadRecord()


class RunInfo(Closed):
    """run.json: what ran (resolved scenario, versions, host, engine) and how it was observed. `bench run` writes
    it before the load and again after it with the observers' status; `bench plan` writes it with simulated."""

    schema_version: str = Version
    scenario: dict[str, Any] = Field(description="the resolved scenario (harness/scenario/scenario.py's model)")
    versions: dict[str, str | None] = Field(description="harness, python and library versions by name")
    simulated: bool | None = None
    host: Host | None = None  # a plan's has none
    backend: Backend
    stamps: Stamps | None = None
    token_count_method: str
    tokenizer: str
    sampling: Sampling | None = None
    workers: int | None = None
    workers_sizing: WorkersSizing | None = None
    time_unit: str
    startup: Startup | None = None  # an engine bench launched
    ray: RayClients | None = None
    # after the load: the observers' status (harness/engine/observers.py) and the clock
    profile: ProfileStatus | None = None
    engine_trace: EngineTraceStatus | None = None
    server_metrics: ServerMetricsStatus | None = None
    telemetry: TelemetryStatus | None = None
    t0_perf_counter_ns: int | None = None
    telemetry_t0_offset_s: float | None = None


# --- the manifests ----------------------------------------------------------------------------------


class SweepPoint(Closed):
    index: int
    offered_load: float = Field(description="requests/s (rate sweep) or requests in flight (concurrency sweep)")
    dir: str
    status: str = Field(description="pending | running | completed | interrupted | failed")
    client_bound: bool


class SweepManifest(Closed):
    """sweep.json (harness/results/folder.write_manifest): a sweep's points; each point's run folder is a run."""

    schema_version: str = Version
    kind: Literal["rate", "concurrency"]
    unit: str
    scenario: dict[str, Any]
    points: list[SweepPoint]


class Candidate(Closed):
    name: str
    dir: str = Field(description="relative to the candidates folder")
    launch_args: list[str]
    accelerators: int
    status: str = Field(description="pending | running | completed | failed | interrupted")
    reason: str = Field(description="why it failed")
    client_bound: bool
    line: str | None = Field(None, description="the console's summary of it")


class CandidatesManifest(Closed):
    """candidates.json (harness/runs/candidates.py): each deployment candidate's run folder and status."""

    schema_version: str = Version
    scenario: dict[str, Any]
    candidates: list[Candidate]


class Repeat(Closed):
    index: int
    dir: str
    seed: int
    status: str = Field(description="pending | running | completed | interrupted | failed")
    valid: bool | None
    reasons: list[str] = Field(description="the validity verdict's, when invalid")


class MeanInterval(Closed):
    """One headline figure's mean across the runs with its Student t interval (harness/metrics/across_runs.py);
    the interval's fields null with fewer than 2 runs."""

    unit: str
    n: int
    values: list[float]
    mean: float | None
    std: float | None
    t_critical: float | None
    half_width: float | None
    low: float | None
    high: float | None
    relative_half_width: float | None


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
    repeats: list[Repeat]
    metrics: dict[str, MeanInterval] = Field(description="by summary.json path: throughput.requests_per_s, ...")


class TuneCapacity(Closed):
    """A configuration's capacity from its search (harness/tune/tune.py): where the line between the bracket's
    two attainments crosses the target; `error` alone when bench plan could not predict it."""

    offered_load: float | None
    status: str | None = Field(None, description="bracketed | at_least | none | budget")
    bracket: list[float | None] | None = None
    bracket_runs_passed: list[list[bool] | None] | None = Field(None, description="each end's runs, in order")
    requests_per_s: float | None = None
    points: int | None = None
    error: str | None = None


class TuneConfiguration(Closed):
    name: str
    setting: dict[str, Any] = Field(description="tune.space's values for this configuration, by flag")
    launch_args: list[str]
    accelerators: int
    status: str = Field(description="pending | running | completed | failed | interrupted | pruned | budget")
    reason: str
    engine_start_s: float
    capacity: TuneCapacity | None
    predicted: TuneCapacity | None = Field(description="with a plan: block, the search on bench plan's simulation")


class PercentileBound(Closed):
    """tune.percentile_slo's bound against a point's measured percentile (harness/scenario/tuning.py)."""

    limit_ms: float
    measured_ms: float | None
    met: bool


class TuneTrial(Closed):
    config: str
    seq: int = Field(description="its place in the configuration's search, probe first")
    kind: str = Field(description="probe | point")
    offered_load: float
    dir: str = Field(description="relative to the tune folder")
    status: str = Field(description="pending | running | completed | failed | interrupted")
    passed: bool | None
    goodput_fraction: float | None
    requests: int
    requests_per_s: float
    completion_per_s: float | None = None
    output_tokens_per_s: float
    output_tokens_per_s_per_accelerator: float
    tokens_per_s_per_user: float | None
    wall_s: float
    stopped_early: StopDecision | None
    seconds_saved: float | None
    client_bound: bool
    prefix_cache: str
    percentiles: dict[str, PercentileBound] | None
    reason: str
    repeat: int
    met: int
    judged: int


class Recommendation(Closed):
    """The configuration with the highest capacity, and by how much it leads the next one."""

    name: str
    launch_args: list[str]
    capacity: float
    bracket: list[float | None]
    next: str | None
    margin: float | None
    separated: bool | None = Field(description="the two brackets apart: the ranking holds whatever lies in them")


class SearchCost(Closed):
    runs: int
    repeats: int
    requests: int
    minutes: float
    seconds_saved_by_early_stops: float


class DenseCost(Closed):
    points_per_configuration: int
    runs: int
    requests: int
    minutes_at_least: float


class TuneCost(Closed):
    search: SearchCost
    dense_sweep: DenseCost


class TuneManifest(Closed):
    """tune.json (harness/tune/summary.tune_document): each configuration, each trial, the recommendation, cost."""

    schema_version: str = Version
    status: str
    kind: Literal["rate", "concurrency"]
    unit: str
    attainment: float
    slo: dict[str, Any]
    percentile_slo: dict[str, Any] | None
    method: str
    method_why: str
    configurations: list[TuneConfiguration]
    trials: list[TuneTrial]
    recommended: Recommendation | None
    cost: TuneCost
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
