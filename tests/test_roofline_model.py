"""The roofline step model against step costs worked out by hand (Llama-3.1-8B on an H100), and its fit
from a run's step trace."""

import csv
import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from harness.engine.step_trace import write_engine_trace
from harness.plan.architectures import BUILTIN
from harness.plan.roofline_fit import VLLM_COUNTERS, fit_roofline, trace_rows
from harness.plan.roofline_model import RooflineParams, RooflineStepModel, link_efficiency
from harness.plan.roofline_scenario import roofline_step_model
from harness.plan.simulator import simulate_scenario
from harness.plan.step_model import StepShape
from harness.scenario.gpus import GPU_SPECS
from harness.scenario.planning import StepModelSpec
from harness.scenario.scenario import ScenarioError, load_scenario

FIXTURE_RUN = Path(__file__).parent / "fixtures" / "roofline_fit_run"
IDEAL = RooflineParams(mfu=1.0, mbu=1.0, overhead_ms=0.0, allreduce_hop_latency_us=0.0)
# Llama-3.1-8B by hand: 32 layers x (q, k, v, o, gate/up/down, 2 norms) and the lm_head
LAYER_PARAMS = 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 3 * 4096 * 14336 + 2 * 4096
MATMUL_PARAMS, LM_HEAD_PARAMS = 32 * LAYER_PARAMS, 128256 * 4096
WEIGHT_BYTES = (MATMUL_PARAMS + LM_HEAD_PARAMS) * 2
KV_PER_TOKEN = 2 * 32 * 8 * 128 * 2
# H100 SXM datasheet: BF16 1,979 TFLOPS with sparsity (989.5 dense), 3.35 TB/s
H100_FLOPS, H100_BYTES_PER_S = 1979e12 / 2, 3.35e12


def llama_on_h100(params=IDEAL, tensor_parallel=1):
    return RooflineStepModel(BUILTIN["llama-3.1-8b"], GPU_SPECS["H100-SXM"], tensor_parallel, params)


def test_decode_at_batch_one_is_memory_bound():
    shape = StepShape(prefill_tokens=0, prefill_seqs=0, decode_seqs=1, context_tokens=1000)
    costs = llama_on_h100().costs(shape)
    flops = 2 * MATMUL_PARAMS + 2 * LM_HEAD_PARAMS + 4 * 32 * (32 * 128) * 1000
    moved = WEIGHT_BYTES + (1000 + 1) * KV_PER_TOKEN  # every weight once, the context's KV read, one written
    assert costs.flops_per_gpu == pytest.approx(flops) and costs.bytes_per_gpu == pytest.approx(moved)
    assert costs.bound == "memory"
    # compute and reads added: the weights' and KV's 4.52 ms and the 16 GFLOP's 0.016 ms
    assert costs.step_s == pytest.approx(moved / H100_BYTES_PER_S + flops / H100_FLOPS)
    assert costs.step_s == pytest.approx(4.535e-3, rel=1e-3)


def test_large_prefill_is_compute_bound():
    shape = StepShape(prefill_tokens=8192, prefill_seqs=1, decode_seqs=0, context_tokens=8192)
    costs = llama_on_h100().costs(shape)
    # without prefill_pairs, the step's queries are spread over its sequences: 8192 x 8192 pairs
    flops = 2 * MATMUL_PARAMS * 8192 + 2 * LM_HEAD_PARAMS + 4 * 32 * (32 * 128) * 8192 * 8192
    assert costs.bound == "compute" and costs.flops_per_gpu == pytest.approx(flops)
    # lm_head multiplies one row (the prompt's last token): a matrix-vector product that reads its 1.05 GB
    lm_head_read_s = LM_HEAD_PARAMS * 2 / H100_BYTES_PER_S
    assert costs.lm_head.memory_s == pytest.approx(lm_head_read_s) and lm_head_read_s > costs.lm_head.compute_s
    # read: every weight once, and the KV of the context (8,192 positions) and of the new tokens (8,192)
    moved = WEIGHT_BYTES + 2 * 8192 * KV_PER_TOKEN
    assert costs.step_s == pytest.approx(flops / H100_FLOPS + moved / H100_BYTES_PER_S)  # 151.1 + 5.1 ms
    assert costs.step_s == pytest.approx(0.1562, rel=1e-3)


