"""How long one engine step takes, given its batch: the interface every step model follows, and the
`fitted` model, a least-squares fit of measured steps (engine_trace.json of runs with backend.trace).

Fitted form, with non-negative coefficients (a step never gets faster by adding work):
    step_time_s = intercept_s + multi_token_step_s * [prefill_tokens + decode_seqs >= 2]
                  + per_prefill_token_s * prefill_tokens + per_prefill_seq_s * prefill_seqs
                  + per_decode_seq_s * decode_seqs + per_context_token_s * context_tokens
                  + per_prefill_pair_s * prefill_pairs
multi_token_step_s is the jump from one token to two: with one token row every weight matrix is a
matrix-vector product, with two or more BLAS repacks each matrix for a matrix product first
(native_engine/model_runner.py), so a batch of 2 costs more than twice a batch of 1 and the cost per
sequence after that is much less than the first sequence's. A line through batches of 1..10 without it
puts a batch of 30 at twice what it takes.
prefill_pairs is prefill attention's quadratic part: a chunk of n tokens starting at position p computes
n * p + n * (n + 1) / 2 (query, key) pairs. Without it the fit put the steps of 384-token prompts 7-9%
above and those of 128-token prompts 5-10% below what they took (benchmarks/planner_accuracy.py).
plus `step_gap_s`, the engine loop's median idle between two back-to-back steps, and
`request_overhead_s`, the server's per-request time outside the engine's queue and prefill
(HTTP, tokenization, the first chunk's trip), from the runs' phases_ms.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict
from scipy.optimize import nnls

from harness.engine.step_trace import read_engine_trace
from harness.results.folder import read_records

FEATURES = ("prefill_tokens", "prefill_seqs", "decode_seqs", "context_tokens", "prefill_pairs")
COEFFICIENTS = ("intercept_s", "multi_token_step_s", *("per_" + f.removesuffix("s") + "_s" for f in FEATURES))
DECODE_BANDS = ((1, 1), (2, 4), (5, 8), (9, 16), (17, 32), (33, 1 << 30))  # decode-only steps by batch size
BACK_TO_BACK_S = 0.005  # a gap longer than this between steps is the engine waiting for work, not overhead


@dataclass(frozen=True)
class StepShape:
    """One engine step's batch, as the simulator built it."""

    prefill_tokens: int  # prompt tokens computed this step, all chunks together
    prefill_seqs: int  # sequences with a prefill chunk this step
    decode_seqs: int  # sequences generating one token this step
    context_tokens: int  # sum over the step's sequences of the tokens each attends over (KV read)
    prefill_pairs: int = 0  # (query, key) pairs of the prefill chunks' attention: n * start + n * (n + 1) / 2 each


class StepModel(Protocol):
    def step_time_s(self, shape: StepShape) -> float: ...

    def describe(self) -> dict: ...  # {"kind", "form", "coefficients", ...} saved beside the prediction


@dataclass(frozen=True)
class FittedStepModel:
    coefficients: dict[str, float]  # COEFFICIENTS; a stated model may leave out multi_token_step_s (0)
    step_gap_s: float
    request_overhead_s: float
    residuals: dict  # of the fit on its own steps: rms_ms, mape, steps
    sources: list[str]  # the run folders fitted

    def __post_init__(self) -> None:
        # a stated model may leave out the terms it does not use: they cost nothing
        object.__setattr__(self, "coefficients", dict.fromkeys(COEFFICIENTS, 0.0) | self.coefficients)

    def step_time_s(self, shape: StepShape) -> float:
        c = self.coefficients
        multi_token = shape.prefill_tokens + shape.decode_seqs >= 2
        return (
            c["intercept_s"]
            + c["multi_token_step_s"] * multi_token
            + c["per_prefill_token_s"] * shape.prefill_tokens
            + c["per_prefill_seq_s"] * shape.prefill_seqs
            + c["per_decode_seq_s"] * shape.decode_seqs
            + c["per_context_token_s"] * shape.context_tokens
            + c["per_prefill_pair_s"] * shape.prefill_pairs
            + self.step_gap_s
        )

    def describe(self) -> dict:
        return {
            "kind": "fitted",
            "form": "intercept + multi_token_step [2+ tokens] + prefill_tokens + prefill_seqs + decode_seqs + "
            "context_tokens + prefill_pairs (least squares, coefficients >= 0) + step_gap",
            **asdict(self),
        }


class _TracedBatch(BaseModel):
    """What a step of engine_trace.json says of its batch; its other keys are ignored."""

    model_config = ConfigDict(extra="ignore")
    prefill_tokens: int
    prefill_chunks: list[int]
    decode_seqs: int
    kv_blocks_used: int
    kv_positions_read: int | None = None  # None: traced before the engine recorded it
    prefill_starts: list[int] | None = None  # the same


def shape_of(step: dict, kv_block_size: int) -> StepShape:
    """A measured step's batch. context_tokens: the engine's kv_positions_read where the trace has it,
    else the KV blocks held (a bound: blocks are whole and include shared prefixes once). prefill_pairs from
    the chunks' prefill_starts where traced, else as if each chunk started its prompt (a lower bound)."""
    batch = _TracedBatch.model_validate(step)
    context = batch.kv_positions_read
    if context is None:
        context = batch.kv_blocks_used * kv_block_size
    chunks = batch.prefill_chunks
    starts = batch.prefill_starts or [0] * len(chunks)
    return StepShape(batch.prefill_tokens, len(chunks), batch.decode_seqs, context, prefill_pairs(chunks, starts))


