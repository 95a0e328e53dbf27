"""`bench memory` (and its deprecated spelling `bench plan --memory`) and `bench plan SCENARIO --search` as a user runs
them."""

import json

from bench_process import bench


def test_memory_for_llama_8b_at_fp16_kv():
    res = bench(
        "memory",
        "--model",
        "llama-3.1-8b",
        "--kv-dtype",
        "fp16",
        "--context",
        "8192",
        "--concurrency",
        "32",
        "--hardware",
        "H100",
    )
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "KV cache: 131,072 bytes per token" in out
    assert "weights: 16.06 GB" in out  # 8,030,261,248 parameters x 2 bytes
    assert "32 sequences x 8,192 tokens = 34.36 GB" in out  # 32 x 8192 x 131072 bytes
    # H100 SXM: the 81,559 MiB nvidia-smi reports (85.52 GB) x 0.9 - 16.06 GB - 1 GiB reserve = 59.83 GB,
    # in blocks of 16 x 131072 bytes
    assert "GPU memory: 85.52 GB (79.65 GiB)" in out
    assert "28,531 blocks of 16 tokens" in out and "fits: yes" in out


def test_memory_seven_billion_at_four_bits_on_a_16_gib_laptop():
    res = bench(
        "memory",
        "--model",
        "mistral-7b",
        "--weight-bits",
        "4.5",
        "--context",
        "8192",
        "--concurrency",
        "4",
        "--gpu-memory",
        "16GiB",
    )
    assert res.returncode == 0, res.stderr
    assert "weights: 4.08 GB" in res.stdout and "fits: yes" in res.stdout
    bf16 = bench("memory", "--model", "mistral-7b", "--context", "8192", "--concurrency", "4", "--gpu-memory", "16GiB")
    assert "fits: NO" in bf16.stdout and bf16.returncode == 1  # a script can ask: 1 when it does not fit
    # the old spelling still answers, and says it is deprecated (14.5 GB of bf16 weights leave no KV in 16 GiB)
    old = bench("plan", "--memory", "--model", "mistral-7b", "--context", "8192", "--gpu-memory", "16GiB")
    assert "fits: NO" in old.stdout and old.returncode == 1 and "deprecated: use bench memory" in old.stderr


def test_memory_bad_input_names_the_option():
    res = bench("memory", "--gpu-memory", "sixteen")
    assert res.returncode != 0 and "--gpu-memory" in res.stderr and "16GiB" in res.stderr
    res = bench("memory", "--kv-dtype", "int3")
    assert res.returncode != 0 and "--kv-dtype" in res.stderr and "fp8" in res.stderr


def test_search_writes_and_prints_the_selection_table(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "name: search-cli\n"
        "backend: {kind: native, model: smollm2, launch: {args: [--max-num-batched-tokens, '2048']}}\n"
        "workload: {kind: random, input_tokens: 128, output_tokens: 16, ignore_eos: true}\n"
        "load: {arrival: poisson, rate: 10, num_requests: 24}\n"
        "slo: {ttft_ms: 500, tpot_ms: 50}\n"
        "plan: {model: llama-3.1-70b, step_model: roofline, prices: {H100: 3.0}}\n"
    )
    res = bench("plan", scenario, "--search", "--output", tmp_path / "out", "--max-gpus", "8", timeout_s=300)
    assert res.returncode == 0, res.stderr
    # 70B at bf16 is 141 GB: one H100 (85.5 GB) cannot hold it, so the search starts at TP 2
    saved = json.loads((tmp_path / "out" / "search.json").read_text())
    result = saved["levels"][0]["results"][0]
    best = result["best"]
    assert best["meets_slo"] and best["tensor_parallel"] >= 2
    assert "TP 1: weights leave no KV cache" in result["notes"]
    assert not any(t["tensor_parallel"] == 1 for t in result["tried"])
    gpus = best["tensor_parallel"] * best["replicas"]
    assert f"| H100 | {best['tensor_parallel']} | {best['replicas']} | {gpus} | {3.0 * gpus:.2f} |" in res.stdout
    assert (tmp_path / "out" / "search.md").read_text().splitlines()[4] in res.stdout
    assert "% busy at 10 req/s (30% headroom asked)" in res.stdout and "At 20 req/s (2x load.rate)" in res.stdout


def test_search_without_prices_names_the_field(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "name: search-cli\nbackend: {kind: native, model: smollm2, launch: {}}\n"
        "workload: {kind: random, input_tokens: 16, output_tokens: 4}\nload: {arrival: poisson, rate: 1, "
        "num_requests: 2}\nslo: {ttft_ms: 500}\nplan: {model: llama-3.1-8b, step_model: roofline}\n"
    )
    res = bench("plan", scenario, "--search", "--output", tmp_path / "out")
    assert res.returncode != 0 and "plan.prices" in res.stderr
