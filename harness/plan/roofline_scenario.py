"""A scenario's `plan:` block turned into the roofline step model and the KV memory of its deployment: the wiring
between the scenario and harness/plan/roofline_model.py (and roofline_fit.py, which fits that model's parameters and
so imports it)."""

from __future__ import annotations

import dataclasses

from harness.plan.architectures import Architecture, load_architecture
from harness.plan.memory import MemoryPlan, check_tensor_parallel, plan_memory
from harness.plan.roofline_fit import fit_roofline
from harness.plan.roofline_model import DEFAULTS, RooflineStepModel
from harness.scenario.gpus import GPU_SPECS, GpuSpec


def scenario_architecture(scenario) -> Architecture:
    plan = scenario.plan
    return load_architecture(plan.model or scenario.backend.model, plan.weight_bits)


def scenario_gpu(scenario) -> GpuSpec:
    """plan.hardware's part: one of plan.gpus, else of the GPU table (harness/scenario/gpus.py)."""
    plan = scenario.plan
    if not plan.hardware:
        raise ValueError(
            f"plan.hardware: the roofline step model needs a GPU; one of {', '.join(GPU_SPECS)}, or one "
            "described under plan.gpus"
        )
    try:
        return plan.gpu_spec(plan.hardware)
    except ValueError as e:
        raise ValueError(f"plan.hardware {plan.hardware!r}: {e}") from None


def tensor_parallel_architecture(scenario) -> Architecture:
    """The model, once plan.tensor_parallel is known to split its heads as vLLM and SGLang require."""
    arch = scenario_architecture(scenario)
    check_tensor_parallel(arch, scenario.plan.tensor_parallel, "plan.tensor_parallel")
    return arch


def roofline_step_model(scenario) -> RooflineStepModel:
    """The step model of a scenario's `plan:` block with step_model roofline: parameters set there, else fitted
    to the run named in `fit` (against plan.hardware's datasheet peaks), else DEFAULTS."""
    gpu, given = scenario_gpu(scenario), scenario.plan.step_model.roofline.model_dump(exclude_none=True)
    arch = tensor_parallel_architecture(scenario)
    base = DEFAULTS
    if run_dir := given.pop("fit", None):
        base = fit_roofline(run_dir, gpu.tensor_flops("bf16"), gpu.hbm_bytes_per_s).params
    return RooflineStepModel(arch, gpu, scenario.plan.tensor_parallel, dataclasses.replace(base, **given))


def roofline_memory(scenario, kv_block_size: int) -> MemoryPlan:
    """The KV blocks a replica of the plan's deployment has: the GPU's memory less the weights (per GPU under TP)."""
    plan = scenario.plan
    return plan_memory(
        tensor_parallel_architecture(scenario),
        scenario_gpu(scenario).hbm_bytes,
        plan.gpu_memory_utilization,
        plan.tensor_parallel,
        kv_block_size=kv_block_size,
    )
