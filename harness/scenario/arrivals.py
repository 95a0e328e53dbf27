"""When each request is due: offsets in seconds after the run starts, on one absolute timeline.

Arrival processes are registered like backends: `load.arrival` names one in ARRIVALS (or in the
`bench.arrivals` entry-point group, for a third-party package), each one class, found by backends/registry.py
as backends are. docs/extending.md walks through adding one (harness/scenario/square_wave.py).

Open-loop arrivals do not wait for answers (the engine falls behind, the queue grows, as in
production); a closed loop keeps `concurrency` requests in flight and has no schedule (None).
- constant:    gaps of exactly 1/rate
- poisson:     exponential gaps with mean 1/rate (coefficient of variation 1)
- gamma:       gamma gaps with shape = burstiness and scale = 1/(rate*shape): mean 1/rate,
               coefficient of variation 1/sqrt(burstiness); burstiness < 1 gives bursts and lulls
- square_wave: Poisson at `rate` and at `arrival_options.low_rate` in turn, every half `period_s`
- trace:       the trace's own timestamps, relative to the first, times time_scale
- closed:      `concurrency` requests in flight, each sent when one finishes
- offline:     every request due at 0 (MLPerf Offline, vLLM's benchmark_throughput, `--request-rate inf`);
               only the engine's pace matters. `bench plan` holds them client-side and hands the engine one
               whenever its waiting queue has room, so none is refused for a full queue (harness/plan/simulator.py)
The first arrival is at offset 0 so a run does not open with an idle gap.
"""

from __future__ import annotations

from functools import cache
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ValidationError

from backends.registry import registered, registered_class

GROUP = "bench.arrivals"
ARRIVALS = {
    "constant": "harness.scenario.arrivals:Constant",
    "poisson": "harness.scenario.arrivals:Poisson",
    "gamma": "harness.scenario.arrivals:Gamma",
    "square_wave": "harness.scenario.square_wave:SquareWave",
    "trace": "harness.scenario.arrivals:Trace",
    "closed": "harness.scenario.arrivals:Closed",
    "offline": "harness.scenario.arrivals:Offline",
}


class ArrivalError(ValueError):
    """A load that does not suit its arrival process; the message names the field and the fix."""


class Arrival:
    """One arrival process. `paced_by` says which load field sets its pace: rate (requests/s, an open
    loop with a schedule drawn before the run), concurrency (a closed loop), trace (the trace's times) or
    offline (none: every request at once, the engine's own pace)."""

    name: ClassVar[str]
    paced_by: ClassVar[Literal["rate", "concurrency", "trace", "offline"]]
    options: ClassVar[type[BaseModel] | None] = None  # the model of its load.arrival_options, if it takes any

    def check(self, load: Any) -> None:
        """ArrivalError when `load` (a LoadConfig) lacks what this process needs."""
        field = {"rate": "rate", "concurrency": "concurrency", "trace": "trace"}[self.paced_by]
        if getattr(load, field) is None and not (load.sweep is not None and self.paced_by != "trace"):
            raise ArrivalError(f"load.{field}: missing; arrival {self.name} needs {_NEEDS[field]}")
        self.parsed_options(load)

    def parsed_options(self, load: Any) -> BaseModel | None:
        """load.arrival_options read by this process's options model (ArrivalError naming the key if bad)."""
        given = load.arrival_options
        if self.options is None:
            if given is not None:
                raise ArrivalError(f"load.arrival_options: arrival {self.name} takes no options; leave it out")
            return None
        try:
            return self.options.model_validate(given or {})
        except ValidationError as error:
            item = error.errors()[0]
            where = ".".join(str(part) for part in item["loc"])
            raise ArrivalError(
                f"load.arrival_options.{where}: {item['msg'].removeprefix('Value error, ')} "
                f"(arrival {self.name} takes {', '.join(self.options.model_fields)})"
            ) from None

    def mean_rate_per_s(self, load: Any, rate: float) -> float:
        """Requests/s averaged over the run when `rate` is the load's rate (open loops only)."""
        return rate


_NEEDS = {
    "rate": "a rate in requests/s (e.g. rate: 4)",
    "concurrency": "the number of requests in flight",
    "trace": "a trace file (e.g. trace: traces/day.jsonl)",
}


