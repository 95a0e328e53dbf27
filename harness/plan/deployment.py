"""The simulated deployment's engine settings. `backend.kind` picks the engine's profile
(harness/plan/engine_profiles.py) and its own flags in `backend.launch.args` change it as they change the engine
(harness/plan/engine_flags.py); the native engine's flags are parsed by `bench serve`'s own command line
(native_engine/cli.py). Either way a flag means in `bench plan` what it means to the engine."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import click
import typer

from harness.plan.engine_flags import (
    EXPERT_PARALLEL_OVER_TP_DP,
    PLAN_FIELDS,
    EngineFlags,
    engine_flags,
    same_setting,
)
from harness.plan.engine_profiles import EngineProfile, EngineSettings, engine_profile
from native_engine.config import CacheAwareConfig, SchedulerConfig, from_flags
from native_engine.disaggregation import DisaggregationSpec  # --disaggregate read as the engine reads it

PLACEHOLDERS = {"{port}": "0", "{host}": "127.0.0.1"}
UNBOUNDED_WAITING = 1 << 62  # an engine whose waiting queue has no bound (vLLM, SGLang): no request is refused
SGLANG_MAX_PREFILL_TOKENS = 16384  # ServerArgs.max_prefill_tokens: a prefill batch's tokens with chunking off
# the plan fields an engine flag may set, as PlanSpec names them
PLAN_SPEC_FIELDS = {
    "tensor_parallel": "tensor_parallel",
    "weight_dtype": "weight_dtype",
    "kv_cache_dtype": "kv_cache_dtype",
    "memory_fraction": "gpu_memory_utilization",
    "expert_parallel": "expert_parallel",
}


@dataclass(frozen=True, kw_only=True)
class EngineChoice:
    """The engine a plan simulates (any but the native one): its profile, its settings on the plan's GPU and where
    each setting came from ("profile default", the flag that set it, or the plan field)."""

    profile: EngineProfile
    settings: EngineSettings
    sources: dict[str, str]
    tensor_parallel: int
    replicas: int | None  # --data-parallel-size / --dp-size; None: not set

    @property
    def capture_sizes(self) -> tuple[int, ...]:
        return self.profile.capture_sizes(self.settings)

    @property
    def not_modelled(self) -> list[str]:
        return list(self.profile.not_modelled)

    def from_flags(self) -> list[str]:
        return [f"{name} {source}" for name, source in self.sources.items() if source != "profile default"]

    def describe(self) -> dict:
        p = self.profile
        return {
            "profile": p.kind,
            "name": p.name,
            "settings": dataclasses.asdict(self.settings),
            "sources": dict(self.sources),
            "batching": p.batching,
            "admission": p.admission,
            "prefix_cache": p.prefix_cache_words if self.settings.enable_prefix_caching else None,
            "memory_fraction_of": p.memory_fraction_of,
            "cuda_graph_sizes": list(self.capture_sizes),
            "overheads_ms": dataclasses.asdict(p.overheads),
            "not_modelled": self.not_modelled,
            "profile_sources": list(p.sources),
        }


@dataclass
class Deployment:
    scheduler: SchedulerConfig
    num_kv_blocks: int  # per replica
    kv_block_size: int  # tokens per block
    enable_prefix_caching: bool
    prefix_cache: str  # "hash" | "radix"
    replicas: int
    router_policy: str  # round_robin | least_load | cache_aware (with more than one replica)
    cache_aware: CacheAwareConfig
    max_model_len: int  # tokens one sequence may hold
    engine: EngineChoice | None = None  # the engine's profile and settings; None: the native engine
    # --disaggregate prefill=P,decode=D: P prefill and D decode replicas (harness/plan/disaggregation.py); None:
    # every replica serves whole requests behind the router
    disaggregate: DisaggregationSpec | None = None


def serve_parameters(launch_args: list[str], model: str) -> dict:
    """{parameter: value} as `bench serve` would read launch_args; a bad flag is a ValueError naming it."""
    from native_engine.cli import serve  # typer's command objects are only needed here

    app = typer.Typer()
    app.command()(serve)
    args = [a.replace("{model}", model) for a in launch_args]
    for placeholder, value in PLACEHOLDERS.items():
        args = [a.replace(placeholder, value) for a in args]
    try:
        return typer.main.get_command(app).make_context("serve", args).params
    except (click.UsageError, typer.TyperException) as e:  # typer >= 0.29 parses with its own copy of click
        raise ValueError(f"backend.launch.args: {e.format_message()} (the flags of `bench serve --help`)") from None


def deployment_from_args(
    launch_args: list[str], model: str, replicas: int | None = None, context_length: int = 8192
) -> Deployment:
    """The native engine's deployment: `replicas` (plan.replicas) overrides --data-parallel; context_length is the
    model's."""
    p = serve_parameters(launch_args, model)
    try:
        serve = from_flags(p)  # the settings as `bench serve` builds them: one definition (native_engine/config.py)
    except ValueError as e:
        raise ValueError(f"backend.launch.args: {e}") from None
    engine, deployment = serve.engine, serve.deployment
    split = disaggregation(deployment, replicas)
    if engine.speculative is not None:
        raise ValueError(
            "backend.launch.args: --speculative is not simulated by bench plan (acceptance depends "
            "on the text); leave it out"
        )
    num_blocks = engine.kv_cache_tokens // max(engine.kv_block_size, 1)
    return Deployment(
        engine.scheduler,
        num_blocks,
        engine.kv_block_size,
        engine.enable_prefix_caching,
        engine.prefix_cache,
        split.prefill + split.decode if split else replicas or deployment.data_parallel,
        deployment.router_policy,
        deployment.cache_aware,
        min(context_length, num_blocks * engine.kv_block_size),
        disaggregate=split,
    )


