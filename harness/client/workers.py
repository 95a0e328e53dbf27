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
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_for_connections

from harness.client.capacity import PLANNING_FIGURE, ClientCapacity
from harness.client.runner import Runner, RunOutcome, Target, group_jobs, run_blocking, t0_ahead_ns
from harness.limits import MAX_WORKERS_PER_CORE
from harness.results.folder import RequestRecord
from harness.results.schema import Summary

WORKER_START_TIMEOUT_S = 120.0  # spawning imports the harness anew in each process


def workers_needed(
    requests: list, concurrency: int | None, duration_hint_s: float | None, capacity: ClientCapacity = PLANNING_FIGURE
) -> int:
    """Client processes the plan needs: one per `capacity` (harness.client.capacity) of streamed tokens/s
    (closed loop: per 256 streams), whatever the cores. More processes only help with cores to spare."""
    offsets = [r.intended_offset_s for r in requests if r.intended_offset_s is not None]
    tokens = sum(r.output_tokens for r in requests)
    span_s = (max(offsets) - min(offsets)) if len(offsets) > 1 else (duration_hint_s or 0.0)
    if span_s > 0:
        return max(1, math.ceil(tokens / span_s / capacity.tokens_per_s_per_worker))
    return max(1, math.ceil((concurrency or 1) / 256))


def resolve_workers(
    option,
    requests: list,
    concurrency: int | None,
    duration_hint_s: float | None,
    cpu_count: int,
    capacity: ClientCapacity = PLANNING_FIGURE,
) -> int:
    """`auto`: the processes the plan needs (workers_needed), at most one per core but one."""
    if option is None or option == "auto":
        return min(workers_needed(requests, concurrency, duration_hint_s, capacity), max(1, cpu_count - 1))
    try:
        n = int(option)
    except (TypeError, ValueError):
        raise ValueError(f"load.workers: {option!r} is not valid: use auto or a whole number >= 1") from None
    if n < 1:
        raise ValueError(f"load.workers: {n} is not valid: use auto or a whole number >= 1")
    most = MAX_WORKERS_PER_CORE * cpu_count
    if n > most:  # each is a full Python process; past the cores they only take turns
        raise ValueError(
            f"load.workers: {n} is not valid: at most {most} client processes on this machine "
            f"({MAX_WORKERS_PER_CORE} per core, {cpu_count} cores); use auto"
        )
    return n


def client_bound_advice(summary: Summary, cpu_count: int | None) -> str:
    """What can help a client-bound run (summary.json's), on a client machine of `cpu_count` cores: more
    processes only where a core is spare (auto leaves one for the rest), else fewer streams per process."""
    workers, nodes = summary.workers or 1, len(summary.ray_nodes or [])
    streams = summary.concurrency.max
    each = f" (up to {math.ceil(streams / workers)} each in this run)" if streams else ""
    cpu_s, window_s = summary.client_cpu_s, summary.run_span_s
    used = f"; its processes used {cpu_s / window_s:.2f} cores in all on average" if cpu_s and window_s else ""
    needed, sizing = summary.workers_needed or 0, summary.workers_sizing
    each_takes = (
        sizing.describe
        if sizing is not None
        else f"{PLANNING_FIGURE.tokens_per_s_per_worker:,.0f} streamed tokens/s each, a planning figure"
    )
    if needed > workers:
        used += f"; this load needs about {needed} client processes ({each_takes})"
    elif sizing is not None and sizing.source == "measured":  # what this machine's client was measured to take
        used += f"; a client process here plans {each_takes}"
    if nodes:
        return (
            f"the load already ran on {nodes} Ray node(s), one client process each{used}: add nodes so each "
            f"holds fewer streams{each}, or lower the load"
        )
    cpu_count = cpu_count or os.cpu_count() or 1
    spare = max(1, cpu_count - 1)
    if workers < spare:
        return f"use --workers {spare} (up to one per core but one, here {cpu_count} cores){used}, or lower the load"
    return (
        f"more client processes cannot help: this machine has {cpu_count} core(s) and the client already uses "
        f"{workers} process(es){used}. Give each process fewer streams{each} (lower load.concurrency or "
        f"load.rate), run bench on a machine with more cores, or spread the load over several machines with "
        f"--ray (pip install -e '.[ray]')"
    )


def concurrency_share(total: int | None, n: int, w: int) -> int | None:
    """Shard w's part of a concurrency cap split over n client processes."""
    if total is None:
        return None
    return total // n + (1 if w < total % n else 0)


