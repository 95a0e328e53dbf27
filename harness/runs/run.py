"""One run of a scenario as a pipeline of named steps (RunSteps); the CLI and sweeps call `run_scenario`.

results folder -> engine session (launch, wait until ready) -> token counts and request schedule
(schedule_requests) -> where the load is sent from (choose_load_site: this process, worker processes or Ray
actors, harness/client/load_site.py) ->
run.json (write_run_info) -> load, with telemetry, server metrics, the engine watched, and the run watched live when
the reporter asks (reporter.live, harness/runs/live.py) (send_load) -> summary.json (write_summary).
Problems are raised as typed errors (ScenarioError, ResultsError, BackendUnreachable,
TokenizerError) for the caller to print; what a finished run found (interrupted, engine died,
most requests failed, client-bound) is in the RunResult.
"""

from __future__ import annotations

import asyncio
import signal
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from pathlib import Path

from harness.client.capacity import ClientCapacity, load_capacity
from harness.client.load_site import LoadSite, choose_load_site
from harness.client.runner import RunOutcome, Target, run_async
from harness.client.stamped_http import choose_stamps
from harness.client.workers import workers_needed
from harness.engine.launcher import LaunchedBackend
from harness.engine.observers import RunObservers
from harness.engine.server_metrics import counter_deltas, counter_resets
from harness.engine.session import EngineSession, engine_session
from harness.engine.startup import first_request
from harness.metrics.explain import explain
from harness.metrics.latencies import client_bound_reasons, summarize
from harness.metrics.live import LiveAggregates, LiveFrame
from harness.metrics.validity import run_validity, served_models
from harness.results.folder import ResultsWriteFailed, ResultWriter, host_info, read_records, versions
from harness.results.schema import Backend, RunInfo, Stamps, Summary, WorkersSizing
from harness.runs.live import LiveRun, LiveSettings
from harness.scenario.answers import accuracy
from harness.scenario.sampling import sampling_info
from harness.scenario.scenario import Scenario, ScenarioError
from harness.scenario.tokenizer_source import TokenizerSource, resolve_tokenizer
from harness.scenario.workload import RequestSchedule, build_schedule

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
    """What the pipeline says while it runs. This one keeps the lines (tests read them); the CLI prints.
    `live`: how each run is watched as it happens (harness/runs/live.py), None: not at all; a live dashboard takes
    the console, so start_requests, request_done and end_requests are not called while it shows."""

    live: LiveSettings | None = None

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
    summary: Summary
    run_info: RunInfo | None  # None: a simulated point's (bench plan), whose run.json says nothing of a host
    warnings: list[str] = field(default_factory=list)
    not_written: list[str] = field(default_factory=list)  # results files a full disk kept out, and why
    live_frame: LiveFrame | None = None  # the live view's last frame (reporter.live set): the summary's figures

    @property
    def interrupted_by(self) -> str | None:
        """ "SIGINT" or "SIGTERM" when a signal cut the load short."""
        return self.summary.interrupted_by if self.summary.interrupted else None

    @property
    def engine_exit(self) -> str | None:
        return self.summary.engine_exited

    @property
    def completed_share(self) -> float:
        req = self.summary.requests
        return req.completed / req.measured if req.measured else 0.0

    @property
    def mostly_failed(self) -> bool:
        return self.completed_share < MIN_COMPLETED_SHARE

    @property
    def incomplete_reasons(self) -> list[str]:
        """Why records are missing (a lost worker, a short single-process run); empty when none are."""
        return self.summary.incomplete_reasons if self.summary.incomplete else []

    @property
    def client_bound(self) -> bool:
        return self.summary.client_bound

    @property
    def cpu_count(self) -> int | None:
        """The client machine's cores, as run.json recorded them."""
        return self.run_info.host.cpu_count if self.run_info is not None and self.run_info.host else None


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
    """Runs one scenario into out_dir. `session`: an engine already started and ready (a sweep's),
    used as is and left running; without one, the scenario's engine is started (or checked ready) and stopped.
    `watch` (harness.runs.early_stop.PointWatch): sees each record and may stop the load early; its decision
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
            with suppress(ResultsWriteFailed):  # a full disk: the CLI says no summary was written
                writer.write_summary(
                    interrupted_summary(writer.dir, scenario, "SIGTERM" if isinstance(stop, Terminated) else "SIGINT")
                )
        raise


def interrupted_summary(run_dir: Path, scenario: Scenario, signal_name: str) -> Summary:
    """The summary of a run a signal stopped outside its load: of the records on disk (none when the engine was
    still starting), with `interrupted: true`."""
    figures = summarize(read_records(run_dir), scenario.slo.model_dump(), trim=trims(scenario))
    summary = Summary.of_requests(figures, interrupted=True, interrupted_by=signal_name)
    summary.validity = run_validity(summary)
    return summary


@dataclass
class RunSteps:
    """One run as named steps, each a method a test can call in turn; each fills the fields the next reads.

    schedule_requests -> choose_load_site -> write_run_info -> send_load -> write_summary. Where the load is sent from
    (this process, worker processes, Ray actors) is the LoadSite's business alone (harness/client/load_site.py)."""

    scenario: Scenario
    writer: ResultWriter
    session: EngineSession
    reporter: Reporter = field(default_factory=Reporter)
    watch: object = None  # harness.runs.early_stop.PointWatch, or None
    warnings: list[str] = field(default_factory=list)
    tokenizer: TokenizerSource | None = None
    schedule: RequestSchedule | None = None
    stamps: str = ""
    stamps_fallback: str | None = None
    capacity: ClientCapacity | None = None
    site: LoadSite | None = None
    run_info: RunInfo | None = None
    t0_ns: int = 0
    observers: RunObservers | None = None
    outcome: RunOutcome | None = None
    stopped_by: str | None = None
    summary: Summary | None = None
    not_written: list[str] = field(default_factory=list)
    live: LiveRun | None = None  # the run watched as it happens (reporter.live), made by send_load

    def schedule_requests(self) -> None:
        """Token counts (the engine's /tokenize, a local tokenizer or words) and every request's due time."""
        scenario, engine = self.scenario, self.session.engine
        if scenario.workload.ignore_eos and not engine.forces_length:
            self.warnings.append(
                f"workload.ignore_eos: {engine.name} cannot force the output length; answers may be "
                f"shorter than planned (records show the server's count)"
            )
        self.tokenizer = resolve_tokenizer(scenario, self.session.url, self.warnings)
        self.schedule = build_schedule(scenario, self.tokenizer)
        if self.watch is not None:
            self.watch.begin(self.schedule.requests)
        self.warnings += self.schedule.warnings
        if self.schedule.token_count_method == "approximate":
            self.warnings.append(
                "prompt lengths are approximate (about one token per word): the engine has no /tokenize and "
                "no local tokenizer is known; set backend.tokenizer to a GGUF file, a Hugging Face "
                "tokenizer folder or name for exact counts"
            )
        else:
            self.reporter.info(f"prompt lengths counted by {self.tokenizer.name} ({self.schedule.token_count_method})")

    def choose_load_site(self, workers: str | None, cleanup: ExitStack) -> None:
        """Token stamps, this machine's measured client capacity, and where the load is sent from."""
        try:
            self.stamps, self.stamps_fallback = choose_stamps(self.scenario.backend.stamps, self.session.url)
        except ValueError as e:
            raise ScenarioError(str(e)) from None
        self.capacity = load_capacity(self.stamps, self.warnings)  # this machine's client, measured by earlier runs
        self.site = choose_load_site(
            self.scenario,
            self.schedule.requests,
            self.schedule.duration_s,
            workers,
            self.stamps,
            self.capacity,
            cleanup,
            self.reporter.info,
        )
        if self.stamps_fallback and self.scenario.backend.stamps == "auto":
            self.reporter.info(f"token times from the event loop, not the kernel: {self.stamps_fallback}")

    def write_run_info(self) -> None:
        """run.json as known before the load: the resolved scenario, versions, host, engine, clients."""
        backend, engine, url, launched = self.scenario.backend, self.session.engine, self.session.url, self.launched
        run_info = RunInfo(
            scenario=self.scenario.resolved_dict(),
            versions=versions(),
            host=host_info(),
            backend=Backend(
                kind=backend.kind,
                url=url,
                model=backend.model,
                api=backend.api,
                launched=launched is not None,
                engine_version=engine.version(url, backend.headers),
                engine_pid=launched.pid if launched else None,
            ),
            stamps=Stamps(setting=backend.stamps, used=self.stamps, why_not_kernel=self.stamps_fallback),
            token_count_method=self.schedule.token_count_method,
            tokenizer=self.tokenizer.name,
            sampling=sampling_info(self.scenario.workload.sampling),
            workers=self.site.workers,
            workers_sizing=sizing_info(self.capacity),
            time_unit="seconds from t0 (perf_counter_ns)",
        )
        if launched is not None:
            run_info.startup = launched.startup.model_copy()  # first_request joins it after the load
        self.run_info = run_info
        self._record_ray_clients()
        self.writer.write_run_info(self.run_info)

    def _record_ray_clients(self) -> None:
        """run.json's `ray` (the Ray cluster's clients by node, their counts after the load); absent without Ray."""
        ray = self.site.ray_clients()
        if ray is not None:
            self.run_info.ray = ray

    @property
    def launched(self) -> LaunchedBackend | None:
        return self.session.launched

    def target(self) -> Target:
        """How each request is sent: the endpoint, its dialect, and what the scenario asks of every request."""
        backend, workload = self.scenario.backend, self.scenario.workload
        return Target(
            url=self.session.url,
            api=backend.api,
            model=backend.model,
            request_timeout_s=backend.request_timeout_s,
            headers=dict(backend.headers),
            ignore_eos=workload.ignore_eos,
            kind=backend.kind,
            eos_token_ids=tuple(backend.eos_token_ids),
            max_response_bytes=backend.max_response_bytes,
            stamps=backend.stamps,
            sampling=workload.sampling.fields(),
            extra_body=dict(backend.extra_body),
            record_outputs=workload.record_outputs,
        )

    def send_load(self) -> None:
        """The load, with telemetry and server metrics on its clock; run.json again with what it found."""
        self.t0_ns = self.site.t0_ns()
        session = self.session
        self.observers = RunObservers(
            self.scenario, session.engine, session.url, self.launched, self.t0_ns, self.writer.dir
        )
        self.warnings += self.observers.start()
        for warning in self.warnings:
            self.reporter.warning(warning)
        self.live = self.live_run()
        if self.live is not None:  # the engine's gauges and the GPUs' on the view, from what is sampled anyway
            self.observers.scraper.page_listeners.append(self.live.engine_page)
            if self.observers.recorder.timeline is not None:  # None: telemetry.enabled false
                self.observers.recorder.timeline.listeners.append(self.live.telemetry_sample)
        try:
            self.outcome, self.stopped_by = run_async(_load(self))
        finally:  # profile, engine_trace, server_metrics, telemetry: each observer's status
            self.observers.stop(self.run_info)
        self.run_info.t0_perf_counter_ns = self.outcome.t0_ns
        if self.outcome.t0_ns != self.t0_ns:
            self.run_info.telemetry_t0_offset_s = (self.outcome.t0_ns - self.t0_ns) / 1e9  # workers started late
        self._record_ray_clients()
        self._warn(self.site.lost_lines())
        launched = self.launched
        if launched is not None:
            startup = launched.startup
            # set once, by the run that sent the engine's first request (None, written as null, when it sent none)
            if "first_request" not in startup.model_fields_set:
                startup.first_request = first_request(self.outcome.records, self.writer.dir.name)
            self.run_info.startup = startup.model_copy()
        self._write(self.writer.write_run_info, self.run_info)

    def live_run(self) -> LiveRun | None:
        """The run's live view, when the reporter asks for one: aggregates over this schedule, labelled by the results
        folder's name and the scenario's."""
        settings, scenario = self.reporter.live, self.scenario
        if settings is None:
            return None
        aggregates = LiveAggregates(
            self.schedule.requests,
            scenario.load.concurrency,
            scenario.slo.model_dump(),
            self.schedule.duration_s,
            settings.window_s,
        )
        return LiveRun(settings, aggregates, self.writer.dir.name, scenario.name)

    def write_summary(self) -> RunResult:
        """summary.json: the metrics, what stopped the load, the clients, where the time went, the verdict."""
        scenario, outcome, schedule, load = self.scenario, self.outcome, self.schedule, self.scenario.load
        figures = summarize(outcome.records, scenario.slo.model_dump(), outcome.loop_lag_s, trims(scenario))
        reasons = client_bound_reasons(figures)
        summary = Summary(
            **dict(figures),
            client_bound=bool(reasons),
            client_bound_reasons=reasons,
            interrupted=outcome.interrupted,
            workers=self.site.workers,
            client_cpu_s=outcome.client_cpu_s,
            token_count_method=schedule.token_count_method,
            workers_needed=workers_needed(schedule.requests, load.concurrency, schedule.duration_s, self.capacity),
            workers_sizing=sizing_info(self.capacity),
            incomplete=bool(self.incomplete_reasons()),  # a run with missing records is not a result
            incomplete_reasons=self.incomplete_reasons(),
            lost_workers=outcome.lost_workers,
        )
        if self.stopped_by in ("SIGINT", "SIGTERM"):
            summary.interrupted_by = self.stopped_by
        elif self.stopped_by:
            summary.engine_exited = self.stopped_by
        self._warn(self.site.client_summary(outcome, summary, capacity_tokens(outcome, summary), str(self.writer.dir)))
        if self.watch is not None and self.watch.decision is not None:
            summary.stopped_early = self.watch.decision
        self._explain(summary)
        self.summary = summary
        self._write(self.writer.write_summary, summary)
        final = self.live.finish(figures) if self.live is not None else None
        return RunResult(self.writer.dir, summary, self.run_info, self.warnings, self.not_written, final)

    def _write(self, write, doc) -> None:
        """A results file written after the load: one a full disk refuses is named in not_written (the CLI then
        prints the summary and exits 4), so the figures of the records on disk still reach the user."""
        try:
            write(doc)
        except ResultsWriteFailed as failure:
            self.not_written.append(str(failure))

    def incomplete_reasons(self) -> list[str]:
        """Why the records do not cover the plan: the load site's reasons, and a results file that stopped taking
        records (then requests.jsonl holds fewer than the summary counts)."""
        failure, writer = self.writer.write_failure, self.writer
        if failure is None:
            return self.outcome.incomplete_reasons
        written = f"{writer.records_written} of {writer.records_written + writer.records_unwritten} records"
        return [*self.outcome.incomplete_reasons, f"{failure}: {written} are in requests.jsonl, the load was stopped"]

    def _explain(self, summary: Summary) -> None:
        """Telemetry, engine counters, phases and diagnosis, accuracy and the validity verdict into `summary`."""
        outcome, run_dir = self.outcome, self.writer.dir
        summary.telemetry = self.observers.derived(outcome)
        summary.engine_counters = counter_deltas(run_dir / "server_metrics.csv")
        engine_steps = self.observers.engine_steps(outcome)
        offset_s = (outcome.t0_ns - self.t0_ns) / 1e9
        explain(summary, outcome.records, run_dir, engine_steps, self.scenario.resolved_dict(), offset_s)
        summary.accuracy = accuracy(outcome.records, self.scenario.slo.confidence or 0.95)  # a known-answer task's
        resets = counter_resets(run_dir / "server_metrics.csv")
        summary.validity = run_validity(summary, resets, served_models(outcome.records))

    def _warn(self, lines: list[str]) -> None:
        for line in lines:
            self.reporter.warning(line)
            self.warnings.append(line)