def test_a_mixed_steps_compute_and_reads_add():
    """A chunk of a prompt beside a decode batch: the decode batch's attention reads its KV cache in kernels of its
    own (one stream: they run one after another), and within each kernel group the reads do not hide under the
    compute (roofline_model's docstring: measured decode steps grow from the weights' read), so the step is the
    whole step's compute plus its reads. Attention's pairs: the chunk's causal ones (prefill_pairs) and one query a
    decoding sequence over its context."""
    # 512 prompt tokens from position 1024 of one sequence, and 64 sequences decoding at 4,000 positions each
    pairs = 512 * 1024 + 512 * 513 // 2
    shape = StepShape(512, 1, 64, (1024 + 512) + 64 * 4000, pairs)
    costs = llama_on_h100().costs(shape)
    tokens, positions = 512 + 64, 1536 + 256_000 + 576  # KV read over the context, written for the new tokens
    assert costs.layers.compute_s == pytest.approx(2 * MATMUL_PARAMS * tokens / H100_FLOPS)  # 8.1 ms
    assert costs.attention.flops == pytest.approx(4 * 32 * 4096 * (pairs + 64 * 4000))
    assert costs.attention.memory_s == pytest.approx(positions * KV_PER_TOKEN / H100_BYTES_PER_S)  # 10.1 ms
    flops = 2 * MATMUL_PARAMS * tokens + 2 * LM_HEAD_PARAMS * 65 + costs.attention.flops  # 65 sequences sampled
    moved = WEIGHT_BYTES + positions * KV_PER_TOKEN
    assert costs.step_s == pytest.approx(flops / H100_FLOPS + moved / H100_BYTES_PER_S)  # 8.7 + 14.6 ms
    assert costs.step_s == pytest.approx(0.02326, rel=1e-3)
    # the ideal roofline over the step's totals would hide the compute under the reads: 14.6 ms, 37% less
    assert max(costs.compute_s, costs.memory_s) == pytest.approx(0.01458, rel=1e-3)
    assert llama_on_h100().step_time_s(shape) == pytest.approx(costs.step_s, rel=1e-12)


def test_mfu_mbu_and_overhead_scale_their_own_terms():
    decode = StepShape(0, 0, 1, 1000)
    model = llama_on_h100(RooflineParams(mfu=0.5, mbu=0.8, overhead_ms=2.0))
    moved = WEIGHT_BYTES + 1001 * KV_PER_TOKEN
    flops = 2 * MATMUL_PARAMS + 2 * LM_HEAD_PARAMS + 4 * 32 * (32 * 128) * 1000
    assert model.step_time_s(decode) == pytest.approx(
        moved / (H100_BYTES_PER_S * 0.8) + flops / (H100_FLOPS * 0.5) + 2e-3
    )
    assert model.describe()["coefficients"]["mbu"] == 0.8


