"""`bench serve --data-parallel N`: N engine processes (`python -m native_engine serve`, each with its
own threads and KV cache, on free loopback ports) behind a router in this process, on one port.
`--disaggregate prefill=P,decode=D`: P + D such processes behind a coordinator (disaggregation.py),
sharing a KV transfer directory on /dev/shm that is removed when the deployment stops.

No replica outlives this process: they stay in its process group (so the harness's launcher guard,
which ends the group, ends them too), each asks the kernel for SIGTERM when its parent dies
(PR_SET_PDEATHSIG, Linux), and stopping this process (SIGINT/SIGTERM) stops them first.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

import typer

from native_engine.config import ServeConfig, ServerConfig, to_flags
from native_engine.disaggregation import DisaggregationSpec, Disaggregator
from native_engine.router import Router, start_router
from native_engine.routing_policy import Policy

log = logging.getLogger("native_engine.deployment")
# Set by the deployment for each replica itself, not passed on from `serve`'s own.
REPLICA_SETS = {"host", "port", "blas_threads", "kv_transfer_dir"}
READY_LINE = re.compile(r"serving .* on http://([0-9.]+):(\d+)")
# How long a replica may take to exit after SIGTERM before it is killed. It is sent once the router has
# drained (--shutdown-grace-s) and cancelled what was left, so it has nothing in flight: it exits in well
# under a second (its engine thread ends its step, no interpreter teardown); this bounds a hung one.
STOP_GRACE_S = 3.0
PR_SET_PDEATHSIG = 1


@dataclass
class ReplicaProcess:
    id: str
    process: subprocess.Popen
    url: str = ""
    stopping: bool = False  # set when we stop it: its exit is then no news


def replica_args(settings: ServeConfig) -> list[str]:
    """The engine's and the server's settings this `serve` was given, as flags for each replica's own `serve`."""
    return to_flags(settings.engine, REPLICA_SETS) + to_flags(settings.server, REPLICA_SETS)


def die_with_parent(cpu: int | None = None) -> None:
    """Runs in the child before exec: SIGTERM it when the router process dies, however it dies; with
    cpu, the child and every thread it starts run on that core only (--pin-cpus)."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def start_replicas(
    ids: list[str], engine_args: list[str], blas_threads: int, pin_cpus: bool = False
) -> list[ReplicaProcess]:
    """Starts all at once (they load the model in parallel), then waits for each to print its port.
    pin_cpus: replica k on the k-th core this process may use (round the cores again past the last)."""
    replicas = []
    cores = sorted(os.sched_getaffinity(0)) if pin_cpus else []
    for k, i in enumerate(ids):
        cpu = cores[k % len(cores)] if cores else None
        command = [
            sys.executable,
            "-m",
            "native_engine",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--blas-threads",
            str(blas_threads),
            *engine_args,
        ]
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=functools.partial(die_with_parent, cpu) if sys.platform == "linux" else None,
        )
        replicas.append(ReplicaProcess(i, process))
    try:
        for r in replicas:
            seen = []
            for line in r.process.stdout:
                seen.append(line)
                found = READY_LINE.search(line)
                if found:
                    r.url = f"http://{found.group(1)}:{found.group(2)}"
                    break
            if not r.url:
                raise RuntimeError(
                    f"replica {r.id} exited with code {r.process.wait()} before serving:\n" + "".join(seen[-20:])
                )
            threading.Thread(target=relay_output, args=(r,), daemon=True).start()
    except BaseException:
        stop_replicas(replicas)
        raise
    return replicas


def relay_output(replica: ReplicaProcess) -> None:
    """Its log lines, prefixed; then, once its output ends, how it ended (a dead replica is reported)."""
    for line in replica.process.stdout:
        sys.stderr.write(f"[replica {replica.id}] {line}")
    code = replica.process.wait()
    how = f"signal {signal.Signals(-code).name}" if code < 0 else f"code {code}"
    log.log(
        logging.INFO if replica.stopping or code == 0 else logging.ERROR,
        "replica %s (pid %d, %s) exited with %s",
        replica.id,
        replica.process.pid,
        replica.url,
        how,
    )


def stop_replicas(replicas: list[ReplicaProcess]) -> None:
    for r in replicas:
        r.stopping = True
        if r.process.poll() is None:
            r.process.terminate()
    deadline = time.monotonic() + STOP_GRACE_S  # one wait for all: they stop at the same time
    for r in replicas:
        try:
            r.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            r.process.kill()
            r.process.wait()


def serve_deployment(settings: ServeConfig) -> int:
    """Runs until SIGINT/SIGTERM; returns the exit code."""
    d = settings.deployment
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        spec = DisaggregationSpec.parse(d.disaggregate) if d.disaggregate is not None else None
        if spec and d.data_parallel > 1:
            raise ValueError(
                "--disaggregate: give it or --data-parallel, not both (prefill=P,decode=D already "
                "says how many engine processes run)"
            )
        ids = spec.worker_ids() if spec else [str(i) for i in range(d.data_parallel)]
        policy = None if spec else Policy(d.router_policy, ids, d.cache_aware)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        return 2
    # One BLAS thread pool per replica: by default the cores are shared out, not each replica taking all.
    blas_threads = settings.engine.threads or max(1, (os.cpu_count() or 1) // len(ids))
    engine_args = replica_args(settings)
    transfer_dir = None
    if spec:
        transfer_dir = tempfile.mkdtemp(prefix="native-kv-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        engine_args += ["--kv-transfer-dir", transfer_dir]
    try:
        try:
            replicas = start_replicas(ids, engine_args, blas_threads, d.pin_cpus)
        except RuntimeError as exc:
            typer.echo(f"error: {exc}", err=True)
            return 1
        urls = [r.url for r in replicas]
        if spec:
            front = Disaggregator(spec, urls, transfer_dir)
            front.pids = {r.id: r.process.pid for r in replicas}
            what = f"coordinator (disaggregated, prefill={spec.prefill},decode={spec.decode})"
        else:
            front, what = Router(urls, policy), f"router ({policy.name})"
        try:
            server = settings.server
            asyncio.run(run_front(front, what, server, replicas, blas_threads))
        finally:
            stop_replicas(replicas)
    finally:
        if transfer_dir:
            shutil.rmtree(transfer_dir, ignore_errors=True)
    return 0


def pinned(pid: int) -> str:
    cores = os.sched_getaffinity(pid) if sys.platform == "linux" else set()
    return f", cpu {next(iter(cores))}" if len(cores) == 1 else ""


async def run_front(
    front: Router | Disaggregator, what: str, server: ServerConfig, replicas: list[ReplicaProcess], blas_threads: int
) -> None:
    """Serves until SIGINT/SIGTERM, then drains as one engine's server does: the requests in flight get
    --shutdown-grace-s, the rest are cancelled (each closes its connection to its replica, which aborts it)."""
    host, grace_s = server.host, server.shutdown_grace_s
    runner, bound_port = await start_router(front, host, server.port, shutdown_grace_s=grace_s)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    listing = ", ".join(f"{r.id}={r.url} (pid {r.process.pid}{pinned(r.process.pid)})" for r in replicas)
    typer.echo(
        f"native_engine {what} serving on http://{host}:{bound_port} in front of "
        f"{len(replicas)} replicas, {blas_threads} BLAS threads each: {listing}"
    )
    await stop.wait()
    typer.echo(
        f"stopping: no new connections; requests in flight get up to {grace_s:g} s (--shutdown-grace-s) to finish",
        err=True,
    )
    await runner.cleanup()
