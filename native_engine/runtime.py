"""Which kernels run the forward step: the numpy fp32 reference or torch (int4/int8/bf16 weights, optional extra).

Everything above the runner (scheduler, block manager, sampler, server) is the same for both;
the runner only has to take SeqChunks and return fp32 logits.
"""

from __future__ import annotations

import importlib.util

from native_engine.gguf_model import ModelConfig, ModelWeights

RUNTIMES = ("numpy", "torch", "auto")
TORCH_DTYPES = ("int4", "int8", "bf16", "fp32")


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def resolve_runtime(runtime: str) -> str:
    """'numpy', 'torch', or 'auto' when torch is installed (make_runner then measures which is faster here);
    'auto' without torch is numpy. A clear error for the rest."""
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime {runtime!r}: choose one of {', '.join(RUNTIMES)}")
    if runtime == "auto":
        return "auto" if torch_available() else "numpy"
    if runtime == "torch" and not torch_available():
        raise ValueError(
            "runtime 'torch' needs torch, its CPU build: pip install torch --index-url "
            "https://download.pytorch.org/whl/cpu, then pip install -e '.[torch]' (docs/runtimes.md); "
            "or use --runtime numpy"
        )
    return runtime


def make_runner(
    config: ModelConfig,
    weights: ModelWeights,
    num_kv_blocks: int,
    kv_block_size: int,
    runtime: str = "numpy",
    dtype: str = "int4",
    threads: int = 0,
    device: str = "cpu",
    cuda_graphs: bool = True,
    few_rows_weights: bool = False,
):
    """A ModelRunner (numpy fp32, exact reference) or a TorchModelRunner (weights in `dtype`, on `device`);
    'auto' with torch installed: whichever is faster on this machine (auto_runtime.py measures).
    few_rows_weights (numpy only): keep transposed layer weights for speculative verification chunks."""
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"dtype {dtype!r}: choose one of {', '.join(TORCH_DTYPES)} (used by runtime torch)")
    runtime = resolve_runtime(runtime)

    def torch_runner():
        # torch is imported only here
        from native_engine.torch_runner import TorchModelRunner

        return TorchModelRunner(
            config,
            weights,
            num_kv_blocks,
            kv_block_size,
            dtype=dtype,
            threads=threads,
            device=device,
            cuda_graphs=cuda_graphs,
        )

    def numpy_runner():
        from native_engine.model_runner import ModelRunner

        return ModelRunner(
            config, weights, num_kv_blocks=num_kv_blocks, kv_block_size=kv_block_size, few_rows_weights=few_rows_weights
        )

    if runtime == "auto":
        from native_engine.auto_runtime import pick_runner

        return pick_runner(torch_runner, numpy_runner)
    if runtime == "torch":
        return torch_runner()
    if device != "cpu":
        raise ValueError(f"device {device!r} needs --runtime torch; the numpy runtime runs on the CPU only")
    return numpy_runner()