def prefill_pairs(chunk_tokens: list[int], starts: list[int]) -> int:
    """Attention's (query, key) pairs over prefill chunks: each query attends to the positions before it."""
    return sum(n * start + n * (n + 1) // 2 for n, start in zip(chunk_tokens, starts))


def fit_step_model(run_dirs: list[str | Path], kv_block_size: int = 16) -> FittedStepModel:
    """Least squares over the steps of every run's engine_trace.json (field plan.step_model.fitted)."""
    shapes, durations_s, gaps_s, overheads_s = [], [], [], []
    for run_dir in map(Path, run_dirs):
        trace = run_dir / "engine_trace.json"
        if not trace.is_file():
            raise ValueError(
                f"plan.step_model.fitted: {run_dir} has no engine_trace.json; measure the run with "
                f"backend.trace: true against the native engine"
            )
        if is_simulated_run(run_dir):
            raise ValueError(f"plan.step_model.fitted: {run_dir} is a simulated run (bench plan); fit to measured runs")
        steps = read_engine_trace(trace)
        shapes += [shape_of(s, kv_block_size) for s in steps]
        durations_s += [s["dur_s"] for s in steps]
        gaps_s += [b["t_s"] - a["t_s"] - a["dur_s"] for a, b in itertools.pairwise(steps)]
        overheads_s.append(request_overhead_s(run_dir))
    if len(shapes) < 2 * len(COEFFICIENTS):
        raise ValueError(
            f"plan.step_model.fitted: {len(shapes)} steps in {', '.join(map(str, run_dirs))}; "
            f"too few to fit {len(COEFFICIENTS)} coefficients (measure a longer run)"
        )
    x = np.array(
        [[1.0, float(s.prefill_tokens + s.decode_seqs >= 2), *(getattr(s, f) for f in FEATURES)] for s in shapes]
    )
    y = np.array(durations_s)
    # Absolute, not relative, errors: the sum of step times (throughput, queueing) is what must come out right,
    # and on a shared machine a step's time varies several-fold around its mean.
    coef, _ = nnls(x, y)
    predicted = x @ coef
    gaps = [g for g in gaps_s if 0 <= g < BACK_TO_BACK_S]
    residuals = {
        "steps": len(y),
        "rms_ms": float(np.sqrt(np.mean((predicted - y) ** 2)) * 1e3),
        "mape": float(np.mean(np.abs(predicted - y) / y)),
        "bands": band_residuals(shapes, y, predicted),
    }
    return FittedStepModel(
        dict(zip(COEFFICIENTS, map(float, coef))),
        float(np.median(gaps)) if gaps else 0.0,
        float(np.median(overheads_s)),
        residuals,
        [str(p) for p in run_dirs],
    )


class _RunKind(BaseModel):
    """What the fits read of run.json: whether `bench plan` simulated the run (its other keys are ignored)."""

    model_config = ConfigDict(extra="ignore")
    simulated: bool | None = None


def is_simulated_run(run_dir: Path) -> bool:
    """Whether the folder is `bench plan`'s (its steps are a model's, not measured); False without a run.json."""
    info = run_dir / "run.json"
    return info.is_file() and bool(_RunKind.model_validate_json(info.read_bytes()).simulated)


class _EngineTimings(BaseModel):
    """The engine's queue and prefill of a request, from its server_timings (native; others leave them out)."""

    model_config = ConfigDict(extra="ignore")
    queue_ms: float | None = None
    prefill_ms: float | None = None


def request_overhead_s(run_dir: Path) -> float:
    """The median over a run's requests of client TTFT minus the engine's own queue + prefill."""
    values = []
    for rec in read_records(run_dir):
        timings = _EngineTimings.model_validate(rec.server_timings)
        if not rec.ok or not rec.token_times_s or timings.prefill_ms is None:
            continue
        ttft_s = rec.token_times_s[0] - rec.intended_send_s
        values.append(ttft_s - (timings.queue_ms or 0.0) / 1e3 - timings.prefill_ms / 1e3)
    return max(float(np.median(values)), 0.0) if values else 0.0


def band_residuals(shapes: list[StepShape], measured_s: np.ndarray, predicted_s: np.ndarray) -> list[dict]:
    """The fit's error by kind of step: decode-only steps by batch size, then every step with a prefill.
    `bias` is summed predicted over summed measured time, minus 1 (what throughput and queueing feel);
    a form that misses how cost grows with the batch shows as biases of opposite signs across bands."""
    bands = [
        (f"decode {lo}" if lo == hi else f"decode {lo}-{hi}" if hi < 1 << 30 else f"decode {lo}+", lo, hi)
        for lo, hi in DECODE_BANDS
    ]
    out = []
    for name, lo, hi in [*bands, ("with prefill", 0, 0)]:
        if name == "with prefill":
            picked = [i for i, s in enumerate(shapes) if s.prefill_tokens]
        else:
            picked = [i for i, s in enumerate(shapes) if not s.prefill_tokens and lo <= s.decode_seqs <= hi]
        if not picked:
            continue
        m, p = measured_s[picked], predicted_s[picked]
        out.append(
            {
                "band": name,
                "steps": len(picked),
                "measured_ms": float(np.mean(m) * 1e3),
                "bias": float(p.sum() / m.sum() - 1),
                "mape": float(np.mean(np.abs(p - m) / m)),
            }
        )
    return out
