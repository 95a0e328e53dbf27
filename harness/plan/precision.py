"""The Precision a plan builds from its precision fields (harness/scenario/precision.py: the fields' tables and
checks): the bits, bytes and tensor peak that the memory plan (harness/plan/memory.py) and the roofline step model
(harness/plan/roofline_model.py) read."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from harness.plan.architectures import Architecture
from harness.scenario.gpus import GpuSpec
from harness.scenario.precision import (
    DEFAULT_COMPUTE,
    KV_CACHE_DTYPE_BYTES,
    MODEL_OWN,
    UNQUANTIZED_BITS,
    WEIGHT_DTYPE_BITS,
    WEIGHT_DTYPE_VALUE_BITS,
    compute_dtype_problem,
    weight_bits_problem,
)


@dataclass(frozen=True, kw_only=True)
class Precision:
    """The deployment's precisions; the weights' bits live on the Architecture (stored_architecture)."""

    weights: str = "model"  # a WeightDtype, or "model": the model's own (16-bit, a GGUF's average)
    compute: str = "bf16"  # the layers' matmuls: a GpuSpec.tensor_flops precision
    kv_cache: str = "auto"  # a KvCacheDtype
    compute_defaulted: bool = True  # compute follows from weights (not set in the plan): said in errors

    @property
    def kv_bytes(self) -> int:
        """Bytes a K or V element takes."""
        return KV_CACHE_DTYPE_BYTES[self.kv_cache]

    @property
    def kv_cache_resolved(self) -> str:
        return "bf16" if self.kv_cache == "auto" else self.kv_cache

    def compute_flops(self, gpu: GpuSpec) -> float:
        """The dense tensor peak of the layers' matmuls on `gpu`; a ValueError naming plan.compute_dtype and the
        GPU where it has no tensor cores for them."""
        peaks = gpu.tensor_peaks()
        if ("bf16" if self.compute == "fp16" else self.compute) not in peaks:
            why = f" (weight_dtype {self.weights}'s default)" if self.compute_defaulted else ""
            raise ValueError(
                f"plan.compute_dtype {self.compute!r}{why}: {gpu.name} has no {self.compute} tensor cores (its peaks: "
                f"{', '.join(peaks)}); set plan.compute_dtype: bf16 for weight-only kernels (vLLM runs fp8 and fp4 "
                "checkpoints through Marlin on such parts), or pick a part that has them"
            )
        return gpu.tensor_flops(self.compute)

    def weights_text(self, arch: Architecture) -> str:
        """'fp8 (8 bits a layer weight, embedding and lm_head 16)': the format and the bits the plan counts."""
        if arch.lm_head_bits != arch.weight_bits:
            bits = f"{arch.weight_bits:.4g} bits a layer weight, embedding and lm_head {arch.lm_head_bits:g}"
        else:
            bits = f"{arch.weight_bits:.4g} bits a weight"
        if arch.routed_expert_bits != arch.weight_bits and arch.is_moe:
            bits += f", routed experts {arch.routed_expert_bits:.4g}"
        return f"{MODEL_OWN if self.weights == 'model' else self.weights} ({bits})"

    def kv_cache_text(self) -> str:
        auto = " (auto)" if self.kv_cache == "auto" else ""
        return f"{self.kv_cache_resolved}{auto} ({self.kv_bytes} byte{'s' * (self.kv_bytes > 1)} an element)"

    def line(self, arch: Architecture, gpu: GpuSpec | None = None) -> str:
        """bench plan's account of what was assumed: the weights, the matmuls (and their peak on `gpu`), the KV
        cache."""
        peak = f" ({self.compute_flops(gpu) / 1e12:,.0f} dense TFLOP/s on {gpu.name})" if gpu is not None else ""
        attention = "" if self.compute in ("bf16", "fp16") else ", attention and lm_head in bf16"
        return (
            f"precision: weights {self.weights_text(arch)}, matmuls in {self.compute}{peak}{attention}, "
            f"KV cache {self.kv_cache_text()}"
        )


MODEL_PRECISION = Precision()  # no precision set: the model's own weights, bf16 matmuls, a bf16 KV cache


def plan_precision(
    weight_dtype: str | None, compute_dtype: str | None = None, kv_cache_dtype: str = "auto"
) -> Precision:
    """The plan's fields as a Precision: compute defaults to DEFAULT_COMPUTE of the weights (bf16 for the model's
    own). ValueError naming the field for a pairing no kernel runs."""
    if (problem := compute_dtype_problem(compute_dtype, weight_dtype)) is not None:
        raise ValueError(f"plan.compute_dtype: {problem}")
    compute = compute_dtype or DEFAULT_COMPUTE.get(weight_dtype or "bf16", "bf16")
    return Precision(
        weights=weight_dtype or "model",
        compute=compute,
        kv_cache=kv_cache_dtype,
        compute_defaulted=compute_dtype is None,
    )


def memory_precision(weight_dtype: str | None, kv_cache_dtype: str) -> Precision:
    """bench memory's --weight-dtype and --kv-cache-dtype; a ValueError naming the option for another value."""
    if weight_dtype is not None and weight_dtype not in WEIGHT_DTYPE_BITS:
        raise ValueError(f"--weight-dtype: {weight_dtype!r}; use one of {', '.join(WEIGHT_DTYPE_BITS)}")
    if kv_cache_dtype not in KV_CACHE_DTYPE_BYTES:
        raise ValueError(
            f"--kv-cache-dtype (--kv-dtype): {kv_cache_dtype!r}; use one of {', '.join(KV_CACHE_DTYPE_BYTES)}"
        )
    return plan_precision(weight_dtype, None, kv_cache_dtype)


def stored_architecture(
    arch: Architecture, weight_dtype: str | None, weight_bits: float | None, bits_field: str = "plan.weight_bits"
) -> Architecture:
    """The model as the deployment stores it. With a weight_dtype the layers take its bits (weight_bits, when
    given, counts other scales) and a quantized format leaves the embedding and lm_head at 16 bits; weight_bits
    alone is an average over every tensor (a GGUF's), the embedding included. Either sets the routed experts' bits
    too (a checkpoint's own expert_bits, GPT-OSS's MXFP4, holds only where neither is given)."""
    if weight_dtype is None:
        whole = {"weight_bits": weight_bits, "embedding_bits": None, "expert_bits": None}
        return dataclasses.replace(arch, **whole) if weight_bits else arch
    if (problem := weight_bits_problem(weight_dtype, weight_bits)) is not None:
        raise ValueError(f"{bits_field}: {problem}")
    bits = weight_bits or WEIGHT_DTYPE_BITS[weight_dtype]
    quantized = WEIGHT_DTYPE_VALUE_BITS[weight_dtype] < UNQUANTIZED_BITS
    embedding = UNQUANTIZED_BITS if quantized else None
    return dataclasses.replace(arch, weight_bits=bits, embedding_bits=embedding, expert_bits=None)
