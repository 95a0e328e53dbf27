"""Mixture-of-experts models in the planner (issue 39): parameters, memory and a step's cost against numbers worked out
by hand from each model's config.json (harness/plan/architectures.py cites them), expert parallelism, MLA's KV,
sliding-window layers, `bench memory`'s verdict on an MoE model and a whole `bench plan` of one."""

import pytest
from bench_process import bench

from harness.plan.architectures import BUILTIN, from_hf_config, load_architecture
from harness.plan.deployment import planned
from harness.plan.launch_command import expert_parallel_flags, launch_plan
from harness.plan.memory import (
    kv_bytes_per_token,
    load_fit,
    plan_memory,
    weights_bytes_per_gpu,
    window_kv_bytes,
)
from harness.plan.precision import stored_architecture
from harness.plan.roofline_model import RooflineParams, RooflineStepModel
from harness.plan.roofline_scenario import roofline_step_model
from harness.plan.simulator import simulate_scenario
from harness.plan.step_model import StepShape
from harness.scenario.gpus import GPU_SPECS
from harness.scenario.scenario import ScenarioError, load_scenario

IDEAL = RooflineParams(mfu=1.0, mbu=1.0, overhead_ms=0.0, allreduce_hop_latency_us=0.0)
H100 = GPU_SPECS["H100-SXM"]  # 3.35 TB/s, 900 GB/s NVLink both ways

# Mixtral-8x7B by hand (mistralai/Mixtral-8x7B-v0.1 config.json: 32 layers, hidden 4096, 32 heads, 8 KV heads of
# 128, 8 experts of FFN 14336, 2 a token, vocab 32000):
MIXTRAL_ATTENTION = 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096  # q, k, v, o = 41,943,040
MIXTRAL_EXPERT = 3 * 4096 * 14336  # gate, up, down = 176,160,768
MIXTRAL_ALWAYS = MIXTRAL_ATTENTION + 4096 * 8 + 2 * 4096  # + router + 2 norms = 41,984,000 a layer
MIXTRAL_EMBEDDINGS = 2 * 32000 * 4096 + 4096  # embedding, lm_head, final norm = 262,148,096
# Qwen3-30B-A3B by hand (Qwen/Qwen3-30B-A3B: 48 layers, hidden 2048, 32 heads, 4 KV heads of 128, 128 experts of FFN
# 768, 8 a token, vocab 151936, untied):
QWEN_ALWAYS = 2048 * 4096 + 2 * 2048 * 512 + 4096 * 2048 + 2048 * 128 + 2 * 2048  # attention, router, norms: 19,140,608
QWEN_EXPERT = 3 * 2048 * 768  # 4,718,592
QWEN_LM_HEAD = 151936 * 2048  # 311,164,928


