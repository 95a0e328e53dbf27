"""The harness's own Prometheus endpoint (`--metrics-port`): requests by status, TTFT / ITL / TPOT / E2E histograms
measured from the intended send time, in-flight and send-lag gauges, labelled by run and scenario.

One endpoint per process, bound to 127.0.0.1, kept up after a run ends (a sweep's points add their `run` label to
it), so a scrape after the last record still finds the final counts. A record only joins a list as it comes; its
latencies are put in buckets when a scrape asks, all the waiting ones in one numpy pass (not one prometheus_client
observe() per token gap on the client's loop), and written out as Prometheus text (exposition); warm-up requests are
left out, as in the summary. The scrapes are served from a thread of their own (SideServer).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np
from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.utils import floatToGoString

from harness.metrics.latencies import RequestLatency, flat
from harness.metrics.live import LiveFrame
from harness.results.folder import RequestRecord
from harness.runs.side_server import SideServer

# Buckets (s) as vLLM publishes its own series, so the client's and the engine's histograms line up bucket for bucket
# on one board (vllm-project/vllm vllm/v1/metrics/loggers.py, commit 005a810b: vllm:time_to_first_token_seconds,
# vllm:time_per_output_token_seconds, vllm:e2e_request_latency_seconds; its later vllm:inter_token_latency_seconds
# keeps the token-gap bounds).
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
TTFT_BUCKETS_S += (40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_GAP_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
TOKEN_GAP_BUCKETS_S += (40.0, 80.0)
E2E_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0)
E2E_BUCKETS_S += (480.0, 960.0, 1920.0, 7680.0)

# name -> (buckets, help); each histogram is "<name>" with _bucket/_sum/_count series
HISTOGRAMS = {
    "bench_ttft_seconds": (TTFT_BUCKETS_S, "Time to first token, from the intended send time (client side)."),
    "bench_itl_seconds": (TOKEN_GAP_BUCKETS_S, "Gaps between output tokens, each token its own sample (client side)."),
    "bench_tpot_seconds": (TOKEN_GAP_BUCKETS_S, "Time per output token after the first, per request (client side)."),
    "bench_e2e_seconds": (E2E_BUCKETS_S, "Request latency from the intended send time to the last token."),
}
LABELS = ("run", "scenario")


@dataclass
class Histogram:
    """Bucket counts (the last one +Inf) and the sum of one histogram."""

    bounds_s: tuple[float, ...]
    counts: np.ndarray
    sum_s: float = 0.0

    @classmethod
    def of(cls, bounds_s: tuple[float, ...]) -> Histogram:
        return cls(bounds_s, np.zeros(len(bounds_s) + 1, dtype=np.int64))

    def add(self, values_s) -> None:
        values = np.asarray(values_s, dtype=np.float64)
        if values.size:  # a value equal to a bound falls in that bucket: Prometheus buckets are `le`
            self.counts += np.bincount(np.searchsorted(self.bounds_s, values, side="left"), minlength=len(self.counts))
            self.sum_s += float(values.sum())

    def cumulative(self) -> list[tuple[str, int]]:
        """(le label, count up to it), +Inf last."""
        running = np.cumsum(self.counts).tolist()
        return [(floatToGoString(b), c) for b, c in zip(self.bounds_s, running)] + [("+Inf", running[-1])]


@dataclass
class RunSeries:
    """One run's series: its requests by status, histograms, and the latest gauges."""

    by_status: dict[str, int] = field(default_factory=dict)
    output_tokens: int = 0
    histograms: dict[str, Histogram] = field(
        default_factory=lambda: {name: Histogram.of(bounds) for name, (bounds, _) in HISTOGRAMS.items()}
    )
    in_flight: int = 0
    send_lag_p99_s: float = 0.0
    pending: list[RequestLatency] = field(default_factory=list)  # latencies not in the histograms yet

    def add(self, rec: RequestRecord, latency: RequestLatency | None) -> None:
        status = "ok" if rec.ok else rec.error_reason or "failed"
        self.by_status[status] = self.by_status.get(status, 0) + 1
        if latency is not None:
            self.output_tokens += rec.output_tokens
            self.pending.append(latency)

    def fold(self) -> None:
        """The pending latencies into the histograms, one numpy pass each."""
        lats, self.pending = self.pending, []
        if not lats:
            return
        self.histograms["bench_ttft_seconds"].add([lat.ttft_s for lat in lats if lat.ttft_s is not None])
        self.histograms["bench_itl_seconds"].add(flat([lat.itl_token_s for lat in lats]))
        self.histograms["bench_tpot_seconds"].add([lat.tpot_s for lat in lats if lat.tpot_s is not None])
        self.histograms["bench_e2e_seconds"].add([lat.e2e_s for lat in lats])


