"""How many streamed tokens one client process can take on this machine, measured from finished runs.

Every run knows the CPU its client processes used while sending (RunOutcome.client_cpu_s) and the tokens
they received, so the client's capacity is tokens per CPU-second, kept per machine (host name, CPU model)
and client path (kernel stamps or aiohttp, backend.stamps: they cost differently) over the last few runs.
`workers: auto` gives each process WORKER_CPU_SHARE of a core's worth of tokens; with no measurement yet it
uses the planning figure. The record is a small JSON file in the user's cache (BENCH_CLIENT_CAPACITY_FILE
moves it); a file that cannot be read is a warning and the planning figure, never a failed run. Only a valid,
complete run's completed requests are measured (harness/runs/run.py), and a stored measurement that is not a plausible
one (NaN, negative, more tokens per CPU-second than any client can parse) is skipped with a warning naming the file
and dropped when the file is next written: one broken server must not size every later run.
A run's fixed costs only add CPU, so a measurement errs low, and far low when the run is small: runs of fewer than
MIN_MEASURED_TOKENS are not kept, the estimate is the median of the kept runs, and a run measuring under
OUTLIER_SHARE of that median is not kept (with a warning): one odd run must not outvote the runs before it.
"""

from __future__ import annotations

import json
import math
import os
import platform
import socket
import statistics
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from harness.results.schema import CapacityMeasurement

CAPACITY_FILE_ENV = "BENCH_CLIENT_CAPACITY_FILE"
FORMAT = 1
KEEP_LAST = 5  # measurements per machine and client path; older ones are dropped
MIN_CPU_S = 0.05  # below this a run's CPU time is mostly timer noise and fixed costs
# A run costs its client ~0.1 CPU-second whatever it streams (connections, the first request, telemetry start and
# stop): a 16-token run used 0.100 CPU-s. Measured here (2026-12-07, 2 cores, load average 7; 64 streams against the
# ground-truth server): 4,096 tokens measured 18,713 tokens per CPU-second, 10,240 tokens 41,164, 20,480 and
# 40,960 tokens 46,751 and 44,932. From 10,000 tokens on the fixed cost is within ~10% of the figure; the fault
# kit's 12-16-token runs measured 64-91 and once sized every later run.
MIN_MEASURED_TOKENS = 10_000
# A kept run under this share of the median of the runs before it is not kept: runs of one machine and client path
# measure within ~1.5x of each other (kernel 37,330-39,016, aiohttp 28,826-29,676, and from 10,240 tokens up
# 41,164-46,751), while a run whose fixed costs swamp its tokens measures hundreds of times lower.
OUTLIER_SHARE = 0.25
# A client busy less than this share of a core spends its CPU mostly on fixed costs (telemetry scrapes, the
# progress display, timers), not on tokens: the README's quickstart (42 tokens/s, 0.05 of a core) measured
# ~900 tokens per CPU-second where 64 streams measure ~38,000. Such a run says nothing of the client's capacity.
MIN_BUSY_CORES = 0.2
# Headroom: the share of a core one process is planned to use. benchmarks/fidelity.py met the TTFT and ITL
# targets with one process up to ~25,000 tokens/s, at ~16 us/token: about 0.4 of a core; past that, events
# queue behind each other and send lag grows (docs/metrics.md, "Kernel and loop stamps side by side").
WORKER_CPU_SHARE = 0.4
# Planning figure without a measurement: streamed tokens/s given to one client process. One process
# used 0.2-0.35 cores at 5,000-20,000 tokens/s in benchmarks/fidelity.py on a loaded machine.
PLANNING_TOKENS_PER_S_PER_WORKER = 5000
# No client parses a streamed token in under a nanosecond (a few instructions): a measurement above this came from
# a server's absurd usage counts, not from the client (one such run once stored 1e13 tokens per CPU-second).
MAX_TOKENS_PER_CPU_S = 1e9


@dataclass
class ClientCapacity:
    tokens_per_s_per_worker: float
    source: str  # "measured" or "planning figure"
    tokens_per_cpu_s: float | None = None
    measurements: int = 0
    file: str | None = None

    def describe(self) -> str:
        if self.source != "measured":
            return f"{self.tokens_per_s_per_worker:,.0f} streamed tokens/s each, a planning figure"
        return (
            f"{self.tokens_per_s_per_worker:,.0f} streamed tokens/s each: {WORKER_CPU_SHARE:g} of a core at the "
            f"{self.tokens_per_cpu_s:,.0f} tokens per CPU-second measured here "
            f"(the median of {self.measurements} run(s))"
        )


PLANNING_FIGURE = ClientCapacity(PLANNING_TOKENS_PER_S_PER_WORKER, "planning figure")


def capacity_file() -> Path:
    return Path(
        os.environ.get(CAPACITY_FILE_ENV) or Path.home() / ".cache" / "llm-serving-bench" / "client_capacity.json"
    )


def machine_key(client: str) -> str:
    return f"{socket.gethostname()}|{cpu_model()}|{client}"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


class CapacityFile(BaseModel):
    """The file as stored: its format and, by machine key (machine_key), what each machine's entry holds. The
    entries are read one by one (_measurements): a malformed one is skipped, not the file."""

    format: int
    machines: dict[str, Any]


class MachineEntry(BaseModel):
    measurements: list[Any] = []  # each checked by _plausible_measurement before it counts