def disaggregation(deployment, replicas: int | None) -> DisaggregationSpec | None:
    """The native engine's --disaggregate split (None without it), refused as `bench serve` refuses it, and beside
    plan.replicas, which would say the replica count twice."""
    if deployment.disaggregate is None:
        return None
    try:
        split = DisaggregationSpec.parse(deployment.disaggregate)
    except ValueError as e:
        raise ValueError(f"backend.launch.args: {e}") from None
    if deployment.data_parallel > 1:
        raise ValueError(
            "backend.launch.args: --disaggregate: give it or --data-parallel, not both (prefill=P,decode=D already "
            "says how many engine processes run)"
        )
    if replicas is not None:
        raise ValueError(
            f"plan.replicas: {replicas} and backend.launch.args --disaggregate {deployment.disaggregate} both say "
            "how many replicas run; give one of them"
        )
    return split


def scenario_flags(scenario) -> EngineFlags | None:
    """The engine's flags in backend.launch.args (None for the native engine, whose flags are bench serve's)."""
    backend = scenario.backend
    if backend.kind == "native":
        return None
    engine_profile(backend.kind)  # a kind without a profile is refused here, naming the ones there are
    return engine_flags(backend.kind, backend.launch.args if backend.launch else [], backend.model)


def plan_fields_from_flags(plan, flags: EngineFlags) -> dict:
    """{PlanSpec field: value} the flags set. The rule: a flag sets what the plan leaves unset; an explicit plan
    field and a flag that disagree are refused naming both."""
    update = {}
    for name, plan_field in PLAN_SPEC_FIELDS.items():
        if name not in flags.values:
            continue
        value = flags.values[name]
        if value == EXPERT_PARALLEL_OVER_TP_DP:  # vLLM's --enable-expert-parallel: over every GPU of TP x DP
            tp = flags.values.get("tensor_parallel", plan.tensor_parallel)
            value = tp * (plan.replicas or flags.values.get("data_parallel", 1))
        if plan_field not in plan.model_fields_set:
            update[plan_field] = value
        elif not same_setting(name, getattr(plan, plan_field), value):
            raise ValueError(
                f"backend.launch.args {flags.spelled[name]} and {PLAN_FIELDS[name]}: {getattr(plan, plan_field)} "
                f"disagree; give one of them (the flag, or the plan field), or make them agree"
            )
    return update


