"""The scenario's `plan:` block: the deployment `bench plan` simulates (harness/plan/simulator.py).

    plan:
      step_model: {fitted: [results/run-a]}     # this machine: steps fitted to measured native runs
    plan:
      hardware: H100                            # a GPU of harness/metrics/roofline.py's table
      model: llama-3.1-8b                       # builtin name | GGUF path | HF config.json path
      step_model: roofline                      # or {roofline: {mfu: 0.4, mbu: 0.7, overhead_ms: 2}}
      replicas: 100
      tensor_parallel: 1
    plan:
      step_model: {fitted: [results/run-a]}
      host_cores: 2                             # replicas share this host's 2 cores (harness/plan/host.py)

Engine settings (batch budget, KV blocks, prefix cache, router policy, data parallelism) come from
backend.launch.args, parsed as `bench serve` parses them; `replicas` overrides --data-parallel.
"""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from harness.scenario.paths import scenario_path

STEP_MODEL_FORMS = "{fitted: [RUN_DIR, ...]}, roofline, or {roofline: {mfu: 0.5, mbu: 0.8, overhead_ms: 1}}"


class _Strict(BaseModel):
    # as harness.scenario.scenario.Strict (not imported: harness.scenario.scenario imports this module)
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class RooflineParams(_Strict):
    """Unset: the roofline model's stated defaults (harness/plan/roofline_model.py)."""

    mfu: float | None = Field(default=None, gt=0, le=1, description="share of peak FLOP/s")
    mbu: float | None = Field(default=None, gt=0, le=1, description="share of peak memory bandwidth")
    overhead_ms: float | None = Field(default=None, ge=0, le=10_000, description="ms per step")
    # a run measured on plan.hardware (step trace or vLLM's MFU counters): mfu, mbu, overhead fitted (set ones win)
    fit: str | None = None

    @field_validator("fit")
    @classmethod
    def _run_folder(cls, run_dir: str | None, info: ValidationInfo) -> str | None:
        if run_dir is None:
            return None
        path = scenario_path(run_dir, info)
        if not any((path / name).is_file() for name in ("engine_trace.json", "server_metrics.csv")):
            raise ValueError(
                f"run folder {run_dir!r} has no engine_trace.json nor server_metrics.csv (looked in "
                f"{path.resolve()}); measure it with backend.trace: true, or vLLM --enable-mfu-metrics"
            )
        return str(path.resolve())


class StepModelSpec(_Strict):
    fitted: list[str] | None = None  # measured run folders with engine_trace.json
    roofline: RooflineParams | None = None

    @model_validator(mode="before")
    @classmethod
    def _roofline_word(cls, value: Any) -> Any:
        if value == "roofline":
            return {"roofline": {}}
        if not isinstance(value, dict):
            raise ValueError(f"must be {STEP_MODEL_FORMS}")  # noqa: TRY004 (pydantic reports ValueError)
        return value

    @field_validator("fitted")
    @classmethod
    def _run_folders(cls, dirs: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if dirs is None:
            return None
        if not dirs:
            raise ValueError("give at least one measured run folder, e.g. fitted: [results/run-a]")
        resolved = []
        for d in dirs:
            path = scenario_path(d, info)
            if not path.is_dir():
                raise ValueError(f"run folder {d!r} not found (looked in {path.parent.resolve()})")
            resolved.append(str(path.resolve()))
        return resolved

    @model_validator(mode="after")
    def _one_model(self) -> StepModelSpec:
        if (self.fitted is None) == (self.roofline is None):
            raise ValueError(f"give exactly one step model: {STEP_MODEL_FORMS}")
        return self

    @property
    def kind(self) -> str:
        return "fitted" if self.fitted is not None else "roofline"


class PlanSpec(_Strict):
    hardware: str | None = None  # GPU name (harness/metrics/roofline.py's table); None: this machine (fitted)
    model: str | None = None  # builtin name | GGUF path | HF config.json path; None: backend.model
    step_model: StepModelSpec
    replicas: int | None = Field(default=None, ge=1, le=100_000)  # None: the launch args' --data-parallel
    tensor_parallel: int = Field(default=1, ge=1, le=64)
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    # bits a stored weight takes (4.5: 4-bit with scales); None: the model's own (GGUF) or 16 (built-in, config.json)
    weight_bits: float | None = Field(default=None, gt=0, le=32)
    prices: dict[str, float] = {}  # $/GPU-hour by GPU name (bench plan --search)
    # Replicas sharing one CPU host (harness/plan/host.py): its cores; None: each replica has its own device.
    # engine_cores / host_other_cores: cores a stepping engine and the rest of the host (client, router) take;
    # None: read from the fitted runs' telemetry
    host_cores: float | None = Field(default=None, gt=0, le=4096)
    engine_cores: float | None = Field(default=None, gt=0, le=4096)
    host_other_cores: float | None = Field(default=None, ge=0, le=4096)

    @field_validator("model")
    @classmethod
    def _model_file(cls, model: str | None, info: ValidationInfo) -> str | None:
        """A .gguf or config.json path is relative to the scenario's folder, as run folders are."""
        if model is None or not model.endswith((".gguf", ".json")):
            return model
        path = scenario_path(model, info)
        if not path.is_file():
            raise ValueError(
                f"{model!r}: no such file (looked in {path.parent.resolve()}); give a built-in name "
                "such as llama-3.1-8b, a .gguf or an HF config.json"
            )
        return str(path.resolve())

    @model_validator(mode="after")
    def _known_gpu(self) -> PlanSpec:
        if self.hardware is not None and self.step_model.kind == "roofline":
            from harness.scenario.gpus import gpu_spec

            gpu_spec(self.hardware)  # a ValueError naming the table's GPUs
        return self

    @field_validator("prices")
    @classmethod
    def _positive_prices(cls, prices: dict[str, float]) -> dict[str, float]:
        for gpu, price in prices.items():
            if not price > 0:
                raise ValueError(f"prices.{gpu}: {price!r} must be > 0 dollars per GPU-hour")
        return prices
