"""The simulated deployment's engine settings: backend.launch.args parsed by `bench serve`'s own
command line (native_engine/cli.py), so a flag means in `bench plan` what it means to the engine."""

from __future__ import annotations

from dataclasses import dataclass

import click
import typer

from native_engine.config import CacheAwareConfig, SchedulerConfig, from_flags

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
    try:
        serve = from_flags(p)  # the settings as `bench serve` builds them: one definition (native_engine/config.py)
    except ValueError as e:
        raise ValueError(f"backend.launch.args: {e}") from None
    engine, deployment = serve.engine, serve.deployment
    if deployment.disaggregate is not None:
        raise ValueError(
            "backend.launch.args: --disaggregate is not simulated yet by bench plan; "
            "leave it out, or measure the deployment with bench run"
        )
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
        replicas or deployment.data_parallel,
        deployment.router_policy,
        deployment.cache_aware,
        min(context_length, num_blocks * engine.kv_block_size),
    )
