"""The GPU table by exact part name (harness/scenario/gpus.py), a custom GPU described in the scenario, and tensor
parallelism refused where the model's heads do not split. Every figure below is read off the vendor's datasheet
(dense = the "with sparsity" figure halved) or the memory total nvidia-smi / rocm-smi reports, by hand."""

import json

import pytest
from bench_process import bench

from harness.plan.architectures import BUILTIN, Architecture
from harness.plan.memory import plan_memory, tensor_parallel_problem
from harness.plan.roofline_model import RooflineParams, RooflineStepModel
from harness.plan.search import Search
from harness.plan.simulator import simulate_scenario
from harness.plan.step_model import StepShape
from harness.scenario.gpus import _ALIASES, GPU_SPECS, gpu_peaks, gpu_spec, normalized_gpu_name, table_gpu_name
from harness.scenario.scenario import ScenarioError, load_scenario

MIB, GIB = 2**20, 2**30
LLAMA_8B_WEIGHT_BYTES = 8_030_261_248 * 2
KV_BLOCK_BYTES = 16 * 131_072  # 16 tokens x Llama-3.1-8B's fp16 KV per token
IDEAL = RooflineParams(mfu=1.0, mbu=1.0, overhead_ms=0.0, allreduce_hop_latency_us=0.0)

SCENARIO = """
name: gpu-variant
backend: {kind: native, model: smollm2, launch: {}}
workload: {kind: random, input_tokens: 64, output_tokens: 8, ignore_eos: true}
load: {arrival: poisson, rate: 5, num_requests: 4}
seed: 0
"""


def scenario_file(tmp_path, plan: str):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO + f"plan: {plan}\n")
    return path


def test_a100_40gb_is_sized_as_40gb_not_80():
    a100 = gpu_spec("A100-40GB")
    assert a100.name == "A100-40GB-SXM" and a100.hbm_bytes == 40536 * MIB  # 42.5 GB, not 80e9
    assert a100.hbm_bytes_per_s == 1555e9 and a100.bf16_flops == 624e12 / 2
    # Llama-3.1-8B: 40,536 MiB x 0.9 - 16.06 GB of weights - 1 GiB reserve = 21.12 GB, in 2,097,152-byte blocks
    assert plan_memory(BUILTIN["llama-3.1-8b"], a100.hbm_bytes).num_kv_blocks == 10_070
    assert gpu_spec("A100-80GB-PCIe").hbm_bytes_per_s == 1935e9  # not the SXM part's 2,039 GB/s
    with pytest.raises(ValueError, match="A100-40GB-SXM has no fp8 tensor cores .*bf16, int8"):
        a100.tensor_flops("fp8")
    with pytest.raises(ValueError, match="hardware 'A100': names several parts; use one of A100-40GB-SXM, A100-80GB"):
        gpu_spec("A100")


def test_h100_pcie_gets_its_own_bandwidth_not_the_sxm_parts():
    pcie, sxm = gpu_spec("H100 PCIe"), gpu_spec("H100")
    assert (pcie.name, sxm.name) == ("H100-PCIe", "H100-SXM")
    assert pcie.hbm_bytes_per_s == 2.0e12 and sxm.hbm_bytes_per_s == 3.35e12
    assert pcie.bf16_flops == 1513e12 / 2 and pcie.interconnect_bytes_per_s == 128e9  # PCIe Gen5, not NVLink 4
    # a batch-1 decode step streams the same bytes on both: 3.35 / 2.0 = 1.675x longer on the PCIe part
    decode = StepShape(prefill_tokens=0, prefill_seqs=0, decode_seqs=1, context_tokens=1000)
    on_pcie = RooflineStepModel(BUILTIN["llama-3.1-8b"], pcie, 1, IDEAL).costs(decode)
    on_sxm = RooflineStepModel(BUILTIN["llama-3.1-8b"], sxm, 1, IDEAL).costs(decode)
    assert on_pcie.memory_s / on_sxm.memory_s == pytest.approx(3.35 / 2.0)
    assert on_pcie.step_s / on_sxm.step_s == pytest.approx(1.674, rel=1e-3)  # its 16 GFLOP at 756.5 TFLOP/s
    nvl = gpu_spec("h100-nvl")
    assert nvl.hbm_bytes == 95830 * MIB and nvl.hbm_bytes_per_s == 3.9e12 and nvl.bf16_flops == 1671e12 / 2
    # the roofline placement's lookup by the NVML name tells the parts apart too
    assert gpu_peaks("NVIDIA H100 PCIe") == (756.5e12, 2.0e12)
    assert gpu_peaks("NVIDIA H100 80GB HBM3") == (989.5e12, 3.35e12)


