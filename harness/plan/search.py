"""`bench plan SCENARIO --search`: per GPU type, the cheapest deployment (replicas x tensor parallel) that meets
the scenario's SLOs at its load, simulated on the roofline step model; an engine-selection table, cheapest first.

A deployment meets the SLOs when its predicted goodput fraction (requests within every SLO) reaches
`attainment` (harness/metrics/slo_capacity.py's 0.9 by default). Search order, so a GPU type costs a handful of
simulations rather than every pair:
- tensor-parallel sizes are those whose weight shard fits the GPU's memory with room for KV, that
  split the attention and KV heads as vLLM requires (harness/plan/memory.py), and whose decode step
  alone (batch 1, the roofline) is within the TPOT and ITL SLOs, smallest first; a size is skipped once
  even one replica of it costs as much as the cheapest deployment already found;
- replicas double from 1 until the SLOs are met (more replicas never hurt: the load is fixed), then
  bisection between the last failing and the first passing count.
Every simulation writes its results folder under OUT/simulations/, so `bench report` reads them.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.metrics.slo_capacity import DEFAULT_ATTAINMENT
from harness.plan.deployment import scenario_flags
from harness.plan.memory import tensor_parallel_problem
from harness.plan.roofline_scenario import (
    precision_line,
    roofline_memory,
    roofline_step_model,
    scenario_architecture,
)
from harness.plan.simulator import simulate_scenario
from harness.plan.step_model import StepShape
from harness.results.schema import Summary

TP_SIZES = (1, 2, 4, 8)
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms", "itl_ms")


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    gpu: str
    tensor_parallel: int
    replicas: int
    meets_slo: bool
    goodput_fraction: float
    goodput_requests_per_s: float
    output_tokens_per_s: float
    slo_margin: float | None  # the tightest SLO's headroom at the attainment percentile: 1 - value / limit
    dollars_per_hour: float
    dollars_per_mtok: float | None  # per million output tokens at the predicted throughput
    folder: str

    @property
    def gpus(self) -> int:
        return self.tensor_parallel * self.replicas


@dataclass
class GpuResult:
    gpu: str
    best: Evaluation | None = None
    tried: list[Evaluation] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


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


class Search:
    def __init__(
        self,
        scenario,
        out_dir: Path,
        attainment: float = DEFAULT_ATTAINMENT,
        max_gpus: int = 64,
        time_budget_s: float = 600.0,
        overwrite: bool = False,
    ):
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
        flags = scenario_flags(scenario)
        if flags is not None and "tensor_parallel" in flags.values:
            raise ValueError(
                f"backend.launch.args: --search chooses the tensor parallelism per GPU; leave "
                f"{flags.spelled['tensor_parallel']} out"
            )
        self.scenario, self.out_dir, self.attainment = scenario, Path(out_dir), attainment
        self.max_gpus, self.deadline = max_gpus, time.monotonic() + time_budget_s
        self.overwrite = overwrite  # replace the simulated folders a previous search left in out_dir
        self.simulations = 0

    def evaluate(self, gpu: str, tensor_parallel: int, replicas: int, price: float) -> Evaluation:
        plan = self.scenario.plan.model_copy(
            update={"hardware": gpu, "tensor_parallel": tensor_parallel, "replicas": replicas}
        )
        folder = self.out_dir / "simulations" / f"{gpu}-tp{tensor_parallel}-x{replicas}"
        summary = simulate_scenario(self.scenario.model_copy(update={"plan": plan}), folder, overwrite=self.overwrite)
        self.simulations += 1
        goodput, throughput = summary.goodput, summary.throughput.output_tokens_per_s
        per_hour = price * tensor_parallel * replicas
        return Evaluation(
            gpu=gpu,
            tensor_parallel=tensor_parallel,
            replicas=replicas,
            meets_slo=goodput.fraction >= self.attainment,
            goodput_fraction=goodput.fraction,
            goodput_requests_per_s=goodput.requests_per_s,
            output_tokens_per_s=throughput,
            slo_margin=slo_margin(summary, self.attainment),
            dollars_per_hour=per_hour,
            dollars_per_mtok=per_hour / (throughput * 3600 / 1e6) if throughput else None,
            folder=str(folder),
        )

    def tensor_parallel_sizes(self, gpu: str) -> tuple[list[int], list[str]]:
        arch, notes, sizes = scenario_architecture(self.scenario), [], []
        for tp in TP_SIZES:
            if (problem := tensor_parallel_problem(arch, tp)) is not None:
                notes.append(f"TP {problem}")
            elif not self.memory(gpu, tp).weights_fit:
                notes.append(f"TP {tp}: weights leave no KV cache")
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

    def decode_floor_note(self, gpu: str, tp: int) -> str | None:
        """Why no replica count helps, when one sequence's decode step is already over the TPOT or ITL limit."""
        plan = self.scenario.plan.model_copy(update={"hardware": gpu, "tensor_parallel": tp})
        step_ms = 1e3 * roofline_step_model(self.scenario.model_copy(update={"plan": plan})).step_time_s(
            StepShape(prefill_tokens=0, prefill_seqs=0, decode_seqs=1, context_tokens=1)
        )
        limits = {
            k: v for k, v in self.scenario.slo.model_dump(exclude_none=True).items() if k in ("tpot_ms", "itl_ms")
        }
        over = [f"{k} {v:g}" for k, v in limits.items() if step_ms > v]
        return f"TP {tp}: a decode step alone takes {step_ms:.1f} ms, over {', '.join(over)}" if over else None

    def fewest_replicas(self, gpu: str, tp: int, price: float, most: int, result: GpuResult) -> Evaluation | None:
        """The fewest replicas (at most `most`) meeting the SLOs: doubling, then bisection."""
        failing, passing, replicas = 0, None, 1
        while time.monotonic() < self.deadline:
            trial = self.evaluate(gpu, tp, replicas, price)
            result.tried.append(trial)
            if trial.meets_slo:
                passing = trial
                break
            failing = replicas
            if replicas >= most:
                break
            replicas = min(2 * replicas, most)
        while passing is not None and passing.replicas - failing > 1 and time.monotonic() < self.deadline:
            trial = self.evaluate(gpu, tp, (failing + passing.replicas) // 2, price)
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

    def search_gpu(self, gpu: str, price: float) -> GpuResult:
        result = GpuResult(gpu)
        if (problem := self.precision_problem(gpu)) is not None:
            result.notes.append(problem)
            return result
        sizes, result.notes = self.tensor_parallel_sizes(gpu)
        for tp in sizes:
            best_gpus = result.best.gpus if result.best else self.max_gpus + 1
            most = (best_gpus - 1) // tp  # strictly fewer GPUs than the best so far
            if most < 1:
                break
            found = self.fewest_replicas(gpu, tp, price, most, result)
            if found is not None:
                result.best = found
        if time.monotonic() >= self.deadline:
            result.notes.append("stopped at the time budget: a cheaper deployment may exist")
        if result.best is None:
            result.notes.append(f"nothing up to {self.max_gpus} GPUs met the SLOs")
        return result

    def run(self) -> list[GpuResult]:
        results = [self.search_gpu(gpu, price) for gpu, price in self.scenario.plan.prices.items()]
        return sorted(results, key=lambda r: (r.best is None, r.best.dollars_per_hour if r.best else 0))


def table_lines(results: list[GpuResult]) -> list[str]:
    """The engine-selection table as Markdown, cheapest first."""
    lines = [
        "| GPU | TP | replicas | GPUs | $/hour | $/Mtok out | goodput | goodput req/s | SLO margin |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        b = r.best
        if b is None:
            lines.append(f"| {r.gpu} | - | - | - | - | - | - | - | {'; '.join(r.notes)} |")
            continue
        per_mtok = f"{b.dollars_per_mtok:.3f}" if b.dollars_per_mtok is not None else "-"
        margin = f"{100 * b.slo_margin:.0f}%" if b.slo_margin is not None else "-"
        lines.append(
            f"| {b.gpu} | {b.tensor_parallel} | {b.replicas} | {b.gpus} | {b.dollars_per_hour:.2f} | "
            f"{per_mtok} | {100 * b.goodput_fraction:.0f}% | {b.goodput_requests_per_s:.2f} | {margin} |"
        )
    return lines


def write_search(results: list[GpuResult], out_dir: Path, simulations: int) -> list[str]:
    """search.json and search.md in the output folder; returns the Markdown lines."""
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = table_lines(results)
    (out_dir / "search.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    payload = {
        "simulations": simulations,
        "results": [
            {
                "gpu": r.gpu,
                "best": asdict(r.best) if r.best else None,
                "notes": r.notes,
                "tried": [asdict(t) for t in r.tried],
            }
            for r in results
        ],
    }
    (out_dir / "search.json").write_text(json.dumps(payload, indent=2), encoding="utf-8")
    return lines
