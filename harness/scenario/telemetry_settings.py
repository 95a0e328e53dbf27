"""The scenario's `telemetry:` block: what the run samples beside the load, and how often
(harness/engine/telemetry/ does the sampling)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, field_validator


class TelemetryConfig(BaseModel):
    """The scenario's `telemetry:` section."""

    model_config = ConfigDict(extra="forbid", strict=True)

    enabled: bool = True
    interval_ms: int = 500
    gpu: bool = True
    host: bool = True
    dcgm_exporter_url: str | None = None  # e.g. http://127.0.0.1:9400/metrics
    engine_metrics_url: str | None = None  # the backend's /metrics; the harness fills it in

    @field_validator("interval_ms")
    @classmethod
    def _not_too_fast(cls, value: int) -> int:
        if value < 100:
            raise ValueError(
                f"telemetry.interval_ms must be at least 100 (got {value}): sampling faster "
                f"costs the engine CPU time it is being measured on; use 100-1000"
            )
        return value