async def run_plan(
    requests: list,
    target: Target,
    concurrency: int | None,
    workers: int,
    on_record: Callable[[RequestRecord], None],
    stop: asyncio.Event,
    dispatch_until_s: float | None = None,
    t0_ns: int | None = None,
) -> RunOutcome:
    """Sends the plan from this process (workers <= 1) or that many client processes (harness/client/load_site.py
    chooses between these and a Ray cluster's actors). t0_ns: the run's clock origin (perf_counter_ns),
    picked by the caller so other recorders share it; with several workers it moves later if they were not all
    started by then. The outcome's incomplete_reasons say what is missing: a worker that died, records never
    written."""
    if workers <= 1:
        cpu_start = time.process_time()
        outcome = await Runner(
            target, requests, concurrency, on_record, t0_ns=t0_ns, stop=stop, dispatch_until_s=dispatch_until_s
        ).run()
        outcome.client_cpu_s = time.process_time() - cpu_start
    else:
        outcome = await _run_processes(requests, target, concurrency, workers, on_record, stop, dispatch_until_s, t0_ns)
    outcome.incomplete_reasons = incomplete_reasons(outcome, len(requests), dispatch_until_s is not None)
    return outcome


def lost_records(
    requests: list, recorded: set, t0_ns: int, dispatch_until_s: float | None, stopped: bool, reason: str, detail: str
) -> list[RequestRecord]:
    """A failed record (`reason`) for each of a lost client's planned `requests` without one (`recorded`: indices),
    so the summary counts them. Not planned: those due after a duration's end, or (open loop) after the loss once
    the run was being stopped anyway."""
    lost_at_s = (time.perf_counter_ns() - t0_ns) / 1e9
    cutoff_s = lost_at_s if stopped else dispatch_until_s
    out = []
    for spec in requests:
        offset = spec.intended_offset_s
        if spec.index in recorded or (cutoff_s is not None and offset is not None and offset > cutoff_s):
            continue
        rec = RequestRecord(
            index=spec.index,
            intended_send_s=lost_at_s if offset is None else offset,
            prompt_tokens=spec.prompt_tokens,
            is_warmup=spec.is_warmup,
            session_id=spec.session_id,
            turn_index=spec.turn_index,
            model=spec.model,
            turn_kind=spec.turn_kind,
            parent_session_id=spec.parent_session_id,
            image_count=spec.image_count,
            image_bytes=spec.image_bytes,
        )
        rec.end_s = max(lost_at_s, rec.intended_send_s)
        rec.fail(reason, detail)
        out.append(rec)
    return out


def incomplete_reasons(outcome: RunOutcome, planned: int, stops_at_duration: bool) -> list[str]:
    """Why the records do not cover the plan; an interrupted run or one stopped by its duration may stop early."""
    reasons = []
    for lost in outcome.lost_workers:
        reasons.append(
            f"client worker {lost['worker']} (pid {lost['pid']}) {lost['exit']}: {lost['recorded']} of "
            f"its {lost['planned']} planned requests recorded, {lost['worker_lost_failures']} more "
            f"counted failed (worker_lost)"
        )
    missing = planned - len(outcome.records)
    if missing > 0 and not outcome.interrupted and not stops_at_duration:
        reasons.append(f"{missing} of {planned} planned requests have no record")
    return reasons


@dataclass
class _Worker:
    """The parent's view of one client process, over its own pipe: a death is an EOF there."""

    index: int
    process: mp.Process
    conn: Connection
    requests: list  # its share of the plan (RequestSpecs)
    recorded: set = field(default_factory=set)  # indices of the requests it sent a record of
    ready: bool = False
    done: bool = False
    closed: bool = False

    def send(self, message) -> None:
        try:
            self.conn.send(message)
        except OSError:  # it died; its EOF is read in the loop
            pass

    def receive(self):
        try:
            return self.conn.recv()
        except (EOFError, OSError):  # gone, perhaps mid-message (kill -9)
            self.closed = True
            self.conn.close()
            return None

    def exit_description(self) -> str:
        code = self.process.exitcode
        if not self.ready:
            return f"did not start within {WORKER_START_TIMEOUT_S:g} s (exit code {code})"
        if code is None:
            return "closed its pipe while still running"
        if code < 0:
            return f"was killed by {signal.Signals(-code).name}"
        return f"exited with code {code} before finishing"


def _spawn(requests, target, concurrency, workers, dispatch_until_s) -> list[_Worker]:
    """`workers` client processes, each given its share of the jobs (a session stays in one)."""
    ctx = mp.get_context("spawn")
    jobs = group_jobs(requests)
    spawned = []
    for w in range(workers):
        mine = [spec for job in jobs[w::workers] for spec in job]
        parent_end, child_end = ctx.Pipe()
        p = ctx.Process(
            target=_worker_main,
            daemon=True,
            args=(w, mine, target, concurrency_share(concurrency, workers, w), dispatch_until_s, child_end),
        )
        p.start()
        child_end.close()  # the worker holds the only other end, so its death reads as EOF here
        spawned.append(_Worker(w, p, parent_end, mine))
    return spawned