def test_tensor_parallel_splits_the_work_and_adds_two_all_reduces_per_layer():
    shape = StepShape(0, 0, 8, 8 * 1000)
    params = dataclasses.replace(IDEAL, allreduce_hop_latency_us=2.0)
    costs = llama_on_h100(params, tensor_parallel=2).costs(shape)
    # per GPU: half the weights, half of the 8 KV heads
    assert costs.bytes_per_gpu == pytest.approx(WEIGHT_BYTES / 2 + (8000 + 8) * KV_PER_TOKEN / 2)
    # a ring all-reduce of 8 tokens x 4096 x 2 bytes: each GPU sends 2 x (2-1)/2 of it at NVLink 4's 450 GB/s one
    # way x 0.82 (NCCL's 20.6 of 25 GB/s a link) = 369 GB/s, plus 2 x (2-1) hops of 2 us; 2 per layer, 32 layers
    one = 2 * (1 / 2) * (8 * 4096 * 2) / 369e9 + 2 * 1 * 2e-6
    assert one == pytest.approx(4.1776e-6, rel=1e-4)
    assert costs.allreduce_s == pytest.approx(64 * one)
    flops = (2 * MATMUL_PARAMS * 8 + 2 * LM_HEAD_PARAMS * 8 + 4 * 32 * (32 * 128) * 8000) / 2
    assert costs.flops_per_gpu == pytest.approx(flops)
    assert costs.step_s == pytest.approx(costs.bytes_per_gpu / H100_BYTES_PER_S + flops / H100_FLOPS + 64 * one)
    # over PCIe (L40S: 64 GB/s both ways, 32 one way) at 0.5 of it, 16 GB/s: the same bytes move 23x slower
    pcie = RooflineStepModel(BUILTIN["llama-3.1-8b"], GPU_SPECS["L40S"], 2, params)
    assert pcie.allreduce_s(8) == pytest.approx(64 * (2 * (1 / 2) * (8 * 4096 * 2) / 16e9 + 4e-6))
    assert llama_on_h100(params).allreduce_s(8) == 0.0


def test_link_efficiency_by_link_kind():
    """NVLink, NVLink bridges and Infinity Fabric at nvlink_efficiency, PCIe at pcie_efficiency; set to 1 the
    all-reduce moves at half the datasheet's both-ways figure, as before issue 38's TP drift."""
    params = RooflineParams()
    assert (params.nvlink_efficiency, params.pcie_efficiency) == (0.82, 0.5)
    kinds = {name: link_efficiency(GPU_SPECS[name]) for name in ("H100-SXM", "H100-NVL", "MI300X", "L40S", "H100-PCIe")}
    assert kinds == {"H100-SXM": 0.82, "H100-NVL": 0.82, "MI300X": 0.82, "L40S": 0.5, "H100-PCIe": 0.5}
    # H100 SXM TP8, 4,096 rows of Llama-3.1-70B's 8,192 hidden: 64 MiB a message, 2 x 7/8 of it each way
    arch = BUILTIN["llama-3.1-70b"]
    line_rate = dataclasses.replace(IDEAL, nvlink_efficiency=1.0)
    full = RooflineStepModel(arch, GPU_SPECS["H100-SXM"], 8, line_rate).allreduce_s(4096)
    nccl = RooflineStepModel(arch, GPU_SPECS["H100-SXM"], 8, IDEAL).allreduce_s(4096)
    assert full == pytest.approx(160 * 2 * 7 / 8 * 4096 * 8192 * 2 / 450e9)  # 41.8 ms a step at the line rate
    assert nccl == pytest.approx(full / 0.82)  # 50.9 ms at NCCL's 369 GB/s


def synthetic_run(tmp_path: Path, mfu: float, mbu: float, overhead_s: float) -> Path:
    """A run folder whose steps took exactly what the roofline with these parameters says (compute + reads)."""
    peak_flops, peak_bytes = 1e12, 2e10
    steps = []
    for i, (flops, moved) in enumerate(
        [(5e8, 6e7), (8e8, 6.5e7), (2e11, 9e7), (4e11, 1.2e8), (3e8, 7e7), (1e11, 8e7), (6e10, 7.5e7), (9e8, 6.2e7)]
    ):
        dur = flops / (peak_flops * mfu) + moved / (peak_bytes * mbu) + overhead_s
        steps.append(
            {
                "t_s": i * 0.5,
                "dur_s": dur,
                "forward_s": dur,
                "prefill_tokens": 0,
                "prefill_chunks": [],
                "decode_seqs": 1,
                "kv_blocks_used": 1,
                "preemptions": 0,
                "prefix_hit_tokens": 0,
                "bytes_read": moved,
                "flops": flops,
                "running": 1,
                "waiting": 0,
            }
        )
    write_engine_trace(tmp_path / "engine_trace.json", steps)
    ceilings = {"flops_per_s": peak_flops, "bytes_per_s": peak_bytes}
    (tmp_path / "summary.json").write_text(json.dumps({"roofline": {"ceilings": ceilings}}))
    return tmp_path


