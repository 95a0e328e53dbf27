"""`bench plan --search --disaggregate-splits 1:1,1:2`: disaggregated deployments beside the aggregated choice.

Per traffic level and GPU type, once search.py has chosen its cheapest aggregated deployment (replicas x TP),
each asked prefill:decode split is simulated at that deployment's TP and the level's target rate, as the native
engine's `--disaggregate prefill=P,decode=D` (harness/plan/disaggregation.py), and tabled under that aggregated
deployment's own row: GPUs, $/hour, whether it meets the SLOs, goodput, TTFT and TPOT at p90. A comparison, not a
search: the splits are the ones asked, each simulated once, and the recommendation stays the aggregated one (its
launch command and scenarios too).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from harness.plan.simulator import simulate_scenario
from harness.results.folder import point_dir_name, read_model
from harness.results.schema import Summary

SPLIT = re.compile(r"(\d+):(\d+)")


@dataclass(frozen=True, kw_only=True)
class SplitTrial:
    """A deployment of the comparison at a level's rate: a split, or the aggregated choice it is compared with."""

    gpu: str
    tensor_parallel: int
    replicas: int  # all of them
    prefill: int  # 0: aggregated, every replica serving whole requests
    decode: int
    rate_per_s: float | None
    meets_slo: bool
    goodput_fraction: float
    ttft_p90_ms: float | None
    tpot_p90_ms: float | None
    dollars_per_hour: float
    folder: str

    @property
    def gpus(self) -> int:
        return self.tensor_parallel * self.replicas

    @property
    def layout(self) -> str:
        return f"{self.prefill}:{self.decode}" if self.prefill else f"aggregated x{self.replicas}"


def split_name(gpu: str, tensor_parallel: int, prefill: int, decode: int) -> str:
    return f"{gpu}-tp{tensor_parallel}-{prefill}p{decode}d"


def parse_splits(text: str | None) -> tuple[tuple[int, int], ...]:
    """--disaggregate-splits "1:1,1:2": (prefill, decode) replica counts, each at least 1; "" or None: none."""
    splits = []
    for part in (text or "").split(","):
        if not part.strip():
            continue
        found = SPLIT.fullmatch(part.strip())
        if not found or min(int(found.group(1)), int(found.group(2))) < 1:
            raise ValueError(
                f"--disaggregate-splits: {part.strip()!r} is not a split; give prefill:decode replica counts, "
                "each at least 1, e.g. --disaggregate-splits 1:1,1:2"
            )
        splits.append((int(found.group(1)), int(found.group(2))))
    return tuple(splits)


def check_splittable(scenario) -> None:
    """The splits are the native engine's --disaggregate: a native plan, its replicas left to the splits."""
    args = scenario.backend.launch.args if scenario.backend.launch else []
    if scenario.backend.kind != "native":
        raise ValueError(
            f"--disaggregate-splits: backend.kind {scenario.backend.kind} is not simulated disaggregated (the native "
            "engine's --disaggregate is); plan backend.kind native to compare splits"
        )
    if any(a == "--data-parallel" or a.startswith("--data-parallel=") for a in args):  # the splits count replicas
        raise ValueError("--disaggregate-splits: backend.launch.args has --data-parallel; leave it out")


def simulate_split(search, at: tuple[str, int, float], split: tuple[int, int], rate_per_s, judged) -> SplitTrial:
    """One disaggregated deployment on `at` (GPU type, TP, $/GPU-hour) at the rate, its folder beside the search's
    others; `judged(summary)`: its goodput fraction as the search judges one (search.py judged_fraction)."""
    gpu, tp, price = at
    prefill, decode = split
    backend = search.scenario.backend
    args = [*backend.launch.args, "--disaggregate", f"prefill={prefill},decode={decode}"]
    plan = search.scenario.plan.model_copy(update={"hardware": gpu, "tensor_parallel": tp, "replicas": None})
    scenario = search.scenario.model_copy(
        update={
            "plan": plan,
            "load": search.load_at(rate_per_s),
            "backend": backend.model_copy(update={"launch": backend.launch.model_copy(update={"args": args})}),
        }
    )
    name = split_name(gpu, tp, prefill, decode)
    folder = search.out_dir / "simulations" / name
    folder = folder / point_dir_name(0, "rate", rate_per_s) if rate_per_s is not None else folder
    search._say(f"simulation {search.simulations + 1}: {name}" + (f" at {rate_per_s:g} req/s" if rate_per_s else ""))
    summary = simulate_scenario(scenario, folder, overwrite=search.overwrite)
    search.simulations += 1
    fraction = judged(summary)
    meets_slo = fraction >= search.attainment
    return trial_of(summary, at, split, rate_per_s, meets_slo=meets_slo, fraction=fraction, folder=str(folder))


def aggregated_trial(best, price: float, judged) -> SplitTrial:
    """The aggregated choice (search.py's Evaluation) as a row of the comparison, from its simulated folder."""
    summary: Summary = read_model(Path(best.folder) / "summary.json")
    at = (best.gpu, best.tensor_parallel, price)
    split, fraction = (0, best.replicas), judged(summary)
    return trial_of(
        summary, at, split, best.rate_per_s, meets_slo=best.meets_slo, fraction=fraction, folder=best.folder
    )


def trial_of(summary: Summary, at, split, rate_per_s, *, meets_slo: bool, fraction: float, folder: str) -> SplitTrial:
    """A row from a simulation's summary: `at` (GPU type, TP, $/GPU-hour), `split` (prefill, decode) replicas, (0, R)
    for R aggregated ones."""
    (gpu, tp, price), (prefill, decode) = at, split
    return SplitTrial(
        gpu=gpu,
        tensor_parallel=tp,
        replicas=prefill + decode,
        prefill=prefill,
        decode=decode,
        rate_per_s=rate_per_s,
        meets_slo=meets_slo,
        goodput_fraction=fraction,
        ttft_p90_ms=summary.ttft_ms.p90,
        tpot_p90_ms=summary.tpot_ms.p90,
        dollars_per_hour=price * tp * (prefill + decode),
        folder=folder,
    )


def split_lines(trials: list[SplitTrial]) -> list[str]:
    """The level's comparison as Markdown: per GPU type the aggregated choice, then each split, in order asked."""
    if not trials:
        return []
    ms = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    lines = [
        "Aggregated and disaggregated (--disaggregate-splits: each split at the aggregated choice's TP and the same "
        "rate; compared, not recommended):",
        "",
        "| GPU | TP | prefill:decode | GPUs | $/hour | meets SLOs | goodput | TTFT p90 ms | TPOT p90 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for t in trials:
        lines.append(
            f"| {t.gpu} | {t.tensor_parallel} | {t.layout} | {t.gpus} | {t.dollars_per_hour:.2f} | "
            f"{'yes' if t.meets_slo else 'no'} | {100 * t.goodput_fraction:.0f}% | {ms(t.ttft_p90_ms)} | "
            f"{ms(t.tpot_p90_ms)} |"
        )
    return [*lines, ""]
