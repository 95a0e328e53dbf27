"""Spreading one schedule over several client processes when one event loop cannot keep up.

All workers share t0 on CLOCK_MONOTONIC (perf_counter_ns is the same clock in every process
on Linux), so intended send times stay on one timeline. Worker w takes every N-th job (a job
is a request, or a whole multi-turn session) and streams its records back to the parent,
which writes them as they come.
"""
from __future__ import annotations

import asyncio
import math
import multiprocessing as mp
import queue
import signal
import time
from dataclasses import asdict
from typing import Callable

from harness.results import RequestRecord
from harness.runner import Runner, RunOutcome, Target, group_jobs, run_blocking

# Planning figure for `auto`: streamed tokens/s given to one client process. One process
# used 0.2-0.35 cores at 5,000-20,000 tokens/s in benchmarks/fidelity.py; its accuracy then
# depends on getting that CPU promptly, so more processes only help with cores to spare.
TOKENS_PER_S_PER_WORKER = 5000
START_LEAD_S = 1.0  # from all workers ready to t0: time to open their connections


def resolve_workers(option, requests: list, concurrency: int | None, duration_hint_s: float | None,
                    cpu_count: int) -> int:
    """`auto`: one process per TOKENS_PER_S_PER_WORKER streamed tokens/s, leaving one core free."""
    if option is None or option == "auto":
        offsets = [r.intended_offset_s for r in requests if r.intended_offset_s is not None]
        tokens = sum(r.output_tokens for r in requests)
        span_s = (max(offsets) - min(offsets)) if len(offsets) > 1 else (duration_hint_s or 0.0)
        if span_s > 0:
            need = math.ceil(tokens / span_s / TOKENS_PER_S_PER_WORKER)
        else:  # closed loop: one process per 256 streams
            need = math.ceil((concurrency or 1) / 256)
        return max(1, min(need, max(1, cpu_count - 1)))
    try:
        n = int(option)
    except (TypeError, ValueError):
        raise ValueError(f"load.workers: {option!r} is not valid: use auto or a whole number >= 1") from None
    if n < 1:
        raise ValueError(f"load.workers: {n} is not valid: use auto or a whole number >= 1")
    return n


def _share(total: int | None, n: int, w: int) -> int | None:
    if total is None:
        return None
    return total // n + (1 if w < total % n else 0)


async def run_plan(requests: list, target: Target, concurrency: int | None, workers: int,
                   on_record: Callable[[RequestRecord], None], stop: asyncio.Event,
                   dispatch_until_s: float | None = None, t0_ns: int | None = None) -> RunOutcome:
    """t0_ns: the run's clock origin (perf_counter_ns), picked by the caller so other recorders
    share it; with several workers it moves later if they were not all started by then."""
    if workers <= 1:
        return await Runner(target, requests, concurrency, on_record, t0_ns=t0_ns, stop=stop,
                            dispatch_until_s=dispatch_until_s).run()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    stop_flag, go = ctx.Event(), ctx.Event()
    t0_value = ctx.Value("q", 0)
    jobs = group_jobs(requests)
    procs = []
    for w in range(workers):
        mine = [spec for job in jobs[w::workers] for spec in job]
        p = ctx.Process(target=_worker_main, daemon=True,
                        args=(w, mine, target, _share(concurrency, workers, w), t0_value, go, dispatch_until_s,
                              results, stop_flag))
        p.start()
        procs.append(p)
    loop = asyncio.get_running_loop()
    for _ in range(workers):  # t0 is fixed only once every worker has started (spawn takes a while)
        try:
            await loop.run_in_executor(None, results.get, True, 120)
        except queue.Empty:
            raise RuntimeError("load.workers: the client worker processes did not start within 120 s") from None
    earliest_ns = time.perf_counter_ns() + int(0.2 * 1e9)  # time to read t0 and open connections
    if t0_ns is None or t0_ns < earliest_ns:
        t0_ns = time.perf_counter_ns() + int(START_LEAD_S * 1e9)
    t0_value.value = t0_ns
    go.set()
    stop_watch = asyncio.create_task(stop.wait())
    records, loop_lag, interrupted, running = [], [], False, workers
    while running:
        if stop_watch.done():
            stop_flag.set()  # workers stop sending and give in-flight requests a grace
        try:
            kind, payload = await loop.run_in_executor(None, results.get, True, 0.2)
        except queue.Empty:
            if not any(p.is_alive() for p in procs) and results.empty():
                break  # a worker died without saying done: keep what arrived
            continue
        if kind == "record":
            rec = RequestRecord.from_dict(payload)
            records.append(rec)
            on_record(rec)
        else:
            running -= 1
            loop_lag += payload["loop_lag_s"]
            interrupted |= payload["interrupted"]
    stop_watch.cancel()
    for p in procs:
        p.join(timeout=5)
    return RunOutcome(records, loop_lag, t0_ns, interrupted or stop.is_set())


def _worker_main(w, requests, target, concurrency, t0_value, go, dispatch_until_s, results, stop_flag) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    results.put(("ready", w))
    go.wait()
    t0_ns = t0_value.value

    def make_runner():
        stop = asyncio.Event()

        async def watch_stop():
            while not stop_flag.is_set():
                await asyncio.sleep(0.05)
            stop.set()
        asyncio.get_running_loop().create_task(watch_stop())
        return Runner(target, requests, concurrency, lambda rec: results.put(("record", asdict(rec))),
                      t0_ns=t0_ns, stop=stop, dispatch_until_s=dispatch_until_s)

    outcome = run_blocking(make_runner)
    results.put(("done", {"worker": w, "loop_lag_s": outcome.loop_lag_s, "interrupted": outcome.interrupted}))
