"""Polls the engine's Prometheus /metrics for its own estimate of bytes read (and flops done).

Engines that count what their forward passes read let us compute memory-bandwidth
utilisation (MBU) without hardware counters: bytes read per second / the memory's ceiling
(reads only: decode is dominated by them, and the native engine counts nothing else).
  native engine  native:weight_bytes_read_total + native:kv_bytes_read_total, native:flops_total  (CPU: host ceiling)
  vLLM, SGLang   <prefix>:estimated_{read,write}_bytes_per_gpu_total, <prefix>:estimated_flops_per_gpu_total
                 per GPU (vllm/v1/metrics/perf.py PerfMetricsProm, one label set per engine; SGLang's
                 python/sglang/srt/observability/metrics_collector.py, one per TP rank); only with
                 --enable-mfu-metrics, and vLLM's CPU backend leaves them at 0 (then they count as not sampled)
Label sets combine as in the run's server_metrics.csv (harness.engine.server_metrics.combine_label_sets): the
per-GPU counters are averaged, so the rate is one GPU's and MBU divides it by one GPU's ceiling.
During `bench run` the pages come from the run's /metrics scraper (server_metrics.py), so the
engine is asked once per interval; standalone, the poller fetches them itself.
Series (source `engine_metrics`): each counter under its own name, plus read_bytes_total,
write_bytes_total, flops_total and their per-second rates; bandwidth_util is added at stop,
once the ceiling is known.
"""

from __future__ import annotations

import urllib.error

from prometheus_client.parser import text_string_to_metric_families

from backends.base import http_get
from harness.engine.server_metrics import combine_label_sets
from harness.engine.telemetry.timeline import Unavailable

# family -> {what: counters summed into it}
ENGINE_COUNTERS = {
    "native": {
        "read_bytes": ["native:weight_bytes_read_total", "native:kv_bytes_read_total"],
        "flops": ["native:flops_total"],
    },
    **{
        prefix: {
            "read_bytes": [f"{prefix}:estimated_read_bytes_per_gpu_total"],
            "write_bytes": [f"{prefix}:estimated_write_bytes_per_gpu_total"],
            "flops": [f"{prefix}:estimated_flops_per_gpu_total"],
        }
        for prefix in ("vllm", "sglang")
    },
}
WANTED = {name for family in ENGINE_COUNTERS.values() for names in family.values() for name in names}


def engine_counters(text: str, names: set[str]) -> dict[str, float]:
    """{sample name: value} for the wanted names, their label sets combined by combine_label_sets."""
    found: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                found.setdefault(sample.name, []).append(sample.value)
    return {name: combine_label_sets(name, values) for name, values in found.items()}


class EngineBytesPoller:
    def __init__(self, metrics_url: str, timeout_s: float = 2.0):
        if not metrics_url.startswith(("http://", "https://")):
            raise Unavailable(f"engine_metrics_url {metrics_url!r} is not an http(s) URL")
        self.url, self.timeout_s = metrics_url, timeout_s
        self.not_sampled: dict[str, str] = {}
        self.family: str | None = None  # a key of ENGINE_COUNTERS, known after the first good scrape
        self._last: tuple[int, dict[str, float]] | None = None  # (ns, {what: total})

    def sample(self, now_ns: int) -> list[tuple[str, str, float]]:
        try:
            text = http_get(self.url, timeout_s=self.timeout_s)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise Unavailable(f"{self.url} answers 404: this engine has no /metrics page") from None
            raise
        return self.ingest(now_ns, text)

    def ingest(self, now_ns: int, text: str) -> list[tuple[str, str, float]]:
        """Rows from one /metrics page fetched at now_ns (by sample(), or by the run's scraper)."""
        values = engine_counters(text, WANTED)
        self.family = next(
            (
                family
                for family, counters in ENGINE_COUNTERS.items()
                if any(name in values for name in counters["read_bytes"])
            ),
            None,
        )
        if self.family is None:
            raise Unavailable(
                f"{self.url} has no bytes-read counters (native:*_bytes_read_total, "
                f"vllm: or sglang:estimated_read_bytes_per_gpu_total): no MBU for this engine"
            )
        totals = {
            what: sum(values[n] for n in names if n in values)
            for what, names in ENGINE_COUNTERS[self.family].items()
            if any(n in values for n in names)
        }
        rows = [("engine_metrics", name, value) for name, value in values.items()]
        rows += [("engine_metrics", f"{what}_total", total) for what, total in totals.items()]
        if self._last is not None:
            last_ns, last_totals = self._last
            elapsed_s = (now_ns - last_ns) / 1e9
            rows += [
                ("engine_metrics", f"{what}_per_s", (total - last_totals[what]) / elapsed_s)
                for what, total in totals.items()
                if what in last_totals and elapsed_s > 0
            ]
        self._last = (now_ns, totals)
        return rows

    def close(self) -> None:
        pass
