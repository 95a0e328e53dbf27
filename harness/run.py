"""One run of a scenario as a pipeline of small steps; the CLI and sweeps call `run_scenario`.

results folder -> engine session (launch, probe) -> token counts -> plan -> client processes ->
run.json -> load (with telemetry, server metrics, the engine watched) -> summary.json.
Problems are raised as typed errors (ScenarioError, ResultsError, BackendUnreachable,
TokenizerError) for the caller to print; what a finished run found (interrupted, engine died,
most requests failed, client-bound) is in the RunResult.
"""

from __future__ import annotations

import asyncio
import os
import signal
from contextlib import ExitStack, closing
from dataclasses import dataclass, field
from pathlib import Path

from harness.answers import accuracy
from harness.client_capacity import ClientCapacity, load_capacity, record_capacity
from harness.explain import explain
from harness.launcher import LaunchedBackend
from harness.metrics import client_bound_reasons, summarize
from harness.observers import RunObservers
from harness.ray_shards import start_crew
from harness.results import ResultWriter, host_info, read_records, versions
from harness.runner import Target, run_async, t0_ahead_ns
from harness.sampling import sampling_info
from harness.scenario import Scenario, ScenarioError
from harness.server_metrics import counter_deltas, counter_resets
from harness.session import EngineSession, engine_session
from harness.stamped_http import choose_stamps
from harness.startup import first_request
from harness.tokenizer_source import resolve_tokenizer
from harness.validity import run_validity
from harness.workers import resolve_workers, run_plan, workers_needed
from harness.workload import build_plan

MIN_COMPLETED_SHARE = 0.5  # a run where fewer measured requests completed is a failed run (exit 4)
ENGINE_WATCH_S = 0.25


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would raise KeyboardInterrupt, so both unwind the same way."""


def raise_on_sigterm() -> None:
    """From now on SIGTERM unwinds like Ctrl-C (engines stopped, files closed) instead of killing bench."""

    def handler(signum, frame):
        raise Terminated()

    signal.signal(signal.SIGTERM, handler)


class Reporter:
    """What the pipeline says while it runs. This one keeps the lines (tests read them); the CLI prints."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, text: str) -> None:
        self.lines.append(text)

    def warning(self, text: str) -> None:
        self.lines.append(f"warning: {text}")

    def start_requests(self, total: int) -> None:
        pass

    def request_done(self, record) -> None:
        pass

    def end_requests(self) -> None:
        pass


@dataclass
class RunResult:
    out_dir: Path
    summary: dict
    run_info: dict
    warnings: list[str] = field(default_factory=list)

    @property
    def interrupted_by(self) -> str | None:
        """ "SIGINT" or "SIGTERM" when a signal cut the load short."""
        return self.summary.get("interrupted_by") if self.summary["interrupted"] else None

    @property
    def engine_exit(self) -> str | None:
        return self.summary.get("engine_exited")

    @property
    def completed_share(self) -> float:
        req = self.summary["requests"]
        return req["completed"] / req["measured"] if req["measured"] else 0.0

    @property
    def mostly_failed(self) -> bool:
        return self.completed_share < MIN_COMPLETED_SHARE

    @property
    def incomplete_reasons(self) -> list[str]:
        """Why records are missing (a lost worker, a short single-process run); empty when none are."""
        return self.summary.get("incomplete_reasons", []) if self.summary.get("incomplete") else []

    @property
    def client_bound(self) -> bool:
        return bool(self.summary["client_bound"])


def run_scenario(
    scenario: Scenario,
    out_dir: str | Path,
    *,
    workers: str | None = None,
    session: EngineSession | None = None,
    overwrite: bool = False,
    reporter: Reporter | None = None,
    watch=None,
) -> RunResult:
    """Runs one scenario into out_dir. `session`: an engine already started and probed (a sweep's),
    used as is and left running; without one, the scenario's engine is started (or probed) and stopped.
    `watch` (harness.early_stop.PointWatch): sees each record and may stop the load early; its decision
    is the summary's `stopped_early`."""
    reporter = reporter or Reporter()
    writer = ResultWriter(out_dir, overwrite)  # refuses a folder holding a run before anything starts
    try:
        with ExitStack() as cleanup:  # undone in reverse: Ray's client actors, the engine, the results file
            cleanup.callback(writer.close)
            if session is None:
                session = cleanup.enter_context(engine_session(scenario, writer.dir / "engine.log", reporter.info))
            return _run(scenario, writer, session, workers, reporter, cleanup, watch)
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM before the load began (launch, planning), or after it
        if not (writer.dir / "summary.json").exists():  # the README's exit codes promise a summary
            writer.write_summary(
                interrupted_summary(writer.dir, scenario, "SIGTERM" if isinstance(stop, Terminated) else "SIGINT")
            )
        raise


def interrupted_summary(run_dir: Path, scenario: Scenario, signal_name: str) -> dict:
    """The summary of a run a signal stopped outside its load: of the records on disk (none when the engine was
    still starting), with `interrupted: true`."""
    summary = summarize(read_records(run_dir), scenario.slo.model_dump(), trim=trims(scenario))
    summary.update(
        interrupted=True,
        interrupted_by=signal_name,
        client_bound=False,
        client_bound_reasons=[],
        incomplete=False,
        incomplete_reasons=[],
        lost_workers=[],
    )
    summary["validity"] = run_validity(summary)
    return summary


