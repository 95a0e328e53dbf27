"""`bench plan SCENARIO --search`: per GPU type, the cheapest deployment (replicas x tensor parallel) that meets
the scenario's SLOs at its load, simulated on the roofline step model; an engine-selection table, cheapest first.

A deployment meets the SLOs when its predicted goodput fraction (requests within every SLO) reaches
`attainment` (harness/metrics/slo_capacity.py's 0.9 by default). Search order, so a GPU type costs a handful of
simulations rather than every pair:
- tensor-parallel sizes are those whose weight shard fits the GPU's memory with room for KV, that
  split the attention and KV heads as vLLM requires (harness/plan/memory.py), whose decode step
  alone (batch 1, the roofline) is within the TPOT and ITL SLOs, and whose replicas, as many as --max-gpus
  allows, hold in their KV caches the sequences the load keeps in flight at the least (Search.kv_floor),
  smallest first; a size is skipped once even one replica of it costs as much as the cheapest deployment
  already found; each left out says why in the notes;
- replicas double from the fewest whose KV caches hold those sequences (1 at most loads) until the SLOs are
  met (more replicas never hurt: the load is fixed), then bisection between the last failing and the first
  passing count.
Then, per GPU type, the chosen deployment's capacity: the highest rate at which it still meets the SLOs,
bracketed upwards from the rate it passed (x1.5 until it fails, then bisection to 5%) and interpolated as
`bench select` does (harness/metrics/slo_capacity.py), from every rate the search simulated it at.

Headroom and traffic levels: with `load.rate` R, the search asks each deployment to carry R x traffic x
(1 + headroom) (default headroom 30%, traffic levels 1x and 2x), and states each one's load at R x traffic
(R x traffic / capacity). Every simulation writes its results folder under
OUT/simulations/<gpu>-tp<TP>-x<replicas>/point-NNN-rate-R/ (one sweep folder per deployment), and
OUT/candidates.json lists each level's choices, so `bench report OUT` and `bench select OUT` read them.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.metrics.slo_capacity import DEFAULT_ATTAINMENT, LoadPoint, SloCapacity, max_load_meeting_slo
from harness.plan.deployment import scenario_flags
from harness.plan.launch_command import launch_plan, write_scenarios
from harness.plan.memory import tensor_parallel_problem
from harness.plan.roofline_scenario import (
    precision_line,
    roofline_memory,
    roofline_step_model,
    scenario_architecture,
)
from harness.plan.simulator import simulate_scenario
from harness.plan.split_search import (
    SplitTrial,
    aggregated_trial,
    check_splittable,
    parse_splits,
    simulate_split,
    split_lines,
)
from harness.plan.step_model import StepShape
from harness.results.folder import point_dir_name, write_candidates
from harness.results.schema import Candidate, Summary

TP_SIZES = (1, 2, 4, 8)
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms", "itl_ms")
# Headroom: the share of the asked rate a recommended deployment must carry on top of it. 30% because the
# load it meets is a mean: Poisson arrivals at 20 req/s vary by sqrt(20)/20 = 22% from one second to the next,
# and the roofline's predicted throughput is off by 14.5% (MAPE over 73 held-out published rows, docs/planner.md
# "Against published GPU measurements"); a deployment at 1 / 1.3 = 77% of its capacity absorbs either.
DEFAULT_HEADROOM = 0.3
DEFAULT_TRAFFIC = (1.0, 2.0)  # the asked rate, and "what if traffic doubles?"
# Capacity bracket: up by x1.5 from the rate a deployment passed until it fails, then bisection until the
# bracket is within 5% of its passing end (finer is false precision beside the 14.5% above), at most 8 runs.
CAPACITY_GROWTH, CAPACITY_PRECISION, CAPACITY_MAX_SIMULATIONS = 1.5, 0.05, 8


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    gpu: str
    tensor_parallel: int
    replicas: int
    rate_per_s: float | None  # the load.rate simulated (None: the scenario's load is not paced by a rate)
    meets_slo: bool
    goodput_fraction: float  # its lower bound when the SLOs set a confidence, as bench select judges it
    goodput_requests_per_s: float
    output_tokens_per_s: float
    slo_margin: float | None  # the tightest SLO's headroom at the attainment percentile: 1 - value / limit
    dollars_per_hour: float
    dollars_per_mtok: float | None  # per million output tokens at the predicted throughput
    folder: str

    @property
    def gpus(self) -> int:
        return self.tensor_parallel * self.replicas

    @property
    def deployment(self) -> str:
        return deployment_name(self.gpu, self.tensor_parallel, self.replicas)


def deployment_name(gpu: str, tensor_parallel: int, replicas: int) -> str:
    return f"{gpu}-tp{tensor_parallel}-x{replicas}"


@dataclass
class GpuResult:
    gpu: str
    best: Evaluation | None = None
    tried: list[Evaluation] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    capacity: SloCapacity | None = None  # the best deployment's, from every rate it was simulated at


@dataclass
class Level:
    """One traffic level of a search: the asked rate times `traffic`, and each GPU type's choice for it."""

    traffic: float  # a multiple of load.rate
    rate_per_s: float | None  # load.rate x traffic (None: the load is not paced by a rate)
    target_rate_per_s: float | None  # what each deployment is asked to carry: rate x (1 + headroom)
    results: list[GpuResult] = field(default_factory=list)
    splits: list[SplitTrial] = field(default_factory=list)  # --disaggregate-splits at each choice's TP

    def load_share(self, result: GpuResult) -> float | None:
        """The asked rate over the deployment's capacity: 0.77 is 77% busy at the asked traffic."""
        cap = result.capacity
        if self.rate_per_s is None or cap is None or cap.status == "none" or not cap.offered_load:
            return None
        return self.rate_per_s / cap.offered_load


