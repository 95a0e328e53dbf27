"""The runtime seam: numpy stays the default and needs nothing more; torch is optional and only one file imports it."""

import ast
from pathlib import Path

import pytest

from native_engine import runtime
from native_engine.gguf_model import load_gguf
from native_engine.llm_engine import EngineConfig
from native_engine.model_runner import ModelRunner
from native_engine.tiny_gguf import write_tiny_llama_gguf

ROOT = Path(__file__).resolve().parent.parent


def test_default_runtime_is_the_numpy_reference(tmp_path):
    config, weights = load_gguf(write_tiny_llama_gguf(tmp_path / "tiny.gguf", seed=1))
    assert EngineConfig().runtime == "numpy"
    assert type(runtime.make_runner(config, weights, 8, 4)) is ModelRunner


def test_unknown_runtime_names_the_choices():
    with pytest.raises(ValueError, match="runtime 'jax'.*numpy, torch, auto"):
        runtime.resolve_runtime("jax")


def test_unknown_dtype_names_the_choices(tmp_path):
    config, weights = load_gguf(write_tiny_llama_gguf(tmp_path / "tiny.gguf", seed=1))
    with pytest.raises(ValueError, match="dtype 'int3'.*int4, int8, bf16, fp32"):
        runtime.make_runner(config, weights, 8, 4, runtime="numpy", dtype="int3")


def test_without_torch_auto_is_numpy_and_torch_says_how_to_install(monkeypatch):
    monkeypatch.setattr(runtime, "torch_available", lambda: False)
    assert runtime.resolve_runtime("auto") == "numpy"
    with pytest.raises(ValueError, match=r"pip install -e '\.\[torch\]'"):
        runtime.resolve_runtime("torch")


def test_with_torch_auto_is_left_to_the_start_up_measurement(monkeypatch):
    monkeypatch.setattr(runtime, "torch_available", lambda: True)
    assert runtime.resolve_runtime("auto") == "auto"


def test_only_the_torch_runner_imports_torch_at_module_level():
    """torch is an optional extra: importing any other module must work without it (the runner's own
    modules, torch_*.py, are imported only by runtime.make_runner for --runtime torch)."""
    offenders = set()
    for package in ("harness", "backends", "reports", "native_engine"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.parse(path.read_text(encoding="utf-8")).body:  # top-level statements only
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                if any(n == "torch" or n.startswith("torch.") for n in names):
                    offenders.add(str(path.relative_to(ROOT)))
    assert offenders == {
        "native_engine/torch_runner.py",
        "native_engine/torch_linear.py",
        "native_engine/torch_int4.py",
        "native_engine/torch_cuda_graphs.py",
        "native_engine/torch_kernels.py",
    }


def test_numpy_runtime_refuses_a_gpu_device(tmp_path):
    config, weights = load_gguf(write_tiny_llama_gguf(tmp_path / "tiny.gguf", seed=1))
    with pytest.raises(ValueError, match="device 'cuda' needs --runtime torch"):
        runtime.make_runner(config, weights, 8, 4, runtime="numpy", device="cuda")
