"""The scenario's `plan:` block: the deployment `bench plan` simulates (harness/plan/simulator.py).

    plan:
      step_model: {fitted: [results/run-a]}     # this machine: steps fitted to measured native runs
    plan:
      hardware: H100-SXM                        # a part of harness/scenario/gpus.py's table, by exact name
      model: llama-3.1-8b                       # builtin name | GGUF path | HF config.json path
      step_model: roofline                      # or {roofline: {mfu: 0.4, mbu: 0.7, overhead_ms: 2}}
                                                # (nvlink_efficiency, pcie_efficiency too)
      replicas: 100
      tensor_parallel: 1                        # must divide the model's heads as vLLM requires
      expert_parallel: 1                        # MoE: GPUs holding whole experts (a multiple of tensor_parallel)
    plan:
      hardware: H100-SXM
      model: llama-3.1-70b
      step_model: roofline
      weight_dtype: fp8                         # --quantization fp8: fp8 weights, fp8 matmuls (W8A8)
      kv_cache_dtype: fp8                       # --kv-cache-dtype fp8: a byte a K or V element
    plan:
      gpus: {my-gpu: {memory_gib: 96, hbm_tb_per_s: 4.0, bf16_tflops: 900, interconnect_gb_per_s: 900}}
      hardware: my-gpu                          # a GPU the table lacks, described in the scenario
    plan:
      step_model: {fitted: [results/run-a]}
      host_cores: 2                             # replicas share this host's 2 cores (harness/plan/host.py)

Engine settings (batch budget, KV blocks, prefix cache, router policy, data parallelism) come from
backend.launch.args, read as the engine of backend.kind reads them: `bench serve`'s flags for the native engine,
vLLM's, SGLang's, TensorRT-LLM's or llama-server's own for theirs, over that engine's profile of defaults
(harness/plan/engine_profiles.py, engine_flags.py); `replicas` overrides the data-parallel flag. A flag may set
tensor_parallel, weight_dtype, kv_cache_dtype and gpu_memory_utilization (vLLM's `--tensor-parallel-size 4`,
`--quantization fp8`, `--kv-cache-dtype fp8`, `--gpu-memory-utilization`): it sets what the plan leaves unset, and a
plan field set here that disagrees with it is refused. gpu_memory_utilization, when set, is the engine's own
fraction (SGLang's --mem-fraction-static; TensorRT-LLM's of the memory the weights leave); unset, the profile's.
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

from harness.scenario.gpus import GIB, GpuNameError, GpuSpec, is_table_name, resolve_gpu, table_gpu_name
from harness.scenario.paths import scenario_path
from harness.scenario.precision import (
    ComputeDtype,
    KvCacheDtype,
    WeightDtype,
    compute_dtype_problem,
    weight_bits_problem,
)

STEP_MODEL_FORMS = "{fitted: [RUN_DIR, ...]}, roofline, or {roofline: {mfu: 0.5, mbu: 0.8, overhead_ms: 1}}"


class _Strict(BaseModel):
    # as harness.scenario.scenario.Strict (not imported: harness.scenario.scenario imports this module)
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class RooflineParams(_Strict):
    """Unset: the roofline model's stated defaults (harness/plan/roofline_model.py)."""

    mfu: float | None = Field(default=None, gt=0, le=1, description="share of peak FLOP/s")
    mbu: float | None = Field(default=None, gt=0, le=1, description="share of peak memory bandwidth")
    overhead_ms: float | None = Field(default=None, ge=0, le=10_000, description="ms per step")
    # the share of a link's one-way rate NCCL's all-reduce reaches (nccl-tests' busbw over it): where a deployment's
    # own measurement says other than NCCL's figures (the defaults; a two-socket PCIe server, an NVSwitch system)
    nvlink_efficiency: float | None = Field(default=None, gt=0, le=1, description="NVLink / Infinity Fabric share")
    pcie_efficiency: float | None = Field(default=None, gt=0, le=1, description="PCIe share")
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


class CustomGpu(_Strict):
    """A GPU the table lacks (plan.gpus.NAME): its datasheet's figures and the memory the card reports."""

    memory_gib: float = Field(gt=0, le=4096, description="GiB the card reports (nvidia-smi's total MiB / 1024)")
    hbm_tb_per_s: float = Field(gt=0, le=1000, description="TB/s of memory bandwidth")
    bf16_tflops: float = Field(gt=0, le=1e5, description="dense BF16 tensor TFLOP/s (a sparsity figure halved)")
    fp8_tflops: float | None = Field(default=None, gt=0, le=1e5, description="dense FP8 tensor TFLOP/s")
    int8_tops: float | None = Field(default=None, gt=0, le=1e5, description="dense INT8 tensor TOPS")
    fp4_tflops: float | None = Field(default=None, gt=0, le=1e5, description="dense FP4 tensor TFLOP/s")
    interconnect_gb_per_s: float = Field(gt=0, le=1e5, description="GB/s GPU to GPU, both directions, per GPU")
    interconnect: str = "custom link"
    source: str = "the scenario's plan.gpus"

    def spec(self, name: str) -> GpuSpec:
        tera = 1e12
        return GpuSpec(
            name=name,
            bf16_flops=self.bf16_tflops * tera,
            fp8_flops=self.fp8_tflops * tera if self.fp8_tflops else None,
            int8_ops=self.int8_tops * tera if self.int8_tops else None,
            fp4_flops=self.fp4_tflops * tera if self.fp4_tflops else None,
            hbm_bytes=self.memory_gib * GIB,
            hbm_bytes_per_s=self.hbm_tb_per_s * tera,
            interconnect=self.interconnect,
            interconnect_bytes_per_s=self.interconnect_gb_per_s * 1e9,
            source=self.source,
            memory_source="plan.gpus",
        )


