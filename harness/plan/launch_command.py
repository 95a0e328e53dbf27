"""A planned deployment as the engine's own launch command, and as the `bench run` and `bench tune` scenarios that
measure it once the GPUs exist: plan -> run -> tune in one loop.

The flags are the engine's own spelling, each read back by harness/plan/engine_flags.py (the plan's reading of the
same engines' argument parsers, with their sources) in tests/test_plan_quote.py:
- vLLM: `vllm serve MODEL` (the model is `vllm serve [model_tag] [options]`'s positional: vllm-project/vllm
  vllm/entrypoints/cli/serve.py @ 00a5fdd20935ba7679750db22997dcf539ca4591), `--tensor-parallel-size` and
  `--data-parallel-size` (vllm/engine/arg_utils.py @ 99d7eb5d6a512cfcc5a2b104f24ebf2d6cda772b, parallel_group):
  replicas are data-parallel ranks behind vLLM's own API server, as the simulation puts them behind one router;
- SGLang: `python -m sglang.launch_server --model-path MODEL --tp-size TP --dp-size R` (sgl-project/sglang
  python/sglang/srt/server_args.py, the flags engine_flags.py reads);
- TensorRT-LLM: `trtllm-serve MODEL --tp_size TP`, one server per replica behind a load balancer of your own
  (trtllm-serve has no data-parallel flag for a dense model: NVIDIA/TensorRT-LLM tensorrt_llm/commands/serve.py);
- native: `bench serve --data-parallel R`.
The scenario's own launch args come after, as written (the plan read them in the engine's spelling already).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

from harness.scenario.scenario import Scenario

# the engine's KV-cache dtype flag value for plan.kv_cache_dtype (harness/plan/engine_flags.py KV_DTYPES, inverted)
KV_CACHE_FLAG = {"vllm": "--kv-cache-dtype", "sglang": "--kv-cache-dtype"}
MEMORY_FLAG = {"vllm": "--gpu-memory-utilization", "sglang": "--mem-fraction-static"}
# tune's space for the engine's batch limit: the profile default (vLLM 1,024 on an H100, else 256; SGLang from its
# KV pool; TensorRT-LLM 2,048: docs/planner.md's table) and below it, where TTFT under load may gain
BATCH_FLAG = {"vllm": "--max-num-seqs", "sglang": "--max-running-requests", "trtllm": "--max_batch_size"}
BATCH_VALUES = (128, 256, 512, 1024)


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    kind: str  # backend.kind
    model: str  # the HF repository (or path) the engine loads
    program: list[str]  # the engine's command before its flags
    args: list[str]  # the flags: backend.launch.args of the run scenario
    servers: int  # copies of the command to start (TensorRT-LLM: one per replica)
    note: str  # how the copies share the load, or ""

    @property
    def command(self) -> str:
        return shlex.join([*self.program, *self.args])


def hf_model(scenario: Scenario) -> str:
    """The model the engine should load: backend.model when it names a repository or a path, else the repository
    of the built-in architecture's config.json (https://huggingface.co/ORG/NAME/blob/main/config.json)."""
    model = scenario.backend.model or ""
    if "/" in model:
        return model
    from harness.plan.roofline_scenario import scenario_architecture

    source = scenario_architecture(scenario).source or ""
    parts = source.split("huggingface.co/", 1)
    return "/".join(parts[1].split("/")[:2]) if len(parts) == 2 else (scenario.plan.model or model)


def launch_plan(scenario: Scenario, tensor_parallel: int, replicas: int) -> LaunchPlan:
    """The command that starts `replicas` x TP `tensor_parallel` of the scenario's engine on its model."""
    kind, model = scenario.backend.kind, hf_model(scenario)
    own = [str(a) for a in (scenario.backend.launch.args if scenario.backend.launch else [])]
    servers, note = 1, ""
    if kind == "vllm":
        program = ["vllm", "serve", model]
        args = ["--tensor-parallel-size", str(tensor_parallel)] + (
            ["--data-parallel-size", str(replicas)] if replicas > 1 else []
        )
    elif kind == "sglang":
        program = ["python", "-m", "sglang.launch_server", "--model-path", model]
        args = ["--tp-size", str(tensor_parallel)] + (["--dp-size", str(replicas)] if replicas > 1 else [])
    elif kind == "trtllm":
        program, args, servers = ["trtllm-serve", model], ["--tp_size", str(tensor_parallel)], replicas
        if replicas > 1:
            note = f"start {replicas} servers, {tensor_parallel} GPU(s) each, behind a load balancer"
    else:
        program = ["bench", "serve"]
        args = ["--data-parallel", str(replicas)] if replicas > 1 else []
    return LaunchPlan(
        kind=kind, model=model, program=program, args=args + plan_flags(scenario, own) + own, servers=servers, note=note
    )