def test_fit_recovers_the_parameters_a_run_was_made_with(tmp_path):
    fit = fit_roofline(synthetic_run(tmp_path, mfu=0.4, mbu=0.6, overhead_s=3e-3))
    assert fit.params.mfu == pytest.approx(0.4, rel=1e-3)
    assert fit.params.mbu == pytest.approx(0.6, rel=1e-3)
    assert fit.params.overhead_ms == pytest.approx(3.0, rel=1e-3)
    assert fit.compute_bound_rows == 4 and fit.source == "step trace" and fit.median_abs_error < 1e-6


def test_fit_on_a_measured_native_run():
    """A real run of the native engine (SmolLM2-135M, backend.trace) on a heavily loaded 2-core CPU
    (fixtures/roofline_fit_run/README.md): the fitted roofline predicts its steps much better than the
    defaults against the same measured ceilings, the waiting for a core landing in the overhead."""
    fit = fit_roofline(FIXTURE_RUN)
    assert fit.rows == 81 and fit.source == "step trace"
    defaults = RooflineParams()
    flops, moved, _, dur = trace_rows(FIXTURE_RUN / "engine_trace.json")
    predicted = flops / (fit.peak_flops * defaults.mfu) + moved / (fit.peak_bytes_per_s * defaults.mbu)
    default_error = float(np.median(np.abs(predicted + defaults.overhead_ms / 1e3 - dur) / dur))
    assert fit.median_abs_error < 0.5 < default_error
    assert fit.params.overhead_ms > 100  # seconds-long steps of a 135M model: time spent off the CPU
    # a regime without rows keeps its default, and says so
    assert all(
        ("mbu" in n and fit.params.mbu == defaults.mbu) or ("mfu" in n and fit.params.mfu == defaults.mfu)
        for n in fit.notes
    )


def test_fit_from_vllm_mfu_counters(tmp_path):
    """server_metrics.csv as the harness scrapes vLLM (names of shared/engines/captures/vllm_metrics.txt): per
    interval the FLOPs, bytes and steps counted; intervals made with known parameters give them back."""
    mfu, mbu, overhead_s, peak_flops, peak_bytes = 0.45, 0.75, 2e-3, 989e12, 3.35e12
    totals = {"flops": 0.0, "bytes": 0.0, "steps": 0.0}
    rows, t_s = [], 0.0
    # (steps, FLOPs a step, bytes a step): decode-like intervals, then prefill-heavy ones
    for n, flops, moved in [
        (100, 3e11, 1.6e10),
        (80, 5e11, 1.62e10),
        (120, 2e11, 1.61e10),
        (10, 2e14, 1.7e10),
        (6, 4e14, 1.8e10),
        (8, 1e14, 1.65e10),
        (90, 4e11, 1.63e10),
    ]:
        for key, value in VLLM_COUNTERS.items():
            total = totals.get(key, 3.0)  # running: 3 requests
            rows.append([f"{t_s:.6f}", value, total, 'engine="0",model_name="llama"'])
        t_s += n * (flops / (peak_flops * mfu) + moved / (peak_bytes * mbu) + overhead_s)
        totals = {
            "flops": totals["flops"] + n * flops,
            "bytes": totals["bytes"] + n * moved,
            "steps": totals["steps"] + n,
        }
    for key, value in VLLM_COUNTERS.items():
        rows.append([f"{t_s:.6f}", value, totals.get(key, 3.0), 'engine="0",model_name="llama"'])
    with open(tmp_path / "server_metrics.csv", "w", newline="") as f:
        csv.writer(f).writerows([["t_s", "name", "value", "labels"], *rows])
    fit = fit_roofline(tmp_path, peak_flops, peak_bytes)
    assert fit.source == "vLLM server metrics" and fit.rows == 7 and fit.compute_bound_rows == 3
    assert fit.params.mfu == pytest.approx(mfu, rel=1e-3) and fit.params.mbu == pytest.approx(mbu, rel=1e-3)
    assert fit.params.overhead_ms == pytest.approx(2.0, rel=1e-3)