def test_parameter_counts_match_the_model_cards():
    """Total and active parameters: by hand for Mixtral and Qwen3-30B-A3B, and each built-in within 1.5% of its card
    (DeepSeek-V3 671B / 37B; Qwen3-30B-A3B 30.5B / 3.3B; Qwen3-235B-A22B 235B / 22B; Mixtral 46.7B / 12.9B;
    gpt-oss-120b 116.8B / 5.13B and gpt-oss-20b 20.9B / 3.61B, whose card leaves the embedding out of "active")."""
    mixtral = BUILTIN["mixtral-8x7b"]
    # 32 x (41,984,000 + 8 x 176,160,768) + 262,148,096 = 46,702,792,704; active: 2 experts a layer = 12,879,925,248
    assert mixtral.param_count() == 32 * (MIXTRAL_ALWAYS + 8 * MIXTRAL_EXPERT) + MIXTRAL_EMBEDDINGS == 46_702_792_704
    assert mixtral.active_params() == 32 * (MIXTRAL_ALWAYS + 2 * MIXTRAL_EXPERT) + MIXTRAL_EMBEDDINGS == 12_879_925_248
    qwen = BUILTIN["qwen3-30b-a3b"]
    # 48 x (19,140,608 + 128 x 4,718,592) + 2 x 311,164,928 + 2048 = 30,532,110,336; active 3,353,020,416
    assert qwen.param_count() == 48 * (QWEN_ALWAYS + 128 * QWEN_EXPERT) + 2 * QWEN_LM_HEAD + 2048 == 30_532_110_336
    assert qwen.active_params() == 48 * (QWEN_ALWAYS + 8 * QWEN_EXPERT) + 2 * QWEN_LM_HEAD + 2048 == 3_353_020_416
    cards = {
        "deepseek-v3": (671e9, 37e9),
        "qwen3-30b-a3b": (30.5e9, 3.3e9),
        "qwen3-235b-a22b": (235e9, 22e9),
        "mixtral-8x7b": (46.7e9, 12.9e9),
    }
    for name, (total, active) in cards.items():
        arch = BUILTIN[name]
        assert arch.param_count() == pytest.approx(total, rel=0.015), name
        assert arch.active_params() == pytest.approx(active, rel=0.03), name  # the cards round 3.35 to 3.3
    for name, total, active in (("gpt-oss-120b", 116.83e9, 5.13e9), ("gpt-oss-20b", 20.91e9, 3.61e9)):
        arch = BUILTIN[name]
        assert arch.param_count() == pytest.approx(total, rel=0.005), name  # biases and sinks: the rest
        assert arch.active_params() - arch.lm_head_params() == pytest.approx(active, rel=0.005), name


def test_stored_bytes_match_the_checkpoints():
    """The bf16 checkpoints' model.safetensors.index.json total_size: Mixtral-8x7B's 93,405,585,408 is its
    46,702,792,704 parameters x 2 bytes exactly; Qwen3-30B-A3B's 61,064,245,248 is 30,532,110,336 x 2 plus its per-head
    q and k norms (48 layers x 2 x 128 x 2 bytes = 24,576), which are not modelled."""
    assert BUILTIN["mixtral-8x7b"].stored_bytes() == 46_702_792_704 * 2 == 93_405_585_408
    assert BUILTIN["qwen3-30b-a3b"].stored_bytes() == 61_064_245_248 - 48 * 2 * 128 * 2 == 30_532_110_336 * 2


def test_aliases_name_the_same_architecture():
    r1 = load_architecture("deepseek-r1")
    assert r1.name == "deepseek-r1" and "deepseek-ai/DeepSeek-R1" in r1.source
    assert r1.param_count() == BUILTIN["deepseek-v3"].param_count()
    for name in ("Qwen/Qwen3-30B-A3B", "mistralai/Mixtral-8x7B-v0.1", "openai/gpt-oss-120b", "qwen3-235b-a22b"):
        assert load_architecture(name).is_moe, name


def test_weights_per_gpu_under_tensor_and_expert_parallelism():
    """Mixtral at bf16: routed experts 32 x 8 x 176,160,768 x 2 = 90,194,313,216 bytes, the rest (attention, routers,
    norms, embeddings) 46,702,792,704 x 2 - that = 3,211,272,192. TP 2: both halved, 46,702,792,704 a GPU; TP 2 and EP
    2: the same bytes (each GPU holds 4 whole experts instead of half of each 8); TP 1, EP 2 (two replicas share the
    experts): 3,211,272,192 + 90,194,313,216 / 2 = 48,308,428,800; TP 2, EP 4: 1,605,636,096 + 22,548,578,304."""
    mixtral = BUILTIN["mixtral-8x7b"]
    experts, whole = 32 * 8 * MIXTRAL_EXPERT * 2, 46_702_792_704 * 2
    assert mixtral.routed_expert_bytes() == experts == 90_194_313_216
    assert weights_bytes_per_gpu(mixtral, 2) == whole / 2 == 46_702_792_704
    assert weights_bytes_per_gpu(mixtral, 2, 2) == 46_702_792_704
    assert weights_bytes_per_gpu(mixtral, 1, 2) == (whole - experts) + experts / 2 == 48_308_428_800
    assert weights_bytes_per_gpu(mixtral, 2, 4) == (whole - experts) / 2 + experts / 4 == 24_154_214_400
    assert plan_memory(mixtral, H100.hbm_bytes, tensor_parallel=2, expert_parallel=4).weights_bytes_per_gpu == (
        24_154_214_400
    )
    with pytest.raises(ValueError, match="expert_parallel: 3 is not a multiple of tensor parallel 2"):
        plan_memory(mixtral, H100.hbm_bytes, tensor_parallel=2, expert_parallel=3)
    with pytest.raises(ValueError, match="has no experts"):
        plan_memory(BUILTIN["llama-3.1-8b"], H100.hbm_bytes, expert_parallel=2)