def plan_flags(scenario: Scenario, own: list[str]) -> list[str]:
    """The plan fields the engine takes as flags (KV-cache dtype, memory fraction) when set and not in its args."""
    kind, plan, flags = scenario.backend.kind, scenario.plan, []
    kv_dtype = getattr(plan, "kv_cache_dtype", None)
    if kind in KV_CACHE_FLAG and kv_dtype not in (None, "auto") and KV_CACHE_FLAG[kind] not in own:
        flags += [KV_CACHE_FLAG[kind], str(kv_dtype)]
    set_in_plan = "gpu_memory_utilization" in plan.model_fields_set  # else the engine's own default stands
    if kind in MEMORY_FLAG and set_in_plan and MEMORY_FLAG[kind] not in own:
        flags += [MEMORY_FLAG[kind], f"{plan.gpu_memory_utilization:g}"]
    return flags + expert_parallel_flags(kind, getattr(plan, "expert_parallel", 1), own)


def expert_parallel_flags(kind: str, expert_parallel: int, own: list[str]) -> list[str]:
    """plan.expert_parallel as the engine's flag, unless its args already say it: vLLM's switch (EP over TP x DP),
    SGLang's --ep-size, TensorRT-LLM's --ep_size."""
    spelled = {"vllm": ["--enable-expert-parallel"], "sglang": ["--ep-size", str(expert_parallel)]}
    spelled["trtllm"] = ["--ep_size", str(expert_parallel)]
    if expert_parallel == 1 or kind not in spelled or spelled[kind][0] in own:
        return []
    return spelled[kind]


def run_scenario_dict(scenario: Scenario, launch: LaunchPlan, name: str) -> dict:
    """The scenario as written (its load at the level's rate), its engine launched as planned on the real GPUs: no
    plan: block."""
    data = scenario.model_dump(mode="json", exclude_unset=True)
    data.pop("plan", None)
    data.pop("tune", None)
    data["name"] = name
    backend = data.setdefault("backend", {})
    backend["model"] = launch.model
    backend["launch"] = {**(backend.get("launch") or {}), "args": launch.args}
    backend.pop("url", None)
    return data


def tune_scenario_dict(scenario: Scenario, launch: LaunchPlan, name: str, capacity_per_s: float | None) -> dict:
    """The run scenario with a tune: block: the engine's batch limit over BATCH_VALUES, the rate from half the asked
    one to twice the planned capacity (or the asked rate), so the measured search brackets the prediction."""
    data = run_scenario_dict(scenario, launch, name)
    rate = scenario.load.rate
    flag = BATCH_FLAG.get(launch.kind)
    if rate is None or flag is None or flag in launch.args:
        return {}
    top = float(f"{max(2 * (capacity_per_s or rate), rate):.3g}")
    data["tune"] = {"space": {flag: list(BATCH_VALUES)}, "load": {"rate": {"min": rate / 2, "max": top}}}
    return data


def write_scenarios(out_dir: Path, scenario: Scenario, launch: LaunchPlan, name: str, capacity_per_s) -> list[Path]:
    """OUT/deploy/NAME-run.yaml (and NAME-tune.yaml where the engine has a batch flag to tune)."""
    folder = out_dir / "deploy"
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for suffix, data in (
        ("run", run_scenario_dict(scenario, launch, name)),
        ("tune", tune_scenario_dict(scenario, launch, f"{name}-tune", capacity_per_s)),
    ):
        if data:
            path = folder / f"{name}-{suffix}.yaml"
            path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
            written.append(path)
    return written
