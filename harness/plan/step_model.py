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

A fit knows its range (`FitRange`: the sequences, tokens and context per sequence of the steps it saw, and
each StepShape field's largest value). Past it the free coefficients are not trusted: a step is timed at
the range's edge by the fit, plus what the roofline of the fitted steps' own counts adds from the edge to
the step (`RooflineShape`: max(flops x s/FLOP, bytes x s/byte), the engine's traced FLOPs and bytes mapped
onto the batch, the seconds per FLOP and per byte fitted to the steps' times). Inside the range the
formula above is used unchanged.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, fields
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


SHAPE_FIELDS = tuple(f.name for f in fields(StepShape))


@dataclass(frozen=True)
class FitRange:
    """The batches and contexts of the steps a model was fitted on; (min, max) over those steps."""

    steps: int
    sequences: tuple[int, int]  # sequences in a step's batch
    tokens: tuple[int, int]  # tokens computed in a step (prompt tokens + decoding sequences)
    context_per_sequence: tuple[float, float]  # KV positions a step reads, over its sequences
    edge: StepShape  # each field's largest value: a shape past one is timed from there (FittedStepModel)

    @classmethod
    def of(cls, shapes: list[StepShape]) -> FitRange | None:
        """The range of these steps (those with a batch); None without any."""
        batches = [s for s in shapes if s.prefill_seqs + s.decode_seqs > 0]
        if not batches:
            return None
        seqs = [s.prefill_seqs + s.decode_seqs for s in batches]
        tokens = [s.prefill_tokens + s.decode_seqs for s in batches]
        context = [s.context_tokens / n for s, n in zip(batches, seqs)]
        edge = StepShape(*(max(getattr(s, f) for s in batches) for f in SHAPE_FIELDS))
        return cls(len(batches), (min(seqs), max(seqs)), (min(tokens), max(tokens)), (min(context), max(context)), edge)

    def holds(self, shape: StepShape) -> bool:
        """Whether no field of the shape (its context: an array over a decode run's steps) is past the edge."""
        e = self.edge
        return (
            shape.decode_seqs <= e.decode_seqs
            and shape.prefill_tokens <= e.prefill_tokens
            and shape.prefill_seqs <= e.prefill_seqs
            and shape.prefill_pairs <= e.prefill_pairs
            and bool(np.all(shape.context_tokens <= e.context_tokens))
        )

    def clamp(self, shape: StepShape) -> StepShape:
        """The shape with each field brought back to the edge where it is past it."""
        e = self.edge
        return StepShape(
            min(shape.prefill_tokens, e.prefill_tokens),
            min(shape.prefill_seqs, e.prefill_seqs),
            min(shape.decode_seqs, e.decode_seqs),
            np.minimum(shape.context_tokens, e.context_tokens),
            min(shape.prefill_pairs, e.prefill_pairs),
        )


@dataclass(frozen=True)
class RooflineShape:
    """How a fitted model's step time grows past its range: the roofline of the fitted steps' own counts,
    max(flops x seconds_per_flop, bytes x seconds_per_byte). The counts per unit of the batch are the engine's
    traced FLOPs and bytes read mapped onto the step's shape by least squares (its counting is linear in them:
    native_engine/step_trace.py step_flops, the model runner's bytes), the two rates fitted to the steps' times
    as roofline_fit.py fits mfu and mbu (roofline_seconds)."""

    flops_per_token: float  # the matmuls: 2 per weight
    flops_per_sequence: float  # the lm_head rows sampled
    flops_per_attended_pair: float  # attention: 4 x layers x q_dim per (query, position)
    bytes_per_step: float  # the weights, read once a step
    bytes_per_context_token: float  # the KV cache read
    seconds_per_flop: float  # 0 when no fitted step was compute-bound: FLOPs are then not charged past the range
    seconds_per_byte: float  # 0 when no fitted step was memory-bound: bytes the same

    def time_s(self, shape: StepShape):
        """The roofline time of the shape, without overhead (a float, or an array with the context's)."""
        tokens = shape.prefill_tokens + shape.decode_seqs
        seqs = shape.prefill_seqs + shape.decode_seqs
        flops = (
            self.flops_per_token * tokens
            + self.flops_per_sequence * seqs
            + self.flops_per_attended_pair * attended_pairs(shape)
        )
        moved = self.bytes_per_step + self.bytes_per_context_token * shape.context_tokens
        return np.maximum(flops * self.seconds_per_flop, moved * self.seconds_per_byte)


def attended_pairs(shape: StepShape):
    """(query, position) pairs of a step's attention, its queries spread evenly over its sequences (exact for
    decode; roofline_model.py counts them the same way)."""
    tokens, seqs = shape.prefill_tokens + shape.decode_seqs, shape.prefill_seqs + shape.decode_seqs
    return shape.context_tokens * tokens / seqs if seqs else 0 * shape.context_tokens


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
    fit_range: FitRange | None = None  # the fitted steps' batches and contexts (None: a stated model)
    beyond_range: RooflineShape | None = None  # None: past the range the formula goes on along its line

    def __post_init__(self) -> None:
        # a stated model may leave out the terms it does not use: they cost nothing
        object.__setattr__(self, "coefficients", dict.fromkeys(COEFFICIENTS, 0.0) | self.coefficients)

    def step_time_s(self, shape: StepShape) -> float:
        """The formula inside the fitted range; past it, the formula at the range's edge plus the roofline's
        growth from the edge to the shape (the same floats whether the context is one step's or an array)."""
        roofline = self.beyond_range
        if roofline is None or self.fit_range.holds(shape):
            return self.linear_s(shape)
        edge = self.fit_range.clamp(shape)
        # the growth apart: exactly 0 for an array's steps within the range, which so keep the formula's floats
        step_s = self.linear_s(edge) + (roofline.time_s(shape) - roofline.time_s(edge))
        return step_s if isinstance(step_s, np.ndarray) else float(step_s)

    def linear_s(self, shape: StepShape) -> float:
        """The fitted formula (module docstring), whatever the shape."""
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
        past = (
            "past fit_range: the form at the range's edge + beyond_range's roofline growth from there"
            if self.beyond_range is not None
            else "past fit_range (if any): the form along its line"
        )
        return {
            "kind": "fitted",
            "form": "intercept + multi_token_step [2+ tokens] + prefill_tokens + prefill_seqs + decode_seqs + "
            f"context_tokens + prefill_pairs (least squares, coefficients >= 0) + step_gap; {past}",
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
    shapes, durations_s, gaps_s, overheads_s, traced = [], [], [], [], []
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
        traced += steps
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
        FitRange.of(shapes),
        fit_roofline_shape(traced, shapes),
    )


def fit_roofline_shape(steps: list[dict], shapes: list[StepShape]) -> RooflineShape | None:
    """The roofline of the traced steps' FLOPs and bytes (RooflineShape); None where the trace counts none
    (another runtime, an older trace) or too few steps. A regime no fitted step was in keeps a rate of 0: past
    the range the step grows as the regime it was measured in (a CPU's decode steps are all compute-bound)."""
    rows = [
        (shape, step)
        for shape, step in zip(shapes, steps)
        if step.get("flops", 0) > 0 and step.get("bytes_read", 0) > 0 and step["dur_s"] > 0
    ]
    if len(rows) < 2 * len(COEFFICIENTS):
        return None
    counted = np.array(
        [[s.prefill_tokens + s.decode_seqs, s.prefill_seqs + s.decode_seqs, attended_pairs(s)] for s, _ in rows]
    )
    context = np.array([float(s.context_tokens) for s, _ in rows])
    flops = np.array([float(step["flops"]) for _, step in rows])
    moved = np.array([float(step["bytes_read"]) for _, step in rows])
    dur = np.array([step["dur_s"] for _, step in rows])
    (per_token, per_seq, per_pair), _ = nnls(counted, flops)
    (weights, per_context), _ = nnls(np.column_stack([np.ones_like(context), context]), moved)
    # the first guess: steps with a prefill compute-bound, decode-only steps memory-bound
    first_guess = np.array([s.prefill_tokens > 0 for s, _ in rows])
    per_flop, per_byte, _, _ = roofline_seconds(flops, moved, np.ones_like(dur), dur, first_guess)
    if per_flop <= 0 and per_byte <= 0:
        return None
    values = (per_token, per_seq, per_pair, weights, per_context, per_flop, per_byte)
    return RooflineShape(*map(float, values))


def roofline_seconds(
    flops: np.ndarray, moved: np.ndarray, steps: np.ndarray, dur_s: np.ndarray, compute_bound: np.ndarray, iterations=20
) -> tuple[float, float, float, np.ndarray]:
    """(seconds per FLOP, per byte, overhead per step, each row compute-bound) fitted to rows of dur_s =
    max(flops x s/FLOP, bytes x s/byte) + steps x overhead: least squares on relative error, non-negative,
    each row's regime (compute_bound: the first guess) re-chosen from the fit until it settles."""
    for _ in range(iterations):
        design = np.column_stack([flops * compute_bound, moved * ~compute_bound, steps]) / dur_s[:, None]
        (per_flop, per_byte, overhead_s), _ = nnls(design, np.ones_like(dur_s))
        regime = flops * per_flop > moved * per_byte
        if (regime == compute_bound).all():
            break
        compute_bound = regime
    return float(per_flop), float(per_byte), float(overhead_s), compute_bound


def trace_fit_range(run_dir: str | Path, kv_block_size: int = 16) -> FitRange | None:
    """The range of the steps in a run's engine_trace.json (None without one): what a model fitted to it saw."""
    trace = Path(run_dir) / "engine_trace.json"
    if not trace.is_file():
        return None
    return FitRange.of([shape_of(s, kv_block_size) for s in read_engine_trace(trace)])


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