def test_gpt_oss_stores_its_experts_in_mxfp4():
    """gpt-oss-120b: 36 x 128 experts x 3 x 2880 x 2880 = 114,661,785,600 expert weights at 4.25 bits (60.9 GB), the
    other 2,127,263,040 at bf16: 65.17 GB; plan.weight_dtype replaces both."""
    oss = BUILTIN["gpt-oss-120b"]
    experts = 36 * 128 * 3 * 2880 * 2880
    assert oss.routed_expert_params() == experts == 114_661_785_600
    assert oss.stored_bytes() == experts * 4.25 / 8 + (oss.param_count() - experts) * 2 == pytest.approx(65.17e9, 1e-3)
    # gpt-oss-20b: 13,747,605,120 bytes here; its model.safetensors.index.json says total_size 13,761,264,768 (the
    # 0.1% between: biases and attention sinks)
    assert BUILTIN["gpt-oss-20b"].stored_bytes() == pytest.approx(13_761_264_768, rel=0.002)
    fp8 = stored_architecture(oss, "fp8", None)
    assert fp8.routed_expert_bits == 8 and fp8.stored_bytes() == pytest.approx(oss.param_count() + 2 * 201088 * 2880)


def test_kv_bytes_per_token_mla_and_sliding_windows():
    """Mixtral: 2 x 32 layers x 8 KV heads x 128 x 2 bytes = 131,072 (65,536 a GPU at TP 2). DeepSeek-V3's MLA latent:
    61 layers x (512 + 64) x 2 bytes = 70,272, the same on each GPU of a TP 8 group (replicated). gpt-oss-120b: the 18
    full-attention layers x 2 x 8 x 64 x 2 = 36,864 a token in the pool; the 18 sliding ones as much again a token, for
    at most 128 tokens: 4,718,592 bytes a sequence of 4,096 tokens, 36,864 x 100 for one of 100."""
    assert kv_bytes_per_token(BUILTIN["mixtral-8x7b"]) == 2 * 32 * 8 * 128 * 2 == 131_072
    assert kv_bytes_per_token(BUILTIN["mixtral-8x7b"], tensor_parallel=2) == 65_536
    deepseek = BUILTIN["deepseek-v3"]
    assert kv_bytes_per_token(deepseek) == 61 * (512 + 64) * 2 == 70_272
    assert kv_bytes_per_token(deepseek, tensor_parallel=8) == 70_272
    oss = BUILTIN["gpt-oss-120b"]
    assert kv_bytes_per_token(oss) == 18 * 2 * 8 * 64 * 2 == 36_864
    assert window_kv_bytes(oss, 4096) == 18 * 128 * 2048 == 4_718_592 and window_kv_bytes(oss, 100) == 36_864 * 100
    # bench memory's fit counts the window: a 4,096-token sequence takes 256 blocks of 16 and 128 x 36,864 bytes of
    # window, 8 more blocks of 16 x 36,864
    memory = plan_memory(oss, H100.hbm_bytes)
    assert load_fit(memory, 4096, 1)["kv_blocks_needed"] == 256 + 8


