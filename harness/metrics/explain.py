"""Why the numbers are what they are: the phase breakdown, the prefix cache and speculative decoding over the
window, the roofline placement and the diagnosis of one run, added to its summary in one call
(harness/metrics/phases.py, server_metrics.py, roofline.py, diagnosis.py hold the logic)."""

from __future__ import annotations

from pathlib import Path

from harness.engine.server_metrics import read_schema, window_hit_rate, window_speculative
from harness.metrics.diagnosis import Run, diagnose
from harness.metrics.phases import phases
from harness.metrics.roofline import local_gpu_name, roofline


def explain(
    summary: dict, records: list, out_dir: Path, steps: list[dict], scenario: dict, scrape_offset_s: float = 0.0
) -> dict:
    """{phases_ms, prefix_cache, speculative, roofline, diagnosis} for summary.json. `scrape_offset_s`: the records'
    time plus this is server_metrics.csv's time (run.json telemetry_t0_offset_s)."""
    metrics_csv = Path(out_dir) / "server_metrics.csv"
    series = {}
    if metrics_csv.is_file():
        series = {
            name: [(t - scrape_offset_s, v) for t, v in points] for name, points in read_schema(metrics_csv).items()
        }
    out = {"phases_ms": phases(records, metrics_csv, scrape_offset_s)}
    measured = [r for r in records if not r.is_warmup]
    if measured:
        end_s = max(r.end_s if r.end_s is not None else r.intended_send_s for r in measured)
        start_s = min(r.intended_send_s for r in measured)
        out["prefix_cache"] = window_hit_rate(series, start_s, end_s)
        out["speculative"] = window_speculative(series, start_s, end_s)
    kind = scenario["backend"]["kind"]
    out["roofline"] = roofline(
        steps, summary.get("telemetry") or {}, kind, None if kind == "native" else local_gpu_name()
    )
    out["diagnosis"] = diagnose(Run({**summary, **out}, records, series, steps, scenario))
    return out


def explanation_lines(summary: dict) -> list[str]:
    """The console's account: where TTFT went, then each finding."""
    lines = []
    phases_ms = summary.get("phases_ms") or {}
    share = phases_ms.get("ttft_share")
    if share:
        parts = ", ".join(
            f"{name} {100 * value:.0f}%"
            for name, value in sorted(share.items(), key=lambda kv: -kv[1])
            if value >= 0.005
        )
        lines.append(f"TTFT {phases_ms['ttft']['mean']:.0f} ms mean: {parts} ({phases_ms.get('source')})")
    for finding in summary.get("diagnosis") or ():
        lines.append(f"[{finding['severity']}] {finding['message']}")
    return lines
