"""Telemetry during a run: GPU counters (NVML + GPM, or a dcgm-exporter), host and engine-process
CPU/memory from /proc, and the engine's own bytes-read counters, on the run's clock.

    recorder = TelemetryRecorder(config, t0_ns, out_dir, engine_pid, engine_metrics_url)
    recorder.start()            # sampler threads, off the event loop; returns at once
    scraper.page_listeners.append(recorder.engine_page)   # optional: /metrics pages from the run's scraper
    ... the run ...
    status = recorder.stop()    # run.json's TelemetryStatus: sampled, not_sampled {source: reason}, errors
    figures = recorder.derived(window_start_s, window_end_s, output_tokens)   # summary.json's Telemetry

Each source samples in its own thread, so a slow /metrics scrape never delays the GPU
readings, and none of it runs on the harness's event loop. Everything lands in
out_dir/telemetry.csv (see timeline.py for the columns, gpu.py and host.py for names and units).
A source that cannot run here (no GPU, no GPM, no /metrics) is reported once in not_sampled
and the run goes on without it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from harness.engine.telemetry.dcgm import DcgmScraper
from harness.engine.telemetry.derived import summarize
from harness.engine.telemetry.engine_bytes import EngineBytesPoller
from harness.engine.telemetry.gpu import GpuSampler
from harness.engine.telemetry.host import HostSampler, memory_bandwidth_ceiling
from harness.engine.telemetry.timeline import Timeline, Unavailable
from harness.results.schema import Telemetry, TelemetryStatus
from harness.scenario.telemetry_settings import TelemetryConfig

__all__ = ["TelemetryRecorder", "Unavailable"]

JOIN_TIMEOUT_S = 5.0  # a sampler stuck in a scrape gets this long; its late rows are dropped anyway


class _SamplerThread(threading.Thread):
    """Builds its source inside the thread (nvmlInit can take a while) and samples it every interval."""

    def __init__(self, name: str, make_source: Callable, timeline: Timeline, t0_ns: int, interval_ns: int):
        super().__init__(name=f"telemetry-{name}", daemon=True)
        self.source_name, self.make_source = name, make_source
        self.timeline, self.t0_ns, self.interval_ns = timeline, t0_ns, interval_ns
        self.stop_event = threading.Event()
        self.source = None
        self.unavailable: str | None = None
        self.samples = self.failures = 0
        self.last_error: str | None = None

    def run(self) -> None:
        try:
            self.source = self.make_source()
        except Unavailable as exc:
            self.unavailable = str(exc)
            return
        except Exception as exc:  # an unexpected driver answer must not take the run down
            self.unavailable = f"could not start: {type(exc).__name__}: {exc}"
            return
        try:
            self._loop()
        finally:
            self.source.close()

    def _loop(self) -> None:
        due_ns = time.perf_counter_ns()
        while not self.stop_event.is_set():
            now_ns = time.perf_counter_ns()
            self.samples += 1
            try:
                rows = self.source.sample(now_ns)
            except Unavailable as exc:
                self.unavailable = str(exc)
                return
            except Exception as exc:  # a dropped scrape or a busy driver: keep going, report at stop
                self.failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                rows = []
            if rows and not self.stop_event.is_set():
                self.timeline.append((now_ns - self.t0_ns) / 1e9, rows)
            due_ns += self.interval_ns
            if due_ns <= time.perf_counter_ns():  # fell behind: skip the missed ticks, never burst
                due_ns = time.perf_counter_ns() + self.interval_ns
            self.stop_event.wait((due_ns - time.perf_counter_ns()) / 1e9)


class TelemetryRecorder:
    def __init__(
        self,
        config: TelemetryConfig,
        t0_ns: int,
        out_dir: str | Path,
        engine_pid: int | None = None,
        engine_metrics_url: str | None = None,
        nvml=None,
        engine_pages_fed: bool = False,
    ):
        """t0_ns: the run's time.perf_counter_ns() origin. nvml: a stand-in for pynvml (tests).
        engine_pages_fed: the engine's /metrics pages arrive through engine_page() (from the run's
        scraper) instead of a poller of our own, so the engine is asked once per interval."""
        self.config, self.t0_ns, self.out_dir = config, t0_ns, Path(out_dir)
        self.engine_pid, self.nvml = engine_pid, nvml
        self.engine_metrics_url = engine_metrics_url or config.engine_metrics_url
        self.timeline: Timeline | None = None
        self.not_sampled: dict[str, str] = {}
        self.host_ceiling_bytes_per_s: float | None = None
        self.engine_family: str | None = None
        self._fed_counters: EngineBytesPoller | None = None  # with engine_pages_fed
        self._fed_pages = 0
        self.engine_pages_fed = engine_pages_fed
        self._threads: list[_SamplerThread] = []
        self._status: TelemetryStatus | None = None  # stop()'s answer, kept so a second stop() repeats it

    def _sources(self) -> dict[str, Callable]:
        config, sources = self.config, {}
        if config.gpu:
            sources["gpu"] = lambda: GpuSampler(self.nvml)
        else:
            self.not_sampled["gpu"] = "telemetry.gpu is false"
        if config.host:
            sources["host"] = lambda: HostSampler(self.engine_pid)
        else:
            self.not_sampled["host"] = "telemetry.host is false"
        if self.engine_metrics_url and self.engine_pages_fed:
            try:  # built here, not in a sampler thread: a bad URL is reported like a source's
                self._fed_counters = EngineBytesPoller(self.engine_metrics_url)
            except Unavailable as exc:
                self.not_sampled["engine_metrics"] = str(exc)
        elif self.engine_metrics_url:
            sources["engine_metrics"] = lambda: EngineBytesPoller(self.engine_metrics_url)
        else:
            self.not_sampled["engine_metrics"] = "no engine_metrics_url: the backend has no /metrics address"
        if config.dcgm_exporter_url:
            sources["dcgm"] = lambda: DcgmScraper(config.dcgm_exporter_url)
        return sources

    def start(self) -> None:
        if not self.config.enabled or self.timeline is not None:
            return
        self.timeline = Timeline(self.out_dir / "telemetry.csv")
        interval_ns = self.config.interval_ms * 1_000_000
        for name, make_source in self._sources().items():
            thread = _SamplerThread(name, make_source, self.timeline, self.t0_ns, interval_ns)
            thread.start()
            self._threads.append(thread)

    def engine_page(self, t_ns: int, text: str) -> None:
        """One /metrics page of the engine, fetched at t_ns by someone else (the run's scraper)."""
        counters = self._fed_counters
        if counters is None or self.timeline is None or "engine_metrics" in self.not_sampled:
            return
        self._fed_pages += 1
        try:
            rows = counters.ingest(t_ns, text)
        except Unavailable as exc:
            self.not_sampled["engine_metrics"] = str(exc)
            return
        self.timeline.append((t_ns - self.t0_ns) / 1e9, rows)

    def stop(self) -> TelemetryStatus:
        """Stops the samplers; run.json's `telemetry`: the sources sampled, why the others were not, errors."""
        if self.timeline is None:
            return TelemetryStatus(sampled=[], not_sampled={"telemetry": "telemetry.enabled is false"}, errors={})
        if self._status is not None:
            return self._status
        for thread in self._threads:
            thread.stop_event.set()
        errors = {}
        for thread in self._threads:
            thread.join(JOIN_TIMEOUT_S)
            if thread.is_alive():
                errors[thread.source_name] = (
                    f"sampler still busy {JOIN_TIMEOUT_S} s after stop; its later samples are dropped"
                )
            if thread.unavailable:
                self.not_sampled[thread.source_name] = thread.unavailable
            elif thread.failures == thread.samples and thread.samples:
                self.not_sampled[thread.source_name] = f"every sample failed; last: {thread.last_error}"
            elif thread.failures:
                errors[thread.source_name] = (
                    f"{thread.failures} of {thread.samples} samples failed; last: {thread.last_error}"
                )
            self.not_sampled.update(getattr(thread.source, "not_sampled", {}))
            if isinstance(thread.source, EngineBytesPoller):
                self.engine_family = thread.source.family
        if self._fed_counters is not None:
            self.engine_family = self._fed_counters.family if "engine_metrics" not in self.not_sampled else None
            if not self._fed_pages:
                self.not_sampled.setdefault(
                    "engine_metrics", "no /metrics page arrived from the engine (run.json server_metrics says why)"
                )
        self._check_engine_counters_moved()
        self._add_bandwidth_util()
        self.timeline.close()
        if self.timeline.write_error:
            errors["telemetry.csv"] = self.timeline.write_error
        sampled = sorted({source for _, source, _, _ in self.timeline.rows})
        self._status = TelemetryStatus(sampled=sampled, not_sampled=dict(self.not_sampled), errors=errors)
        return self._status

    def _check_engine_counters_moved(self) -> None:
        """vLLM and SGLang export their estimate counters even when they do not fill them."""
        family = self.engine_family
        _, read_bytes = self.timeline.series("engine_metrics", "read_bytes_total")
        if family in ("vllm", "sglang") and not (read_bytes > 0).any():
            self.not_sampled["engine_metrics"] = (
                f"{family}:estimated_read_bytes_per_gpu_total stayed at 0: start "
                f"{family} with --enable-mfu-metrics (vLLM on CPU always reads 0)"
            )
            self.engine_family = None

    def _add_bandwidth_util(self) -> None:
        """Engine bytes/s over the host's memory ceiling, for CPU engines. Measured now, with the
        load over, so the measurement neither disturbs the run nor competes with it."""
        t_s, bytes_per_s = self.timeline.series("engine_metrics", "read_bytes_per_s")
        gpu_peak = self.timeline.series("gpu:0", "memory_bandwidth_peak_bytes_per_s")[1]
        on_gpu = self.engine_family in ("vllm", "sglang") and gpu_peak.size
        if not self.config.host or self.engine_family is None or not t_s.size or on_gpu:
            return
        self.host_ceiling_bytes_per_s = memory_bandwidth_ceiling()
        now_s = (time.perf_counter_ns() - self.t0_ns) / 1e9
        self.timeline.append(now_s, [("host", "memory_bandwidth_ceiling_bytes_per_s", self.host_ceiling_bytes_per_s)])
        for t, value in zip(t_s, bytes_per_s):
            util = value / self.host_ceiling_bytes_per_s
            self.timeline.append(float(t), [("engine_metrics", "bandwidth_util", util)])

    def derived(self, window_start_s: float, window_end_s: float, output_tokens: int) -> Telemetry:
        """Summary figures over the measured window (seconds since t0); see derived.py for the fields; empty
        with telemetry off. Call it after stop(): the CPU bandwidth figures need the ceiling measured there."""
        if self.timeline is None:
            return Telemetry()
        return summarize(
            self.timeline,
            window_start_s,
            window_end_s,
            output_tokens,
            self.engine_family,
            self.host_ceiling_bytes_per_s,
        )