def test_decode_step_reads_the_experts_its_batch_touches():
    """Qwen3-30B-A3B, one H100, ideal roofline. Every step reads the weights every token needs, 48 x 19,140,608 x 2 =
    1,837,498,368 bytes, and of each MoE layer the experts touched: with uniform routing of B tokens to 8 of 128
    experts, 128 x (1 - (120/128)^B) on expectation. B = 1: 8, so 48 x 8 x 4,718,592 x 2 = 3,623,878,656 bytes and the
    layers read 5,461,377,024 (the active weights). B = 64: (15/16)^64 = 0.016075, 125.94 experts, 57,049,973,924
    bytes: the layers read 58,887,472,292, 10.8x batch 1's for 64x the tokens. FLOPs a token: 2 x the active layer
    weights, 2 x 48 x (19,140,608 + 8 x 4,718,592) = 5,461,377,024, plus lm_head's 2 x 311,164,928 a sequence."""
    model = RooflineStepModel(BUILTIN["qwen3-30b-a3b"], H100, 1, IDEAL)
    always, per_expert = 48 * QWEN_ALWAYS * 2, 48 * QWEN_EXPERT * 2
    assert always == 1_837_498_368 and per_expert == 452_984_832
    assert model.experts_touched(1) == pytest.approx(8)
    assert model.experts_touched(64) == pytest.approx(128 * (1 - (15 / 16) ** 64)) == pytest.approx(125.942, abs=1e-3)
    one = model.costs(StepShape(prefill_tokens=0, prefill_seqs=0, decode_seqs=1, context_tokens=1000))
    assert one.layers.bytes == pytest.approx(always + 8 * per_expert) == 5_461_377_024
    assert one.layers.flops == 2 * 48 * (QWEN_ALWAYS + 8 * QWEN_EXPERT) == 5_461_377_024
    assert one.lm_head.flops == 2 * QWEN_LM_HEAD and one.lm_head.bytes == 2 * QWEN_LM_HEAD
    # KV: 1,000 positions read and 1 written, 2 x 48 x 4 x 128 x 2 = 98,304 bytes each
    assert one.attention.bytes == 1001 * 98_304
    # reads plus compute: lm_head and attention (4 x 48 layers x 4,096 q_dim a pair, 1,000 pairs) at the BF16 peak
    flops = 5_461_377_024 + 622_329_856 + 4 * 48 * 4096 * 1000
    assert one.step_s == pytest.approx((5_461_377_024 + 622_329_856 + 1001 * 98_304) / 3.35e12 + flops / 989.5e12)
    batch = model.costs(StepShape(prefill_tokens=0, prefill_seqs=0, decode_seqs=64, context_tokens=64_000))
    assert batch.layers.bytes == pytest.approx(always + 125.94234927 * per_expert) == pytest.approx(58_887_472_292)
    assert batch.layers.flops == 64 * 5_461_377_024
    assert model.step_time_s(StepShape(0, 0, 64, 64_000)) == batch.step_s


def test_a_dense_model_reads_every_weight_as_before():
    """Llama-3.1-8B: no experts, so a step reads all its layers whatever the batch (tests/test_roofline_model.py)."""
    model = RooflineStepModel(BUILTIN["llama-3.1-8b"], H100, 1, IDEAL)
    assert model.layer_read_bytes(1) == model.layer_read_bytes(64) == 6_979_584_000 * 2
    assert model.flops_per_token == 2 * 6_979_584_000 and model.all_to_all_s(64) == 0.0