def planned(scenario):
    """The scenario whose plan holds what the engine's flags set of it (tensor parallelism, the weights' and KV
    cache's dtype, the memory fraction); the scenario itself for the native engine or when no flag sets them."""
    if scenario.plan is None or (flags := scenario_flags(scenario)) is None:
        return scenario
    update = plan_fields_from_flags(scenario.plan, flags)
    if not update:
        return scenario
    return scenario.model_copy(update={"plan": scenario.plan.model_copy(update=update)})


def engine_choice(scenario) -> EngineChoice | None:
    """The non-native engine's profile and settings on the plan's GPU (None for the native engine). A ValueError
    naming the field: a non-native engine needs plan.hardware and the roofline step model."""
    flags = scenario_flags(scenario)
    if flags is None:
        return None
    plan, kind = scenario.plan, scenario.backend.kind
    if plan.step_model.kind != "roofline" or not plan.hardware:
        raise ValueError(
            f"plan: a {kind} deployment is simulated on a GPU: set plan.hardware and step_model: roofline (a fitted "
            "step model measures the native engine on this machine; backend.kind native plans it)"
        )
    merged = plan.model_copy(update=plan_fields_from_flags(plan, flags))
    profile, gpu = engine_profile(kind), plan.gpu_spec(plan.hardware)
    overrides, sources = engine_overrides(kind, flags)
    if "memory_fraction" not in overrides and "gpu_memory_utilization" in plan.model_fields_set:
        overrides["memory_fraction"] = plan.gpu_memory_utilization
        sources["memory_fraction"] = "plan.gpu_memory_utilization"
    settings = profile.defaults(gpu, merged.tensor_parallel)
    settings = dataclasses.replace(settings, **overrides)
    settings = profile.settle(settings, gpu, merged.tensor_parallel, frozenset(overrides))
    if flags.values.get("mixed_chunk"):  # SGLang --enable-mixed-chunk: prefill chunks join the decode batch
        profile = dataclasses.replace(profile, batching="mixed")
    every = {f.name: "profile default" for f in dataclasses.fields(EngineSettings)}
    shared = {name: f"flag {flags.spelled[name]}" for name in PLAN_FIELDS if name in flags.values}
    shared |= {name: field for name, field in PLAN_FIELDS.items() if name not in shared and _explicit(plan, name)}
    return EngineChoice(
        profile=profile,
        settings=settings,
        sources=every | sources | shared,
        tensor_parallel=merged.tensor_parallel,
        replicas=flags.values.get("data_parallel"),
    )


def _explicit(plan, name: str) -> bool:
    """Whether the plan: block sets the plan field standing for this engine setting."""
    return PLAN_SPEC_FIELDS[name] in plan.model_fields_set


def engine_overrides(kind: str, flags: EngineFlags) -> tuple[dict, dict]:
    """({EngineSettings field: value}, {field: the flag that set it}) from an engine's flags."""
    fields = {f.name for f in dataclasses.fields(EngineSettings)}
    values = {k: v for k, v in flags.values.items() if k in fields}
    sources = {k: f"flag {flags.spelled[k]}" for k in values}
    chunk = flags.values.get("chunked_prefill_size")
    if kind == "sglang" and chunk is not None:  # -1: whole prompts, a prefill batch up to --max-prefill-tokens
        values["enable_chunked_prefill"] = chunk != -1
        sources["enable_chunked_prefill"] = f"flag {flags.spelled['chunked_prefill_size']}"
        if chunk != -1:
            values["max_num_batched_tokens"] = chunk
            sources["max_num_batched_tokens"] = sources["enable_chunked_prefill"]
    if kind == "sglang" and not values.get("enable_chunked_prefill", True):
        values["max_num_batched_tokens"] = flags.values.get("max_prefill_tokens", SGLANG_MAX_PREFILL_TOKENS)
        sources["max_num_batched_tokens"] = f"flag {flags.spelled.get('max_prefill_tokens', '--max-prefill-tokens')}"
    return values, sources


def scheduler_knobs(profile: EngineProfile) -> dict[str, bool]:
    """The native scheduler's settings for the profile's batching order (SGLang's prefill steps apart) and admission
    rule (TensorRT-LLM's GUARANTEED_NO_EVICT)."""
    return {
        "prefill_apart": profile.batching == "prefill_apart",
        "reserve_max_tokens": profile.admission == "reserve_max_tokens",
    }


