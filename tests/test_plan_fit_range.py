"""A fitted step model knows its range: the batches (sequences and tokens a step) and contexts of the steps it was
fitted on, beyond which it extrapolates by the roofline of the fitted steps' own FLOP and byte counts instead of
its free linear terms, and `bench plan` says how far, in which dimension and in what share of steps a plan goes
past it (harness/plan/step_model.py FitRange, RooflineShape; harness/plan/range_tally.py)."""

import pytest
import yaml
from test_plan import STATED

from harness.engine.step_trace import write_engine_trace
from harness.metrics.explain import explanation_lines
from harness.plan.decode_run import step_times_s
from harness.plan.deployment import deployment_from_args
from harness.plan.roofline_fit import fit_roofline
from harness.plan.simulator import Simulation, _fit_range, prompt_token_ids, run_simulation, simulate_scenario
from harness.plan.step_model import FitRange, FittedStepModel, StepShape, fit_step_model
from harness.results.folder import RequestRecord
from harness.scenario.scenario import Scenario, load_scenario
from harness.scenario.tokenizer_source import LocalTokenizer
from harness.scenario.workload import build_schedule

# The synthetic engine the traces below come from, a roofline: FLOPs 2e6 a token (matmuls), 4e5 a sequence
# (lm_head), 1e3 an attended (query, position) pair; bytes 1e7 a step (weights) and 1e3 a KV position read;
# 1 ns a FLOP, 1 ns a byte, 1 ms of overhead a step.
FLOPS_PER_TOKEN, FLOPS_PER_SEQ, FLOPS_PER_PAIR = 2e6, 4e5, 1e3
WEIGHT_BYTES, BYTES_PER_POSITION = 1e7, 1e3
S_PER_FLOP, S_PER_BYTE, OVERHEAD_S = 1e-9, 1e-9, 1e-3


def counts(shape: StepShape, weight_bytes: float = WEIGHT_BYTES) -> tuple[float, float]:
    tokens, seqs = shape.prefill_tokens + shape.decode_seqs, shape.prefill_seqs + shape.decode_seqs
    attended = shape.context_tokens * tokens / seqs
    flops = FLOPS_PER_TOKEN * tokens + FLOPS_PER_SEQ * seqs + FLOPS_PER_PAIR * attended
    return flops, weight_bytes + BYTES_PER_POSITION * shape.context_tokens


def roofline_s(shape: StepShape, weight_bytes: float = WEIGHT_BYTES) -> float:
    flops, moved = counts(shape, weight_bytes)
    return max(flops * S_PER_FLOP, moved * S_PER_BYTE)


