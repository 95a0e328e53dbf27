"""A deployment's precision (plan.weight_dtype, compute_dtype, kv_cache_dtype) in the roofline step model and the
memory plan, against Llama-3.1-8B on an H100 SXM worked out by hand; and the errors that name the field."""

import dataclasses
import json
from pathlib import Path
from typing import get_args

import pytest
from bench_process import bench

from harness.plan.architectures import BUILTIN
from harness.plan.precision import plan_precision, stored_architecture
from harness.plan.roofline_model import RooflineParams, RooflineStepModel
from harness.plan.roofline_scenario import precision_line, roofline_memory, roofline_step_model
from harness.plan.step_model import StepShape
from harness.scenario.gpus import GPU_SPECS, PRECISIONS
from harness.scenario.precision import (
    DEFAULT_COMPUTE,
    KV_CACHE_DTYPE_BYTES,
    WEIGHT_DTYPE_BITS,
    ComputeDtype,
    KvCacheDtype,
    WeightDtype,
)
from harness.scenario.scenario import ScenarioError, load_scenario

IDEAL = RooflineParams(mfu=1.0, mbu=1.0, overhead_ms=0.0, allreduce_hop_latency_us=0.0)
# Llama-3.1-8B by hand: 32 layers x (q, k, v, o, gate/up/down, 2 norms); lm_head and the embedding 128,256 x 4,096
LAYER_PARAMS = 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 3 * 4096 * 14336 + 2 * 4096  # 218,112,000
MATMUL_PARAMS, LM_HEAD_PARAMS = 32 * LAYER_PARAMS, 128256 * 4096  # 6,979,584,000 and 525,336,576
PARAMS = MATMUL_PARAMS + 4096 + 2 * LM_HEAD_PARAMS  # + the final norm, the embedding: 8,030,261,248
KV_ELEMENTS_PER_TOKEN = 2 * 32 * 8 * 128  # K and V, 32 layers, 8 KV heads, head_dim 128
# H100 SXM (harness/scenario/gpus.py): BF16 1,979 and FP8 3,958 TFLOPS quoted with sparsity, halved; 81,559 MiB
H100_BF16, H100_FP8, H100_MEMORY = 1979e12 / 2, 3958e12 / 2, 81559 * 2**20
DECODE = StepShape(prefill_tokens=0, prefill_seqs=0, decode_seqs=1, context_tokens=1000)
# a whole 8,192-token prompt in one chunk: 8192 x 8193 / 2 causal (query, key) pairs
PREFILL = StepShape(prefill_tokens=8192, prefill_seqs=1, decode_seqs=0, context_tokens=8192, prefill_pairs=33_558_528)


def llama_on_h100(weight_dtype=None, compute_dtype=None, kv_cache_dtype="auto", params=IDEAL, gpu="H100-SXM"):
    arch = stored_architecture(BUILTIN["llama-3.1-8b"], weight_dtype, None)
    return RooflineStepModel(
        arch, GPU_SPECS[gpu], 1, params, plan_precision(weight_dtype, compute_dtype, kv_cache_dtype)
    )


def test_fp8_weights_halve_the_layers_bytes_a_decode_step_reads():
    """vLLM's --quantization fp8 quantizes the linear layers only: lm_head stays bf16 (and the embedding, which a
    step does not read), as the published 9.08 GB FP8 checkpoint of Llama-3.1-8B weighs."""
    bf16, fp8 = llama_on_h100().costs(DECODE), llama_on_h100("fp8").costs(DECODE)
    kv = (1000 + 1) * KV_ELEMENTS_PER_TOKEN * 2
    assert bf16.bytes_per_gpu == pytest.approx((MATMUL_PARAMS + LM_HEAD_PARAMS) * 2 + kv)  # 15.01 GB of weights
    assert fp8.bytes_per_gpu == pytest.approx(MATMUL_PARAMS * 1 + LM_HEAD_PARAMS * 2 + kv)  # 8.03 GB
    assert bf16.bytes_per_gpu - fp8.bytes_per_gpu == pytest.approx(MATMUL_PARAMS)  # half the layers' 13.96 GB
    # memory-bound at batch one: 4.52 ms -> 2.44 ms on 3.35 TB/s, plus 9 us of compute: the layers' 14 GFLOP at the
    # FP8 peak (W8A8 by default), lm_head's and attention's at the BF16 peak
    compute_s = 2 * MATMUL_PARAMS / H100_FP8 + (2 * LM_HEAD_PARAMS + 4 * 32 * 4096 * 1000) / H100_BF16
    assert fp8.step_s == pytest.approx((MATMUL_PARAMS + LM_HEAD_PARAMS * 2 + kv) / 3.35e12 + compute_s)
    assert fp8.step_s == pytest.approx(2.445e-3, rel=1e-3)
    stored = stored_architecture(BUILTIN["llama-3.1-8b"], "fp8", None).stored_bytes()
    assert stored == (MATMUL_PARAMS + 4096) * 1 + 2 * LM_HEAD_PARAMS * 2 == 9_080_934_400