def _run(
    scenario: Scenario,
    writer: ResultWriter,
    session: EngineSession,
    workers: str | None,
    reporter: Reporter,
    cleanup: ExitStack,
    watch=None,
) -> RunResult:
    backend, load, engine, url = scenario.backend, scenario.load, session.engine, session.url
    warnings: list[str] = []
    if scenario.workload.ignore_eos and not engine.forces_length:
        warnings.append(
            f"workload.ignore_eos: {engine.name} cannot force the output length; answers may be "
            f"shorter than planned (records show the server's count)"
        )
    tokenizer = resolve_tokenizer(scenario, url, warnings)
    plan = build_plan(scenario, tokenizer)
    if watch is not None:
        watch.begin(plan.requests)
    warnings += plan.warnings
    if plan.token_count_method == "approximate":
        warnings.append(
            "prompt lengths are approximate (about one token per word): the engine has no /tokenize and "
            "no local tokenizer is known; set backend.tokenizer to a GGUF file, a Hugging Face "
            "tokenizer folder or name for exact counts"
        )
    else:
        reporter.info(f"prompt lengths counted by {tokenizer.name} ({plan.token_count_method})")
    try:
        stamps, stamps_fallback = choose_stamps(backend.stamps, url)
    except ValueError as e:
        raise ScenarioError(str(e)) from None
    capacity = load_capacity(stamps, warnings)  # this machine's client, measured by earlier runs
    try:
        n_workers = resolve_workers(
            workers or load.workers, plan.requests, load.concurrency, plan.duration_s, os.cpu_count() or 1, capacity
        )
    except ValueError as e:
        raise ScenarioError(str(e)) from None
    if (workers or load.workers) == "auto" and not load.ray:
        reporter.info(f"workers: auto chose {n_workers} client process(es) ({capacity.describe()})")
    crew = None
    if load.ray:  # one client actor per node; refused here when a node's clock is not known well enough
        crew = cleanup.enter_context(
            closing(start_crew(load.ray, plan.requests, load.concurrency, load.ray_max_clock_uncertainty_ms))
        )
        n_workers = len(crew.shards)
    launched = session.launched
    target = Target(
        url,
        backend.api,
        backend.model,
        backend.request_timeout_s,
        dict(backend.headers),
        scenario.workload.ignore_eos,
        backend.kind,
        tuple(backend.eos_token_ids),
        backend.max_response_bytes,
        backend.stamps,
        scenario.workload.sampling.fields(),
        dict(backend.extra_body),
        scenario.workload.record_outputs,
    )
    if stamps_fallback and backend.stamps == "auto":
        reporter.info(f"token times from the event loop, not the kernel: {stamps_fallback}")
    run_info = {
        "scenario": scenario.resolved_dict(),
        "versions": versions(),
        "host": host_info(),
        "backend": {
            "kind": backend.kind,
            "url": url,
            "model": backend.model,
            "api": backend.api,
            "launched": launched is not None,
            "engine_version": engine.version(url, backend.headers),
            "engine_pid": launched.pid if launched else None,
        },
        "stamps": {"setting": backend.stamps, "used": stamps, "why_not_kernel": stamps_fallback},
        "token_count_method": plan.token_count_method,
        "tokenizer": tokenizer.name,
        "sampling": sampling_info(scenario.workload.sampling),
        "workers": n_workers,
        "workers_sizing": sizing_info(capacity),
        "time_unit": "seconds from t0 (perf_counter_ns)",
    }
    if launched is not None:
        run_info["startup"] = dict(launched.startup)  # first_request joins it after the load
    if crew:
        run_info["ray"] = crew.describe()
    writer.write_run_info(run_info)
    # t0 is fixed before the run so telemetry and server metrics share the requests' clock
    t0_ns = t0_ahead_ns(n_workers, spawn=crew is None, connect=True)
    observers = RunObservers(scenario, engine, url, launched, t0_ns, writer.dir)
    warnings += observers.start()
    for warning in warnings:
        reporter.warning(warning)
    try:
        outcome, stopped_by = run_async(
            _load(plan, target, load.concurrency, n_workers, writer, reporter, t0_ns, launched, crew, watch)
        )
    finally:
        run_info.update(observers.stop())
    run_info["t0_perf_counter_ns"] = outcome.t0_ns
    if outcome.t0_ns != t0_ns:
        run_info["telemetry_t0_offset_s"] = (outcome.t0_ns - t0_ns) / 1e9  # workers started late
    if crew:
        run_info["ray"] = crew.describe()  # now with each node's counts
        for line in crew.lost_lines():
            reporter.warning(line)
            warnings.append(line)
    if launched is not None:
        if "first_request" not in launched.startup:  # this run sent the engine's first request
            launched.startup["first_request"] = first_request(outcome.records, writer.dir.name)
        run_info["startup"] = dict(launched.startup)
    writer.write_run_info(run_info)
    summary = summarize(outcome.records, scenario.slo.model_dump(), outcome.loop_lag_s, trims(scenario))
    reasons = client_bound_reasons(summary)
    summary.update(
        client_bound=bool(reasons),
        client_bound_reasons=reasons,
        interrupted=outcome.interrupted,
        workers=n_workers,
        client_cpu_s=outcome.client_cpu_s,
        token_count_method=plan.token_count_method,
        workers_needed=workers_needed(plan.requests, load.concurrency, plan.duration_s, capacity),
        workers_sizing=sizing_info(capacity),
        **outcome.completeness(),
    )
    if stopped_by in ("SIGINT", "SIGTERM"):
        summary["interrupted_by"] = stopped_by
    elif stopped_by:
        summary["engine_exited"] = stopped_by
    if crew:  # Ray's client processes ran on other machines: no measurement of this one's client
        summary["ray_nodes"] = crew.node_counts()
    else:
        late: list[str] = []
        summary["client_capacity_measured"] = record_capacity(
            stamps,
            capacity_tokens(outcome, summary),
            outcome.client_cpu_s,
            summary["run_span_s"],  # the client's CPU ran over the whole run, not only the measured window
            str(writer.dir),
            late,
        )
        for line in late:
            reporter.warning(line)
            warnings.append(line)
    if watch is not None and watch.decision is not None:
        summary["stopped_early"] = watch.decision.as_dict()
    summary["telemetry"] = observers.derived(outcome)
    summary["engine_counters"] = counter_deltas(writer.dir / "server_metrics.csv")
    summary.update(
        explain(
            summary,
            outcome.records,
            writer.dir,
            observers.engine_steps(outcome),
            scenario.resolved_dict(),
            (outcome.t0_ns - t0_ns) / 1e9,
        )
    )  # phases_ms, prefix_cache, speculative, ...
    summary["accuracy"] = accuracy(outcome.records, scenario.slo.confidence or 0.95)
    summary["validity"] = run_validity(summary, counter_resets(writer.dir / "server_metrics.csv"))
    writer.write_summary(summary)
    return RunResult(writer.dir, summary, run_info, warnings)