class PlanSpec(_Strict):
    gpus: dict[str, CustomGpu] = {}  # GPUs the table lacks, by the name plan.hardware and plan.prices give
    hardware: str | None = None  # a part of harness/scenario/gpus.py's table or of gpus; None: this machine (fitted)
    model: str | None = None  # builtin name | GGUF path | HF config.json path; None: backend.model
    step_model: StepModelSpec
    replicas: int | None = Field(default=None, ge=1, le=100_000)  # None: the launch args' --data-parallel
    tensor_parallel: int = Field(default=1, ge=1, le=64)
    # GPUs the routed experts of a mixture-of-experts model are spread over, whole experts each (docs/planner.md,
    # Mixture of experts): 1, experts split as TP splits them; a multiple of tensor_parallel, past it over
    # expert_parallel / tensor_parallel replicas (vLLM's --enable-expert-parallel: TP x DP; SGLang's --ep-size)
    expert_parallel: int = Field(default=1, ge=1, le=1024)
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)  # unset: the engine profile's fraction
    # The deployment's precision (docs/planner.md, Precision; harness/scenario/precision.py), a roofline plan's:
    # weight_dtype: the layers' stored weights (vLLM/SGLang --quantization fp8 -> fp8, awq or gptq -> int4); None:
    # the model's own. A quantized dtype leaves the embedding and lm_head at 16 bits
    weight_dtype: WeightDtype | None = None
    # bits a stored weight takes, scales included (4.5: 4-bit with scales): with weight_dtype, the layers' (another
    # group size); alone, an average over every tensor as a GGUF's. None: weight_dtype's, else the model's own
    weight_bits: float | None = Field(default=None, gt=0, le=32)
    # the layers' matmuls: None: the weights' own precision where tensor cores take it (fp8, int8, fp4: W8A8,
    # W4A4), else bf16 (weight-only int4, the model's own weights)
    compute_dtype: ComputeDtype | None = None
    kv_cache_dtype: KvCacheDtype = "auto"  # as vLLM's --kv-cache-dtype: auto is the activations' bf16
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

    @field_validator("gpus")
    @classmethod
    def _new_gpu_names(cls, gpus: dict[str, CustomGpu]) -> dict[str, CustomGpu]:
        for name in gpus:
            if is_table_name(name):
                part = table_gpu_name(name) or "a name of its parts"
                raise ValueError(
                    f"{name!r} is the GPU table's {part}; give yours a name of its own, e.g. {name}-custom"
                )
        return gpus

    @field_validator("hardware")
    @classmethod
    def _known_gpu(cls, hardware: str | None, info: ValidationInfo) -> str | None:
        """A part of the table or of plan.gpus (checked once gpus is valid: its own errors come first)."""
        if hardware is not None and "gpus" in info.data:
            custom = {name: gpu.spec(name) for name, gpu in info.data["gpus"].items()}
            try:
                resolve_gpu(hardware, custom)
            except GpuNameError as e:
                raise ValueError(str(e)) from None
        return hardware

    def gpu_spec(self, name: str) -> GpuSpec:
        """The part `name` means: plan.gpus first, then the table; a GpuNameError (a ValueError) otherwise."""
        return resolve_gpu(name, {custom: gpu.spec(custom) for custom, gpu in self.gpus.items()})

    @field_validator("weight_dtype", "compute_dtype", "kv_cache_dtype")
    @classmethod
    def _roofline_precision(cls, value: str | None, info: ValidationInfo) -> str | None:
        """A precision set under a fitted step model would be ignored: its steps were measured as they ran."""
        step_model = info.data.get("step_model")
        if value not in (None, "auto") and step_model is not None and step_model.kind == "fitted":
            raise ValueError(
                "applies to a roofline step model (a GPU's datasheet); a fitted one measured the engine at the "
                "precision it ran, so leave it out"
            )
        return value

    @field_validator("weight_bits")
    @classmethod
    def _bits_hold_the_weights(cls, bits: float | None, info: ValidationInfo) -> float | None:
        if (problem := weight_bits_problem(info.data.get("weight_dtype"), bits)) is not None:
            raise ValueError(problem)
        return bits

    @field_validator("compute_dtype")
    @classmethod
    def _compute_takes_the_weights(cls, compute: str | None, info: ValidationInfo) -> str | None:
        if (problem := compute_dtype_problem(compute, info.data.get("weight_dtype"))) is not None:
            raise ValueError(problem)
        return compute

    @field_validator("prices")
    @classmethod
    def _positive_prices(cls, prices: dict[str, float]) -> dict[str, float]:
        for gpu, price in prices.items():
            if not price > 0:
                raise ValueError(f"prices.{gpu}: {price!r} must be > 0 dollars per GPU-hour")
        return prices