def engine_deployment(choice: EngineChoice, replicas: int | None) -> Deployment:
    """A non-native engine's deployment, its KV blocks and max_model_len left for the memory plan
    (simulator.py _step_model) and, where the profile derives it from the KV cache, its max_num_seqs too.
    `replicas` (plan.replicas) overrides the engine's data-parallel flag."""
    s, profile = choice.settings, choice.profile
    scheduler = SchedulerConfig(
        max_num_seqs=s.max_num_seqs or 1,
        max_num_batched_tokens=s.max_num_batched_tokens,
        max_waiting=s.max_waiting or UNBOUNDED_WAITING,
        enable_chunked_prefill=s.enable_chunked_prefill,
        schedule_policy=s.schedule_policy,
        **scheduler_knobs(profile),
    )
    return Deployment(
        scheduler,
        num_kv_blocks=0,
        kv_block_size=profile.simulated_block_size(s),
        enable_prefix_caching=s.enable_prefix_caching,
        prefix_cache=profile.prefix_cache,
        replicas=replicas or choice.replicas or 1,
        router_policy=profile.router_policy,
        cache_aware=CacheAwareConfig(),
        max_model_len=s.max_model_len or 0,
        engine=choice,
    )


def scenario_deployment(scenario, choice: EngineChoice | None) -> Deployment:
    """The plan's deployment: the native engine's from bench serve's flags, another's from its profile and flags."""
    if choice is None:
        launch_args = scenario.backend.launch.args if scenario.backend.launch else []
        return deployment_from_args(launch_args, scenario.backend.model, scenario.plan.replicas)
    return engine_deployment(choice, scenario.plan.replicas)


def size_to_memory(deployment: Deployment, kv_tokens: int) -> None:
    """Sets a non-native deployment's KV blocks, max_model_len and (SGLang) max_num_seqs from the KV tokens its
    memory plan leaves a replica."""
    choice = deployment.engine
    total, per_sequence = choice.profile.kv_limits(choice.settings, kv_tokens)
    deployment.num_kv_blocks = total // deployment.kv_block_size
    deployment.max_model_len = min(per_sequence, deployment.num_kv_blocks * deployment.kv_block_size)
    running = choice.profile.max_running(choice.settings, total, deployment.max_model_len)
    deployment.scheduler = dataclasses.replace(deployment.scheduler, max_num_seqs=running)


def step_overhead_text(scenario, profile: EngineProfile) -> str:
    """The per-step overhead a roofline plan charges and where it came from."""
    roofline = scenario.plan.step_model.roofline
    if roofline is not None and roofline.overhead_ms is not None:
        return f"{roofline.overhead_ms:g} ms a step (plan.step_model.roofline.overhead_ms)"
    if roofline is not None and roofline.fit:
        return f"a step's overhead fitted to {roofline.fit}"
    return f"{profile.overheads.step_ms:g} ms a step (stated)"


def assumptions_line(scenario, choice: EngineChoice | None) -> str:
    """What the printed plan says of its engine: the profile, the settings flags set, the ones assumed."""
    if choice is None:
        return "engine: native engine profile, settings from bench serve's flags in backend.launch.args"
    s, p = choice.settings, choice.profile
    flagged = "; ".join(choice.from_flags()) or "none"
    assumed = [
        f"{name} {getattr(s, name)}"
        for name in ("max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "kv_block_size")
        if choice.sources[name] == "profile default" and getattr(s, name) is not None
    ]
    if choice.sources["memory_fraction"] == "profile default":
        of = "what weights leave" if p.memory_fraction_of == "free" else "the card"
        assumed.append(f"memory fraction {s.memory_fraction:g} of {of}")
    graphs = choice.capture_sizes
    assumed.append(f"CUDA graphs up to batch {graphs[-1]}" if graphs else "no CUDA graphs")
    assumed.append(f"{step_overhead_text(scenario, p)}, {p.overheads.request_ms:g} ms a request (stated)")
    return (
        f"engine: {p.name} profile (backend.kind {p.kind}); from flags and plan: {flagged}; profile defaults: "
        f"{', '.join(assumed)}; not modelled: {'; '.join(choice.not_modelled) or 'nothing listed'}"
    )
