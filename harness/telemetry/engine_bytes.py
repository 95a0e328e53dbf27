"""Polls the engine's Prometheus /metrics for its own estimate of bytes read (and flops done).

Engines that count what their forward passes read let us compute memory-bandwidth
utilisation (MBU) without hardware counters: bytes read per second / the memory's ceiling.
  native engine  native:weight_bytes_read_total + native:kv_bytes_read_total  (CPU: host ceiling)
  vLLM           vllm:estimated_read_bytes_per_gpu_total, vllm:estimated_flops_per_gpu_total
                 (per GPU: averaged over its `engine` label sets; GPU peak or host ceiling)
Series (source `engine_metrics`): each counter under its own name, plus read_bytes_total,
read_bytes_per_s, flops_total, flops_per_s; bandwidth_util is added at stop, once the
ceiling is known.
"""
from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from harness.telemetry.timeline import Unavailable

# family -> (counters summed into bytes read, flops counter or None)
ENGINE_COUNTERS = {
    "native": (["native:weight_bytes_read_total", "native:kv_bytes_read_total"], None),
    "vllm": (["vllm:estimated_read_bytes_per_gpu_total"], "vllm:estimated_flops_per_gpu_total"),
}


def fetch_text(url: str, timeout_s: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return response.read().decode("utf-8", errors="replace")


def per_engine_means(text: str, names: set[str]) -> dict[str, float]:
    """{sample name: value} for the wanted names, averaged over label sets (one per engine/GPU)."""
    found: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                found.setdefault(sample.name, []).append(sample.value)
    return {name: sum(values) / len(values) for name, values in found.items()}


class EngineBytesPoller:
    name = "engine_metrics"

    def __init__(self, metrics_url: str, timeout_s: float = 2.0):
        if not metrics_url.startswith(("http://", "https://")):
            raise Unavailable(f"engine_metrics_url {metrics_url!r} is not an http(s) URL")
        self.url, self.timeout_s = metrics_url, timeout_s
        self.family: str | None = None  # "native" or "vllm", known after the first good scrape
        self.not_sampled: dict[str, str] = {}
        self._last: tuple[int, float, float | None] | None = None  # (ns, bytes, flops)

    def sample(self, now_ns: int) -> list[tuple[str, str, float]]:
        try:
            text = fetch_text(self.url, self.timeout_s)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise Unavailable(f"{self.url} answers 404: this engine has no /metrics page") from None
            raise
        wanted = {n for names, flops in ENGINE_COUNTERS.values() for n in names + [flops] if n}
        values = per_engine_means(text, wanted)
        for family, (byte_names, flops_name) in ENGINE_COUNTERS.items():
            if any(n in values for n in byte_names):
                self.family = family
                break
        else:
            raise Unavailable(f"{self.url} has none of the bytes-read counters {sorted(wanted)}: "
                              f"no bandwidth utilisation from engine counters for this engine")
        byte_names, flops_name = ENGINE_COUNTERS[self.family]
        read_bytes = sum(values.get(n, 0.0) for n in byte_names)
        flops = values.get(flops_name) if flops_name else None
        rows = [("engine_metrics", name, value) for name, value in values.items()]
        rows.append(("engine_metrics", "read_bytes_total", read_bytes))
        if flops is not None:
            rows.append(("engine_metrics", "flops_total", flops))
        if self._last is not None:
            last_ns, last_bytes, last_flops = self._last
            elapsed_s = (now_ns - last_ns) / 1e9
            rows.append(("engine_metrics", "read_bytes_per_s", (read_bytes - last_bytes) / elapsed_s))
            if flops is not None and last_flops is not None:
                rows.append(("engine_metrics", "flops_per_s", (flops - last_flops) / elapsed_s))
        self._last = (now_ns, read_bytes, flops)
        return rows

    def close(self) -> None:
        pass
