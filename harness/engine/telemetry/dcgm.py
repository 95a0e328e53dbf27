"""Scrapes a dcgm-exporter /metrics page (where one runs beside the GPUs, e.g. in Kubernetes).

Keeps every DCGM_FI_* series that has a `gpu` label, as source `dcgm:<gpu>` (`dcgm:<gpu>/<GPU_I_ID>`
for a MIG instance), so they sit beside what gpu.py reads through NVML as `gpu:<index>`.
Values keep dcgm-exporter's units (gpu.py documents them) except the energy counter, which
dcgm-exporter gives in mJ and we keep in J like gpu.py.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from backends.base import http_get
from harness.engine.telemetry.timeline import Unavailable

TO_OUR_UNITS = {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 1e-3}  # mJ -> J


def parse_dcgm_exporter(text: str) -> list[tuple[str, str, float]]:
    rows = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            gpu = sample.labels.get("gpu")
            # The parser names a counter's sample NAME_total; dcgm-exporter's own name has no suffix.
            name = family.name if sample.name == f"{family.name}_total" else sample.name
            if not name.startswith("DCGM_FI_") or gpu is None or sample.name.endswith("_created"):
                continue
            instance = sample.labels.get("GPU_I_ID")
            source = f"dcgm:{gpu}/{instance}" if instance else f"dcgm:{gpu}"
            rows.append((source, name, sample.value * TO_OUR_UNITS.get(name, 1.0)))
    return rows


class DcgmScraper:
    def __init__(self, url: str, timeout_s: float = 2.0):
        if not url.startswith(("http://", "https://")):
            raise Unavailable(f"dcgm_exporter_url {url!r} is not an http(s) URL (e.g. http://127.0.0.1:9400/metrics)")
        self.url, self.timeout_s = url, timeout_s
        self.not_sampled: dict[str, str] = {}

    def sample(self, now_ns: int) -> list[tuple[str, str, float]]:
        rows = parse_dcgm_exporter(http_get(self.url, timeout_s=self.timeout_s))
        if not rows:
            raise Unavailable(f"{self.url} has no DCGM_FI_* series with a gpu label: is it a dcgm-exporter?")
        return rows

    def close(self) -> None:
        pass
