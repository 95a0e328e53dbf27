"""Watching a run as it happens: LiveSettings says what to show (a terminal dashboard, plain lines, the Prometheus
endpoint), LiveRun feeds them each completed record and redraws on a timer of the run's event loop.

A caller turns it on by setting `reporter.live` (harness/runs/run.py's Reporter), so a sweep's, repeats' or tune's
runs get it too; the run pipeline hands every record to LiveRun.observe and ends with LiveRun.finish, whose frame
is the summary's figures.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from dataclasses import dataclass

from rich.console import Console

from harness.metrics.latencies import request_latency
from harness.metrics.live import (
    ROLLING_WINDOW_S,
    EngineState,
    GpuState,
    LiveAggregates,
    LiveFrame,
    engine_state,
    final_frame,
    gpu_state,
)
from harness.results.folder import RequestRecord
from harness.results.schema import RequestFigures
from harness.runs.dashboard import Dashboard, PlainLines, wants_plain_lines
from harness.runs.live_metrics import MetricsEndpoint
from harness.runs.live_page import LivePage
from harness.scenario.scenario import ScenarioError

DISPLAYS = ("auto", "dashboard", "lines", "off")
# The dashboard is redrawn once a second, on the second (t0 + 1 s, + 2 s, ...), and once as it starts: the issue asks
# for at least one frame a second. A frame (the 10 s window's figures ~1-2 ms, its redraw ~1 ms) is the live view's
# largest cost: twice a second it was ~2% of the client's CPU at 256 streams of 50 tokens/s on this 2-core machine
# (benchmarks/live_overhead.py), once a second half that.
DASHBOARD_REFRESH_S = 1.0
# A log gets a line every 10 s: a 10-minute run leaves 60 lines, not 1,200.
LINES_EVERY_S = 10.0


@dataclass(kw_only=True)
class LiveSettings:
    """display: auto (dashboard on a terminal, plain lines elsewhere or with CI=true), dashboard, lines, off.
    metrics: the endpoint each run's series go to (one per process, MetricsEndpoint(port)); None: none."""

    display: str = "auto"
    metrics: MetricsEndpoint | None = None
    page: LivePage | None = None  # the live page each run's frames are pushed to (LivePage(port)); None: none
    console: Console | None = None  # default: a rich Console on stderr, where bench prints
    refresh_s: float | None = None  # default: DASHBOARD_REFRESH_S, or LINES_EVERY_S for plain lines
    window_s: float = ROLLING_WINDOW_S

    def __post_init__(self) -> None:
        if self.display not in DISPLAYS:
            raise ValueError(f"live display {self.display!r}: use one of {', '.join(DISPLAYS)}")


def live_settings(
    live: bool | None, metrics_port: int | None, console: Console, live_port: int | None = None
) -> LiveSettings | None:
    """What `bench run --live/--no-live --metrics-port PORT --live-port PORT` asks for. Unsaid (None): the dashboard
    on a terminal and nothing more elsewhere, so logs and scripts read what they read before; --live: the dashboard,
    or plain lines where there is no terminal or CI=true; --no-live: none. A port that cannot be bound is a usage
    error."""
    endpoint = _serve("--metrics-port", MetricsEndpoint, metrics_port)
    page = _serve("--live-port", LivePage, live_port)
    if live is None:
        display = "off" if wants_plain_lines(console) else "dashboard"
    else:
        display = "auto" if live else "off"
    if display == "off" and endpoint is None and page is None:
        return None
    return LiveSettings(display=display, metrics=endpoint, page=page, console=console)


def _serve(option: str, server, port: int | None):
    """server(port) on 127.0.0.1, or None without a port; a port that cannot be bound is a ScenarioError."""
    if port is None:
        return None
    try:
        return server(port)
    except OSError as e:
        raise ScenarioError(f"{option} {port}: cannot serve on 127.0.0.1: {e}") from None


