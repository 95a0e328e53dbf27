"""--runtime auto: torch where it runs this machine's decode steps at least as fast as numpy, else numpy.

A rule from the CPU's instruction set alone would assume every CPU of a kind behaves like the ones measured
(on an AVX2-only EPYC the torch runtime was 4x slower than numpy at 64 streams while faster on AVX-512).
So both runners are built and time the same decode steps at start-up, taking turns (so load from elsewhere
falls on both alike), at one sequence and at many: torch is kept only when its best step is faster at every
batch. The measurement stops after the round that passes MEASURE_BUDGET_S (a round is 8 steps, the four at
batch 64 dominate) and its figures go to the engine's log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from native_engine.model_runner import SeqChunk

log = logging.getLogger(__name__)

BATCHES = (1, 64)  # sequences per measured step: one stream and the server's default batch
CONTEXT_TOKENS = 64  # positions each measured sequence attends to (the cache's zeros: the cost is the same)
MEASURE_ROUNDS = 5  # timed steps of each runner at each batch, at most
MEASURE_BUDGET_S = 5.0  # fewer rounds once this much time is spent, warm-up included (one timed round always runs)


@dataclass
class RuntimeChoice:
    runtime: str  # 'numpy' or 'torch'
    step_s: dict[str, dict[int, float]]  # runtime -> batch -> best step time

    def describe(self) -> str:
        figures = "; ".join(
            f"{name} " + ", ".join(f"batch {b} {1e3 * s:.1f} ms" for b, s in by_batch.items())
            for name, by_batch in self.step_s.items()
        )
        return f"runtime auto: {self.runtime} (best decode step, measured side by side at start-up: {figures})"


def choose_runtime(step_s: dict[str, dict[int, float]]) -> RuntimeChoice:
    """torch only when its step is faster than numpy's at every measured batch; numpy, the reference, otherwise."""
    torch_wins = all(step_s["torch"][batch] < numpy_s for batch, numpy_s in step_s["numpy"].items())
    return RuntimeChoice("torch" if torch_wins else "numpy", step_s)


def decode_step(runner, batch: int) -> list[SeqChunk]:
    """`batch` single-token decode chunks at CONTEXT_TOKENS, on the runner's blocks (wrapping round a small cache)."""
    bs, blocks = runner.kv_block_size, runner.num_kv_blocks
    context = min(CONTEXT_TOKENS, blocks * bs - 1)
    per_seq = context // bs + 1
    vocab = runner.config.vocab_size
    return [
        SeqChunk([(100 + j) % vocab], context, [(j * per_seq + k) % blocks for k in range(per_seq)], True)
        for j in range(batch)
    ]


def measure_step_s(
    runners: dict, batches=BATCHES, rounds: int = MEASURE_ROUNDS, budget_s: float = MEASURE_BUDGET_S
) -> dict[str, dict[int, float]]:
    """Best time of each runner's decode step at each batch, runners taking turns. Each turn runs the step
    twice and times the second: right after the other runtime's step its thread pool is still spinning
    (OpenBLAS's and torch's OpenMP threads busy-wait a while before they sleep) and slows this one."""
    steps = {(name, b): decode_step(runner, b) for name, runner in runners.items() for b in batches}
    best = {name: {b: float("inf") for b in batches} for name in runners}
    started = time.perf_counter()
    for _ in range(rounds):
        for (name, b), chunks in steps.items():
            runners[name].forward(chunks)
            start = time.perf_counter()
            runners[name].forward(chunks)
            best[name][b] = min(best[name][b], time.perf_counter() - start)
        if time.perf_counter() - started > budget_s:
            break
    return best


def pick_runner(make_torch: Callable, make_numpy: Callable):
    """The faster of the two runners on this machine. A torch runner on a GPU is kept without measuring."""
    torch_runner = make_torch()
    if torch_runner.device != "cpu":
        return torch_runner
    numpy_runner = make_numpy()
    choice = choose_runtime(measure_step_s({"numpy": numpy_runner, "torch": torch_runner}))
    log.info(choice.describe())
    return torch_runner if choice.runtime == "torch" else numpy_runner
