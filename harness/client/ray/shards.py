"""Load generation spread over a Ray cluster (`bench run --ray auto`, or load.ray): one client actor per node,
each running the harness's Runner on its shard of the schedule (every N-th job, as harness.client.workers shards).

One timeline: the driver fixes t0 on its wall clock. Before the run it measures each actor's wall-clock
offset by round trips (harness.client.clock_offset) and refuses to start when one is known less precisely than
load.ray_max_clock_uncertainty_ms. Each actor turns t0 into its own perf_counter once and then times
everything as a local run does (seconds from t0), so the records of every node share one axis.

Records come back by polling: every POLL_S the driver asks each actor for the records finished since its
last ask and hands them to the one writer (harness.results.folder) as they arrive. Polling, not a ray.util.queue:
a queue is one more actor (a process that can die, a hop more), while a poll that fails says exactly which
actor died and which of its records the driver already holds. Its planned requests without a record are
then counted failed (reason actor_lost) and the run goes on. The node side is harness.client.ray.actor. Ray is an
optional extra, imported only once a run asks for it.
"""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from harness.client.clock_offset import ClockOffset, measure_offset
from harness.client.ray.actor import ShardActor
from harness.client.runner import RunOutcome, group_jobs, t0_ahead_ns
from harness.client.workers import concurrency_share, lost_records
from harness.results.folder import RequestRecord
from harness.results.schema import RayClients, RayNode, RayNodeCounts

POLL_S = 0.2
SILENT_ACTOR_S = 30.0  # a poll unanswered this long: the actor (or its node) is taken for lost
DEFAULT_MAX_CLOCK_UNCERTAINTY_MS = 1.0  # load.ray_max_clock_uncertainty_ms unset; a Ray round trip here: ~0.7 ms
ACTOR_START_TIMEOUT_S = 120.0  # placing actors and shipping them the harness's code
CONNECT_TIMEOUT_S = 5.0  # a GCS address that does not accept a TCP connection by then is not a cluster
INSTALL_HINT = "install the extra: pip install -e '.[ray]' (or pip install 'ray>=2.9')"


class DistributedError(Exception):
    """The Ray cluster cannot run this load; the message says why and what to do."""


def _ray():
    try:
        import ray
    except ImportError:
        raise DistributedError(f"load.ray: Ray is not installed; {INSTALL_HINT}") from None
    return ray


class ActorPlace(BaseModel):
    """Where an actor runs, as its `where` reports it."""

    model_config = ConfigDict(extra="ignore")
    pid: int | None = None
    host: str | None = None
    node_id: str | None = None


class ActorEnd(BaseModel):
    """What an actor reports once its runner has ended: the runner's account, or why it failed."""

    model_config = ConfigDict(extra="ignore")
    loop_lag_s: list[float] = []
    interrupted: bool = False
    cpu_s: float | None = None  # the actor process's CPU time over the run
    error: str | None = None  # the runner failed: the shard's missing records are counted lost


@dataclass
class Shard:
    """The driver's view of one actor and its share of the plan."""

    node_id: str
    node_ip: str
    actor: object
    requests: list
    concurrency: int | None
    place: ActorPlace = field(default_factory=ActorPlace)
    clock: ClockOffset | None = None
    recorded: set = field(default_factory=set)  # request indices written, actor_lost failures included
    completed: int = 0
    failed: int = 0
    counted_lost: int = 0
    finished: ActorEnd | None = None  # a runner that ended without an error
    lost: str | None = None

    @property
    def running(self) -> bool:
        return self.finished is None and self.lost is None

    def node(self) -> RayNode:
        """run.json's entry of this node: where the actor runs, its clock and counts."""
        c = self.clock
        return RayNode(
            node_id=self.node_id,
            node_ip=self.node_ip,
            pid=self.place.pid,
            host=self.place.host,
            planned=len(self.requests),
            recorded=len(self.recorded),
            completed=self.completed,
            failed=self.failed,
            actor_lost_failures=self.counted_lost,
            lost=self.lost,
            clock_offset_s=c.offset_s if c else None,
            clock_uncertainty_s=c.uncertainty_s if c else None,
            round_trip_min_s=c.round_trip_min_s if c else None,
            cpu_s=self.finished.cpu_s if self.finished else None,
        )

    def counts(self) -> RayNodeCounts:
        """summary.json's entry of this node: its share of the load."""
        return RayNodeCounts(
            node_ip=self.node_ip,
            node_id=self.node_id,
            planned=len(self.requests),
            recorded=len(self.recorded),
            completed=self.completed,
            failed=self.failed,
            actor_lost_failures=self.counted_lost,
            lost=self.lost,
        )


