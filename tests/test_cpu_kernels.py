"""The torch runtime picks its kernels for the CPU torch reports, --runtime auto keeps numpy where torch is
measured slower, and FLOPs and bytes are counted from the weights each runtime holds. The CPU's capability
and the step times are injected: nothing here depends on which CPU runs the tests."""

import logging
import re

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="torch is an optional extra (pip install -e '.[torch]'); these tests cover --runtime torch only"
)

from native_engine import auto_runtime, runtime, torch_int4, torch_kernels, torch_linear  # noqa: E402
from native_engine.gguf_model import load_gguf  # noqa: E402
from native_engine.llm_engine import EngineConfig, LLMEngine, LoadedModel  # noqa: E402
from native_engine.model_runner import ModelRunner, SeqChunk  # noqa: E402
from native_engine.sequence import SamplingParams  # noqa: E402
from native_engine.tiny_gguf import write_tiny_llama_gguf  # noqa: E402
from native_engine.torch_runner import TorchModelRunner  # noqa: E402

TINY = {"seed": 1, "n_layers": 2, "hidden": 64, "n_heads": 4, "n_kv_heads": 2, "ffn": 128}


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", **TINY)


@pytest.fixture
def cpu_reports(monkeypatch):
    """cpu_reports('AVX2'): torch's capability probe answers that; the CPU's units (BF16, VNNI, AMX) all 'present',
    so only the capability can turn them off."""

    def report(capability: str):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
        for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported", "_is_vnni_supported"):
            monkeypatch.setattr(torch.cpu, probe, lambda: True, raising=False)

    return report


@pytest.mark.parametrize(
    "capability, dense, int8_activations",
    [("AVX512", torch.bfloat16, True), ("AVX2", torch.float32, False), ("DEFAULT", torch.float32, False)],
)
def test_kernels_follow_the_capability_torch_reports(cpu_reports, capability, dense, int8_activations):
    cpu_reports(capability)
    kernels = torch_kernels.this_cpu()
    assert (kernels.capability, kernels.dense_dtype, kernels.int8_activations) == (capability, dense, int8_activations)
    assert capability in kernels.describe()


def test_avx512_without_bf16_or_vnni_units_gets_the_fp32_kernels():
    kernels = torch_kernels.choose_kernels("AVX512", bf16_units=False, int8_units=False)
    assert kernels.dense_dtype == torch.float32
    assert not kernels.int8_activations


def test_an_avx2_runner_never_quantizes_activations_and_multiplies_many_rows_in_fp32(
    cpu_reports, tiny_path, monkeypatch, caplog
):
    """int8 and int4 runners built where torch reports AVX2: many-row steps go through fp32 copies (never
    _int_mm, which emulates int8 dot products there), and the engine log says which kernels were chosen."""
    cpu_reports("AVX2")
    config, weights = load_gguf(tiny_path)

    def no_int_mm(*args):
        raise AssertionError("_int_mm called on a CPU without VNNI/AMX")

    monkeypatch.setattr(torch, "_int_mm", no_int_mm)
    # 12 rows, each with logits: past both few-row thresholds in every matrix, the lm_head's too
    chunks = [SeqChunk(list(range(10, 22)), 0, [0, 1, 2], True, all_logits=True)]
    reference = ModelRunner(config, weights, 8, 4).forward(chunks)
    for dtype in ("int8", "int4"):
        with caplog.at_level(logging.INFO, logger="native_engine.torch_runner"):
            runner = TorchModelRunner(config, weights, 8, 4, dtype=dtype)
        assert "CPU capability AVX2" in caplog.text
        assert runner.layers[0].w_gate_up.many_rows_dense.dtype == torch.float32
        assert runner.lm_head.many_rows_dense.dtype == torch.float32
        # fp32 copies of the reference's own weights (bf16 copies would be ~0.1 off): the reference's logits
        np.testing.assert_allclose(runner.forward(chunks), reference, rtol=0, atol=1e-3)