def _read(path: Path) -> dict[str, Any]:
    """The file's machines, {} when there is none; ValueError naming the file when it is not ours."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"client capacity file {path} cannot be read ({e})") from None
    try:
        stored = CapacityFile.model_validate(data, strict=True)
    except ValidationError:
        stored = None
    if stored is None or stored.format != FORMAT:
        raise ValueError(f"client capacity file {path} is not in format {FORMAT}")
    return stored.machines


def plausible(tokens, cpu_s) -> bool:
    """Whether (tokens, cpu_s) can be a client's measurement: a whole number of tokens, a finite positive CPU time,
    at most MAX_TOKENS_PER_CPU_S."""
    return (
        isinstance(tokens, int)
        and not isinstance(tokens, bool)
        and tokens > 0
        and isinstance(cpu_s, (int, float))
        and not isinstance(cpu_s, bool)
        and math.isfinite(cpu_s)
        and cpu_s > 0
        and tokens / cpu_s <= MAX_TOKENS_PER_CPU_S
    )


def _plausible_measurement(m) -> bool:
    """A stored measurement that plausible() accepts and that holds no NaN or infinity anywhere (it is rewritten)."""
    return (
        isinstance(m, dict)
        and plausible(m.get("tokens"), m.get("cpu_s"))
        and not any(isinstance(v, float) and not math.isfinite(v) for v in m.values())
    )


def _measurements(entry) -> list:
    try:
        return MachineEntry.model_validate(entry, strict=True).measurements
    except ValidationError:  # not an entry of ours: nothing stored
        return []


def _usable(measurements: list) -> list[dict]:
    """The stored measurements an estimate uses: plausible ones of runs of at least MIN_MEASURED_TOKENS (an earlier
    version kept smaller runs; they are passed over without a word and dropped at the next write)."""
    return [m for m in measurements if _plausible_measurement(m) and m["tokens"] >= MIN_MEASURED_TOKENS]


def median_tokens_per_cpu_s(measurements: list[dict]) -> float:
    """The estimate from stored measurements: the median run's tokens per CPU-second (one odd run moves a median
    at most to its neighbour's figure, where a pooled sum follows it)."""
    return statistics.median(m["tokens"] / m["cpu_s"] for m in measurements)


def load_capacity(client: str, warnings: list[str]) -> ClientCapacity:
    """This machine's measured capacity for `client` ("kernel" or "loop"), else the planning figure. Measurements
    that are not plausible() are skipped with a warning naming the file."""
    path = capacity_file()
    try:
        stored = _measurements(_read(path).get(machine_key(client)))
    except ValueError as e:
        warnings.append(f"{e}; workers: auto uses the planning figure (delete the file to start it anew)")
        return PLANNING_FIGURE
    malformed = sum(not _plausible_measurement(m) for m in stored)
    if malformed:
        warnings.append(
            f"client capacity file {path} has malformed measurements ({malformed} of "
            f"{len(stored)}: NaN, negative, or more than {MAX_TOKENS_PER_CPU_S:g} tokens per CPU-second); "
            f"they are ignored, and dropped when the next run's measurement is written"
        )
    kept = _usable(stored)
    if not kept:
        return PLANNING_FIGURE
    per_cpu_s = median_tokens_per_cpu_s(kept)
    return ClientCapacity(per_cpu_s * WORKER_CPU_SHARE, "measured", per_cpu_s, len(kept), str(path))


def record_capacity(
    client: str, tokens: int, cpu_s: float | None, window_s: float | None, run_dir: str, warnings: list[str]
) -> CapacityMeasurement | None:
    """Adds one run's measurement and returns it, or None when the run cannot measure its client: not plausible(),
    fewer than MIN_MEASURED_TOKENS, under MIN_CPU_S, or busy less than MIN_BUSY_CORES of a core over its window_s.
    A measurement under OUTLIER_SHARE of the stored median is returned but not kept, with a warning. The caller
    passes only a valid, complete run's completed tokens."""
    if (
        not plausible(tokens, cpu_s)
        or tokens < MIN_MEASURED_TOKENS
        or cpu_s < MIN_CPU_S
        or not window_s
        or cpu_s / window_s < MIN_BUSY_CORES
    ):
        return None
    measurement = CapacityMeasurement(
        tokens=tokens,
        cpu_s=round(cpu_s, 4),
        tokens_per_cpu_s=round(tokens / cpu_s, 1),
        at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        run=run_dir,
    )
    path = capacity_file()
    try:
        machines = _read(path)
    except ValueError as e:
        warnings.append(f"{e}; this run's client capacity is not kept (delete the file to start it anew)")
        return measurement
    key = machine_key(client)
    earlier = _usable(_measurements(machines.get(key)))
    if earlier and tokens / cpu_s < OUTLIER_SHARE * median_tokens_per_cpu_s(earlier):
        warnings.append(_outlier_warning(path, measurement, earlier))
        return measurement
    machines[key] = {
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "client": client,
        "measurements": earlier[-(KEEP_LAST - 1) :] + [measurement.model_dump()],
    }
    _write(path, machines, warnings)
    return measurement


def _outlier_warning(path: Path, measurement: CapacityMeasurement, earlier: list[dict]) -> str:
    return (
        f"this run's client measured {measurement.tokens_per_cpu_s:,.0f} tokens per CPU-second, under "
        f"{OUTLIER_SHARE:g} of the {median_tokens_per_cpu_s(earlier):,.0f} measured here (the median of "
        f"{len(earlier)} earlier run(s)): not kept in {path}, workers: auto sizes from the earlier runs (something "
        f"else used the client's CPU; if this machine's client really is that much slower, delete the file)"
    )


def _write(path: Path, machines: dict[str, Any], warnings: list[str]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        # allow_nan=False: NaN is not JSON (strict parsers refuse the file); another machine's NaN stops the write
        text = json.dumps({"format": FORMAT, "machines": machines}, indent=1, allow_nan=False)
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)  # a reader never sees half a file
    except (OSError, ValueError) as e:
        warnings.append(
            f"client capacity file {path} cannot be written ({e}); set {CAPACITY_FILE_ENV} to a writable path"
        )
