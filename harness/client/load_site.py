"""Where a run's load is sent from: this process or client worker processes on this machine (LocalClients),
or client actors on a Ray cluster's nodes (RayActors). The run pipeline (harness/runs/run.py) asks its LoadSite,
and only it, how many clients send, when t0 can be, what run.json and summary.json say of the clients, and
to send the load; a new place to send from is one LoadSite subclass plus its case in `choose_load_site`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from contextlib import ExitStack, closing

from harness.client.capacity import ClientCapacity, record_capacity
from harness.client.ray.shards import RayCrew, start_crew
from harness.client.runner import RunOutcome, Target, t0_ahead_ns
from harness.client.workers import incomplete_reasons, resolve_workers, run_plan
from harness.results.schema import RayClients, Summary
from harness.scenario.scenario import Scenario, ScenarioError


class LoadSite:
    workers: int  # client processes (or actors) sending the load

    def t0_ns(self) -> int:
        """The run's t0 (perf_counter_ns), fixed before the load so telemetry and server metrics share its clock."""
        raise NotImplementedError

    def ray_clients(self) -> RayClients | None:
        """run.json's `ray`: the Ray cluster's client actors by node; None for clients on this machine."""
        return None

    async def send(
        self,
        requests: list,
        target: Target,
        concurrency: int | None,
        on_record: Callable,
        stop: asyncio.Event,
        dispatch_until_s: float | None,
        t0_ns: int,
    ) -> RunOutcome:
        raise NotImplementedError

    def lost_lines(self) -> list[str]:
        """A warning for each client lost during the load."""
        return []

    def client_summary(self, outcome: RunOutcome, summary: Summary, tokens: int, run_dir: str) -> list[str]:
        """Sets what summary.json says of the clients (client_capacity_measured, ray_nodes); returns warnings."""
        return []


class LocalClients(LoadSite):
    """This process (one worker) or that many spawned client processes; its run measures this machine's client."""

    def __init__(self, workers: int, stamps: str, capacity: ClientCapacity) -> None:
        self.workers, self.stamps, self.capacity = workers, stamps, capacity

    def t0_ns(self) -> int:
        return t0_ahead_ns(self.workers, spawn=True, connect=True)

    async def send(self, requests, target, concurrency, on_record, stop, dispatch_until_s, t0_ns):
        return await run_plan(requests, target, concurrency, self.workers, on_record, stop, dispatch_until_s, t0_ns)

    def client_summary(self, outcome, summary, tokens, run_dir):
        late: list[str] = []
        summary.client_capacity_measured = record_capacity(
            self.stamps,
            tokens,
            outcome.client_cpu_s,
            summary.run_span_s,  # the client's CPU ran over the whole run, not only the measured window
            run_dir,
            late,
        )
        return late


class RayActors(LoadSite):
    """One client actor per node of a Ray cluster, started and clock-checked before t0."""

    def __init__(self, crew: RayCrew) -> None:
        self.crew = crew
        self.workers = len(crew.shards)

    def t0_ns(self) -> int:
        return t0_ahead_ns(self.workers, spawn=False, connect=True)  # the actors are running already

    def ray_clients(self) -> RayClients | None:
        return self.crew.describe()  # after the load, with each node's counts

    async def send(self, requests, target, concurrency, on_record, stop, dispatch_until_s, t0_ns):
        outcome = await self.crew.run(target, on_record, stop, dispatch_until_s, t0_ns)
        outcome.incomplete_reasons = incomplete_reasons(outcome, len(requests), dispatch_until_s is not None)
        return outcome

    def lost_lines(self) -> list[str]:
        return self.crew.lost_lines()

    def client_summary(self, outcome, summary, tokens, run_dir):
        summary.ray_nodes = self.crew.node_counts()  # the clients ran on other machines: none measured here
        return []


def choose_load_site(
    scenario: Scenario,
    requests: list,
    duration_s: float | None,
    workers: str | None,
    stamps: str,
    capacity: ClientCapacity,
    cleanup: ExitStack,
    say: Callable[[str], None],
) -> LoadSite:
    """load.ray's actors (closed by `cleanup`), else `workers` (or load.workers) client processes here."""
    load = scenario.load
    setting = workers or load.workers
    try:
        n_workers = resolve_workers(setting, requests, load.concurrency, duration_s, os.cpu_count() or 1, capacity)
    except ValueError as e:
        raise ScenarioError(str(e)) from None
    if load.ray:  # one client actor per node; refused here when a node's clock is not known well enough
        crew = start_crew(load.ray, requests, load.concurrency, load.ray_max_clock_uncertainty_ms)
        return RayActors(cleanup.enter_context(closing(crew)))
    if setting == "auto":
        say(f"workers: auto chose {n_workers} client process(es) ({capacity.describe()})")
    return LocalClients(n_workers, stamps, capacity)