def _run(scenario, writer, session, workers, reporter, cleanup, watch=None) -> RunResult:
    steps = RunSteps(scenario, writer, session, reporter, watch)
    steps.schedule_requests()
    steps.choose_load_site(workers, cleanup)
    steps.write_run_info()
    try:
        steps.send_load()
        return steps.write_summary()
    finally:
        if steps.live is not None:  # a run that raised leaves no live view drawn over the terminal
            steps.live.abandon()


def trims(scenario: Scenario) -> bool:
    """Whether the summary measures the steady-state window only (load.trim; unset means yes)."""
    return scenario.load.trim is not False


def capacity_tokens(outcome, summary: Summary) -> int:
    """The tokens a run's client measurably streamed: those of its completed requests (their counts were checked
    against the limits), and only from a valid, complete run; 0 (nothing to record) for any other run. A failed
    request's count is the server's word, unchecked: a server claiming 1e12 tokens once sized every later run."""
    req = summary.requests
    if (
        summary.interrupted
        or summary.engine_exited
        or summary.incomplete
        or not req.measured
        or req.completed / req.measured < MIN_COMPLETED_SHARE
    ):
        return 0
    return sum(r.output_tokens for r in outcome.records if r.ok)


def sizing_info(capacity: ClientCapacity) -> WorkersSizing:
    """What `workers: auto` took as one client process's share, and where that figure came from."""
    return WorkersSizing(
        source=capacity.source,
        tokens_per_s_per_worker=round(capacity.tokens_per_s_per_worker),
        tokens_per_cpu_s=capacity.tokens_per_cpu_s and round(capacity.tokens_per_cpu_s),
        measurements=capacity.measurements,
        file=capacity.file,
        describe=capacity.describe(),
    )


