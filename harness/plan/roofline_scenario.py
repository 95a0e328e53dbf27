"""A scenario's `plan:` block turned into the roofline step model and the KV memory of its deployment: the wiring
between the scenario and harness/plan/roofline_model.py (and roofline_fit.py, which fits that model's parameters and
so imports it).

The plan read here is the one the engine's flags complete (harness/plan/deployment.py `planned`: a vLLM
`--tensor-parallel-size 4` is plan.tensor_parallel 4), and a non-native engine's profile sets the per-step overhead,
the CUDA-graph padding of decode steps, the memory fraction and what it is a fraction of."""

from __future__ import annotations

import dataclasses

from harness.plan.architectures import Architecture, load_architecture
from harness.plan.deployment import engine_choice, planned
from harness.plan.memory import MemoryPlan, check_tensor_parallel, expert_parallel_problem, plan_memory
from harness.plan.precision import Precision, plan_precision, stored_architecture
from harness.plan.roofline_fit import fit_roofline
from harness.plan.roofline_model import DEFAULTS, RooflineStepModel
from harness.scenario.gpus import GPU_SPECS, GpuSpec


def scenario_architecture(scenario) -> Architecture:
    """The model as the plan's deployment stores it: plan.weight_dtype's (or weight_bits') bits."""
    plan = planned(scenario).plan
    return stored_architecture(
        load_architecture(plan.model or scenario.backend.model), plan.weight_dtype, plan.weight_bits
    )


def scenario_precision(scenario) -> Precision:
    """plan.weight_dtype, compute_dtype and kv_cache_dtype (harness/scenario/precision.py)."""
    plan = planned(scenario).plan
    return plan_precision(plan.weight_dtype, plan.compute_dtype, plan.kv_cache_dtype)


def precision_line(scenario) -> str | None:
    """What a roofline plan assumed for its weights, matmuls and KV cache (None for a fitted plan: its steps were
    measured); a ValueError naming the field for a precision plan.hardware cannot compute in."""
    if scenario.plan is None or scenario.plan.step_model.kind != "roofline":
        return None
    gpu = scenario_gpu(scenario) if scenario.plan.hardware else None
    return scenario_precision(scenario).line(scenario_architecture(scenario), gpu)


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
    """The model, once plan.tensor_parallel is known to split its heads as vLLM and SGLang require, and
    plan.expert_parallel its experts."""
    arch, plan = scenario_architecture(scenario), planned(scenario).plan
    check_tensor_parallel(arch, plan.tensor_parallel, "plan.tensor_parallel")
    if (problem := expert_parallel_problem(arch, plan.tensor_parallel, plan.expert_parallel)) is not None:
        raise ValueError(f"plan.expert_parallel: {problem}")
    return arch


def roofline_step_model(scenario) -> RooflineStepModel:
    """The step model of a scenario's `plan:` block with step_model roofline: parameters set there, else fitted
    to the run named in `fit` (against plan.hardware's datasheet peaks: the matmuls' at the plan's compute
    precision, so the run should have been measured at it), else DEFAULTS with the engine profile's per-step
    overhead. A non-native engine's decode steps are padded to its CUDA graphs' sizes."""
    gpu, given = scenario_gpu(scenario), scenario.plan.step_model.roofline.model_dump(exclude_none=True)
    arch, precision = tensor_parallel_architecture(scenario), scenario_precision(scenario)
    choice = engine_choice(scenario)
    base = DEFAULTS if choice is None else dataclasses.replace(DEFAULTS, overhead_ms=choice.profile.overheads.step_ms)
    if run_dir := given.pop("fit", None):
        base = fit_roofline(run_dir, precision.compute_flops(gpu), gpu.hbm_bytes_per_s).params
    params = dataclasses.replace(base, **given)
    tp, ep = planned(scenario).plan.tensor_parallel, planned(scenario).plan.expert_parallel
    if choice is None:
        return RooflineStepModel(arch, gpu, tp, params, precision, expert_parallel=ep)
    padding = choice.settings.cuda_graph_padding
    return RooflineStepModel(
        arch, gpu, tp, params, precision, capture_sizes=choice.capture_sizes, pad_to_capture=padding, expert_parallel=ep
    )


def roofline_memory(scenario, kv_block_size: int) -> MemoryPlan:
    """The KV blocks a replica of the plan's deployment has: the GPU's memory less the weights (per GPU under TP), at
    the engine profile's memory fraction (of the card, or of what the weights leave) and reserve."""
    plan, choice = planned(scenario).plan, engine_choice(scenario)
    engine = (
        {}
        if choice is None
        else {
            "reserve_bytes": choice.profile.reserve_bytes,
            "memory_fraction_of": choice.profile.memory_fraction_of,
        }
    )
    return plan_memory(
        tensor_parallel_architecture(scenario),
        scenario_gpu(scenario).hbm_bytes,
        plan.gpu_memory_utilization if choice is None else choice.settings.memory_fraction,
        plan.tensor_parallel,
        kv_bytes=scenario_precision(scenario).kv_bytes,
        kv_block_size=kv_block_size,
        expert_parallel=plan.expert_parallel,
        **engine,
    )
