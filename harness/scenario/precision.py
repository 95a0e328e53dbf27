"""The precision fields of a plan and their checks (the Precision a plan builds from them: harness/plan/precision.py).

What a deployment stores its weights and KV cache in, and what its matmuls multiply in: the plan's `weight_dtype`,
`weight_bits`, `compute_dtype` and `kv_cache_dtype` turned into the bits, bytes and tensor peak that the memory plan
(harness/plan/memory.py) and the roofline step model (harness/plan/roofline_model.py) read.

The names are the engines' own: vLLM's and SGLang's `--quantization fp8` stores the layers' weights in fp8 and
multiplies in fp8 (W8A8) on parts with fp8 tensor cores; `--quantization awq|gptq` stores int4 and multiplies in
bf16 (weight-only: the kernel dequantizes); `--kv-cache-dtype fp8` stores K and V in one byte, `auto` in the
activations' dtype (bf16 or fp16: two bytes). Their quantization methods take the linear layers only: the embedding
and lm_head stay in 16 bits, as llm-compressor's FP8 checkpoints leave lm_head out (Llama-3.1-8B at fp8:
6.98 G layer weights x 1 byte + 2 x 525 M x 2 bytes = 9.08e9 bytes, 8.46 GiB; such a checkpoint's card says ~8.5 GB),
and attention (QK^T, softmax x V) runs in bf16, the KV cache read in its own dtype and widened in the kernel.
"""

from __future__ import annotations

from typing import Literal

WeightDtype = Literal["bf16", "fp16", "fp8", "int8", "int4", "fp4"]
ComputeDtype = Literal["bf16", "fp16", "fp8", "int8", "fp4"]
KvCacheDtype = Literal["auto", "bf16", "fp16", "fp8", "fp8_e4m3", "fp8_e5m2"]  # vLLM's --kv-cache-dtype spellings

# Bits a stored weight takes in each format, its scales included: what a checkpoint of that format weighs
WEIGHT_DTYPE_BITS: dict[str, float] = {
    "bf16": 16.0,
    "fp16": 16.0,
    "fp8": 8.0,  # e4m3, one fp32 scale per tensor or per output channel (under 0.01 bits a weight)
    "int8": 8.0,  # per-channel scales, as fp8
    "int4": 4 + (16 + 4) / 128,  # AWQ/GPTQ at group 128: an fp16 scale and a packed 4-bit zero per 128 weights
    "fp4": 4 + 8 / 16,  # NVFP4: an fp8 (e4m3) scale per 16 weights
}
# The bits of the values alone: a weight_bits override (another group size) cannot go below them
WEIGHT_DTYPE_VALUE_BITS: dict[str, int] = {"bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4, "fp4": 4}
# The matmuls run in the weights' own precision where tensor cores take it (W8A8, NVFP4's W4A4); int4 has no
# tensor peak on these parts, so AWQ/GPTQ dequantize into bf16
DEFAULT_COMPUTE: dict[str, str] = {
    "bf16": "bf16",
    "fp16": "fp16",
    "fp8": "fp8",
    "int8": "int8",
    "int4": "bf16",
    "fp4": "fp4",
}
# The weights each low-precision compute multiplies: W8A8 fp8 and int8, W4A8 (TensorRT-LLM's int4 AWQ with fp8
# activations, QServe's int8), MXFP4 weights with fp8 activations, NVFP4 W4A4. bf16/fp16 take any weights.
COMPUTE_TAKES: dict[str, tuple[str, ...]] = {"fp8": ("fp8", "int4", "fp4"), "int8": ("int8", "int4"), "fp4": ("fp4",)}
KV_CACHE_DTYPE_BYTES: dict[str, int] = {"auto": 2, "bf16": 2, "fp16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
MODEL_OWN = "the model's own"
UNQUANTIZED_BITS = 16.0  # the embedding, lm_head and activations beside quantized layers (bf16 or fp16)


def weight_bits_problem(weight_dtype: str | None, weight_bits: float | None) -> str | None:
    """Why plan.weight_bits cannot hold plan.weight_dtype's weights, None when it can."""
    if weight_dtype is None or weight_bits is None or weight_bits >= WEIGHT_DTYPE_VALUE_BITS[weight_dtype]:
        return None
    return (
        f"fewer than {weight_dtype}'s {WEIGHT_DTYPE_VALUE_BITS[weight_dtype]} bits a value; give the stored bits with "
        f"the scales ({weight_dtype}'s default: {WEIGHT_DTYPE_BITS[weight_dtype]:.4g}) or leave it out"
    )


def compute_dtype_problem(compute_dtype: str | None, weight_dtype: str | None) -> str | None:
    """Why matmuls in `compute_dtype` cannot multiply `weight_dtype` weights, None when they can."""
    if compute_dtype is None or compute_dtype not in COMPUTE_TAKES or weight_dtype in COMPUTE_TAKES[compute_dtype]:
        return None
    *others, last = COMPUTE_TAKES[compute_dtype]
    takes = f"{', '.join(others)} or {last}" if others else last
    stored = f"weight_dtype {weight_dtype}" if weight_dtype else "the model's own weights (no weight_dtype)"
    return (
        f"{compute_dtype} matmuls multiply {takes} weights, not {stored}; set plan.weight_dtype: {compute_dtype} "
        "(the checkpoint's format: vLLM's --quantization fp8 quantizes a bf16 checkpoint as it loads), or compute "
        "in bf16"
    )