def test_fit_refuses_a_simulated_run(tmp_path):
    shutil.copytree(FIXTURE_RUN, tmp_path / "run")
    (tmp_path / "run" / "run.json").write_text(json.dumps({"simulated": True}))
    with pytest.raises(ValueError, match="simulated run"):
        fit_roofline(tmp_path / "run")


def test_fit_without_a_step_trace_says_how_to_get_one(tmp_path):
    shutil.copy(FIXTURE_RUN / "summary.json", tmp_path / "summary.json")
    with pytest.raises(FileNotFoundError, match="backend.trace: true.*--enable-mfu-metrics"):
        fit_roofline(tmp_path)


ROOFLINE_SCENARIO = """
name: roofline-sim
backend: {kind: native, model: smollm2, launch: {}}
workload: {kind: random, input_tokens: 64, output_tokens: 8, ignore_eos: true}
load: {arrival: poisson, rate: 5, num_requests: 6}
plan: {hardware: L4, model: llama-3.1-8b, step_model: roofline}
"""


def roofline_scenario(tmp_path, **plan):
    path = tmp_path / "s.yaml"
    path.write_text(ROOFLINE_SCENARIO)
    scenario = load_scenario(path)
    return scenario.model_copy(update={"plan": scenario.plan.model_copy(update=plan)})


def test_a_roofline_deployment_takes_its_kv_blocks_from_the_gpus_memory(tmp_path):
    summary = simulate_scenario(roofline_scenario(tmp_path))
    # L4: the 23,034 MiB nvidia-smi reports x 0.9 - 16.06 GB of weights - 1 GiB reserve, in blocks of 16 tokens
    # x 131,072 bytes
    blocks = int((23034 * 2**20 * 0.9 - 8_030_261_248 * 2 - 2**30) // (16 * KV_PER_TOKEN))
    assert summary.plan.deployment["num_kv_blocks"] == blocks == 2195
    assert summary.plan.step_model["kind"] == "roofline" and summary.requests.completed == 6
    with pytest.raises(ScenarioError, match="raise plan.tensor_parallel"):
        simulate_scenario(roofline_scenario(tmp_path, model="llama-3.1-70b"))


def test_roofline_parameters_fitted_from_a_run_named_in_the_plan(tmp_path):
    scenario = roofline_scenario(tmp_path)
    spec = StepModelSpec.model_validate({"roofline": {"fit": str(FIXTURE_RUN), "mbu": 0.9}})
    model = roofline_step_model(
        scenario.model_copy(update={"plan": scenario.plan.model_copy(update={"step_model": spec})})
    )
    fitted = fit_roofline(FIXTURE_RUN, GPU_SPECS["L4"].tensor_flops("bf16"), GPU_SPECS["L4"].hbm_bytes_per_s).params
    assert model.params.mfu == fitted.mfu and model.params.overhead_ms == fitted.overhead_ms
    assert model.params.mbu == 0.9  # set in the plan: wins over the fit
    with pytest.raises(ValueError, match="backend.trace: true"):
        StepModelSpec.model_validate({"roofline": {"fit": str(tmp_path)}})


def test_plan_errors_name_the_field(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(ROOFLINE_SCENARIO.replace("hardware: L4", "hardware: TPUv5"))
    with pytest.raises(
        ScenarioError, match="plan.hardware: 'TPUv5' is not valid: not in the GPU table; use one of A100"
    ):
        load_scenario(path)
    path.write_text(ROOFLINE_SCENARIO.replace("model: llama-3.1-8b", "model: models/config.json"))
    with pytest.raises(ScenarioError, match="plan.model.*no such file"):
        load_scenario(path)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "config.json").write_text(
        json.dumps(
            {
                "num_hidden_layers": 2,
                "hidden_size": 64,
                "num_attention_heads": 4,
                "intermediate_size": 128,
                "vocab_size": 100,
            }
        )
    )
    assert load_scenario(path).plan.model == str(tmp_path / "models" / "config.json")  # beside the scenario
