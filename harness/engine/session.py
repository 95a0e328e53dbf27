"""The engine a run talks to: started when backend.launch asks, checked ready, stopped however the run ends.

A sweep opens one session for all its points; a single run opens its own. Leaving the `with`
block stops an engine bench started (an exception, Ctrl-C and SIGTERM included); an engine that
was already running is left alone.
"""

from __future__ import annotations

import math
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from backends import load_backend
from backends.base import Backend
from harness.engine.launcher import EngineSizing, LaunchedBackend, check_ready, launch
from harness.scenario.scenario import Scenario, ScenarioError

OPEN_LOOP_SLOTS = 8  # requests an engine must hold at once when the scenario sets no concurrency
UNKNOWN_TOKENS_PER_REQUEST = 4096  # prompt + answer when the scenario does not bound them (files, traces)


@dataclass
class EngineSession:
    engine: Backend
    url: str
    launched: LaunchedBackend | None  # None: an engine bench did not start (backend.url)


def engine_for(scenario: Scenario) -> Backend:
    """The scenario's backend, checked against its API (a bad pairing is a scenario error)."""
    backend = scenario.backend
    engine = load_backend(backend.kind, tuple(backend.eos_token_ids), backend.profile, backend.trace)
    try:
        engine.endpoint_path(backend.api)
    except ValueError as e:
        raise ScenarioError(str(e)) from None
    return engine


def engine_sizing(scenario: Scenario) -> EngineSizing:
    """Threads = the cores; slots >= the run's concurrency (the largest of a sweep); each slot holds the
    longest prompt + answer (a multi-turn session's whole history)."""
    load, workload = scenario.load, scenario.workload
    slots = load.concurrency or OPEN_LOOP_SLOTS
    if load.process.paced_by == "concurrency" and load.sweep:
        slots = int(max(load.sweep))

    def upper(dist) -> float:
        if dist.max is not None:
            return dist.max
        return dist.expected + 4 * (dist.std or 0.0)

    if workload.kind == "file" or load.process.paced_by == "trace":
        tokens = UNKNOWN_TOKENS_PER_REQUEST
    else:
        tokens = upper(workload.input_tokens) + upper(workload.output_tokens) + (workload.prefix_tokens or 0)
        tokens *= workload.turns or 1
    return EngineSizing(threads=os.cpu_count() or 1, slots=slots, tokens_per_slot=256 * math.ceil(tokens / 256))


@contextmanager
def engine_session(scenario: Scenario, log_path: Path, say=lambda text: None):
    """Yields an EngineSession once the engine answers its readiness check (BackendUnreachable if not)."""
    backend = scenario.backend
    engine = engine_for(scenario)
    launched = None
    if backend.launch is not None:
        say(f"starting the {backend.kind} engine (log: {log_path})")
        launched = launch(
            engine, backend.launch, backend.url, backend.model, log_path, backend.headers, engine_sizing(scenario)
        )
    try:
        url = launched.url if launched else backend.url
        check_ready(url, backend.headers, ready_paths=engine.ready_paths)  # one clear error before any load
        yield EngineSession(engine, url, launched)
    finally:
        if launched:
            launched.stop()
