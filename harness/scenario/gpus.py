"""The GPU table: each accelerator's published peaks, memory and interconnect, which `plan.hardware` names and
the roofline placement (harness/metrics/roofline.py) reads."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator's published figures (SXM/OAM parts unless the name says otherwise)."""

    bf16_flops: float  # dense BF16 tensor FLOP/s (the sparsity-doubled figure halved)
    hbm_bytes_per_s: float  # memory bandwidth
    hbm_bytes: float  # memory size, decimal GB as the datasheets quote it
    interconnect: str  # the GPU-to-GPU link tensor parallelism's all-reduces cross
    interconnect_bytes_per_s: float  # that link's total (both directions) per GPU, as quoted
    source: str


# Vendors' datasheets: nvidia.com/en-us/data-center/{h100,h200,a100,l40s,l4,hgx}/ (HGX B200: 1.44 TB
# over 8 GPUs), amd.com/en/products/accelerators/instinct/mi300/mi300x.html (Infinity Fabric: 7 links
# of 128 GB/s). L40S and L4 have no NVLink: their GPUs talk over PCIe Gen4 x16 (64 GB/s both ways).
GPU_SPECS = {
    "H200": GpuSpec(989e12, 4.8e12, 141e9, "NVLink 4", 900e9, "NVIDIA H200 Tensor Core GPU datasheet"),
    "H100": GpuSpec(989e12, 3.35e12, 80e9, "NVLink 4", 900e9, "NVIDIA H100 Tensor Core GPU datasheet (SXM5)"),
    "A100": GpuSpec(312e12, 2.039e12, 80e9, "NVLink 3", 600e9, "NVIDIA A100 datasheet (80GB SXM)"),
    "L40S": GpuSpec(362e12, 0.864e12, 48e9, "PCIe Gen4 x16", 64e9, "NVIDIA L40S datasheet"),
    "L4": GpuSpec(121e12, 0.3e12, 24e9, "PCIe Gen4 x16", 64e9, "NVIDIA L4 Tensor Core GPU datasheet"),
    "B200": GpuSpec(2250e12, 8.0e12, 180e9, "NVLink 5", 1800e9, "NVIDIA HGX B200 datasheet, per GPU"),
    "MI300X": GpuSpec(1307e12, 5.3e12, 192e9, "Infinity Fabric (xGMI)", 896e9, "AMD Instinct MI300X datasheet"),
}
# name fragment -> (dense BF16 tensor FLOP/s, memory bytes/s), what the roofline placement reads
GPU_PEAKS = {name: (spec.bf16_flops, spec.hbm_bytes_per_s) for name, spec in GPU_SPECS.items()}


def gpu_spec(name: str) -> GpuSpec:
    """The table entry whose name appears in `name` (longest first: 'L40S' before 'L4'), or an error listing them."""
    for key in sorted(GPU_SPECS, key=len, reverse=True):
        if key.lower() in name.lower():
            return GPU_SPECS[key]
    raise ValueError(f"hardware {name!r}: not in the GPU table; use one of {', '.join(GPU_SPECS)}")


def gpu_peaks(name: str | None) -> tuple[float, float] | None:
    """(FLOP/s, bytes/s) of the first table entry whose name appears in `name` (longest first)."""
    for key in sorted(GPU_PEAKS, key=len, reverse=True):
        if name and key.lower() in name.lower():
            return GPU_PEAKS[key]
    return None
