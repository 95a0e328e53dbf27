"""The node side of a distributed run (harness.client.ray.shards places one per node, as a Ray actor).

It runs the harness's own Runner on its shard in a thread of its own, with t0 turned into this process's
perf_counter, and keeps each finished record until the driver takes it (`take`, polled). It needs
nothing of Ray but the node id it reports, so it imports Ray only there.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections import deque

from harness.client.runner import Runner, run_blocking
from harness.results.folder import RequestRecord


class ShardActor:
    """Runs on a node (as a Ray actor): one Runner on its shard, records kept until the driver takes them."""

    def __init__(self) -> None:
        self._records: deque = deque()
        self._finished: dict | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stop_asked = False

    def where(self) -> dict:
        import ray

        return {"pid": os.getpid(), "host": socket.gethostname(), "node_id": ray.get_runtime_context().get_node_id()}

    def wall_clock_ns(self) -> int:
        return time.time_ns()

    def start(self, requests, target, concurrency, dispatch_until_s, t0_wall_ns: int) -> None:
        """t0_wall_ns: the run's t0 on this node's wall clock (the driver's t0 plus the measured offset)."""
        t0_ns = time.perf_counter_ns() + (t0_wall_ns - time.time_ns())
        threading.Thread(
            target=self._run, args=(requests, target, concurrency, dispatch_until_s, t0_ns), daemon=True
        ).start()

    def _run(self, requests, target, concurrency, dispatch_until_s, t0_ns: int) -> None:
        def make_runner() -> Runner:
            self._stop = asyncio.Event()  # before _loop: stop() uses _stop once it sees _loop
            self._loop = asyncio.get_running_loop()
            if self._stop_asked:
                self._stop.set()
            return Runner(
                target,
                requests,
                concurrency,
                self._records.append,
                t0_ns=t0_ns,
                stop=self._stop,
                dispatch_until_s=dispatch_until_s,
            )

        cpu_start = time.process_time()
        try:
            outcome = run_blocking(make_runner)
            self._finished = {
                "loop_lag_s": outcome.loop_lag_s,
                "interrupted": outcome.interrupted,
                "cpu_s": time.process_time() - cpu_start,
            }
        except BaseException as e:  # reported to the driver, which counts the shard's missing records
            self._finished = {"error": f"the runner failed: {type(e).__name__}: {e}"}

    def take(self) -> tuple[list[RequestRecord], dict | None]:
        """The records finished since the last call, and the runner's end once every record is taken."""
        finished = self._finished  # read first: once it is set, every record is already in the deque
        taken = []
        while self._records:
            taken.append(self._records.popleft())
        return taken, finished

    def stop(self) -> None:
        self._stop_asked = True
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