def test_an_avx512_int8_runner_quantizes_activations_where_the_units_are(cpu_reports, tiny_path, monkeypatch):
    cpu_reports("AVX512")
    config, weights = load_gguf(tiny_path)
    calls = []
    real_int_mm = torch._int_mm
    monkeypatch.setattr(torch, "_int_mm", lambda *args: calls.append(1) or real_int_mm(*args))
    runner = TorchModelRunner(config, weights, 8, 4, dtype="int8")
    assert runner.layers[0].w_gate_up.many_rows_dense is None
    assert runner.layers[0].w_down.many_rows_dense.dtype == torch.bfloat16  # outlier inputs: a dense copy
    runner.forward([SeqChunk(list(range(10, 30)), 0, [0, 1, 2, 3, 4], True)])
    assert len(calls) == 3 * config.n_layers  # wqkv, wo, w_gate_up of every layer


@pytest.mark.parametrize(
    "measured, chosen",
    [
        ({"numpy": {1: 0.050, 64: 0.150}, "torch": {1: 0.020, 64: 0.600}}, "numpy"),  # the AVX2 EPYC's 64 streams
        ({"numpy": {1: 0.050, 64: 0.150}, "torch": {1: 0.070, 64: 0.100}}, "numpy"),
        ({"numpy": {1: 0.050, 64: 0.150}, "torch": {1: 0.020, 64: 0.100}}, "torch"),
        ({"numpy": {1: 0.050, 64: 0.150}, "torch": {1: 0.050, 64: 0.100}}, "numpy"),
    ],
)  # a tie keeps the reference
def test_auto_keeps_torch_only_where_it_is_faster_at_every_batch(measured, chosen):
    assert auto_runtime.choose_runtime(measured).runtime == chosen


@pytest.mark.parametrize("torch_s, runner_type", [(0.5, ModelRunner), (0.001, TorchModelRunner)])
def test_auto_serves_with_the_measured_faster_runner_and_logs_the_figures(
    tiny_path, monkeypatch, caplog, torch_s, runner_type
):
    """make_runner('auto') builds both runners, times them (injected here) and keeps the faster."""
    timed = []

    def measured(runners, *args, **kwargs):
        timed.append({name: type(r) for name, r in runners.items()})
        return {"numpy": {1: 0.010, 64: 0.100}, "torch": {1: torch_s, 64: torch_s}}

    monkeypatch.setattr(auto_runtime, "measure_step_s", measured)
    monkeypatch.setattr(runtime, "torch_available", lambda: True)
    config, weights = load_gguf(tiny_path)
    with caplog.at_level(logging.INFO, logger="native_engine.auto_runtime"):
        runner = runtime.make_runner(config, weights, 8, 4, runtime="auto")
    assert timed == [{"numpy": ModelRunner, "torch": TorchModelRunner}]
    assert type(runner) is runner_type
    assert f"runtime auto: {'numpy' if runner_type is ModelRunner else 'torch'}" in caplog.text
    assert "numpy batch 1 10.0 ms, batch 64 100.0 ms" in caplog.text


def test_the_start_up_measurement_times_every_runner_at_every_batch_within_its_budget(tiny_path):
    config, weights = load_gguf(tiny_path)
    runners = {"numpy": ModelRunner(config, weights, 8, 4), "torch": TorchModelRunner(config, weights, 8, 4)}
    best = auto_runtime.measure_step_s(runners, batches=(1, 3), rounds=50, budget_s=0.0)  # one round only
    assert set(best) == {"numpy", "torch"}
    assert all(set(by_batch) == {1, 3} and all(0 < s < 1 for s in by_batch.values()) for by_batch in best.values())


# ---- FLOPs and bytes from what the runtime holds ----------------------------------------------------
# The tiny model by hand: hidden 64, 4 heads of 16 (q 64), 2 KV heads (k, v 32 each), ffn 128, 2 layers.
MATMUL_PARAMS = 2 * (64 * (64 + 32 + 32) + 64 * 64 + 64 * 2 * 128 + 128 * 64)  # wqkv, wo, gate_up, down: 73,728
LM_HEAD_PARAMS = 64 * 269  # the byte-level vocabulary: 3 control tokens, 256 bytes, 10 merges


