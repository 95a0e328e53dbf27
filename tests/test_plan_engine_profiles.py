"""Engine profiles in bench plan (issue 38 part 1): backend.kind picks vLLM's, SGLang's, TensorRT-LLM's or
llama.cpp's defaults, the engine's own flags mean what they mean to it, an unknown flag is refused in the engine's
words, a flag and a plan field that disagree are refused naming both; the CUDA-graph padding of a decode step, the
per-request overhead in TTFT and the profile in the plan's description, each against numbers worked out by hand."""

import dataclasses
from pathlib import Path

import pytest

from harness.plan.architectures import BUILTIN
from harness.plan.deployment import assumptions_line, engine_choice, planned, scenario_deployment
from harness.plan.engine_flags import engine_flags
from harness.plan.engine_profiles import PROFILES, Overheads, sglang_mem_fraction_static
from harness.plan.memory import plan_memory
from harness.plan.precision import MODEL_PRECISION
from harness.plan.roofline_model import RooflineParams, RooflineStepModel
from harness.plan.roofline_scenario import roofline_memory, roofline_step_model
from harness.plan.simulator import _tokenizer, simulate_scenario
from harness.plan.step_model import StepShape
from harness.results.folder import read_records
from harness.scenario.gpus import GPU_SPECS, MIB
from harness.scenario.scenario import ScenarioError, load_scenario

IDEAL = RooflineParams(mfu=1.0, mbu=1.0, overhead_ms=0.0, allreduce_hop_latency_us=0.0)
H100 = GPU_SPECS["H100-SXM"]  # 81,559 MiB as nvidia-smi reports it; BF16 989.5 dense TFLOP/s, 3.35 TB/s
MATMUL_PARAMS = 6_979_584_000  # Llama-3.1-8B's layers (tests/test_plan_precision.py works them out)
FP8_WEIGHTS_BYTES = 9_080_934_400  # its fp8 checkpoint: layers at 1 byte, embedding and lm_head at 2


def scenario(tmp_path: Path, kind: str, args: list[str], plan: str = "", load: str = "rate: 2, num_requests: 4"):
    """A roofline plan of Llama-3.1-8B on one H100 SXM behind `kind` launched with `args`, loaded as bench plan
    loads it."""
    quoted = ", ".join(f'"{a}"' for a in args)
    path = tmp_path / f"{kind}.yaml"
    path.write_text(
        f"name: {kind}\n"
        f"backend: {{kind: {kind}, model: meta-llama/Llama-3.1-8B-Instruct, launch: {{args: [{quoted}]}}}}\n"
        "workload: {kind: random, input_tokens: 256, output_tokens: 16, ignore_eos: true}\n"
        f"load: {{arrival: poisson, {load}}}\n"
        f"plan: {{hardware: H100-SXM, model: llama-3.1-8b, step_model: roofline{plan}}}\n"
    )
    return load_scenario(path)


VLLM_ARGS = [
    *("--tensor-parallel-size", "2", "--max-num-seqs", "96", "--max-num-batched-tokens", "4096"),
    *("--no-enable-prefix-caching", "--block-size", "32", "--gpu-memory-utilization", "0.8"),
    *("--kv-cache-dtype", "fp8", "--quantization", "fp8", "--data-parallel-size", "3"),
    *("--port", "8000", "--host", "0.0.0.0", "--trust-remote-code", "--served-model-name", "llama"),
]