@dataclass(frozen=True, kw_only=True)
class KvFloor:
    """What one replica's KV cache holds against the sequences the load keeps in flight (Search.kv_floor)."""

    holds: int  # sequences of `tokens` one replica's KV cache holds
    tokens: float  # a sequence's own tokens: its prompt and half its output
    in_flight: float  # the fewest sequences in flight at the rate (each as fast as one decode step allows)
    least_replicas: int  # the fewest replicas that hold them


def slo_margin(summary: Summary, attainment: float) -> float | None:
    """1 - (the SLO metric at the attainment percentile) / its limit, the smallest over the SLOs set."""
    key = f"p{round(attainment * 100)}"
    at_percentile = {name: getattr(getattr(summary, name), key, None) for name in SLO_KEYS}
    margins = [
        1 - at_percentile[name] / limit
        for name, limit in summary.goodput.slo.items()
        if name in SLO_KEYS and at_percentile[name] is not None
    ]
    return min(margins) if margins else None


def mean_tokens(length) -> float | None:
    """A workload length's mean (a plain number, or a Dist's mean or the middle of its uniform range)."""
    if length is None or isinstance(length, int | float):
        return length
    mean = getattr(length, "mean", None)
    if mean is None and getattr(length, "min", None) is not None and getattr(length, "max", None) is not None:
        mean = (length.min + length.max) / 2
    return mean


def judged_fraction(summary: Summary) -> float:
    """The goodput fraction a verdict rests on: the lower bound under slo.confidence (as slo_capacity.py)."""
    good = summary.goodput
    return good.fraction if good.fraction_low is None else good.fraction_low


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    """`bench plan --search`'s options, parsed."""

    max_gpus: int = 64
    time_budget_s: float = 600.0
    headroom: float = DEFAULT_HEADROOM
    traffic: tuple[float, ...] = DEFAULT_TRAFFIC
    splits: tuple[tuple[int, int], ...] = ()  # --disaggregate-splits: (prefill, decode) replicas to compare

    @classmethod
    def parse(
        cls, max_gpus: int, time_budget_s: float, headroom: str, traffic: str, splits: str | None = None
    ) -> SearchOptions:
        """--headroom "30%" (or 0.3), --traffic "1,2" and --disaggregate-splits "1:1,1:2"."""
        text = headroom.strip()
        try:
            share = float(text.removesuffix("%")) / (100 if text.endswith("%") else 1)
        except ValueError:
            raise ValueError(f"--headroom: {headroom!r} is not a share; give e.g. 30% or 0.3 (0: none)") from None
        try:
            levels = tuple(float(x) for x in traffic.split(",") if x.strip())
        except ValueError:
            raise ValueError(f"--traffic: {traffic!r} is not a list of multiples of load.rate, e.g. 1,2") from None
        if not levels or min(levels) <= 0:
            raise ValueError(f"--traffic: {traffic!r}: give positive multiples of load.rate, e.g. 1,2")
        return cls(
            max_gpus=max_gpus,
            time_budget_s=time_budget_s,
            headroom=share,
            traffic=levels,
            splits=parse_splits(splits),
        )

    def search_kwargs(self) -> dict:
        return {
            "max_gpus": self.max_gpus,
            "time_budget_s": self.time_budget_s,
            "headroom": self.headroom,
            "splits": self.splits,
        }