class RayCrew:
    """The client actors of one run: placed and clock-checked before t0 (start_crew), run, then closed."""

    def __init__(self, address: str, max_uncertainty_s: float, owns_ray: bool) -> None:
        self.address, self.max_uncertainty_s, self.owns_ray = address, max_uncertainty_s, owns_ray
        self.shards: list[Shard] = []
        self.t0_wall_ns: int | None = None

    def describe(self) -> RayClients:
        """run.json's `ray`: every node's clock offset with its uncertainty and, after the run, its counts."""
        return RayClients(
            address=self.address,
            t0_wall_clock_ns=self.t0_wall_ns,
            max_clock_uncertainty_s=self.max_uncertainty_s,
            clock_method="min round trip of driver->actor calls: offset = actor clock - midpoint, ± rtt/2",
            nodes=[s.node() for s in self.shards],
        )

    def node_counts(self) -> list[RayNodeCounts]:
        """summary.json's `ray_nodes`: per node, planned = completed + failed once the run has ended."""
        return [s.counts() for s in self.shards]

    def lost_lines(self) -> list[str]:
        return [
            f"client actor on node {s.node_ip} ({s.node_id[:8]}, pid {s.place.pid}) was lost: "
            f"{len(s.recorded) - s.counted_lost} of its {len(s.requests)} planned requests recorded, "
            f"{s.counted_lost} more counted failed (actor_lost)"
            for s in self.shards
            if s.lost
        ]

    async def run(
        self, target, on_record, stop: asyncio.Event, dispatch_until_s: float | None, t0_ns: int
    ) -> RunOutcome:
        """t0_ns: the driver's perf_counter_ns at t0 (later if that leaves the actors too little time to open their
        connections); its wall-clock reading at that instant is what the actors get."""
        t0_ns = max(t0_ns, t0_ahead_ns(len(self.shards), spawn=False, connect=True))
        self.t0_wall_ns = time.time_ns() + (t0_ns - time.perf_counter_ns())
        for s in self.shards:
            s.actor.start.remote(
                s.requests, target, s.concurrency, dispatch_until_s, self.t0_wall_ns + round(s.clock.offset_s * 1e9)
            )
        records: list[RequestRecord] = []

        def keep(shard: Shard, rec: RequestRecord) -> None:
            shard.recorded.add(rec.index)
            shard.completed += rec.ok
            shard.failed += not rec.ok
            records.append(rec)
            on_record(rec)

        stop_sent = False
        while any(s.running for s in self.shards):
            if stop.is_set() and not stop_sent:
                for s in self.shards:
                    if s.running:
                        s.actor.stop.remote()
                stop_sent = True
            running = [s for s in self.shards if s.running]
            for s, (taken, finished, error) in zip(running, await asyncio.gather(*map(self._poll, running))):
                for rec in taken:
                    keep(s, rec)
                if error:
                    s.lost = error
                    detail = (
                        f"the client actor on node {s.node_ip} ({s.node_id[:8]}) was lost before this "
                        f"request's record reached the driver: {s.lost}"
                    )
                    for rec in lost_records(
                        s.requests, s.recorded, t0_ns, dispatch_until_s, stop.is_set(), "actor_lost", detail
                    ):
                        s.counted_lost += 1
                        keep(s, rec)
                elif finished is not None:
                    s.finished = finished
            await asyncio.sleep(POLL_S)
        ended = [s.finished for s in self.shards if s.finished is not None]
        loop_lag = [lag for end in ended for lag in end.loop_lag_s]
        interrupted = stop.is_set() or any(end.interrupted for end in ended)
        cpu_s = sum(end.cpu_s or 0.0 for end in ended)
        return RunOutcome(records, loop_lag, t0_ns, interrupted, client_cpu_s=cpu_s)

    async def _poll(self, shard: Shard) -> tuple[list, ActorEnd | None, str | None]:
        """(the records taken, the runner's end once it ended well, why the actor is lost: its runner failed,
        it went silent or Ray lost it)."""
        ray = _ray()
        try:
            taken, finished = await asyncio.wait_for(
                asyncio.wrap_future(shard.actor.take.remote().future()), SILENT_ACTOR_S
            )
            end = None if finished is None else ActorEnd.model_validate(finished)
            if end is not None and end.error is not None:
                return taken, None, end.error
            return taken, end, None
        except asyncio.TimeoutError:
            ray.kill(shard.actor)  # a silent node must not keep sending once it is counted lost
            return [], None, f"no answer to the driver for {SILENT_ACTOR_S:g} s"
        except ray.exceptions.RayError as e:
            return [], None, f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"

    def close(self) -> None:
        ray = _ray()
        for s in self.shards:
            try:
                ray.kill(s.actor)
            except Exception:  # already gone
                pass
        if self.owns_ray:
            ray.shutdown()