def trims(scenario: Scenario) -> bool:
    """Whether the summary measures the steady-state window only (load.trim; unset means yes)."""
    return scenario.load.trim is not False


def capacity_tokens(outcome, summary: dict) -> int:
    """The tokens a run's client measurably streamed: those of its completed requests (their counts were checked
    against the limits), and only from a valid, complete run; 0 (nothing to record) for any other run. A failed
    request's count is the server's word, unchecked: a server claiming 1e12 tokens once sized every later run."""
    req = summary["requests"]
    if (
        summary["interrupted"]
        or summary.get("engine_exited")
        or summary["incomplete"]
        or not req["measured"]
        or req["completed"] / req["measured"] < MIN_COMPLETED_SHARE
    ):
        return 0
    return sum(r.output_tokens for r in outcome.records if r.ok)


def sizing_info(capacity: ClientCapacity) -> dict:
    """What `workers: auto` took as one client process's share, and where that figure came from."""
    return {
        "source": capacity.source,
        "tokens_per_s_per_worker": round(capacity.tokens_per_s_per_worker),
        "tokens_per_cpu_s": capacity.tokens_per_cpu_s and round(capacity.tokens_per_cpu_s),
        "measurements": capacity.measurements,
        "file": capacity.file,
        "describe": capacity.describe(),
    }


async def _load(
    plan,
    target: Target,
    concurrency,
    n_workers: int,
    writer: ResultWriter,
    reporter: Reporter,
    t0_ns: int,
    launched: LaunchedBackend | None,
    crew=None,
    watch=None,
):
    """Sends the plan; SIGINT, SIGTERM or the launched engine's exit stop it. Returns (outcome, what stopped it)."""
    stop = asyncio.Event()
    stopped_by: list[str] = []

    def stop_for(reason: str) -> None:
        stopped_by.append(reason)
        stop.set()

    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        loop.add_signal_handler(sig, stop_for, sig.name)

    async def watch_engine():
        while not stop.is_set():
            message = launched.exit_message()
            if message:
                stop_for(message)
                return
            await asyncio.sleep(ENGINE_WATCH_S)

    watcher = asyncio.create_task(watch_engine()) if launched else None

    def on_record(rec) -> None:
        writer.append(rec)
        reporter.request_done(rec)
        if watch is not None and not stop.is_set() and watch.observe(rec):
            stop.set()  # an early stop: no signal, no engine exit, so stopped_by stays empty

    reporter.start_requests(len(plan.requests))
    try:
        outcome = await run_plan(
            plan.requests, target, concurrency, n_workers, on_record, stop, plan.duration_s, t0_ns=t0_ns, crew=crew
        )
    finally:
        reporter.end_requests()
        if watcher:
            watcher.cancel()
        for sig, handler in previous.items():
            loop.remove_signal_handler(sig)
            if handler is not None:  # remove_signal_handler leaves the default, not what was there
                signal.signal(sig, handler)
    return outcome, (stopped_by[0] if stopped_by else None)
