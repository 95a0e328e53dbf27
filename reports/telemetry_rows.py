"""The report's device table: each run's summary.json `telemetry` figures over its measured window
(harness/engine/telemetry/derived.py; what each means: docs/telemetry.md), a row only for a run that has one."""

from __future__ import annotations

TELEMETRY_COLUMNS = (
    "run",
    "energy per output token (J)",
    "GPU energy (J)",
    "GPU DRAM active",
    "GPU tensor active",
    "MBU",
    "engine CPU (%)",
    "engine RSS max (GiB)",
)
GIB = 1024**3
TELEMETRY_NOTE = (
    "Over each run's measured window (summary.json telemetry; docs/telemetry.md): energy from the GPUs' energy "
    "counter, shares of time busy, MBU = the engine's bytes read per second over the memory bandwidth ceiling."
)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def telemetry_rows(labelled) -> list[list[str]]:
    rows = []
    for label, run in labelled:
        t = run.summary.telemetry
        if t is None:
            continue
        row = [
            label,
            _number(t.energy_per_output_token_j, 3),
            _number(t.gpu_energy_j, 0),
            _share(t.gpu_dram_active_mean),
            _share(t.gpu_tensor_active_mean),
            _share(t.mbu),
            _number(t.engine_cpu_percent_mean, 0),
            _number(None if t.engine_rss_bytes_max is None else t.engine_rss_bytes_max / GIB, 2),
        ]
        if any(cell != "-" for cell in row[1:]):
            rows.append(row)
    return rows
