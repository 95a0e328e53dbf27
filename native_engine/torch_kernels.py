"""Which torch kernels the weight matrices use on this CPU, from the instruction set torch reports.

The quantized few-row kernels (int4, int8 weight-only) read a matrix once per step and are bound by memory
on every x86 CPU. Steps of many rows are bound by compute, and there the fast kernel depends on the CPU:
bf16 matmuls and int8 x int8 (torch._int_mm) run on AVX-512 BF16 / VNNI / AMX units where a CPU has them,
and fall back to slow emulation where it does not. On an AVX2-only CPU a batch-16 int8 step took 2,357 ms
(_int_mm) against 238 ms in fp32, and bf16 took 363 ms: there the many-row copy is fp32 and int8 inputs
are never quantized. docs/runtimes.md has the measurements behind this rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CpuKernels:
    capability: str  # torch.backends.cpu.get_cpu_capability(): 'AVX512', 'AVX2', 'DEFAULT', ...
    dense_dtype: torch.dtype  # the dense copy many-row steps multiply by: bf16 or fp32
    int8_activations: bool  # many-row int8 steps quantize their inputs for torch._int_mm

    def describe(self) -> str:
        dense = "bf16" if self.dense_dtype == torch.bfloat16 else "fp32"
        int8 = "int8 x int8 (_int_mm)" if self.int8_activations else f"the {dense} copy"
        return (
            f"CPU capability {self.capability}: many-row steps multiply by a {dense} copy of int4 weights, "
            f"int8 weights through {int8}"
        )


def choose_kernels(capability: str, bf16_units: bool, int8_units: bool) -> CpuKernels:
    """The rule. capability is torch's (it follows ATEN_CPU_CAPABILITY, so a capped run gets the capped
    rule); bf16_units / int8_units: whether the CPU has AVX-512 BF16 or AMX, and VNNI or AMX. Those units
    are only used by torch's AVX-512 kernels, so below AVX512 they count as absent."""
    avx512 = capability.upper().startswith("AVX512")
    bf16 = avx512 and bf16_units
    return CpuKernels(capability, torch.bfloat16 if bf16 else torch.float32, avx512 and int8_units)


def this_cpu() -> CpuKernels:
    """choose_kernels for the CPU this process runs on (torch's private probes; absent ones count as no)."""

    def has(probe: str) -> bool:
        return bool(getattr(torch.cpu, probe, lambda: False)())

    amx = has("_is_amx_tile_supported")
    return choose_kernels(
        torch.backends.cpu.get_cpu_capability(),
        has("_is_avx512_bf16_supported") or amx,
        has("_is_vnni_supported") or amx,
    )