class Search:
    def __init__(
        self,
        scenario,
        out_dir: Path,
        attainment: float = DEFAULT_ATTAINMENT,
        max_gpus: int = 64,
        time_budget_s: float = 600.0,
        overwrite: bool = False,
        headroom: float = DEFAULT_HEADROOM,
        splits: tuple[tuple[int, int], ...] = (),
    ):
        """`splits`: (prefill, decode) replica counts simulated beside each level's choices (split_search.py)."""
        check_searchable(scenario)
        if splits:
            check_splittable(scenario)
        self.splits = splits
        if not 0 <= headroom < 10:
            raise ValueError(f"--headroom: {headroom!r} is not a share of the asked rate; give e.g. 30% (0.3)")
        self.scenario, self.out_dir, self.attainment = scenario, Path(out_dir), attainment
        self.max_gpus, self.deadline = max_gpus, time.monotonic() + time_budget_s
        self.overwrite = overwrite  # replace the simulated folders a previous search left in out_dir
        if overwrite:  # a previous search's points would join this one's sweeps (and bench select's capacities)
            shutil.rmtree(self.out_dir / "simulations", ignore_errors=True)
            shutil.rmtree(self.out_dir / "deploy", ignore_errors=True)
        self.headroom = headroom if scenario.load.rate is not None else 0.0  # no rate: nothing to scale
        self.simulations = 0
        self.levels: list[Level] = []  # filled as the search goes, so an interrupted search keeps what it ran
        self.evaluations: dict[tuple[str, int, int, float | None], Evaluation] = {}
        # told a line before each simulation (what is being tried) and after it (what it gave, the best so far):
        # a search of minutes says which deployment it is on (bench plan --search prints them)
        self.progress: Callable[[str], None] | None = None

    def evaluate(
        self, gpu: str, tensor_parallel: int, replicas: int, price: float, rate_per_s: float | None = None
    ) -> Evaluation:
        """One simulation (or the one already run at these settings: simulations are deterministic)."""
        rate_per_s = self.scenario.load.rate if rate_per_s is None else round(rate_per_s, 4)
        key = (gpu, tensor_parallel, replicas, rate_per_s)
        if key in self.evaluations:
            return self.evaluations[key]
        plan = self.scenario.plan.model_copy(
            update={"hardware": gpu, "tensor_parallel": tensor_parallel, "replicas": replicas}
        )
        load = self.load_at(rate_per_s)
        deployment = self.out_dir / "simulations" / deployment_name(gpu, tensor_parallel, replicas)
        index = sum(k[:3] == key[:3] for k in self.evaluations)
        if rate_per_s is not None:
            folder = deployment / point_dir_name(index, "rate", rate_per_s)
        elif load.concurrency:  # a closed loop: one point at its concurrency
            folder = deployment / point_dir_name(index, "concurrency", load.concurrency)
        else:  # a trace: the deployment's one run
            folder = deployment
        scenario = self.scenario.model_copy(update={"plan": plan, "load": load})
        tried = f"{deployment_name(gpu, tensor_parallel, replicas)}" + (
            f" at {rate_per_s:g} req/s" if rate_per_s is not None else ""
        )
        self._say(f"simulation {self.simulations + 1}: {tried} ...")
        started = time.monotonic()
        summary = simulate_scenario(scenario, folder, overwrite=self.overwrite)
        self.simulations += 1
        goodput, throughput = summary.goodput, summary.throughput.output_tokens_per_s
        per_hour = price * tensor_parallel * replicas
        self.evaluations[key] = Evaluation(
            gpu=gpu,
            tensor_parallel=tensor_parallel,
            replicas=replicas,
            rate_per_s=rate_per_s,
            meets_slo=judged_fraction(summary) >= self.attainment,
            goodput_fraction=judged_fraction(summary),
            goodput_requests_per_s=goodput.requests_per_s,
            output_tokens_per_s=throughput,
            slo_margin=slo_margin(summary, self.attainment),
            dollars_per_hour=per_hour,
            dollars_per_mtok=per_hour / (throughput * 3600 / 1e6) if throughput else None,
            folder=str(folder),
        )
        self._say(progress_line(self.evaluations[key], time.monotonic() - started, self.best_so_far()))
        return self.evaluations[key]

    def _say(self, line: str) -> None:
        if self.progress is not None:
            self.progress(line)

    def best_so_far(self) -> Evaluation | None:
        """The cheapest deployment simulated so far that met the SLOs at the traffic level being searched (its
        target rate; the capacity bracket's other rates and earlier levels are not answers to it)."""
        target = self.levels[-1].target_rate_per_s if self.levels else None
        rate = None if target is None else round(target, 4)
        meeting = [e for e in self.evaluations.values() if e.meets_slo and (not self.levels or e.rate_per_s == rate)]
        return min(meeting, key=lambda e: (e.dollars_per_hour, -e.goodput_requests_per_s), default=None)

    def load_at(self, rate_per_s: float | None):
        """The scenario's load at another rate, for as long: num_requests grows with the rate, so a higher rate is
        a longer steady state rather than a shorter burst whose in-flight count num_requests caps."""
        load, update = self.scenario.load, {"rate": rate_per_s}
        if rate_per_s is not None and load.rate and load.num_requests:
            update["num_requests"] = max(load.num_requests, math.ceil(load.num_requests * rate_per_s / load.rate))
        return load.model_copy(update=update)

    def tensor_parallel_sizes(self, gpu: str, target_rate_per_s: float | None = None) -> tuple[list[int], list[str]]:
        arch, notes, sizes = scenario_architecture(self.scenario), [], []
        for tp in TP_SIZES:
            if (problem := tensor_parallel_problem(arch, tp)) is not None:
                notes.append(f"TP {problem}")
            elif not self.memory(gpu, tp).weights_fit:
                notes.append(f"TP {tp}: weights leave no KV cache")
            elif (short := self.kv_room_note(gpu, tp, target_rate_per_s)) is not None:
                notes.append(short)
            elif (slow := self.decode_floor_note(gpu, tp)) is not None:
                notes.append(slow)
            else:
                sizes.append(tp)
        return sizes, notes

    def memory(self, gpu: str, tp: int):
        """The KV memory of one replica at this size, as the simulation will plan it: the plan's KV dtype, the
        engine profile's memory fraction and reserve."""
        plan = self.scenario.plan.model_copy(update={"hardware": gpu, "tensor_parallel": tp})
        return roofline_memory(self.scenario.model_copy(update={"plan": plan}), kv_block_size=16)

    def kv_room_note(self, gpu: str, tp: int, target_rate_per_s: float | None) -> str | None:
        """Why a TP size is left out: even at the most replicas --max-gpus allows, a replica's KV cache holds fewer
        sequences than the load keeps in flight on it at the least (kv_floor)."""
        floor = self.kv_floor(gpu, tp, target_rate_per_s)
        most_replicas = max(1, self.max_gpus // tp)
        if floor is None or (floor.holds >= 1 and floor.least_replicas <= most_replicas):
            return None
        return (
            f"TP {tp}: a replica's KV cache holds {floor.holds} sequences of {floor.tokens:,.0f} tokens; the load "
            f"keeps at least {floor.in_flight / most_replicas:.1f} in flight on each of {most_replicas} replicas "
            f"(--max-gpus {self.max_gpus})"
        )

    def kv_floor(self, gpu: str, tp: int, target_rate_per_s: float | None) -> KvFloor | None:
        """The fewest replicas whose KV caches hold the sequences the load keeps in flight at the least: by Little's
        law, the rate times the fastest a request can finish (its output tokens at one sequence's decode step), each
        sequence holding its prompt and half its output on average (a shared prefix counted once). Fewer replicas
        serve fewer than `rate` requests a second, so their queue only grows: no run long enough meets a TTFT SLO."""
        workload = self.scenario.workload
        prompt, output = mean_tokens(workload.input_tokens), mean_tokens(workload.output_tokens)
        if target_rate_per_s is None or prompt is None or output is None:
            return None
        in_flight = target_rate_per_s * output * self.decode_step_ms(gpu, tp) / 1e3
        prefix = mean_tokens(getattr(workload, "prefix_tokens", None)) or 0
        tokens = prompt + output / 2
        holds = int(max(0.0, self.memory(gpu, tp).kv_tokens - prefix) // tokens)
        least = math.ceil(in_flight / holds) if holds >= 1 else self.max_gpus + 1
        return KvFloor(holds=holds, tokens=tokens, in_flight=in_flight, least_replicas=max(1, least))

    def decode_step_ms(self, gpu: str, tp: int) -> float:
        """One sequence's decode step at this size, on the roofline: the fastest a token can come."""
        plan = self.scenario.plan.model_copy(update={"hardware": gpu, "tensor_parallel": tp})
        return 1e3 * roofline_step_model(self.scenario.model_copy(update={"plan": plan})).step_time_s(
            StepShape(prefill_tokens=0, prefill_seqs=0, decode_seqs=1, context_tokens=1)
        )

    def decode_floor_note(self, gpu: str, tp: int) -> str | None:
        """Why no replica count helps, when one sequence's decode step is already over the TPOT or ITL limit."""
        step_ms = self.decode_step_ms(gpu, tp)
        limits = {
            k: v for k, v in self.scenario.slo.model_dump(exclude_none=True).items() if k in ("tpot_ms", "itl_ms")
        }
        over = [f"{k} {v:g}" for k, v in limits.items() if step_ms > v]
        return f"TP {tp}: a decode step alone takes {step_ms:.1f} ms, over {', '.join(over)}" if over else None

    def fewest_replicas(
        self,
        gpu: str,
        tp: int,
        price: float,
        most: int,
        result: GpuResult,
        rate_per_s: float | None = None,
        least: int = 1,
    ) -> Evaluation | None:
        """The fewest replicas (from `least` to `most`) meeting the SLOs at this rate: doubling, then bisection."""
        failing, passing, replicas = least - 1, None, min(least, most)
        while time.monotonic() < self.deadline:
            trial = self.evaluate(gpu, tp, replicas, price, rate_per_s)
            result.tried.append(trial)
            if trial.meets_slo:
                passing = trial
                break
            failing = replicas
            if replicas >= most:
                break
            replicas = min(2 * replicas, most)
        while passing is not None and passing.replicas - failing > 1 and time.monotonic() < self.deadline:
            trial = self.evaluate(gpu, tp, (failing + passing.replicas) // 2, price, rate_per_s)
            result.tried.append(trial)
            passing, failing = (trial, failing) if trial.meets_slo else (passing, trial.replicas)
        return passing

    def precision_problem(self, gpu: str) -> str | None:
        """Why this GPU cannot run the plan's precision (fp8 matmuls on an A100, say), None when it can."""
        plan = self.scenario.plan.model_copy(update={"hardware": gpu})
        try:
            precision_line(self.scenario.model_copy(update={"plan": plan}))
        except ValueError as e:
            return f"skipped: {e}"
        return None

    def search_gpu(self, gpu: str, price: float, target_rate_per_s: float | None = None) -> GpuResult:
        result = GpuResult(gpu)
        if (problem := self.precision_problem(gpu)) is not None:
            result.notes.append(problem)
            return result
        sizes, result.notes = self.tensor_parallel_sizes(gpu, target_rate_per_s)
        for tp in sizes:
            best_gpus = result.best.gpus if result.best else self.max_gpus + 1
            most = (best_gpus - 1) // tp  # strictly fewer GPUs than the best so far
            if most < 1:
                break
            floor = self.kv_floor(gpu, tp, target_rate_per_s)
            least = floor.least_replicas if floor is not None else 1
            if least > most:
                continue
            if least > 1:
                result.notes.append(
                    f"TP {tp}: from {least} replicas (fewer hold less KV than the {floor.in_flight:.0f} sequences "
                    f"in flight at the least)"
                )
            found = self.fewest_replicas(gpu, tp, price, most, result, target_rate_per_s, least)
            if found is not None:
                result.best = found
        if time.monotonic() >= self.deadline:
            result.notes.append("stopped at the time budget: a cheaper deployment may exist")
        if result.best is None:
            result.notes.append(f"nothing up to {self.max_gpus} GPUs met the SLOs")
        return result

    def bracket_capacity(self, best: Evaluation, price: float) -> None:
        """Simulates `best` at higher rates until the highest rate within the SLOs is bracketed to 5%."""
        if best.rate_per_s is None:
            return
        for _ in range(CAPACITY_MAX_SIMULATIONS):
            rates = self.rates_of(best)
            passing = max((r for r, ok in rates if ok), default=None)
            failing = min((r for r, ok in rates if not ok and (passing is None or r > passing)), default=None)
            if passing is None or time.monotonic() >= self.deadline:
                return
            if failing is not None and failing - passing <= CAPACITY_PRECISION * passing:
                return
            rate = passing * CAPACITY_GROWTH if failing is None else (passing + failing) / 2
            self.evaluate(best.gpu, best.tensor_parallel, best.replicas, price, rate)

    def rates_of(self, deployment: Evaluation) -> list[tuple[float, bool]]:
        """(rate, met the SLOs) for every rate this deployment was simulated at."""
        return [
            (e.rate_per_s, e.meets_slo)
            for e in self.evaluations.values()
            if e.deployment == deployment.deployment and e.rate_per_s is not None
        ]

    def capacity(self, deployment: Evaluation) -> SloCapacity | None:
        """The highest rate within the SLOs, interpolated as bench select does, from every rate simulated."""
        points = [
            LoadPoint(e.rate_per_s, e.goodput_fraction, e.goodput_requests_per_s, e.output_tokens_per_s)
            for e in self.evaluations.values()
            if e.deployment == deployment.deployment and e.rate_per_s is not None
        ]
        return max_load_meeting_slo(points, self.attainment) if points else None

    def run(self, traffic: float = 1.0) -> list[GpuResult]:
        """Each GPU type's cheapest deployment carrying load.rate x traffic x (1 + headroom), with its capacity."""
        rate = self.scenario.load.rate
        asked = None if rate is None else rate * traffic
        level = Level(traffic, asked, None if asked is None else asked * (1 + self.headroom))
        self.levels.append(level)
        for gpu, price in self.scenario.plan.prices.items():
            level.results.append(self.search_gpu(gpu, price, level.target_rate_per_s))
        for result in level.results:
            if result.best is not None:
                self.bracket_capacity(result.best, self.scenario.plan.prices[result.gpu])
        self.compare_splits(level)
        self.update_capacities()
        level.results.sort(key=lambda r: ranking_key(r))
        return level.results

    def compare_splits(self, level: Level) -> None:
        """Each asked prefill:decode split at each GPU type's chosen TP and the level's target rate (split_search.py),
        while the time budget lasts."""
        for result in level.results:
            if result.best is None:
                continue
            price = self.scenario.plan.prices[result.gpu]
            at = (result.gpu, result.best.tensor_parallel, price)
            if self.splits:
                level.splits.append(aggregated_trial(result.best, price, judged_fraction))
            for split in self.splits:
                if time.monotonic() >= self.deadline:
                    result.notes.append(f"--disaggregate-splits {split[0]}:{split[1]} not simulated: time budget spent")
                    continue
                level.splits.append(simulate_split(self, at, split, level.target_rate_per_s, judged_fraction))

    def update_capacities(self) -> None:
        """Every level's capacities from every rate simulated so far (a later level adds rates to a deployment)."""
        for level in self.levels:
            for result in level.results:
                result.capacity = self.capacity(result.best) if result.best is not None else None


def progress_line(done: Evaluation, seconds: float, best: Evaluation | None) -> str:
    """What one simulation gave, and the cheapest deployment meeting the SLOs so far."""
    verdict = "meets the SLOs" if done.meets_slo else "misses the SLOs"
    best_text = (
        f"{best.deployment} at ${best.dollars_per_hour:g}/h"
        + (f", {best.rate_per_s:g} req/s" if best.rate_per_s else "")
        if best is not None
        else "none yet"
    )
    return (
        f"  {verdict}: {100 * done.goodput_fraction:.0f}% within them, {done.goodput_requests_per_s:.2f} req/s good, "
        f"{done.output_tokens_per_s:,.0f} tok/s ({seconds:.1f} s); cheapest meeting so far: {best_text}"
    )


def ranking_key(result: GpuResult) -> tuple:
    """Cheapest per hour first; at equal price, the most capacity (bench select's order on a search folder)."""
    if result.best is None:
        return (True, 0.0, 0.0)
    cap = result.capacity.offered_load if result.capacity and result.capacity.offered_load else 0.0
    return (False, result.best.dollars_per_hour, -cap)


def check_searchable(scenario) -> None:
    """What --search needs of a scenario: a roofline, prices per GPU type it knows, SLOs, TP left to it."""
    if scenario.plan is None or scenario.plan.step_model.kind != "roofline":
        raise ValueError(
            "plan.step_model: --search simulates GPUs it does not have, so it needs "
            "step_model: roofline (with plan.model)"
        )
    if not scenario.plan.prices:
        raise ValueError(
            "plan.prices: --search ranks by cost; give $/GPU-hour per GPU type, e.g. prices: {H100: 2.5, L40S: 1.0}"
        )
    for gpu in scenario.plan.prices:
        try:
            scenario.plan.gpu_spec(gpu)  # a part of the GPU table or of plan.gpus
        except ValueError as e:
            raise ValueError(f"plan.prices: hardware {gpu!r}: {e}") from None
    if not scenario.slo.model_dump(exclude_none=True, exclude={"confidence"}):
        raise ValueError(
            "slo: --search looks for the deployment that meets the SLOs; set at least one, "
            "e.g. slo: {ttft_ms: 500, tpot_ms: 50}"
        )
    args = scenario.backend.launch.args if scenario.backend.launch else []
    if any(a == "--disaggregate" or a.startswith("--disaggregate=") for a in args):
        raise ValueError(
            "backend.launch.args: --search chooses the replicas; leave --disaggregate out and compare "
            "prefill:decode splits with --disaggregate-splits"
        )
    flags = scenario_flags(scenario)
    if flags is not None and "tensor_parallel" in flags.values:
        raise ValueError(
            f"backend.launch.args: --search chooses the tensor parallelism per GPU; leave "
            f"{flags.spelled['tensor_parallel']} out"
        )


def table_lines(results: list[GpuResult], level: Level | None = None) -> list[str]:
    """The engine-selection table as Markdown, cheapest first; with a level, each deployment's capacity within
    the SLOs and its load at the level's rate."""
    asked = f"{level.rate_per_s:.3g} req/s" if level and level.rate_per_s else "the asked rate"
    lines = [
        f"| GPU | TP | replicas | GPUs | $/hour | capacity req/s | load at {asked} | $/Mtok out | goodput | "
        "SLO margin |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        b = r.best
        if b is None:
            lines.append(f"| {r.gpu} | - | - | - | - | - | - | - | - | {'; '.join(r.notes)} |")
            continue
        per_mtok = f"{b.dollars_per_mtok:.3f}" if b.dollars_per_mtok is not None else "-"
        margin = f"{100 * b.slo_margin:.0f}%" if b.slo_margin is not None else "-"
        share = level.load_share(r) if level else None
        lines.append(
            f"| {b.gpu} | {b.tensor_parallel} | {b.replicas} | {b.gpus} | {b.dollars_per_hour:.2f} | "
            f"{capacity_text(r.capacity)} | {'-' if share is None else f'{100 * share:.0f}%'} | {per_mtok} | "
            f"{100 * b.goodput_fraction:.0f}% | {margin} |"
        )
    return lines


def capacity_text(cap: SloCapacity | None) -> str:
    if cap is None or cap.status == "none" or cap.offered_load is None:
        return "-"
    return f"{cap.offered_load:.3g}" if cap.status == "bracketed" else f">= {cap.offered_load:.3g}"


def level_heading(level: Level, headroom: float) -> str:
    """What the table below it answers: the asked rate, the headroom and what each deployment was asked to carry."""
    if level.rate_per_s is None:
        return "At the scenario's load (not paced by a rate: no capacity or headroom):"
    return (
        f"At {level.rate_per_s:.3g} req/s ({level.traffic:g}x load.rate) with {100 * headroom:.0f}% headroom "
        f"(--headroom): each deployment below meets the SLOs at {level.target_rate_per_s:.3g} req/s"
    )


def recommendation(level: Level, headroom: float) -> str:
    """The cheapest deployment of the level, in a sentence a customer can be quoted."""
    best = next((r for r in level.results if r.best is not None), None)
    if best is None:
        return "No deployment met the SLOs at this traffic within the GPU budget (--max-gpus)."
    b, share = best.best, level.load_share(best)
    text = (
        f"Recommended: {b.gpus} x {b.gpu} ({b.replicas} replica{'s' if b.replicas > 1 else ''} at TP "
        f"{b.tensor_parallel}), ${b.dollars_per_hour:.2f}/hour"
    )
    if share is not None:
        text += (
            f": capacity {capacity_text(best.capacity)} req/s within the SLOs, {100 * share:.0f}% busy at "
            f"{level.rate_per_s:.3g} req/s ({100 * headroom:.0f}% headroom asked)"
        )
    return text + "."


def search_lines(search: Search) -> list[str]:
    """Every level's heading, table and recommendation, as Markdown."""
    lines = []
    for level in search.levels:
        lines += [level_heading(level, search.headroom), "", *table_lines(level.results, level), ""]
        lines += split_lines(level.splits)
        lines += [recommendation(level, search.headroom), ""]
    return lines


def write_search(search: Search, interrupted: bool = False) -> list[str]:
    """search.md, search.json and candidates.json (the levels' choices, each a sweep folder of the rates it was
    simulated at, for bench report and bench select) in the output folder; returns the Markdown lines."""
    out_dir = search.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    search.update_capacities()  # an interrupted level has not yet
    lines = search_lines(search) + deployment_lines(search)
    (out_dir / "search.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    payload = {
        "simulations": search.simulations,
        "interrupted": interrupted,
        "headroom": search.headroom,
        "attainment": search.attainment,
        "levels": [
            {
                "traffic": level.traffic,
                "rate_per_s": level.rate_per_s,
                "target_rate_per_s": level.target_rate_per_s,
                "results": [result_json(r, level) for r in level.results],
                "disaggregated": [asdict(t) | {"gpus": t.gpus, "layout": t.layout} for t in level.splits],
            }
            for level in search.levels
        ],
    }
    (out_dir / "search.json").write_text(json.dumps(payload, indent=2), encoding="utf-8")
    write_candidates(out_dir, search.scenario.resolved_dict(), search_candidates(search))
    return lines


def deployment_lines(search: Search) -> list[str]:
    """Each level's recommendation as the engine's launch command, and the scenarios written to measure it."""
    lines = []
    for level in search.levels:
        chosen = next((r for r in level.results if r.best is not None), None)
        if chosen is None:
            continue
        best = chosen.best
        launch = launch_plan(search.scenario, best.tensor_parallel, best.replicas)
        name = f"{search.scenario.name}-{best.deployment}"
        capacity = chosen.capacity.offered_load if chosen.capacity else None
        at_level = search.scenario.model_copy(update={"load": search.load_at(level.rate_per_s)})
        written = write_scenarios(search.out_dir, at_level, launch, name, capacity)
        servers = f"{launch.servers} x " if launch.servers > 1 else ""
        where = f"{level.rate_per_s:.3g} req/s" if level.rate_per_s else "the scenario's load"
        lines.append(f"Launch for {where} on {best.gpus} x {best.gpu}: {servers}`{launch.command}`")
        if launch.note:
            lines.append(f"  ({launch.note})")
        lines += [f"  measure it there: bench {path.stem.rsplit('-', 1)[1]} {path}" for path in written]
    return lines + ([""] if lines else [])


def result_json(result: GpuResult, level: Level) -> dict:
    return {
        "gpu": result.gpu,
        "best": asdict(result.best) if result.best else None,
        "capacity_per_s": result.capacity.offered_load if result.capacity else None,
        "capacity_status": result.capacity.status if result.capacity else None,
        "load_share": level.load_share(result),
        "notes": result.notes,
        "tried": [asdict(t) for t in result.tried],
    }


def search_candidates(search: Search) -> list[Candidate]:
    """Each level's chosen deployments, once each, as candidates: the folder of the rates each was simulated at."""
    chosen = {r.best.deployment: r.best for level in search.levels for r in level.results if r.best is not None}
    return [
        Candidate(
            name=name,
            dir=f"simulations/{name}",
            launch_args=launch_plan(search.scenario, best.tensor_parallel, best.replicas).args,
            accelerators=best.gpus,
            status="completed",
            reason="",
            client_bound=False,
        )
        for name, best in chosen.items()
    ]
