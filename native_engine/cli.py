"""`bench serve` / `python -m native_engine serve`: the built-in engine behind an OpenAI-compatible server.

Its options are generated from the settings' dataclasses (native_engine/config.py), where each flag's name,
default and help text is defined once. Importing this module stays cheap (typer and those dataclasses);
numpy and the model load when the command runs.
"""

from __future__ import annotations

import inspect

import typer

from native_engine.config import Flag, ServeConfig, from_flags, serve_flags


def serve(**flags) -> None:
    """Serve the built-in engine: /v1/completions, /v1/chat/completions, /metrics, /health."""
    try:
        settings = from_flags(flags)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if settings.deployment.data_parallel > 1 or settings.deployment.disaggregate is not None:
        from native_engine.deployment import serve_deployment

        raise typer.Exit(serve_deployment(settings))
    serve_engine(settings)


def _option(flag: Flag) -> inspect.Parameter:
    """The typer option of one setting; a `negate` setting's flag is its `--no-...` switch alone."""
    decls = [f"{flag.name}/--no-{flag.name.removeprefix('--')}"] if flag.both else [flag.name]
    option = typer.Option(flag.default, *decls, help=flag.help, rich_help_panel=flag.panel, **dict(flag.option))
    return inspect.Parameter(flag.param, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=flag.type)


# typer reads a command's options from its signature: this one's come from the settings.
serve.__signature__ = inspect.Signature([_option(flag) for flag in serve_flags()], return_annotation=None)


def serve_engine(settings: ServeConfig) -> None:
    """One engine in this process, until SIGINT/SIGTERM."""
    import logging

    from native_engine.blas import set_blas_threads
    from native_engine.llm_engine import LLMEngine

    if not logging.getLogger().handlers:  # the engine's log (stderr): e.g. which kernels and runtime it chose
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    threads = settings.engine.threads
    if threads and set_blas_threads(threads) is None:
        typer.echo("error: --blas-threads: numpy's BLAS is not an OpenBLAS this process can reach", err=True)
        raise typer.Exit(2)
    try:
        engine = LLMEngine(settings.engine)
    except (ValueError, FileNotFoundError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        import uvloop

        uvloop.run(_run_server(engine, settings))
    except ImportError:
        import asyncio

        asyncio.run(_run_server(engine, settings))
    _exit_without_teardown()


def _exit_without_teardown() -> None:
    """Exit 0 now that the server has stopped, skipping the interpreter's teardown: freeing the model's and the
    tokenizer's ~500,000 Python objects one by one took 0.3 s of CPU on a quiet machine and 0.8-1.3 s on a busy
    2-core one, after the drain, inside the supervisor's grace (issue 37). Nothing is left to write: the
    server's cleanup and the KV transfer folder's removal have run."""
    import logging
    import os
    import sys

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # a deployment's replica whose coordinator is gone
            pass
    os._exit(0)


def _say(message: str) -> None:
    """To stderr, which for a deployment's worker is a pipe to the coordinator: when the coordinator was
    killed (the SIGTERM that stops this worker comes from its death), nobody reads it any more."""
    try:
        typer.echo(message, err=True)
    except BrokenPipeError:
        pass


async def _run_server(engine, settings: ServeConfig) -> None:
    import asyncio
    import shutil
    import signal

    from native_engine.server import start_server

    server, grace_s = settings.server, settings.server.shutdown_grace_s
    runner, bound_port = await start_server(engine, server.host, server.port, shutdown_grace_s=grace_s)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    typer.echo(
        f"native_engine serving {settings.engine.served_model_name} on http://{server.host}:{bound_port} "
        f"(max_model_len {engine.max_model_len}, {engine.block_manager.num_blocks} KV blocks, "
        f"{type(engine.runner).__name__} {getattr(engine.runner, 'dtype', 'fp32')} "
        f"{getattr(engine.runner, 'device', 'cpu')})"
    )
    try:
        await stop.wait()
        _say(f"stopping: no new connections; requests in flight get up to {grace_s:g} s (--shutdown-grace-s) to finish")
        await runner.cleanup()
    finally:
        transfer_dir = settings.engine.kv_transfer_dir
        if transfer_dir:  # a disaggregated deployment's worker: whichever process stops last leaves nothing
            shutil.rmtree(transfer_dir, ignore_errors=True)