def test_expert_parallelism_shares_experts_and_adds_all_to_alls():
    """Qwen3-30B-A3B at TP 1, EP 2: two replicas' GPUs hold 64 experts each. At batch 1 a layer's routed tokens are
    both replicas' (2): 128 x (1 - (15/16)^2) = 15.5 experts touched, each GPU reading half: 1,837,498,368 + 15.5 x
    452,984,832 / 2 = 5,348,130,816 bytes. Each MoE layer's FFN all-reduce (none at TP 1) becomes two all-to-alls:
    at batch 64 each GPU sends 64 tokens x 8 experts x 1/2 off-GPU x 2048 x 2 bytes = 1,048,576 bytes at 450 GB/s
    x 0.82 (NCCL's usable NVLink share, nvlink_efficiency) = 369 GB/s, 2.84 us, twice a layer over 48 layers:
    272.8 us."""
    model = RooflineStepModel(BUILTIN["qwen3-30b-a3b"], H100, 1, IDEAL, expert_parallel=2)
    assert model.experts_touched(2) == pytest.approx(15.5)
    one = model.costs(StepShape(prefill_tokens=0, prefill_seqs=0, decode_seqs=1, context_tokens=1000))
    assert one.layers.bytes == pytest.approx(1_837_498_368 + 15.5 * 452_984_832 / 2) == 5_348_130_816
    assert model.all_to_all_s(64) == pytest.approx(2 * 48 * 1_048_576 / 369e9) == pytest.approx(272.8e-6, rel=1e-3)
    # at TP 2 and EP 2 the attention all-reduce stays (48 of them), the FFN's 48 are replaced by the all-to-alls
    tp2 = RooflineStepModel(BUILTIN["qwen3-30b-a3b"], H100, 2, IDEAL)
    tp2_ep2 = RooflineStepModel(BUILTIN["qwen3-30b-a3b"], H100, 2, IDEAL, expert_parallel=2)
    assert tp2_ep2.allreduce_s(64) == pytest.approx(tp2.allreduce_s(64) / 2)
    assert tp2_ep2.all_to_all_s(64) == pytest.approx(2 * 48 * (32 * 8 * 0.5 * 2048 * 2) / 369e9)


def test_hf_config_fields_of_each_family(tmp_path):
    """The config.json field names each family uses, read into the same architecture as the built-in entries."""
    deepseek = tmp_path / "deepseek" / "config.json"
    deepseek.parent.mkdir()
    deepseek.write_text(
        '{"num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 128, "num_key_value_heads": 128,'
        ' "intermediate_size": 18432, "vocab_size": 129280, "n_routed_experts": 256, "num_experts_per_tok": 8,'
        ' "n_shared_experts": 1, "moe_intermediate_size": 2048, "first_k_dense_replace": 3, "moe_layer_freq": 1,'
        ' "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,'
        ' "v_head_dim": 128, "num_nextn_predict_layers": 1, "torch_dtype": "bfloat16",'
        ' "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}'
    )
    arch = from_hf_config(deepseek)
    assert arch.param_count() == BUILTIN["deepseek-v3"].param_count() and arch.stored_bytes() == pytest.approx(
        BUILTIN["deepseek-v3"].stored_bytes()
    )
    assert (arch.dense_layers, arch.head_dim, kv_bytes_per_token(arch)) == (3, 192, 70_272)
    oss = tmp_path / "oss" / "config.json"
    oss.parent.mkdir()
    types = ", ".join('"sliding_attention", "full_attention"' for _ in range(18))
    oss.write_text(
        '{"num_hidden_layers": 36, "hidden_size": 2880, "num_attention_heads": 64, "num_key_value_heads": 8,'
        ' "head_dim": 64, "intermediate_size": 2880, "vocab_size": 201088, "num_local_experts": 128,'
        ' "num_experts_per_tok": 4, "experts_per_token": 4, "sliding_window": 128, "layer_types": [' + types + "],"
        ' "tie_word_embeddings": false, "quantization_config": {"quant_method": "mxfp4"}}'
    )
    arch = from_hf_config(oss)
    assert (arch.sliding_layers, arch.sliding_window, arch.expert_bits) == (18, 128, 4.25)
    assert arch.stored_bytes() == BUILTIN["gpt-oss-120b"].stored_bytes()
    qwen = tmp_path / "qwen" / "config.json"
    qwen.parent.mkdir()
    qwen.write_text(
        '{"num_hidden_layers": 48, "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 4,'
        ' "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768, "vocab_size": 151936,'
        ' "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],'
        ' "sliding_window": null, "use_sliding_window": false, "tie_word_embeddings": false}'
    )
    assert from_hf_config(qwen).active_params() == 3_353_020_416