def test_fp8_kv_halves_the_kv_bytes_and_doubles_the_kv_blocks(tmp_path):
    """One byte a K or V element: half the KV a decode step reads and writes, twice the blocks in the same memory."""
    bf16, fp8 = llama_on_h100().costs(DECODE), llama_on_h100(kv_cache_dtype="fp8").costs(DECODE)
    assert llama_on_h100(kv_cache_dtype="fp8").kv_bytes_per_token_per_gpu == KV_ELEMENTS_PER_TOKEN * 1 == 65_536
    assert bf16.bytes_per_gpu - fp8.bytes_per_gpu == pytest.approx(1001 * 65_536)
    # harness/plan/memory.py: blocks = (memory x 0.9 - weights - 1 GiB reserve) // (16 tokens x KV bytes per token)
    budget = H100_MEMORY * 0.9 - PARAMS * 2 - 2**30  # 59,834,464,665.6 bytes
    auto, one_byte = (roofline_memory(plan_scenario(tmp_path, kv_cache_dtype=kv), 16) for kv in ("auto", "fp8"))
    assert auto.num_kv_blocks == int(budget // (16 * 131_072)) == 28_531
    assert one_byte.num_kv_blocks == int(budget // (16 * 65_536)) == 57_062 == 2 * 28_531
    assert one_byte.kv_bytes_per_token == 65_536


def test_a_prefill_with_fp8_compute_runs_the_layers_at_the_fp8_peak():
    """W8A8: the layers' GEMMs at H100's dense FP8 peak (1,979 TFLOP/s) x mfu; attention stays at the BF16 peak
    (989.5 TFLOP/s), as the engines run it; lm_head, one row for the prompt's last token, reads its bf16 weights."""
    assert GPU_SPECS["H100-SXM"].tensor_flops("fp8") == H100_FP8 == 1979e12
    params = dataclasses.replace(IDEAL, mfu=0.5)
    fp8, bf16 = llama_on_h100("fp8", params=params).costs(PREFILL), llama_on_h100(params=params).costs(PREFILL)
    layers = 2 * MATMUL_PARAMS * 8192  # 114.4 TFLOP
    attention = 4 * 32 * (32 * 128) * 33_558_528  # 17.6 TFLOP
    lm_head_read = LM_HEAD_PARAMS * 2 / 3.35e12  # 0.31 ms: 2 x 525 M FLOPs would take 2 us
    assert fp8.bound == "compute" and fp8.lm_head.memory_s == pytest.approx(lm_head_read)
    # the reads add to the compute: fp8 layers (1 byte a weight) and bf16 lm_head, the KV of 8,192 positions read
    # and 8,192 written at 131,072 bytes a token (4.6 ms at 3.35 TB/s)
    fp8_read = (MATMUL_PARAMS + 2 * LM_HEAD_PARAMS + 2 * 8192 * 131_072) / 3.35e12
    bf16_read = (2 * MATMUL_PARAMS + 2 * LM_HEAD_PARAMS + 2 * 8192 * 131_072) / 3.35e12
    lm_head_compute = 2 * LM_HEAD_PARAMS / H100_BF16 / 0.5
    expected = (layers / H100_FP8 + attention / H100_BF16) / 0.5 + lm_head_compute + fp8_read
    assert fp8.step_s == pytest.approx(expected)
    assert fp8.step_s == pytest.approx(0.1542, rel=1e-3)
    assert bf16.step_s == pytest.approx((layers + attention) / H100_BF16 / 0.5 + lm_head_compute + bf16_read)
    assert fp8.flops_per_gpu == bf16.flops_per_gpu == pytest.approx(layers + attention + 2 * LM_HEAD_PARAMS)


def test_int4_weight_only_keeps_the_bf16_peak():
    """AWQ/GPTQ int4 dequantizes in the kernel: compute as bf16, read 4 bits a weight plus a group-128 fp16 scale and
    4-bit zero (4.15625 bits)."""
    assert WEIGHT_DTYPE_BITS["int4"] == 4 + 16 / 128 + 4 / 128 == 4.15625
    int4, bf16 = llama_on_h100("int4"), llama_on_h100()
    assert int4.precision.compute == "bf16" and int4.matmul_peak_flops == H100_BF16
    assert int4.costs(PREFILL).compute_s == pytest.approx(bf16.costs(PREFILL).compute_s)
    kv = 1001 * KV_ELEMENTS_PER_TOKEN * 2
    assert int4.costs(DECODE).bytes_per_gpu == pytest.approx(MATMUL_PARAMS * 4.15625 / 8 + LM_HEAD_PARAMS * 2 + kv)


SCENARIO = """
name: precision
backend: {kind: native, model: smollm2, launch: {}}
workload: {kind: random, input_tokens: 64, output_tokens: 8, ignore_eos: true}
load: {arrival: poisson, rate: 5, num_requests: 6}
plan: {hardware: H100-SXM, model: llama-3.1-8b, step_model: roofline}
"""


def plan_scenario(tmp_path: Path, **plan):
    """The scenario with these plan: fields, loaded (validated) as bench plan loads it."""
    fields = "".join(f", {key}: {value}" for key, value in plan.items())
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.replace("step_model: roofline}", f"step_model: roofline{fields}}}"))
    return load_scenario(path)


def test_fp8_compute_on_an_a100_is_refused_naming_the_field(tmp_path):
    for plan in ({"weight_dtype": "fp8"}, {"weight_dtype": "fp8", "compute_dtype": "fp8"}):
        scenario = plan_scenario(tmp_path, hardware="A100-80GB-SXM", **plan)
        with pytest.raises(ValueError, match=r"plan.compute_dtype 'fp8'.*A100-80GB-SXM has no fp8 tensor cores"):
            roofline_step_model(scenario)
    # weight-only fp8 (Marlin on Ampere): fp8 bytes, the A100's BF16 peak (624 TFLOPS with sparsity, halved)
    weight_only = roofline_step_model(
        plan_scenario(tmp_path, hardware="A100-80GB-SXM", weight_dtype="fp8", compute_dtype="bf16")
    )
    assert (
        weight_only.matmul_peak_flops == 312e12 and weight_only.weight_bytes_read == MATMUL_PARAMS + LM_HEAD_PARAMS * 2
    )


def test_precision_fields_are_checked_where_the_scenario_loads(tmp_path):
    with pytest.raises(ScenarioError, match=r"plan.weight_dtype: 'int3' is not valid: must be 'bf16'.*'fp4'"):
        plan_scenario(tmp_path, weight_dtype="int3")
    with pytest.raises(ScenarioError, match=r"plan.compute_dtype: 'fp8' is not valid: .*set plan.weight_dtype: fp8"):
        plan_scenario(tmp_path, compute_dtype="fp8")  # bf16 weights cannot go through fp8 matmuls
    with pytest.raises(ScenarioError, match=r"plan.weight_bits: 3 is not valid: fewer than int4's 4 bits"):
        plan_scenario(tmp_path, weight_dtype="int4", weight_bits=3)
    with pytest.raises(ScenarioError, match=r"plan.kv_cache_dtype: 'fp16_e4m3' is not valid: must be 'auto'"):
        plan_scenario(tmp_path, kv_cache_dtype="fp16_e4m3")
    fitted = Path(__file__).parent / "fixtures" / "roofline_fit_run"
    path = tmp_path / "fitted.yaml"
    path.write_text(
        SCENARIO.replace("step_model: roofline}", f"step_model: {{fitted: [{fitted}]}}, kv_cache_dtype: fp8}}")
    )
    with pytest.raises(ScenarioError, match="plan.kv_cache_dtype: 'fp8' is not valid: applies to a roofline"):
        load_scenario(path)
    # int4 with its scales counted another way (group 32: 4 + 20/32 bits)
    arch = stored_architecture(BUILTIN["llama-3.1-8b"], "int4", 4.625)
    assert (arch.weight_bits, arch.lm_head_bits) == (4.625, 16.0)


def test_the_plan_fields_choices_are_the_tables_choices():
    assert set(get_args(WeightDtype)) == set(WEIGHT_DTYPE_BITS) == set(DEFAULT_COMPUTE)
    assert set(get_args(KvCacheDtype)) == set(KV_CACHE_DTYPE_BYTES)
    assert set(get_args(ComputeDtype)) - {"fp16"} == set(PRECISIONS)  # a tensor peak for each (fp16: bf16's)


def test_bench_memory_and_bench_plan_say_which_precision_they_assumed(tmp_path):
    res = bench("memory", "--hardware", "H100-SXM", "--weight-dtype", "fp8", "--kv-cache-dtype", "fp8")
    assert res.returncode == 0, res.stderr
    assert "precision: weights fp8 (8 bits a layer weight, embedding and lm_head 16), KV cache fp8" in res.stdout
    assert "weights: 9.08 GB" in res.stdout and "KV cache: 65,536 bytes per token" in res.stdout
    # (85,520,809,984 x 0.9 - 9,080,934,400 - 2^30) // (16 x 65,536) = 63,718 blocks
    assert "63,718 blocks of 16 tokens" in res.stdout
    assert precision_line(plan_scenario(tmp_path, weight_dtype="fp8", kv_cache_dtype="fp8")) == (
        "precision: weights fp8 (8 bits a layer weight, embedding and lm_head 16), matmuls in fp8 (1,979 dense "
        "TFLOP/s on H100-SXM), attention and lm_head in bf16, KV cache fp8 (1 byte an element)"
    )
    plan = bench("plan", tmp_path / "s.yaml", "--output", tmp_path / "out")
    assert plan.returncode == 0, plan.stderr
    assert "matmuls in fp8 (1,979 dense TFLOP/s on H100-SXM)" in " ".join(plan.stderr.split())  # lines wrapped
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["plan"]["step_model"]["precision"]["kv_bytes"] == 1
