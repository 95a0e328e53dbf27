"""Why the numbers are what they are: the phase breakdown, the prefix cache and speculative decoding over the
window, the roofline placement and the diagnosis of one run, filled into its summary in one call
(harness/metrics/phases.py, server_metrics.py, roofline.py, diagnosis.py hold the logic)."""

from __future__ import annotations

from pathlib import Path

from harness.engine.server_metrics import read_schema, window_hit_rate, window_speculative
from harness.metrics.diagnosis import Run, diagnose
from harness.metrics.phases import phases
from harness.metrics.roofline import local_gpu_name, roofline
from harness.results.schema import Summary, Telemetry


def explain(
    summary: Summary,
    records: list,
    out_dir: Path,
    steps: list[dict],
    scenario: dict,
    scrape_offset_s: float = 0.0,
) -> None:
    """Fills the summary's phases_ms, prefix_cache and speculative (when requests were measured), roofline and
    diagnosis. `scrape_offset_s`: the records' time plus this is server_metrics.csv's time (run.json
    telemetry_t0_offset_s)."""
    metrics_csv = Path(out_dir) / "server_metrics.csv"
    series = {}
    if metrics_csv.is_file():
        series = {
            name: [(t - scrape_offset_s, v) for t, v in points] for name, points in read_schema(metrics_csv).items()
        }
    summary.phases_ms = phases(records, metrics_csv, scrape_offset_s)
    measured = [r for r in records if not r.is_warmup]
    if measured:
        end_s = max(r.end_s if r.end_s is not None else r.intended_send_s for r in measured)
        start_s = min(r.intended_send_s for r in measured)
        summary.prefix_cache = window_hit_rate(series, start_s, end_s)
        summary.speculative = window_speculative(series, start_s, end_s)
    kind = scenario["backend"]["kind"]
    summary.roofline = roofline(
        steps, summary.telemetry or Telemetry(), kind, None if kind == "native" else local_gpu_name()
    )
    summary.diagnosis = diagnose(Run(summary, records, series, steps, scenario))


def explanation_lines(summary: Summary) -> list[str]:
    """The console's account: where TTFT went, then each finding."""
    lines = []
    phases_ms = summary.phases_ms
    share = phases_ms.ttft_share if phases_ms is not None else None
    if share is not None:
        parts = ", ".join(
            f"{name} {100 * value:.0f}%"
            for name, value in sorted(share.model_dump(exclude_none=True).items(), key=lambda kv: -kv[1])
            if value >= 0.005
        )
        source = f" ({phases_ms.source})" if phases_ms.source else ""
        lines.append(f"TTFT {phases_ms.ttft.mean:.0f} ms mean: {parts}{source}")
    for finding in summary.diagnosis or ():
        lines.append(f"[{finding.severity}] {finding.message}")
    return lines