# the fitted run: decode-only batches of 1-4 sequences at 50-150 positions each, and lone prompts of 16-64 tokens
DECODES = [StepShape(0, 0, n, n * c) for n in (1, 2, 3, 4) for c in (50, 100, 150)]
PREFILLS = [StepShape(n, 1, 0, n, n * (n + 1) // 2) for n in (16, 32, 48, 64)]


def write_run(run_dir, shapes: list[StepShape], counted: bool = True, weight_bytes: float = WEIGHT_BYTES):
    steps, t_s = [], 0.0
    for shape in shapes:
        flops, moved = counts(shape, weight_bytes)
        dur_s = roofline_s(shape, weight_bytes) + OVERHEAD_S
        chunks = [shape.prefill_tokens] if shape.prefill_seqs else []
        steps.append(
            {
                "t_s": t_s,
                "dur_s": dur_s,
                "forward_s": dur_s,
                "prefill_tokens": shape.prefill_tokens,
                "prefill_chunks": chunks,
                "prefill_starts": [0] * len(chunks),
                "decode_seqs": shape.decode_seqs,
                "kv_blocks_used": 0,
                "preemptions": 0,
                "prefix_hit_tokens": 0,
                "bytes_read": int(moved) if counted else 0,
                "flops": int(flops) if counted else 0,
                "running": 0,
                "waiting": 0,
                "kv_positions_read": shape.context_tokens,
            }
        )
        t_s += dur_s
    run_dir.mkdir()
    write_engine_trace(run_dir / "engine_trace.json", steps)
    (run_dir / "requests.jsonl").write_text(RequestRecord(0, 0.0, token_times_s=[0.1]).to_json() + "\n")
    return run_dir


def test_the_fit_records_the_range_of_its_steps(tmp_path):
    model = fit_step_model([write_run(tmp_path / "run", DECODES + PREFILLS)])
    r = model.fit_range
    assert r.steps == 16
    assert r.sequences == (1, 4)  # the decode batches; a prompt is one sequence
    assert r.tokens == (1, 64)  # a lone decoding sequence, the 64-token prompt
    assert r.context_per_sequence == (16, 150)  # the 16-token prompt (16 positions), a decode at 150 each
    assert r.edge == StepShape(64, 1, 4, 600, 64 * 65 // 2)
    assert model.describe()["fit_range"]["sequences"] == (1, 4)


def test_past_its_range_the_fit_grows_as_the_roofline_of_its_steps(tmp_path):
    model = fit_step_model([write_run(tmp_path / "run", DECODES + PREFILLS)])
    roofline = model.beyond_range
    assert roofline.seconds_per_flop == pytest.approx(S_PER_FLOP, rel=1e-6)
    assert roofline.seconds_per_byte == pytest.approx(S_PER_BYTE, rel=1e-6)
    assert roofline.flops_per_attended_pair == pytest.approx(FLOPS_PER_PAIR, rel=1e-6)
    # 16 sequences at 150 positions each: 4x the batch, past the edge (4 sequences, 600 positions). By hand, the
    # roofline there: FLOPs 16 x 2.4e6 + 1e3 x 2,400 = 40.8e6 (40.8 ms) over bytes 1e7 + 2.4e6 (12.4 ms); at
    # the edge: bytes 1e7 + 6e5 (10.6 ms) over FLOPs 4 x 2.4e6 + 6e5 (10.2 ms). So the step takes the fit's time
    # at the edge plus 40.8 - 10.6 = 30.2 ms, about the engine's 40.8 + 1 ms.
    big = StepShape(0, 0, 16, 2400)
    edge = StepShape(0, 0, 4, 600)
    assert model.step_time_s(big) - model.linear_s(edge) == pytest.approx(0.0302, rel=1e-6)
    assert model.step_time_s(big) == pytest.approx(0.0418, rel=0.05)
    assert model.linear_s(big) < 0.5 * 0.0418  # the free linear terms: decode looked memory-bound, so nearly flat
    # inside the range the fitted form, unchanged
    inside = StepShape(0, 0, 3, 300)
    assert model.step_time_s(inside) == model.linear_s(inside)
    # a decode run's steps timed at once (fast-forward) give each step's own float, across the edge too
    contexts = list(range(580, 660, 4))  # 4 sequences: the edge's 600 positions crossed halfway
    assert step_times_s(model, 4, contexts) == [model.step_time_s(StepShape(0, 0, 4, c)) for c in contexts]
    assert step_times_s(model, 4, contexts)[-1] > model.linear_s(StepShape(0, 0, 4, 600))


def test_a_fit_whose_steps_were_all_compute_bound_grows_by_flops_past_its_range(tmp_path):
    # weights of 1e5 bytes: every step's FLOPs outweigh its bytes (a CPU's decode steps are compute-bound), so no
    # step tells the time a byte costs; past the range the step grows by its FLOPs alone. By hand, 16 sequences
    # at 150 positions over the edge (4 at 150): 40.8e6 - 10.2e6 FLOPs, 30.6 ms.
    model = fit_step_model([write_run(tmp_path / "run", DECODES + PREFILLS, weight_bytes=1e5)])
    assert model.beyond_range.seconds_per_byte == 0
    assert model.beyond_range.seconds_per_flop == pytest.approx(S_PER_FLOP, rel=1e-6)
    big, edge = StepShape(0, 0, 16, 2400), StepShape(0, 0, 4, 600)
    assert model.step_time_s(big) - model.linear_s(edge) == pytest.approx(0.0306, rel=1e-6)


def test_a_trace_without_flops_and_bytes_extrapolates_along_its_line(tmp_path):
    model = fit_step_model([write_run(tmp_path / "run", DECODES + PREFILLS, counted=False)])
    assert model.beyond_range is None and model.fit_range.sequences == (1, 4)
    big = StepShape(0, 0, 16, 2400)
    assert model.step_time_s(big) == model.linear_s(big)
    assert "along its line" in model.describe()["form"]


def test_the_roofline_fit_records_its_range(tmp_path):
    # weights of 1e5 bytes: every step's time is its FLOPs' (compute-bound), the one form both fits share
    run = write_run(tmp_path / "run", DECODES + PREFILLS, weight_bytes=1e5)
    fit = fit_roofline(run, peak_flops=1e9, peak_bytes_per_s=1e9)
    assert fit.fit_range == fit_step_model([run]).fit_range
    assert fit.params.mfu == pytest.approx(1.0, rel=1e-6) and fit.params.overhead_ms == pytest.approx(1.0, rel=1e-6)


def test_a_plan_on_a_roofline_fitted_to_a_run_knows_that_runs_range(tmp_path):
    write_run(tmp_path / "run", DECODES + PREFILLS)
    spec = {
        "name": "roofline-fit",
        "backend": {"kind": "native", "model": "smollm2", "launch": {"args": []}},
        "load": {"arrival": "poisson", "rate": 1},
        "plan": {"step_model": {"roofline": {"fit": "run"}}},
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    roofline_model = object()  # any model that is not the fitted form: its range is the fitted run's
    fitted_range = _fit_range(load_scenario(tmp_path / "s.yaml"), roofline_model, deployment_from_args([], "smollm2"))
    assert fitted_range == fit_step_model([tmp_path / "run"]).fit_range and fitted_range.sequences == (1, 4)
    assert _fit_range(one_request(tmp_path), STATED, deployment_from_args([], "smollm2")) is None  # a stated model


# A stated model fitted, say, on steps of at most 4 sequences, 16 tokens and 36 positions a sequence.
NARROW = FittedStepModel(
    STATED.coefficients, 0.0, 0.0, {}, [], FitRange(100, (1, 4), (1, 16), (1.0, 36.0), StepShape(16, 1, 4, 144, 136))
)


def one_request(tmp_path) -> Scenario:
    spec = {
        "name": "range",
        "seed": 0,
        "backend": {"kind": "native", "model": "smollm2", "launch": {"args": []}},
        "workload": {"kind": "random", "input_tokens": 32, "output_tokens": 8},
        "load": {"arrival": "closed", "concurrency": 1, "num_requests": 1},
        "plan": {"step_model": "roofline"},
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    return load_scenario(tmp_path / "s.yaml")


def test_a_plan_past_the_fitted_range_says_how_far_in_which_dimension_and_how_often(tmp_path):
    # one request of 32 prompt tokens and 8 answer tokens, alone: by hand, 8 steps. The prefill step: 1 sequence,
    # 32 tokens (past 16: 2.0x), 32 positions; then 7 decode steps at 33..39 positions, of which 37, 38, 39 are
    # past 36 (1.08x at most). Past the range: 4 of 8 steps (50%); tokens 1 of 8, context 3 of 8; sequences never.
    summary = simulate_scenario(one_request(tmp_path), step_model=NARROW)
    finding = next(f for f in summary.diagnosis if f.rule == "plan_beyond_fitted_range")
    e = finding.evidence
    assert (e["steps"], e["beyond"], e["share"]) == (8, 4, 0.5)
    dims = e["dimensions"]
    assert (dims["tokens"]["highest"], dims["tokens"]["times"], dims["tokens"]["steps"]) == (32, 2.0, 1)
    assert dims["context_per_sequence"]["highest"] == 39 and dims["context_per_sequence"]["steps"] == 3
    assert dims["context_per_sequence"]["times"] == pytest.approx(39 / 36)
    assert dims["sequences"]["steps"] == 0 and dims["sequences"]["highest"] == 1
    line = next(line for line in explanation_lines(summary) if "go past" in line)
    assert line.startswith("[warning] 50% of the plan's 8 steps go past the 100 steps the step model was fitted on")
    assert "tokens a step up to 32 (fitted 1-16, 2.0x; 12% of steps)" in line
    assert "context per sequence up to 39 (fitted 1-36, 1.1x; 38% of steps)" in line
    assert "sequences a step up to" not in line
    assert summary.plan.step_model["fit_range"]["tokens"] == (1, 16)


@pytest.mark.parametrize("fast_forward", [False, True])
def test_decode_runs_are_tallied_as_their_steps_would_be(tmp_path, fast_forward):
    scenario = one_request(tmp_path)
    tokenizer = LocalTokenizer("smollm2")
    requests = build_schedule(scenario, tokenizer).requests
    sim = Simulation(deployment_from_args([], "smollm2"), NARROW, fast_forward=fast_forward, fit_range=NARROW.fit_range)
    run_simulation(sim, requests, prompt_token_ids(requests, tokenizer), 1, lambda rec: None)
    assert (sim.fast_forwarded_steps > 0) == fast_forward
    tally = sim.range_tally
    assert (tally.steps, tally.beyond) == (8, 4)
    assert tally.beyond_by == {"sequences": 0, "tokens": 1, "context_per_sequence": 3}
    assert tally.highest == {"sequences": 1, "tokens": 32, "context_per_sequence": 39}


def test_a_plan_within_the_range_says_nothing(tmp_path):
    wide = FittedStepModel(
        STATED.coefficients,
        0.0,
        0.0,
        {},
        [],
        FitRange(10, (1, 8), (1, 64), (1.0, 64.0), StepShape(64, 2, 8, 512, 2080)),
    )
    summary = simulate_scenario(one_request(tmp_path), step_model=wide)
    assert not [f for f in summary.diagnosis if f.rule == "plan_beyond_fitted_range"]