class LiveRun:
    """One run's live figures and where they are shown."""

    def __init__(self, settings: LiveSettings, aggregates: LiveAggregates, run: str, scenario: str) -> None:
        self.settings, self.aggregates = settings, aggregates
        console = settings.console or Console(stderr=True)
        display = settings.display
        if display == "auto":
            display = "lines" if wants_plain_lines(console) else "dashboard"
        title = self.title = f"{scenario} / {run}"
        self.view = {"dashboard": Dashboard, "lines": PlainLines}.get(display, lambda c, t: None)(console, title)
        self.refresh_s = settings.refresh_s or (LINES_EVERY_S if display == "lines" else DASHBOARD_REFRESH_S)
        metrics = settings.metrics
        self.metrics_key = metrics.begin_run(run, scenario) if metrics is not None else None
        self.t0_ns = 0
        self.last_frame: LiveFrame | None = None
        self.engine: EngineState | None = None  # the engine's latest /metrics page read (engine_page)
        self.gpu: GpuState | None = None  # the GPUs' latest sample (telemetry_sample)
        self._view_open = False

    @property
    def takes_the_console(self) -> bool:
        """A dashboard redraws the console in place: the reporter's progress bar stays off meanwhile."""
        return isinstance(self.view, Dashboard)

    @property
    def frames_shown(self) -> int:
        return self.view.frames if self.view is not None else 0

    def begin(self, t0_ns: int) -> None:
        self.t0_ns = t0_ns
        if self.view is not None:
            self.view.start()
            self._view_open = True
            if self.takes_the_console:  # drawn at once, not a second later (plain lines wait for their first turn)
                self.refresh()

    def observe(self, rec: RequestRecord) -> None:
        """A completed record: its latency made once for both the aggregates and the endpoint."""
        latency = request_latency(rec) if rec.ok and not rec.is_warmup else None
        self.aggregates.observe(rec, latency)
        if self.metrics_key is not None:
            self.settings.metrics.observe(self.metrics_key, rec, latency)

    def engine_page(self, arrived_ns: int, page: str) -> None:
        """A /metrics page from the run's scraper (its thread): the engine's gauges for the next frame. A page that
        does not parse leaves the last state; the scraper and the run go on."""
        try:
            self.engine = engine_state(page, (arrived_ns - self.t0_ns) / 1e9)
        except Exception:  # noqa: BLE001 (the scraper's own CSV keeps the page; the view just keeps its last state)
            return

    def telemetry_sample(self, t_s: float, values: list) -> None:
        """A telemetry sample (the recorder's thread): the GPUs' figures for the next frame; other sources' samples
        are not the view's."""
        state = gpu_state(t_s, values)
        # NVML's own reading wins over a dcgm-exporter's where both sample (the same GPUs, twice)
        if state is not None and (state.source == "NVML" or self.gpu is None or self.gpu.source != "NVML"):
            self.gpu = state

    def elapsed_s(self) -> float:
        return (time.perf_counter_ns() - self.t0_ns) / 1e9

    def refresh(self) -> LiveFrame:
        self._show(self.aggregates.frame(self.elapsed_s()))
        return self.last_frame

    def _show(self, frame: LiveFrame) -> None:
        frame = dataclasses.replace(frame, engine=self.engine, gpu=self.gpu)
        self.last_frame = frame
        if self.view is not None and not frame.final:
            self.view.show(frame)
        if self.metrics_key is not None:
            self.settings.metrics.show(self.metrics_key, frame)
        if self.settings.page is not None:
            self.settings.page.push(self.title, frame)

    async def refresh_until(self, stop: asyncio.Event) -> None:
        """A frame every refresh_s from t0 (at t0 + refresh_s, + 2 refresh_s, ...) until `stop` is set (or the task is
        cancelled): on a fixed beat, so the frames' own time does not stretch the gaps between them; a beat missed
        (the loop was busy) is skipped, not caught up."""
        beat = 0
        while not stop.is_set():
            elapsed_s = self.elapsed_s()
            # the next beat after both the last one shown and now (a timer may fire a hair early: no beat twice)
            beat = max(beat + 1, math.floor(elapsed_s / self.refresh_s) + 1)
            try:
                await asyncio.wait_for(stop.wait(), max(0.0, beat * self.refresh_s - elapsed_s))
            except TimeoutError:
                self.refresh()

    def finish(self, figures: RequestFigures) -> LiveFrame:
        """The final frame, of the figures summary.json is written from, shown last; the view closed."""
        self._show(final_frame(figures, self.aggregates, self.elapsed_s()))
        final = self.last_frame  # with the engine's last state
        self._close_view(final)
        return final

    def abandon(self) -> None:
        """The run ended without a summary (an error, Ctrl-C): the view is closed without a final frame; after
        finish() it is closed already and nothing happens."""
        self._close_view(None)

    def _close_view(self, final: LiveFrame | None) -> None:
        if self._view_open:
            self._view_open = False
            self.view.stop(final)