def test_l40_is_not_l4():
    l40, l4 = gpu_spec("L40"), gpu_spec("L4")
    assert (l40.name, l40.hbm_bytes, l40.hbm_bytes_per_s, l40.bf16_flops) == ("L40", 46068 * MIB, 864e9, 181.05e12)
    assert (l4.name, l4.hbm_bytes, l4.hbm_bytes_per_s, l4.bf16_flops) == ("L4", 23034 * MIB, 300e9, 121e12)
    assert gpu_spec("l40s").bf16_flops == 362.05e12
    assert gpu_peaks("NVIDIA L40") == (181.05e12, 864e9) and gpu_peaks("NVIDIA L4") == (121e12, 300e9)


def test_gh200_is_not_h200():
    gh200, h200 = gpu_spec("GH200-96GB"), gpu_spec("H200")
    assert h200.name == "H200-SXM" and (h200.hbm_bytes, h200.hbm_bytes_per_s) == (143771 * MIB, 4.8e12)
    assert (gh200.hbm_bytes, gh200.hbm_bytes_per_s) == (97871 * MIB, 4.0e12)
    assert gpu_spec("GH200 144GB").hbm_bytes_per_s == 4.9e12
    with pytest.raises(ValueError, match="'GH200': names several parts; use one of GH200-96GB, GH200-144GB"):
        gpu_spec("GH200")
    assert gpu_peaks("NVIDIA GH200 480GB") == (989.5e12, 4.0e12)  # the 96 GB HBM3 superchip's NVML name
    assert gpu_peaks("NVIDIA H200") == (989.5e12, 4.8e12)


def test_names_match_whole_ignoring_case_spaces_and_dashes():
    for spelling in ("H100", "h100-sxm", "H100 SXM5 80GB", "NVIDIA H100 80GB HBM3", "h100_sxm"):
        assert table_gpu_name(spelling) == "H100-SXM", spelling
    for nvml, part in [
        ("NVIDIA A100-SXM4-40GB", "A100-40GB-SXM"),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB-PCIe"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB-PCIe"),
        ("NVIDIA H200 NVL", "H200-NVL"),
        ("NVIDIA H20", "H20"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA GB200", "GB200"),
        ("AMD Instinct MI300X", "MI300X"),
    ]:
        assert table_gpu_name(nvml) == part, nvml
    for unknown in ("H1000", "L4S", "NVIDIA GeForce RTX 4090", "B20"):
        assert table_gpu_name(unknown) is None and gpu_peaks(unknown) is None
    # every spelling means one part
    keys = [normalized_gpu_name(n) for n in GPU_SPECS] + [normalized_gpu_name(a) for v in _ALIASES.values() for a in v]
    assert len(keys) == len(set(keys))


def test_an_unknown_name_lists_the_known_ones(tmp_path):
    with pytest.raises(ValueError) as error:
        gpu_spec("TPUv5")
    assert all(name in str(error.value) for name in GPU_SPECS) and "plan.gpus" in str(error.value)
    path = scenario_file(tmp_path, "{hardware: TPUv5, model: llama-3.1-8b, step_model: roofline}")
    with pytest.raises(ScenarioError, match="plan.hardware: 'TPUv5' is not valid: not in the GPU table; use one of "):
        load_scenario(path)
    with pytest.raises(ScenarioError, match="plan.hardware: 'A100' is not valid: names several parts"):
        load_scenario(scenario_file(tmp_path, "{hardware: A100, model: llama-3.1-8b, step_model: roofline}"))


def test_tensor_peaks_per_precision():
    h100 = gpu_spec("H100-SXM")
    assert (h100.tensor_flops("bf16"), h100.tensor_flops("fp16")) == (1979e12 / 2, 1979e12 / 2)
    assert h100.tensor_flops("fp8") == h100.tensor_flops("int8") == 3958e12 / 2
    with pytest.raises(ValueError, match="H100-SXM has no fp4"):
        h100.tensor_flops("fp4")
    # HGX B200: 144 PFLOPS FP4, 72 FP8, 36 BF16 (sparse) over 8 GPUs; GB200 NVL72: per 2-GPU superchip 40/20/10
    b200, gb200 = gpu_spec("B200"), gpu_spec("GB200")
    assert (b200.tensor_flops("fp4"), b200.tensor_flops("fp8"), b200.tensor_flops("bf16")) == (9e15, 4.5e15, 2.25e15)
    assert (gb200.tensor_flops("fp4"), gb200.tensor_flops("fp8"), gb200.tensor_flops("bf16")) == (10e15, 5e15, 2.5e15)
    assert gpu_spec("MI300X").tensor_flops("fp8") == 2614.9e12 and gpu_spec("MI300X").hbm_bytes == 192 * GIB
    assert gpu_spec("L4").tensor_flops("int8") == 485e12 / 2
    with pytest.raises(ValueError, match="precision 'fp3': use one of fp16, bf16, fp8, int8, fp4"):
        h100.tensor_flops("fp3")