def start_crew(
    address: str, requests: list, concurrency: int | None, max_uncertainty_ms: float | None = None, exchanges: int = 32
) -> RayCrew:
    """Connects, places one actor per node with a CPU, measures each clock; DistributedError when it cannot."""
    max_uncertainty_s = (max_uncertainty_ms or DEFAULT_MAX_CLOCK_UNCERTAINTY_MS) / 1e3
    ray = _ray()
    owns_ray = not ray.is_initialized()
    if owns_ray:
        _check_reachable(address)
        import backends
        import harness

        code = [str(Path(m.__file__).parent) for m in (harness, backends)]  # every node runs this very code
        try:
            ray.init(address=address, runtime_env={"py_modules": code}, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise DistributedError(
                f"load.ray: cannot connect to a Ray cluster at {address!r} ({e}); start one "
                f"(`ray start --head`, then `ray start --address ...` on each client machine) "
                f"and give its address, or auto for the one running here"
            ) from None
    crew = RayCrew(address, max_uncertainty_s, owns_ray)
    try:
        _place(ray, crew, requests, concurrency)
        for s in crew.shards:
            s.clock = measure_offset(lambda s=s: ray.get(s.actor.wall_clock_ns.remote()), exchanges)
            if s.clock.uncertainty_s > max_uncertainty_s:
                raise DistributedError(
                    f"load.ray_max_clock_uncertainty_ms: the clock of node {s.node_ip} ({s.node_id[:8]}) is known "
                    f"only to ±{s.clock.uncertainty_s * 1e3:.3f} ms (shortest of {exchanges} round trips "
                    f"{s.clock.round_trip_min_s * 1e3:.3f} ms), above the bound of {max_uncertainty_s * 1e3:g} ms; "
                    f"run the driver closer to the nodes (less loaded, same network), or raise the bound if "
                    f"send times that far apart across nodes are acceptable"
                )
    except BaseException:
        crew.close()
        raise
    return crew


def _check_reachable(address: str) -> None:
    """A host:port that does not answer fails now: Ray itself retries a dead address for minutes."""
    host, _, port = address.rpartition(":")
    if address == "auto" or "://" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise DistributedError(
            f"load.ray: nothing answers at {address!r} ({e.strerror or e}); give the address "
            f"`ray start --head` printed (host:port of its GCS), or auto for the cluster running "
            f"here"
        ) from None


def _place(ray, crew: RayCrew, requests: list, concurrency: int | None) -> None:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = sorted(
        (n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) >= 1), key=lambda n: n["NodeID"]
    )
    if not nodes:
        raise DistributedError(
            f"load.ray: the cluster at {crew.address!r} has no live node with a free CPU "
            f"for a client actor; add one (`ray start --address ... --num-cpus 1`)"
        )
    jobs = group_jobs(requests)
    nodes = nodes[: max(1, len(jobs))]
    actor_class = ray.remote(num_cpus=1, max_restarts=0)(ShardActor)
    for i, node in enumerate(nodes):
        mine = [spec for job in jobs[i :: len(nodes)] for spec in job]
        actor = actor_class.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        ).remote()
        crew.shards.append(
            Shard(
                node["NodeID"], node["NodeManagerAddress"], actor, mine, concurrency_share(concurrency, len(nodes), i)
            )
        )
    try:
        places = ray.get([s.actor.where.remote() for s in crew.shards], timeout=ACTOR_START_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        raise DistributedError(
            f"load.ray: the client actors were not all running within {ACTOR_START_TIMEOUT_S:g} s "
            f"(does every node have a free CPU and this project's dependencies installed?)"
        ) from None
    for s, where in zip(crew.shards, places):
        s.place = ActorPlace.model_validate(where)