class _Crew:
    """The parent's side of one run's client processes: what they sent so far, read off their pipes."""

    def __init__(self, workers: list[_Worker], on_record: Callable[[RequestRecord], None]) -> None:
        self.workers, self.on_record = workers, on_record
        self.records: list[RequestRecord] = []
        self.loop_lag: list[float] = []
        self.interrupted, self.cpu_s = False, 0.0

    async def receive_some(self) -> None:
        """What the workers sent, waiting up to 0.2 s for any of them to send."""
        open_conns = [c.conn for c in self.workers if not c.closed]
        readable = await asyncio.get_running_loop().run_in_executor(None, wait_for_connections, open_conns, 0.2)
        for worker in self.workers:
            while not worker.closed and worker.conn in readable and worker.conn.poll():
                message = worker.receive()
                if message is None:
                    break
                self._take(worker, *message)

    def _take(self, worker: _Worker, kind: str, payload) -> None:
        if kind == "ready":
            worker.ready = True
        elif kind == "record":
            rec = RequestRecord.from_dict(payload)
            worker.recorded.add(rec.index)
            self.keep(rec)
        else:  # done
            worker.done = True
            self.loop_lag.extend(payload["loop_lag_s"])
            self.cpu_s += payload["cpu_s"]
            self.interrupted |= payload["interrupted"]

    def keep(self, rec: RequestRecord) -> None:
        self.records.append(rec)
        self.on_record(rec)

    async def wait_until_started(self) -> None:
        """Until every worker is ready or gone; one not ready within WORKER_START_TIMEOUT_S is killed."""
        start_deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        while not all(c.ready or c.closed for c in self.workers):
            if time.monotonic() > start_deadline:
                for c in self.workers:
                    if not c.ready:  # its EOF follows; it is reported lost
                        c.process.kill()
            await self.receive_some()

    async def run_until_closed(self, stop: asyncio.Event) -> None:
        """Until every worker's EOF, after its "done" or without it; `stop` tells them to stop sending."""
        stop_sent = False
        while not all(c.closed for c in self.workers):
            if stop.is_set() and not stop_sent:
                for c in self.workers:  # workers stop sending and give in-flight requests a grace
                    c.send(("stop", None))
                stop_sent = True
            await self.receive_some()

    def count_lost(self, t0_ns: int, dispatch_until_s: float | None, stopped: bool) -> list[dict]:
        """A failed record for each planned request of a worker that never said done; what each lost worker was."""
        lost = []
        for c in self.workers:
            c.process.join(timeout=5)
            if c.done:
                continue
            exit_description = c.exit_description()
            detail = (
                f"client worker {c.index} (pid {c.process.pid}) {exit_description} before this "
                f"request's record reached the parent"
            )
            never = lost_records(c.requests, c.recorded, t0_ns, dispatch_until_s, stopped, "worker_lost", detail)
            for rec in never:
                self.keep(rec)
            lost.append(
                {
                    "worker": c.index,
                    "pid": c.process.pid,
                    "exit": exit_description,
                    "exitcode": c.process.exitcode,
                    "planned": len(c.requests),
                    "recorded": len(c.recorded),
                    "worker_lost_failures": len(never),
                }
            )
        return lost


async def _run_processes(
    requests, target, concurrency, workers, on_record, stop, dispatch_until_s, t0_ns
) -> RunOutcome:
    crew = _Crew(_spawn(requests, target, concurrency, workers, dispatch_until_s), on_record)
    await crew.wait_until_started()  # t0 is fixed only once every worker has started
    soonest_ns = t0_ahead_ns(workers, spawn=False, connect=True)  # they still read t0 and open connections
    if t0_ns is None or t0_ns < soonest_ns:
        t0_ns = soonest_ns
    for c in crew.workers:
        c.send(("go", t0_ns))
    await crew.run_until_closed(stop)
    lost = crew.count_lost(t0_ns, dispatch_until_s, stop.is_set())
    interrupted = crew.interrupted or stop.is_set()
    return RunOutcome(crew.records, crew.loop_lag, t0_ns, interrupted, lost_workers=lost, client_cpu_s=crew.cpu_s)


def _worker_main(w, requests, target, concurrency, dispatch_until_s, conn: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    # A thread does the sending, so a full pipe never stalls this process's event loop.
    outbox: queue.SimpleQueue = queue.SimpleQueue()

    def feed() -> None:
        while (message := outbox.get()) is not None:
            conn.send(message)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    outbox.put(("ready", w))
    try:
        _, t0_ns = conn.recv()  # ("go", t0)
        cpu_start = time.process_time()
    except EOFError:  # the parent is gone
        return

    def make_runner():
        stop = asyncio.Event()

        async def watch_stop():  # a "stop" from the parent, or its end of the pipe closing
            while not conn.poll():
                await asyncio.sleep(0.05)
            stop.set()

        asyncio.get_running_loop().create_task(watch_stop())
        return Runner(
            target,
            requests,
            concurrency,
            lambda rec: outbox.put(("record", asdict(rec))),
            t0_ns=t0_ns,
            stop=stop,
            dispatch_until_s=dispatch_until_s,
        )

    outcome = run_blocking(make_runner)
    outbox.put(
        (
            "done",
            {
                "worker": w,
                "loop_lag_s": outcome.loop_lag_s,
                "interrupted": outcome.interrupted,
                "cpu_s": time.process_time() - cpu_start,
            },
        )
    )
    outbox.put(None)
    feeder.join()
