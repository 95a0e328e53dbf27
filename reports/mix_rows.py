"""The report's table of a workload.mix: each model's (or adapter's) requests and latencies, from summary.json's
`by_model`, a row per run and model."""

from __future__ import annotations

MIX_COLUMNS = (
    "run",
    "model",
    "requests",
    "failed",
    "req/s",
    "TTFT p50",
    "TTFT p99",
    "TPOT p50",
    "TPOT p99",
    "E2E p50",
    "E2E p99",
)


MIX_NOTE = "Each model's requests over the run's own measured window; latencies in ms from the intended send time."


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def mix_rows(labelled) -> list[list[str]]:
    rows = []
    for label, run in labelled:
        for model, f in (run.summary.by_model or {}).items():
            rows.append(
                [
                    label,
                    model,
                    str(f.requests),
                    str(f.failed),
                    f"{f.requests_per_s:.2f}",
                    _ms(f.ttft_ms.p50),
                    _ms(f.ttft_ms.p99),
                    _ms(f.tpot_ms.p50),
                    _ms(f.tpot_ms.p99),
                    _ms(f.e2e_ms.p50),
                    _ms(f.e2e_ms.p99),
                ]
            )
    return rows
