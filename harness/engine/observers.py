"""What watches the engine while the load runs, all off the event loop and on the run's clock
(t0_ns): the telemetry recorder (telemetry.csv), the Prometheus scraper (server_metrics.csv),
with backend.profile the engine's profiler started before the load and stopped after it, and with
backend.trace the engine's per-step trace, fetched after the load (engine_trace.json)."""

from __future__ import annotations

from pathlib import Path

from backends.base import http_post
from harness.engine.server_metrics import ServerMetricsScraper
from harness.engine.step_trace import fetch_steps, steps_on_run_clock, write_engine_trace
from harness.engine.telemetry import TelemetryRecorder
from harness.results.schema import EngineTraceStatus, ProfileStatus, RunInfo, Telemetry


class RunObservers:
    """What watches the engine during the load: the telemetry recorder, the Prometheus scraper
    and, when asked, the engine's profiler. Each runs off the event loop."""

    def __init__(self, scenario, engine, url: str, launched, t0_ns: int, out_dir: Path):
        backend, config = scenario.backend, scenario.telemetry
        self.engine, self.url, self.headers, self.t0_ns = engine, url, dict(backend.headers), t0_ns
        self.profile = backend.profile
        metrics_url = backend.metrics_url or engine.metrics_url(url)
        why_none = f"the {engine.name} engine has no Prometheus page; set backend.metrics_url if it has one"
        replicas_url = url + engine.replicas_path if engine.replicas_path and metrics_url else None
        self.scraper = ServerMetricsScraper(
            metrics_url,
            t0_ns,
            out_dir / "server_metrics.csv",
            config.interval_ms / 1000,
            headers=self.headers,
            why_none=why_none,
            missing_page_hint=engine.metrics_hint if not backend.metrics_url else "check backend.metrics_url",
            replicas_url=replicas_url,
            replica_pages=list(backend.replica_metrics.items()),
        )
        self.recorder = TelemetryRecorder(
            config, t0_ns, out_dir, launched.pid if launched else None, metrics_url, engine_pages_fed=True
        )
        self.scraper.page_listeners.append(self.recorder.engine_page)  # one /metrics request per interval
        self.profile_status: ProfileStatus | None = None  # with backend.profile
        self.trace_status: EngineTraceStatus | None = None  # with backend.trace
        self.out_dir = out_dir
        self.trace = backend.trace
        self.steps_raw: dict | None = None

    def start(self) -> list[str]:
        """Starts watching; returns warnings for the console (a profiler that is not there)."""
        self.recorder.start()
        self.scraper.begin()
        if not self.profile:
            return []
        if not self.engine.profile_paths:
            return [f"backend.profile: {self.engine.name} has no profiler endpoints; the run goes on unprofiled"]
        path = self.engine.profile_paths[0]
        try:
            code = http_post(self.url + path, {}, self.headers)
        except OSError as e:
            code, why = None, f"failed ({e})"
        else:
            why = f"answered HTTP {code}"
        self.profile_status = ProfileStatus(start_http_status=code)
        if code is not None and code < 400:
            return []
        self.profile_status.error = why
        hint = f": {self.engine.profile_hint}" if self.engine.profile_hint else ""
        return [f"backend.profile: POST {path} {why}, so the engine was started without its profiler{hint}"]

    def stop(self, run_info: RunInfo) -> None:
        """Stops watching; sets run.json's profile and engine_trace (when asked for), server_metrics and telemetry:
        each observer's status."""
        profile = self.profile_status
        if profile is not None and profile.error is None:
            profile.stop_http_status = http_post(
                self.url + self.engine.profile_paths[1], {}, self.headers, timeout_s=300
            )
        if self.trace:  # before the engine stops
            if not self.engine.step_trace_path:
                reason = f"the {self.engine.name} engine has no step trace"
                self.trace_status = EngineTraceStatus(written=False, reason=reason)
            else:
                self.steps_raw, why = fetch_steps(self.url + self.engine.step_trace_path, self.headers)
                if why:
                    self.trace_status = EngineTraceStatus(written=False, reason=why)
        if profile is not None:
            run_info.profile = profile
        if self.trace_status is not None:
            run_info.engine_trace = self.trace_status
        run_info.server_metrics = self.scraper.stop()
        run_info.telemetry = self.recorder.stop()

    def derived(self, outcome) -> Telemetry:
        """summary.json's telemetry figures over the measured window (first intended send to last end); none
        without measured requests or telemetry."""
        measured = [r for r in outcome.records if not r.is_warmup]
        if not measured:
            return Telemetry()
        offset_s = (outcome.t0_ns - self.t0_ns) / 1e9
        start = min(r.intended_send_s for r in measured) + offset_s
        end = max(r.end_s if r.end_s is not None else r.intended_send_s for r in measured) + offset_s
        if end <= start:
            return Telemetry()
        return self.recorder.derived(start, end, sum(r.output_tokens for r in measured if r.ok))

    def engine_steps(self, outcome) -> list[dict]:
        """The engine's steps during this run on the requests' clock; writes engine_trace.json.
        Empty when the run did not ask for the trace or the engine gave none."""
        if self.steps_raw is None or not outcome.records:
            return []
        start = min(r.intended_send_s for r in outcome.records)
        end = max(r.end_s if r.end_s is not None else r.intended_send_s for r in outcome.records)
        steps = steps_on_run_clock(self.steps_raw, outcome.t0_ns, start, end)
        write_engine_trace(self.out_dir / "engine_trace.json", steps)
        self.trace_status = EngineTraceStatus(written=True, steps=len(steps), dropped=self.steps_raw.get("dropped", 0))
        return steps