class OpenLoop(Arrival):
    """An open loop: a unit-free stream of gaps (gaps_s), drawn in order, then warped onto the run's clock
    (warp_s; the identity for a steady rate). A process whose rate changes over time draws unit-rate gaps
    and warps them by its cumulative rate (harness/scenario/square_wave.py)."""

    paced_by = "rate"

    def gaps_s(self, load: Any, n: int, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def warp_s(self, load: Any, offsets_s: np.ndarray) -> np.ndarray:
        return offsets_s

    def offsets_s(self, load: Any, n: int, rng: np.random.Generator) -> np.ndarray:
        """Offsets of n arrivals: 0, then the running sum of n-1 gaps."""
        offsets = np.zeros(n)
        if n > 1:
            offsets[1:] = np.cumsum(self.gaps_s(load, n - 1, rng))
        return self.warp_s(load, offsets)

    def offsets_until_s(self, load: Any, end_s: float, rng: np.random.Generator, max_count: int) -> np.ndarray | None:
        """All arrivals with offset < end_s, or None when more than max_count would be needed."""
        drawn = [np.zeros(1)]
        last = 0.0
        count = 1
        # Draw in chunks sized by the expected count so a long run needs few calls.
        chunk = max(16, int(load.rate * end_s * 0.25))
        while float(self.warp_s(load, np.array([last]))[0]) < end_s and count <= max_count:
            more = last + np.cumsum(self.gaps_s(load, chunk, rng))
            drawn.append(more)
            last = float(more[-1])
            count += chunk
        offsets = self.warp_s(load, np.concatenate(drawn))
        offsets = offsets[offsets < end_s]
        return None if len(offsets) > max_count else offsets


class Constant(OpenLoop):
    name = "constant"

    def gaps_s(self, load, n, rng):
        return np.full(n, 1.0 / load.rate)


class Poisson(OpenLoop):
    name = "poisson"

    def gaps_s(self, load, n, rng):
        return rng.exponential(1.0 / load.rate, size=n)


class Gamma(OpenLoop):
    name = "gamma"

    def gaps_s(self, load, n, rng):
        return rng.gamma(load.burstiness, 1.0 / (load.rate * load.burstiness), size=n)


class Offline(OpenLoop):
    """Every request due at once: the whole load is queued at 0 and the engine sets the pace (MLPerf Offline,
    vLLM's benchmark_throughput). A fixed count (load.num_requests), no rate, no concurrency."""

    name = "offline"
    paced_by = "offline"

    def check(self, load: Any) -> None:
        for field, fix in (
            ("rate", "leave load.rate out (or use an open-loop arrival such as poisson for a rate)"),
            ("concurrency", "leave load.concurrency out (or use arrival closed for requests in flight)"),
            ("duration_s", "give load.num_requests instead"),
            ("sweep", "leave load.sweep out (an offline run has no load to sweep)"),
        ):
            if getattr(load, field) is not None:
                raise ArrivalError(f"load.{field}: arrival offline sends a fixed set of requests at once; {fix}")
        self.parsed_options(load)

    def gaps_s(self, load, n, rng):
        return np.zeros(n)


class Trace(Arrival):
    name = "trace"
    paced_by = "trace"


class Closed(Arrival):
    name = "closed"
    paced_by = "concurrency"


def available() -> dict[str, str]:
    """{name: "module:Class"} for every arrival process: the built-ins and the installed packages'."""
    return registered(ARRIVALS, GROUP)


@cache
def arrival_process(name: str) -> Arrival:
    """The arrival process called `name`; ArrivalError naming load.arrival and the known ones if none is."""
    known = available()
    process = registered_class(
        name,
        known,
        lambda: ArrivalError(
            f"load.arrival: {name!r} is not an arrival process; known: {', '.join(sorted(known))} "
            f"(a package adds one through the {GROUP!r} entry-point group; docs/extending.md)"
        ),
    )
    return process()


def open_loop(name: str) -> OpenLoop:
    """The open-loop process called `name` (ValueError if it has no schedule of its own)."""
    process = arrival_process(name)
    if not isinstance(process, OpenLoop):
        raise ValueError(f"arrival {name!r} has no drawn schedule; it is paced by its {process.paced_by}")
    return process


def trace_offsets_s(timestamps_s: np.ndarray | list[float], time_scale: float) -> np.ndarray:
    """Trace timestamps (any origin, sorted) as offsets from the first, scaled."""
    timestamps = np.asarray(timestamps_s, dtype=np.float64)
    if len(timestamps) == 0:
        return timestamps
    return (timestamps - timestamps[0]) * time_scale
