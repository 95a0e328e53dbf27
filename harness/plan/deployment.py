"""The simulated deployment's engine settings: backend.launch.args parsed by `bench serve`'s own
command line (native_engine/cli.py), so a flag means in `bench plan` what it means to the engine."""

from __future__ import annotations

from dataclasses import dataclass

import click
import typer

from native_engine.routing_policy import CacheAwareConfig
from native_engine.scheduler import SchedulerConfig

PLACEHOLDERS = {"{port}": "0", "{host}": "127.0.0.1"}


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
    """`replicas` (plan.replicas) overrides --data-parallel; context_length is the model's."""
    p = serve_parameters(launch_args, model)
    if p["disaggregate"] is not None:
        raise ValueError(
            "backend.launch.args: --disaggregate is not simulated yet by bench plan; "
            "leave it out, or measure the deployment with bench run"
        )
    if p["speculative"] is not None:
        raise ValueError(
            "backend.launch.args: --speculative is not simulated by bench plan (acceptance depends "
            "on the text); leave it out"
        )
    scheduler = SchedulerConfig(
        max_num_seqs=p["max_num_seqs"],
        max_num_batched_tokens=p["max_num_batched_tokens"],
        max_waiting=p["max_waiting"],
        enable_chunked_prefill=not p["no_chunked_prefill"],
        static_batching=p["static_batching"],
        schedule_policy=p["schedule_policy"],
        schedule_aging_s=p["schedule_aging_s"],
    )
    num_blocks = p["kv_cache_tokens"] // max(p["block_size"], 1)
    cache_aware = CacheAwareConfig(
        p["router_cache_threshold"], p["router_balance_abs_threshold"], p["router_balance_rel_threshold"]
    )
    return Deployment(
        scheduler,
        num_blocks,
        p["block_size"],
        not p["no_prefix_caching"],
        p["prefix_cache"],
        replicas or p["data_parallel"],
        p["router_policy"],
        cache_aware,
        min(context_length, num_blocks * p["block_size"]),
    )