def test_bench_memory_on_moe_models():
    """Mixtral at bf16 (93.41 GB) on one H100 (85.52 GB x 0.9): the weights do not fit, exit 1; at TP 2, 46.70 GB a
    GPU: 85.52 x 0.9 - 46.70 - 1.07 = 29.19 GB of KV in blocks of 16 x 65,536 bytes: 27,839 (27,839.85) blocks, exit 0.
    DeepSeek-R1 (fp8, 672.88 GB) at TP 8: 84.11 GB a GPU, on H200 (the deprecated spelling bench plan --memory)."""
    one = bench("memory", "--model", "mixtral-8x7b", "--hardware", "H100")
    assert one.returncode == 1 and "fits: NO, the weights alone" in one.stdout
    assert "46.70 B parameters, 12.88 B active a token" in one.stdout
    two = bench("memory", "--model", "mixtral-8x7b", "--hardware", "H100", "--tensor-parallel", "2")
    assert two.returncode == 0, two.stderr
    assert "weights: 93.41 GB, 46.70 GB per GPU at tensor parallel 2" in two.stdout
    assert "27,839 blocks of 16 tokens" in two.stdout and "fits: yes" in two.stdout
    r1 = bench("plan", "--memory", "--model", "deepseek-r1", "--hardware", "H200", "--tensor-parallel", "8")
    assert r1.returncode == 0, r1.stderr
    assert "84.11 GB per GPU at tensor parallel 8" in r1.stdout
    assert "KV cache: 70,272 bytes per token (bf16: MLA's latent, 61 layers x (512 + 64) x 2 bytes" in r1.stdout


def moe_scenario(tmp_path, args: list[str], plan: str = ""):
    quoted = ", ".join(f'"{a}"' for a in args)
    path = tmp_path / "moe.yaml"
    path.write_text(
        "name: moe\n"
        f"backend: {{kind: vllm, model: Qwen/Qwen3-30B-A3B, launch: {{args: [{quoted}]}}}}\n"
        "workload: {kind: random, input_tokens: 128, output_tokens: 8, ignore_eos: true}\n"
        "load: {arrival: poisson, rate: 4, num_requests: 6}\n"
        f"plan: {{hardware: H100-SXM, model: qwen3-30b-a3b, step_model: roofline{plan}}}\n"
    )
    return load_scenario(path)


def test_a_plan_of_an_moe_model_runs_with_expert_parallelism(tmp_path):
    """vLLM's --enable-expert-parallel with -dp 2 at TP 1 spreads the experts over both GPUs (EP = TP x DP = 2): the
    plan simulates 2 replicas whose steps read their share of the touched experts; every request completes."""
    s = moe_scenario(tmp_path, ["--enable-expert-parallel", "--data-parallel-size", "2"])
    assert planned(s).plan.expert_parallel == 2
    model = roofline_step_model(s)
    assert (model.ep, model.expert_gpus) == (2, 2)
    summary = simulate_scenario(s, tmp_path / "out")
    assert (summary.requests.completed, summary.requests.failed) == (6, 0)
    assert summary.plan.deployment["replicas"] == 2
    assert summary.plan.step_model["expert_parallel"] == 2
    with pytest.raises(ScenarioError, match="give a multiple of 2 replicas"):
        simulate_scenario(moe_scenario(tmp_path, [], ", expert_parallel: 2, replicas: 1"), tmp_path / "odd")


def test_the_launch_command_carries_expert_parallelism(tmp_path):
    """plan.expert_parallel as each engine's flag, once: vLLM's switch, SGLang's and TensorRT-LLM's sizes."""
    assert expert_parallel_flags("vllm", 2, []) == ["--enable-expert-parallel"]
    assert expert_parallel_flags("sglang", 4, []) == ["--ep-size", "4"]
    assert expert_parallel_flags("trtllm", 4, []) == ["--ep_size", "4"]
    assert expert_parallel_flags("vllm", 1, []) == [] and expert_parallel_flags("sglang", 4, ["--ep-size", "4"]) == []
    s = moe_scenario(tmp_path, [], ", expert_parallel: 2, replicas: 2")
    assert launch_plan(s, 1, 2).args == [
        "--tensor-parallel-size",
        "1",
        "--data-parallel-size",
        "2",
        "--enable-expert-parallel",
    ]