class MetricsEndpoint:
    """/metrics on host:port (port 0: a free one, in `.port`), serving every run begun on it. A scrape folds the waiting
    latencies and copies the counts under the lock the records are added under, then renders the text outside it."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self._lock = threading.Lock()
        self._runs: dict[tuple[str, str], RunSeries] = {}
        app = web.Application()
        app.router.add_get("/metrics", self._scrape)
        self._server = SideServer(app, port, host)
        self.port = self._server.port
        self.url = f"http://{host}:{self.port}/metrics"

    @property
    def thread(self):
        """The thread that serves the scrapes (its CPU is the endpoint's)."""
        return self._server.thread

    def begin_run(self, run: str, scenario: str) -> tuple[str, str]:
        """A run's label values; a run of the same name and scenario starts from zero again."""
        key = (run, scenario)
        with self._lock:
            self._runs[key] = RunSeries()
        return key

    def observe(self, key: tuple[str, str], rec: RequestRecord, latency: RequestLatency | None) -> None:
        if rec.is_warmup:
            return
        with self._lock:
            self._runs[key].add(rec, latency)

    def show(self, key: tuple[str, str], frame: LiveFrame) -> None:
        """The gauges of a frame: in flight, and the window's send lag p99."""
        with self._lock:
            series = self._runs[key]
            series.in_flight = frame.in_flight
            series.send_lag_p99_s = (frame.send_lag_p99_ms or 0.0) / 1e3

    def text(self) -> str:
        """Every run's series in Prometheus's text format (0.0.4)."""
        with self._lock:
            for series in self._runs.values():
                series.fold()
            runs = {key: _copy(series) for key, series in self._runs.items()}
        return exposition(runs)

    async def _scrape(self, request: web.Request) -> web.Response:
        return web.Response(body=self.text().encode(), headers={"Content-Type": CONTENT_TYPE_PLAIN_0_0_4})

    def close(self) -> None:
        self._server.close()


def exposition(runs: dict[tuple[str, str], RunSeries]) -> str:
    """The runs' series as Prometheus text, family by family. Written here rather than by prometheus_client's
    generate_latest: that checks and escapes every label of every sample anew, 1.9 ms a scrape of one run's 96
    samples on this 2-core machine, the endpoint's largest cost; here a run's labels are escaped once (tests parse
    the text with prometheus_client's own parser)."""
    labels = {key: ",".join(f'{name}="{_escape(value)}"' for name, value in zip(LABELS, key)) for key in runs}
    lines: list[str] = []

    def family(name: str, kind: str, text: str, samples) -> None:
        lines.append(f"# HELP {name} {text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{sample_name}{{{label}}} {floatToGoString(value)}" for sample_name, label, value in samples)

    family(
        "bench_requests_total",
        "counter",
        "Measured requests finished, by status.",
        (
            ("bench_requests_total", f'{labels[key]},status="{_escape(status)}"', count)
            for key, series in runs.items()
            for status, count in sorted(series.by_status.items())
        ),
    )
    for name, kind, text, value in (
        ("bench_output_tokens_total", "counter", "Output tokens of the completed requests.", "output_tokens"),
        ("bench_requests_in_flight", "gauge", "Requests due and not finished.", "in_flight"),
        ("bench_send_lag_seconds", "gauge", LAG_HELP, "send_lag_p99_s"),
    ):
        family(name, kind, text, ((name, labels[key], getattr(series, value)) for key, series in runs.items()))
    for name, (_, text) in HISTOGRAMS.items():
        samples = []
        for key, series in runs.items():
            histogram = series.histograms[name]
            samples += [(f"{name}_bucket", f'{labels[key]},le="{le}"', count) for le, count in histogram.cumulative()]
            samples += [
                (f"{name}_count", labels[key], int(histogram.counts.sum())),
                (f"{name}_sum", labels[key], histogram.sum_s),
            ]
        family(name, "histogram", text, samples)
    return "\n".join(lines) + "\n"


LAG_HELP = "Send lag p99 over the window: actual - intended send, less a cap wait."


def _escape(label_value: str) -> str:
    """A label value as the text format writes it: backslash, double quote and newline escaped."""
    return label_value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _copy(series: RunSeries) -> RunSeries:
    """A snapshot a scrape renders outside the lock."""
    return RunSeries(
        by_status=dict(series.by_status),
        output_tokens=series.output_tokens,
        histograms={k: Histogram(h.bounds_s, h.counts.copy(), h.sum_s) for k, h in series.histograms.items()},
        in_flight=series.in_flight,
        send_lag_p99_s=series.send_lag_p99_s,
    )