def record_sink(steps: RunSteps, stop: asyncio.Event, progress: bool):
    """Where each completed record goes, in order: the results file, the live view, the progress bar (`progress`),
    the early-stop watch."""
    writer, reporter, live, watch = steps.writer, steps.reporter, steps.live, steps.watch

    def on_record(rec) -> None:
        try:
            writer.append(rec)
        except ResultsWriteFailed as failure:  # a full disk: end the load, keep what was written (exit 4)
            reporter.warning(f"{failure}; the load stops, the records written so far are kept")
            stop.set()
        if live is not None:
            live.observe(rec)
        if progress:
            reporter.request_done(rec)
        if watch is not None and not stop.is_set() and watch.observe(rec):
            stop.set()  # an early stop: no signal, no engine exit, so stopped_by stays empty

    return on_record


async def _load(steps: RunSteps):
    """Sends the schedule from the run's LoadSite; SIGINT, SIGTERM or the launched engine's exit stop it.
    Returns (outcome, what stopped it)."""
    schedule, reporter, launched, live = steps.schedule, steps.reporter, steps.launched, steps.live
    progress = live is None or not live.takes_the_console  # a dashboard shows the progress itself
    stop = asyncio.Event()
    stopped_by: list[str] = []

    def stop_for(reason: str) -> None:
        stopped_by.append(reason)
        stop.set()

    loop = asyncio.get_running_loop()
    # SIGINT left ignored (a background job of a script: `bench run ... &`) stays ignored, as it is before the load
    honoured = [sig for sig in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(sig) is not signal.SIG_IGN]
    previous = {sig: signal.getsignal(sig) for sig in honoured}
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
    if progress:
        reporter.start_requests(len(schedule.requests))
    if live is not None:
        live.begin(steps.t0_ns)
    refresher = asyncio.create_task(live.refresh_until(stop)) if live is not None else None
    try:
        concurrency, on_record = steps.scenario.load.concurrency, record_sink(steps, stop, progress)
        outcome = await steps.site.send(
            schedule.requests, steps.target(), concurrency, on_record, stop, schedule.duration_s, steps.t0_ns
        )
    finally:
        if progress:
            reporter.end_requests()
        for task in (watcher, refresher):
            if task:
                task.cancel()
        for sig, handler in previous.items():
            loop.remove_signal_handler(sig)
            if handler is not None:  # remove_signal_handler leaves the default, not what was there
                signal.signal(sig, handler)
    return outcome, (stopped_by[0] if stopped_by else None)