def test_flops_of_a_torch_int4_step_match_the_hand_count(tiny_path):
    """A 5-token prefill then one decode step: 2 FLOPs per weight per token, 2 per lm_head weight per sampled
    row, 4 * q_dim per (query, context position) pair per layer. int4 holds half a byte a weight: counting
    parameters as bytes / 4 (fp32) gave an eighth of the matmul FLOPs."""
    engine = LLMEngine(
        EngineConfig(runtime="torch", dtype="int4", kv_cache_tokens=64, kv_block_size=4, step_trace=True),
        LoadedModel.load(str(tiny_path)),
    )
    assert type(engine.runner) is TorchModelRunner
    engine.generate([[5, 6, 7, 8, 9]], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
    flops = [step.flops for step in engine.step_trace.steps]
    prefill = 2 * MATMUL_PARAMS * 5 + 2 * LM_HEAD_PARAMS + 4 * 2 * 64 * (1 + 2 + 3 + 4 + 5)
    decode = 2 * MATMUL_PARAMS + 2 * LM_HEAD_PARAMS + 4 * 2 * 64 * 6
    assert flops == [prefill, decode] == [779_392, 184_960]


def test_bytes_read_follow_the_kernel_each_step_takes(cpu_reports, tiny_path):
    """int4: a few-row step reads the 4-bit blocks (half a byte a weight, 4 bytes of bf16 scale and zero per
    32), a many-row step the dense copy (fp32 where torch reports AVX2); the lm_head is int8 (a byte a weight,
    4 bytes of scale a row) or its dense copy. Norms are fp32 (2 per layer and the output norm)."""
    cpu_reports("AVX2")
    config, weights = load_gguf(tiny_path)
    runner = TorchModelRunner(config, weights, 8, 4, dtype="int4")
    norms = 4 * 64 * (2 * 2 + 1)
    four_bit = MATMUL_PARAMS // 2 + 4 * 2 * (128 * 64 + 64 * 64 + 256 * 64 + 64 * 128) // 32
    assert runner.weight_bytes_read(1, 1) == runner.weight_bytes == four_bit + LM_HEAD_PARAMS + 4 * 269 + norms
    many = torch_int4.INT4_MAX_ROWS + 1
    assert runner.weight_bytes_read(many, many) == 4 * MATMUL_PARAMS + 4 * LM_HEAD_PARAMS + norms
    assert runner.weight_bytes_read(many, 0) == 4 * MATMUL_PARAMS + norms  # no logits: the lm_head is not read
    assert torch_linear.WEIGHT_ONLY_MAX_ROWS < many


def test_the_served_engine_logs_its_kernels_and_auto_choice_and_serves_with_it(tiny_path):
    """`serve --runtime auto` as a user starts it, torch capped by its own ATEN_CPU_CAPABILITY (DEFAULT: runs
    on any CPU): the log names the capability's kernels and auto's measured figures, and the serving line's
    runner is the one auto said it chose."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
    command = [
        sys.executable,
        "-m",
        "native_engine",
        "serve",
        "--model",
        str(tiny_path),
        "--port",
        "0",
        "--runtime",
        "auto",
        "--kv-cache-tokens",
        "2048",
        "--blas-threads",
        "1",
    ]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        serving = proc.stdout.readline()
    finally:
        proc.terminate()
        log = proc.communicate(timeout=60)[1]
    assert "CPU capability DEFAULT: many-row steps multiply by a fp32 copy" in log
    chosen = log.split("runtime auto: ")[1].split()[0]
    assert re.search(r"numpy batch 1 [\d.]+ ms, batch 64 [\d.]+ ms; torch batch 1 [\d.]+ ms, batch 64 [\d.]+ ms", log)
    assert {"numpy": "ModelRunner", "torch": "TorchModelRunner"}[chosen] + " " in serving