CUSTOM = (
    "{gpus: {my-gpu: {memory_gib: 96, hbm_tb_per_s: 4.0, bf16_tflops: 900, fp8_tflops: 1800, "
    "interconnect_gb_per_s: 900}}, hardware: my-gpu, model: llama-3.1-8b, step_model: roofline, prices: {my-gpu: 2.0}}"
)


def test_a_custom_gpu_from_the_yaml_is_used(tmp_path):
    scenario = load_scenario(scenario_file(tmp_path, CUSTOM))
    summary = simulate_scenario(scenario)
    gpu = summary.plan.step_model["gpu"]
    assert (gpu["name"], gpu["hbm_bytes_per_s"], gpu["bf16_flops"], gpu["fp8_flops"]) == ("my-gpu", 4e12, 9e14, 1.8e15)
    # 96 GiB x 0.9 - 16.06 GB of weights - 1 GiB reserve = 75.64 GB, in 2,097,152-byte blocks
    assert summary.plan.deployment["num_kv_blocks"] == 36_066 and summary.requests.completed == 4
    Search(scenario.model_copy(update={"slo": scenario.slo.model_copy(update={"ttft_ms": 500.0})}), tmp_path)


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        (CUSTOM.replace("hbm_tb_per_s: 4.0", "hbm_tb_per_s: -1"), r"plan.gpus.my-gpu.hbm_tb_per_s: -1 is not valid"),
        (CUSTOM.replace("bf16_tflops: 900, ", ""), r"plan.gpus.my-gpu.bf16_tflops: missing"),
        (
            CUSTOM.replace("hbm_tb_per_s", "hbm_tb_s"),
            r"plan.gpus.my-gpu.hbm_tb_per_s: missing.*\nplan.gpus.my-gpu.hbm_tb_s: unknown key",
        ),
        (
            CUSTOM.replace("my-gpu: {", "H100: {"),
            r"plan.gpus: .* 'H100' is the GPU table's H100-SXM; give yours a name",
        ),
        (
            CUSTOM.replace("hardware: my-gpu", "hardware: their-gpu"),
            r"plan.hardware: .*use one of my-gpu \(plan.gpus\)",
        ),
    ],
)
def test_a_bad_custom_gpu_names_the_field(tmp_path, plan, message):
    with pytest.raises(ScenarioError, match=message):
        load_scenario(scenario_file(tmp_path, plan))


def test_tensor_parallel_that_does_not_split_the_heads_is_refused(tmp_path):
    plan = "{hardware: H100-SXM, model: llama-3.1-8b, step_model: roofline, tensor_parallel: 3}"
    refused = (
        "plan.tensor_parallel: 3 does not divide llama-3.1-8b's 32 attention heads; use one of 1, 2, 4, 8, 16, 32$"
    )
    with pytest.raises(ScenarioError, match=refused):
        simulate_scenario(load_scenario(scenario_file(tmp_path, plan)))
    # Qwen2.5-7B: 28 heads divide by 7, but 7 GPUs cannot share its 4 KV heads (vLLM replicates whole heads)
    qwen = BUILTIN["qwen2.5-7b"]
    assert (
        tensor_parallel_problem(qwen, 7)
        == "7 is not a multiple of qwen2.5-7b's 4 KV heads (each GPU holds whole, replicated heads)"
    )
    assert [tp for tp in range(1, 29) if tensor_parallel_problem(qwen, tp) is None] == [1, 2, 4, 28]
    # 12 heads over 4 GPUs divide, 6 KV heads over 4 do not
    odd = Architecture("odd", 2, 768, 12, 6, 64, 2048, 1000)
    assert tensor_parallel_problem(odd, 4) == "4 does not divide odd's 6 KV heads"
    with pytest.raises(ValueError, match="tensor_parallel: 3 does not divide .*; use one of 1, 2, 4, 8, 16, 32"):
        plan_memory(BUILTIN["llama-3.1-8b"], 80e9, tensor_parallel=3)  # bench memory --tensor-parallel 3


def test_bench_plan_runs_on_an_exact_variant(tmp_path):
    path = scenario_file(tmp_path, "{hardware: H100-PCIe, model: llama-3.1-8b, step_model: roofline}")
    res = bench("plan", path, "--output", tmp_path / "out", timeout_s=240)
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["plan"]["step_model"]["gpu"]["name"] == "H100-PCIe"
    assert summary["plan"]["step_model"]["gpu"]["hbm_bytes_per_s"] == 2.0e12
    # 81,559 MiB x 0.9 - 16.06 GB of weights - 1 GiB reserve = 59.83 GB, in 2,097,152-byte blocks
    blocks = int((81559 * MIB * 0.9 - LLAMA_8B_WEIGHT_BYTES - GIB) // KV_BLOCK_BYTES)
    assert summary["plan"]["deployment"]["num_kv_blocks"] == blocks == 28_531
    assert summary["requests"]["completed"] == 4