def test_vllm_flags_set_the_deployment_as_they_set_vllm(tmp_path):
    s = scenario(tmp_path, "vllm", VLLM_ARGS)
    choice = engine_choice(s)
    settings = choice.settings
    assert (settings.max_num_seqs, settings.max_num_batched_tokens, settings.kv_block_size) == (96, 4096, 32)
    assert (settings.enable_prefix_caching, settings.memory_fraction, choice.tensor_parallel) == (False, 0.8, 2)
    assert choice.sources["max_num_seqs"] == "flag --max-num-seqs 96"
    assert choice.sources["enable_chunked_prefill"] == "profile default"  # vLLM's default: on
    plan = planned(s).plan  # the flags' plan fields: TP, the weights' and the KV cache's dtype
    assert (plan.tensor_parallel, plan.weight_dtype, plan.kv_cache_dtype, plan.gpu_memory_utilization) == (
        2,
        "fp8",
        "fp8",
        0.8,
    )
    d = scenario_deployment(s, choice)
    assert (d.replicas, d.router_policy, d.kv_block_size, d.enable_prefix_caching) == (3, "least_load", 32, False)
    # CUDA graphs: min(96 x 2, 512, 4096) = 192, the largest of 1, 2, 4, 8, 16, ..., 184, 192 (vllm/config/vllm.py)
    assert choice.capture_sizes == (1, 2, 4, *range(8, 193, 8))
    # KV per GPU: 0.8 x 81,559 MiB - 9,080,934,400 / 2 fp8 weights - 1 GiB reserve = 62,802,438,963.2 bytes; a token
    # is 2 x 32 layers x (8 KV heads / 2) x 128 x 1 byte = 32,768 bytes, a 32-token block 1,048,576: 59,893 blocks
    budget = 0.8 * 81559 * MIB - FP8_WEIGHTS_BYTES / 2 - 2**30
    assert budget == pytest.approx(62_802_438_963.2)
    memory = roofline_memory(s, d.kv_block_size)
    assert memory.num_kv_blocks == int(budget // 1_048_576) == 59_893
    model = roofline_step_model(s)
    assert (model.tp, model.precision.weights, model.precision.kv_cache) == (2, "fp8", "fp8")
    assert model.params.overhead_ms == PROFILES["vllm"].overheads.step_ms  # the profile's stated 2 ms


def test_vllm_defaults_follow_the_gpu_as_vllm_chooses_them(tmp_path):
    """vLLM's API server: 1,024 sequences and 8,192 tokens a step on a >= 70 GiB GPU other than A100, else 256 and
    2,048 (EngineArgs.get_batch_defaults)."""
    vllm = PROFILES["vllm"]
    big, a100 = vllm.defaults(H100, 1), vllm.defaults(GPU_SPECS["A100-80GB-SXM"], 1)
    assert (big.max_num_seqs, big.max_num_batched_tokens) == (1024, 8192)
    assert (a100.max_num_seqs, a100.max_num_batched_tokens) == (256, 2048)
    assert (big.kv_block_size, big.memory_fraction, big.max_waiting) == (16, 0.9, None)


def test_sglang_memory_fraction_is_computed_as_sglang_computes_it():
    """H100 at TP 1: chunked_prefill_size 8192, cuda_graph_max_bs 256, reserved 512 + 8192 x 1.5 + 256 x 2 + 1/8 x
    1024 = 13,440 MiB, so (81,559 - 13,440) / 81,559 = 0.8352 -> 0.835; at TP 4 the graphs go to 512: 14,336 MiB."""
    defaults = PROFILES["sglang"].defaults(H100, 1)
    assert (defaults.max_num_batched_tokens, defaults.cuda_graph_max_batch, defaults.memory_fraction) == (
        8192,
        256,
        0.835,
    )
    assert sglang_mem_fraction_static(H100, 4, 8192, 512) == round((81559 - 14336) / 81559, 3) == 0.824


def test_an_unknown_flag_is_refused_in_the_engines_own_words(tmp_path):
    with pytest.raises(
        ValueError, match=r"backend.launch.args: vllm serve: error: unrecognized arguments: --max-num-seq"
    ):
        engine_choice(scenario(tmp_path, "vllm", ["--max-num-seq", "4"]))
    with pytest.raises(ValueError, match=r"the flags a vllm plan reads: .*--max-num-seqs"):
        engine_choice(scenario(tmp_path, "vllm", ["--max-num-seq", "4"]))
    with pytest.raises(ValueError, match=r"sglang.launch_server: error: unrecognized arguments: --tp-sizes"):
        engine_choice(scenario(tmp_path, "sglang", ["--tp-sizes", "2"]))
    with pytest.raises(ValueError, match=r"trtllm-serve: Error: No such option: --tp-size"):
        engine_choice(scenario(tmp_path, "trtllm", ["--tp-size", "2"]))  # trtllm-serve spells it --tp_size
    with pytest.raises(ValueError, match=r"argument --max-num-seqs: invalid int value: 'many'"):
        engine_choice(scenario(tmp_path, "vllm", ["--max-num-seqs", "many"]))
    with pytest.raises(ValueError, match=r"--pipeline-parallel-size: pipeline parallelism is not simulated"):
        engine_choice(scenario(tmp_path, "vllm", ["--pipeline-parallel-size", "2"]))
    # vLLM's parser reads underscores as dashes; the harness's own launch flags are accepted and ignored
    assert engine_flags("vllm", ["--max_num_seqs=7", "--profiler-config", "{}"], "m").values == {"max_num_seqs": 7}


def test_a_flag_and_a_plan_field_that_disagree_are_refused_naming_both(tmp_path):
    with pytest.raises(ValueError, match=r"backend.launch.args -tp 2 and plan.tensor_parallel: 4 disagree"):
        planned(scenario(tmp_path, "vllm", ["-tp", "2"], plan=", tensor_parallel: 4"))
    with pytest.raises(ValueError, match=r"--mem-fraction-static 0.7 and plan.gpu_memory_utilization: 0.8 disagree"):
        engine_choice(
            scenario(tmp_path, "sglang", ["--mem-fraction-static", "0.7"], plan=", gpu_memory_utilization: 0.8")
        )
    # agreeing ones are fine: vLLM's fp8 KV cache is e4m3
    agreed = planned(scenario(tmp_path, "vllm", ["--kv-cache-dtype", "fp8_e4m3"], plan=", kv_cache_dtype: fp8")).plan
    assert agreed.kv_cache_dtype == "fp8"  # the plan's own spelling stays
    # a plan field alone sets the engine's setting, and the description says so
    alone = engine_choice(scenario(tmp_path, "vllm", [], plan=", gpu_memory_utilization: 0.5"))
    assert (alone.settings.memory_fraction, alone.sources["memory_fraction"]) == (0.5, "plan.gpu_memory_utilization")


def test_cuda_graph_padding_charges_a_decode_step_the_captured_size():
    """Llama-3.1-8B on an H100 at ideal efficiency: a decode batch's layer GEMMs are compute-bound past 989.5 / 3.35 =
    295 sequences. 300 sequences run vLLM's graph of 304 (256, 272, 288, 304 ...): 4 padding rows x 2 x 6.98 G
    FLOPs / 989.5 TFLOP/s = 56.4 us more. A captured size (256) pays nothing, nor TensorRT-LLM without padding."""
    vllm = PROFILES["vllm"]
    sizes = vllm.capture_sizes(dataclasses.replace(vllm.defaults(H100, 1), cuda_graph_max_batch=512))
    assert sizes[:4] == (1, 2, 4, 8) and sizes[-4:] == (464, 480, 496, 512) and len(sizes) == 3 + 31 + 17
    arch = BUILTIN["llama-3.1-8b"]
    padded = RooflineStepModel(arch, H100, 1, IDEAL, MODEL_PRECISION, capture_sizes=sizes)
    eager = RooflineStepModel(arch, H100, 1, IDEAL, MODEL_PRECISION)
    unpadded = RooflineStepModel(arch, H100, 1, IDEAL, MODEL_PRECISION, capture_sizes=sizes, pad_to_capture=False)

    def decode(n: int) -> StepShape:
        return StepShape(prefill_tokens=0, prefill_seqs=0, decode_seqs=n, context_tokens=n * 1000)

    extra_s = 4 * 2 * MATMUL_PARAMS / 989.5e12
    assert extra_s == pytest.approx(56.43e-6, rel=1e-3)
    assert padded.step_time_s(decode(300)) - eager.step_time_s(decode(300)) == pytest.approx(extra_s)
    assert padded.costs(decode(300)).step_s == pytest.approx(padded.step_time_s(decode(300)))
    assert padded.step_time_s(decode(256)) == eager.step_time_s(decode(256))
    assert unpadded.step_time_s(decode(300)) == eager.step_time_s(decode(300))
    assert padded.step_time_s(decode(600)) == eager.step_time_s(decode(600))  # past 512: eager, no padding
    prefill = StepShape(prefill_tokens=300, prefill_seqs=1, decode_seqs=0, context_tokens=300, prefill_pairs=45150)
    assert padded.step_time_s(prefill) == eager.step_time_s(prefill)  # a prefill step is not a graph replay


def first_record(tmp_path: Path, name: str, s):
    simulate_scenario(s, tmp_path / name)
    (record,) = read_records(tmp_path / name)
    return record


def test_the_request_overhead_is_added_to_ttft_once(tmp_path, monkeypatch):
    """One request on an idle vLLM: it reaches the engine 10 ms (the profile's stated overhead) after it was sent, so
    TTFT and E2E move by exactly 10 ms against a profile with none; the 15 decode steps after it do not."""
    one = "arrival: poisson, rate: 1, num_requests: 1"
    s = scenario(tmp_path, "vllm", [], load=one)
    with_overhead = first_record(tmp_path, "with", s)
    vllm = PROFILES["vllm"]
    monkeypatch.setitem(PROFILES, "vllm", dataclasses.replace(vllm, overheads=Overheads(step_ms=2.0, request_ms=0)))
    without = first_record(tmp_path, "without", scenario(tmp_path, "vllm", [], load=one))

    def ttft(r):
        return r.token_times_s[0] - r.intended_send_s

    assert vllm.overheads.request_ms == 10.0
    assert ttft(with_overhead) - ttft(without) == pytest.approx(0.010)
    assert (with_overhead.end_s - with_overhead.intended_send_s) - (without.end_s - without.intended_send_s) == (
        pytest.approx(0.010)
    )
    # TTFT without it is the prefill step alone: the roofline of 256 prompt tokens plus 2 ms of step overhead
    prefill = roofline_step_model(s).step_time_s(
        StepShape(
            prefill_tokens=with_overhead.prompt_tokens,
            prefill_seqs=1,
            decode_seqs=0,
            context_tokens=with_overhead.prompt_tokens,
            prefill_pairs=with_overhead.prompt_tokens * (with_overhead.prompt_tokens + 1) // 2,
        )
    )
    assert ttft(without) == pytest.approx(prefill)


def test_the_plan_names_its_profile_and_where_each_setting_came_from(tmp_path):
    s = scenario(tmp_path, "sglang", ["--max-running-requests", "128", "--disable-radix-cache"])
    summary = simulate_scenario(s, tmp_path / "out")
    deployment = summary.plan.deployment
    assert deployment["engine_profile"] == "sglang" and deployment["engine"]["name"] == "SGLang"
    assert deployment["max_num_seqs"] == 128 and deployment["prefix_cache"] is None
    assert deployment["engine"]["sources"]["max_num_seqs"] == "flag --max-running-requests 128"
    assert summary.plan.request_overhead_s == PROFILES["sglang"].overheads.request_ms / 1e3
    line = assumptions_line(s, engine_choice(s))
    assert line.startswith("engine: SGLang profile (backend.kind sglang); from flags and plan: max_num_seqs flag")
    assert "profile defaults: max_num_batched_tokens 8192" in line and "memory fraction 0.835 of the card" in line
    # SGLang's prefill batches run in steps of their own (the native scheduler's prefill_apart)
    assert "prefill batches in steps of their own" not in line
    assert deployment["prefill_apart"] is True and deployment["reserve_max_tokens"] is False
    native = load_scenario(tmp_path / "sglang.yaml")
    native = native.model_copy(update={"backend": native.backend.model_copy(update={"kind": "native", "launch": None})})
    assert assumptions_line(native, engine_choice(native)).startswith("engine: native engine profile")


def test_trtllm_reads_its_options_file_and_takes_its_fraction_of_free_memory(tmp_path):
    """trtllm-serve's --kv_cache_free_gpu_memory_fraction is of what weights and buffers leave: (81,559 MiB - 16.06 GB
    of bf16 weights - 1 GiB) x 0.85 in the options file, which wins over the flag's 0.5 (update_llm_args_with_extra
    _dict runs last)."""
    options = tmp_path / "extra.yaml"
    options.write_text("kv_cache_config: {dtype: fp8, free_gpu_memory_fraction: 0.85}\nreturn_perf_metrics: true\n")
    args = [
        "--kv_cache_free_gpu_memory_fraction",
        "0.5",
        "--max_batch_size",
        "64",
        "--extra_llm_api_options",
        str(options),
    ]
    s = scenario(tmp_path, "trtllm", args)
    choice = engine_choice(s)
    assert (choice.settings.memory_fraction, choice.settings.max_num_seqs, planned(s).plan.kv_cache_dtype) == (
        0.85,
        64,
        "fp8",
    )
    weights = BUILTIN["llama-3.1-8b"].stored_bytes()  # 16,060,522,496 bytes at bf16
    memory = roofline_memory(s, 32)
    assert memory.kv_budget_bytes_per_gpu == pytest.approx((81559 * MIB - weights - 2**30) * 0.85)
    assert memory.num_kv_blocks == int(memory.kv_budget_bytes_per_gpu // (32 * 65_536))  # fp8: 65,536 B a token
    total = plan_memory(BUILTIN["llama-3.1-8b"], 81559 * MIB, 0.85, kv_bytes=1, kv_block_size=32)
    # what stays unused is 15% of the free memory, not 15% of the card: 0.15 x (16.06 GB + 1 GiB) = 2.57 GB more KV
    assert memory.kv_budget_bytes_per_gpu - total.kv_budget_bytes_per_gpu == pytest.approx(0.15 * (weights + 2**30))
    assert (memory.num_kv_blocks, total.num_kv_blocks) == (27_717, 26_492)
    assert choice.capture_sizes == (*range(1, 33), 64, 128) and not choice.settings.cuda_graph_padding


def test_llamacpp_splits_its_context_over_its_slots(tmp_path):
    """llama-server -np 4 -c 16384: four sequences at most, each up to 16,384 / 4 = 4,096 tokens."""
    s = scenario(tmp_path, "llamacpp", ["-np", "4", "-c", "16384", "--port", "8080", "--metrics", "-ngl", "99"])
    summary = simulate_scenario(s, tmp_path / "out")
    d = summary.plan.deployment
    assert (d["max_num_seqs"], d["max_model_len"], d["num_kv_blocks"] * d["kv_block_size"]) == (4, 4096, 16384)


def test_a_non_native_plan_needs_a_gpu_and_no_tokenizer_download(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    path = tmp_path / "fitted.yaml"
    path.write_text(
        "name: f\nbackend: {kind: vllm, model: meta-llama/Llama-3.1-8B-Instruct, "
        "tokenizer: meta-llama/Llama-3.1-8B-Instruct, launch: {}}\n"
        "workload: {kind: random, input_tokens: 64, output_tokens: 8}\nload: {arrival: poisson, rate: 1}\n"
        f"plan: {{step_model: {{fitted: [{run}]}}}}\n"
    )
    fitted = load_scenario(path)
    with pytest.raises(ValueError, match=r"a vllm deployment is simulated on a GPU: set plan.hardware"):
        engine_choice(fitted)
    # a hub tokenizer name is passed over (nothing downloaded): the workload's lengths are counted approximately
    assert _tokenizer(fitted).method == "approximate"


def test_a_scenario_sets_the_links_efficiency_and_the_plan_says_so(tmp_path):
    """plan.step_model.roofline.nvlink_efficiency replaces NCCL's 0.82 (a deployment's own nccl-tests busbw):
    Llama-3.1-8B at TP 2 on H100 SXM, an all-reduce of 8 rows x 4,096 x 2 bytes each GPU sends 2 x (2-1)/2 of, at
    0.41 x NVLink 4's 450 GB/s one way = 184.5 GB/s, plus 2 x (2-1) hops of 2 us; 2 a layer, 32 layers. Out of
    (0, 1] it is refused naming the field."""
    path = tmp_path / "links.yaml"
    text = (
        "name: links\n"
        'backend: {kind: vllm, model: meta-llama/Llama-3.1-8B-Instruct, launch: {args: ["--tensor-parallel-size", '
        '"2"]}}\n'
        "workload: {kind: random, input_tokens: 256, output_tokens: 16, ignore_eos: true}\n"
        "load: {arrival: poisson, rate: 2, num_requests: 4}\n"
        "plan: {hardware: H100-SXM, model: llama-3.1-8b, step_model: {roofline: {nvlink_efficiency: EFFICIENCY}}}\n"
    )
    path.write_text(text.replace("EFFICIENCY", "0.41"))
    model = roofline_step_model(load_scenario(path))
    assert model.params.nvlink_efficiency == 0.41 and model.params.pcie_efficiency == 0.5  # the other: the default
    assert model.allreduce_s(8) == pytest.approx(64 * (2 * (1 / 2) * (8 * 4096 * 2) / 184.5e9 + 2 * 2e-6))
    assert model.allreduce_s(8) == pytest.approx(2.78733e-4, rel=1e-5)
    assert model.describe()["coefficients"]["nvlink_efficiency"] == 0.41  # the printed plan names it
    path.write_text(text.replace("EFFICIENCY", "1.5"))
    with pytest.raises(ScenarioError, match="nvlink_efficiency"):
        load_scenario(path)
