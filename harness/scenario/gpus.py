"""The GPU table: each accelerator part's memory as the card reports it, memory bandwidth, GPU-to-GPU link and
dense tensor peak per precision, looked up by exact part name (`plan.hardware`, `plan.prices`, `bench memory
--hardware`) or by the name NVML reports (the roofline placement, harness/metrics/roofline.py).

Names are matched whole, ignoring case, spaces, dashes and underscores, never as substrings: `L40` is not
`L4`, `GH200` is not `H200`. A name without a form factor means the SXM part (`H100` is `H100-SXM`), as
vendors' tables and cloud listings use it; a name that covers parts with different memory (`A100`: 40 or
80 GB; `GH200`: 96 or 144 GB) is refused with the parts it could be. docs/planner.md has the table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MIB = 2**20
GIB = 2**30
PRECISIONS = ("bf16", "fp8", "int8", "fp4")  # the tensor peaks a part may have, dense (no sparsity)


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    """One accelerator part's figures. Peaks are dense: a datasheet figure quoted "with sparsity" is halved."""

    name: str
    bf16_flops: float  # BF16 (and FP16) tensor FLOP/s
    fp8_flops: float | None = None  # FP8 tensor FLOP/s; None: no FP8 tensor cores (A100)
    int8_ops: float | None = None  # INT8 tensor op/s
    fp4_flops: float | None = None  # FP4 tensor FLOP/s (Blackwell)
    hbm_bytes: float  # device memory as the card reports it (nvidia-smi's total, rocm-smi's VRAM total)
    hbm_bytes_per_s: float  # memory bandwidth (HBM, or GDDR6 on L4/L40/L40S)
    interconnect: str  # the GPU-to-GPU link tensor parallelism's all-reduces cross
    interconnect_bytes_per_s: float  # that link's total (both directions) per GPU, as quoted
    source: str  # the datasheet and the figures read from it
    memory_source: str = ""  # where hbm_bytes was read

    def tensor_flops(self, precision: str) -> float:
        """Dense tensor peak for `precision` (fp16 and bf16 share one peak on every part here)."""
        key = "bf16" if precision == "fp16" else precision
        if key not in PRECISIONS:
            raise ValueError(f"precision {precision!r}: use one of fp16, {', '.join(PRECISIONS)}")
        peak = self.tensor_peaks().get(key)
        if peak is None:
            raise ValueError(
                f"{self.name} has no {key} tensor cores (its peaks: {', '.join(self.tensor_peaks())}); compute "
                "in bf16 (weight-only quantization) or pick a part that has them"
            )
        return peak

    def tensor_peaks(self) -> dict[str, float]:
        """{precision: dense peak op/s} for the precisions this part has."""
        peaks = {"bf16": self.bf16_flops, "fp8": self.fp8_flops, "int8": self.int8_ops, "fp4": self.fp4_flops}
        return {precision: peak for precision, peak in peaks.items() if peak is not None}


class GpuNameError(ValueError):
    """A name that is not one part of the table: the message lists what it could be."""


# Vendors' datasheets, each entry's `source` quoting the figures used (* = quoted with sparsity, halved here).
A100_SHEET = "NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100/): BF16 624*, INT8 1,248* TOPS, no FP8"
H100_SHEET = "NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100/)"
H200_SHEET = "NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200/)"
GH200_SHEET = (
    "NVIDIA GH200 Grace Hopper Superchip datasheet (nvidia.com/en-us/data-center/grace-hopper-superchip/): "
    "BF16 1,979*, FP8 3,958*, INT8 3,958* TOPS"
)
NVSMI = "nvidia-smi's total"
T = 1e12


def _a100(memory_gb: int, form: str, mib: int, bandwidth: float, smi_name: str) -> GpuSpec:
    sxm = form == "SXM"
    return GpuSpec(
        name=f"A100-{memory_gb}GB-{form}",
        bf16_flops=624 * T / 2,
        int8_ops=1248 * T / 2,
        hbm_bytes=mib * MIB,
        hbm_bytes_per_s=bandwidth,
        # PCIe boards can bridge pairs over NVLink (600 GB/s); a TP group wider than a pair crosses PCIe Gen4
        interconnect="NVLink 3" if sxm else "PCIe Gen4 x16",
        interconnect_bytes_per_s=600e9 if sxm else 64e9,
        source=f"{A100_SHEET}, {memory_gb} GB {form} at {bandwidth / 1e9:,.0f} GB/s, NVLink 600 GB/s (SXM; PCIe: "
        "bridged pairs), PCIe Gen4 64 GB/s",
        memory_source=f"{NVSMI} {mib}MiB ({smi_name})",
    )


def _hopper(name: str, sparse_bf16_tflops: float, sparse_fp8_tflops: float, **figures) -> GpuSpec:
    """Hopper parts, from the datasheets' sparse figures: INT8 TOPS equal FP8 TFLOPS on every one."""
    fp8 = sparse_fp8_tflops * T / 2
    return GpuSpec(name=name, bf16_flops=sparse_bf16_tflops * T / 2, fp8_flops=fp8, int8_ops=fp8, **figures)


_PARTS = [
    _a100(40, "SXM", 40536, 1555e9, "NVIDIA A100-SXM4-40GB; some drivers show 40960MiB"),
    _a100(40, "PCIe", 40960, 1555e9, "NVIDIA A100-PCIE-40GB"),
    _a100(80, "SXM", 81920, 2039e9, "NVIDIA A100-SXM4-80GB"),
    _a100(80, "PCIe", 81920, 1935e9, "NVIDIA A100 80GB PCIe"),
    _hopper(
        "H100-SXM",
        1979,
        3958,
        hbm_bytes=81559 * MIB,
        hbm_bytes_per_s=3.35e12,
        interconnect="NVLink 4",
        interconnect_bytes_per_s=900e9,
        source=f"{H100_SHEET}, H100 SXM: BF16 1,979*, FP8 3,958*, INT8 3,958* TOPS, 80 GB at 3.35 TB/s, "
        "NVLink 900 GB/s",
        memory_source=f"{NVSMI} 81559MiB (NVIDIA H100 80GB HBM3)",
    ),
    _hopper(
        "H100-PCIe",
        1513,
        3026,
        hbm_bytes=81559 * MIB,
        hbm_bytes_per_s=2.0e12,
        # NVLink bridges join pairs (600 GB/s); a TP group wider than a pair crosses PCIe Gen5
        interconnect="PCIe Gen5 x16",
        interconnect_bytes_per_s=128e9,
        source=f"{H100_SHEET}, H100 PCIe (the sheet's revision before the NVL replaced it): BF16 1,513*, FP8 "
        "3,026*, INT8 3,026* TOPS, 80 GB at 2 TB/s, NVLink bridge 600 GB/s, PCIe Gen5 128 GB/s",
        memory_source=f"{NVSMI} 81559MiB (NVIDIA H100 PCIe)",
    ),
    _hopper(
        "H100-NVL",
        1671,
        3341,
        hbm_bytes=95830 * MIB,
        hbm_bytes_per_s=3.9e12,
        interconnect="NVLink 4 bridge (pairs)",
        interconnect_bytes_per_s=600e9,
        source=f"{H100_SHEET}, H100 NVL: BF16 1,671*, FP8 3,341*, INT8 3,341* TOPS, 94 GB at 3.9 TB/s, NVLink "
        "600 GB/s between a bridged pair, PCIe Gen5 128 GB/s beyond it",
        memory_source=f"{NVSMI} 95830MiB (NVIDIA H100 NVL)",
    ),
    _hopper(
        "H200-SXM",
        1979,
        3958,
        hbm_bytes=143771 * MIB,
        hbm_bytes_per_s=4.8e12,
        interconnect="NVLink 4",
        interconnect_bytes_per_s=900e9,
        source=f"{H200_SHEET}, H200 SXM: BF16 1,979*, FP8 3,958*, INT8 3,958* TOPS, 141 GB at 4.8 TB/s, "
        "NVLink 900 GB/s",
        memory_source=f"{NVSMI} 143771MiB (NVIDIA H200)",
    ),
    _hopper(
        "H200-NVL",
        1671,
        3341,
        hbm_bytes=143771 * MIB,
        hbm_bytes_per_s=4.8e12,
        interconnect="NVLink 4 bridge (2- or 4-way)",
        interconnect_bytes_per_s=900e9,
        source=f"{H200_SHEET}, H200 NVL: BF16 1,671*, FP8 3,341*, INT8 3,341* TOPS, 141 GB at 4.8 TB/s, "
        "2- or 4-way NVLink bridge 900 GB/s per GPU",
        memory_source=f"{NVSMI} 143771MiB (NVIDIA H200 NVL)",
    ),
    _hopper(
        "GH200-96GB",
        1979,
        3958,
        hbm_bytes=97871 * MIB,
        hbm_bytes_per_s=4.0e12,
        # GH200 NVL2/NVL32 join superchips' GPUs over NVLink; single-superchip nodes only over the network
        interconnect="NVLink 4",
        interconnect_bytes_per_s=900e9,
        source=f"{GH200_SHEET}, 96 GB HBM3 at 4 TB/s, NVLink 900 GB/s",
        memory_source=f"{NVSMI} 97871MiB (NVIDIA GH200 480GB, also shown as GH200 120GB)",
    ),
    _hopper(
        "GH200-144GB",
        1979,
        3958,
        hbm_bytes=145920 * MIB,
        hbm_bytes_per_s=4.9e12,
        interconnect="NVLink 4",
        interconnect_bytes_per_s=900e9,
        source=f"{GH200_SHEET}, 144 GB HBM3e at 4.9 TB/s, NVLink 900 GB/s",
        memory_source="CUDA's cuDeviceTotalMem 153008209920 bytes (NVIDIA GH200 144G HBM3e), as recorded in a public "
        "driver test; no nvidia-smi line seen",
    ),
    GpuSpec(
        name="H20",
        bf16_flops=148 * T,
        fp8_flops=296 * T,
        int8_ops=296 * T,
        hbm_bytes=97871 * MIB,
        hbm_bytes_per_s=4.0e12,
        interconnect="NVLink 4",
        interconnect_bytes_per_s=900e9,
        source="NVIDIA H20 product brief (China-market Hopper; partners' copies, not on nvidia.com): BF16 148, "
        "FP8 296, INT8 296 TOPS dense, 96 GB HBM3 at 4.0 TB/s, NVLink 900 GB/s. The later 141 GB HBM3e H20 is "
        "not this part: describe it under plan.gpus",
        memory_source=f"{NVSMI} 97871MiB (NVIDIA H20)",
    ),
    GpuSpec(
        name="L4",
        bf16_flops=242 * T / 2,
        fp8_flops=485 * T / 2,
        int8_ops=485 * T / 2,
        hbm_bytes=23034 * MIB,
        hbm_bytes_per_s=300e9,
        interconnect="PCIe Gen4 x16",  # no NVLink
        interconnect_bytes_per_s=64e9,
        source="NVIDIA L4 datasheet (nvidia.com/en-us/data-center/l4/): BF16 242*, FP8 485*, INT8 485* TOPS, "
        "24 GB GDDR6 at 300 GB/s, PCIe Gen4 x16",
        memory_source=f"{NVSMI} 23034MiB (NVIDIA L4)",
    ),
    GpuSpec(
        name="L40",
        bf16_flops=181.05 * T,
        fp8_flops=362 * T,
        int8_ops=362 * T,
        hbm_bytes=46068 * MIB,
        hbm_bytes_per_s=864e9,
        interconnect="PCIe Gen4 x16",
        interconnect_bytes_per_s=64e9,
        source="NVIDIA L40 datasheet (nvidia.com/en-us/data-center/l40/): BF16 181.05 | 362.1*, FP8 362 | 724*, "
        "INT8 362 | 724* TOPS, 48 GB GDDR6 at 864 GB/s, PCIe Gen4 x16",
        memory_source=f"{NVSMI} 46068MiB (NVIDIA L40)",
    ),
    GpuSpec(
        name="L40S",
        bf16_flops=362.05 * T,
        fp8_flops=733 * T,
        int8_ops=733 * T,
        hbm_bytes=46068 * MIB,
        hbm_bytes_per_s=864e9,
        interconnect="PCIe Gen4 x16",
        interconnect_bytes_per_s=64e9,
        source="NVIDIA L40S datasheet (nvidia.com/en-us/data-center/l40s/): BF16 362.05 | 733*, FP8 733 | 1,466*, "
        "INT8 733 | 1,466* TOPS, 48 GB GDDR6 at 864 GB/s, PCIe Gen4 x16",
        memory_source=f"{NVSMI} 46068MiB (NVIDIA L40S)",
    ),
    GpuSpec(
        name="B200",
        bf16_flops=36e15 / 8 / 2,
        fp8_flops=72e15 / 8 / 2,
        int8_ops=72e15 / 8 / 2,
        fp4_flops=144e15 / 8 / 2,
        hbm_bytes=183359 * MIB,
        # the driver reports a 7,680-bit bus at 3,996 MHz (7.67 TB/s); the datasheet's 8 TB/s is kept
        hbm_bytes_per_s=64e12 / 8,
        interconnect="NVLink 5",
        interconnect_bytes_per_s=1.8e12,
        source="NVIDIA HGX B200 datasheet (nvidia.com/en-us/data-center/hgx/), 8 GPUs: BF16 36*, FP8 72*, INT8 72* "
        "POPS, FP4 144* PFLOPS, 1.44 TB HBM3e at 64 TB/s; NVLink 5 1.8 TB/s per GPU",
        memory_source=f"{NVSMI} 183359MiB (NVIDIA B200)",
    ),
    GpuSpec(
        name="GB200",
        bf16_flops=10e15 / 2 / 2,
        fp8_flops=20e15 / 2 / 2,
        int8_ops=20e15 / 2 / 2,
        fp4_flops=40e15 / 2 / 2,
        hbm_bytes=189471 * MIB,
        hbm_bytes_per_s=16e12 / 2,
        interconnect="NVLink 5",
        interconnect_bytes_per_s=1.8e12,
        source="NVIDIA GB200 NVL72 datasheet (nvidia.com/en-us/data-center/gb200-nvl72/), per superchip (1 Grace, "
        "2 Blackwell GPUs): BF16 10*, FP8 20*, INT8 20* POPS, FP4 40* PFLOPS, up to 372 GB HBM3e at 16 TB/s; "
        "NVLink 5 1.8 TB/s per GPU",
        memory_source=f"{NVSMI} 189471MiB (NVIDIA GB200)",
    ),
    GpuSpec(
        name="MI300X",
        bf16_flops=1307.4 * T,
        fp8_flops=2614.9 * T,
        int8_ops=2614.9 * T,
        hbm_bytes=192 * GIB,
        hbm_bytes_per_s=5.3e12,
        interconnect="Infinity Fabric (xGMI)",
        interconnect_bytes_per_s=896e9,  # 7 links of 128 GB/s
        source="AMD Instinct MI300X datasheet (amd.com/en/products/accelerators/instinct/mi300/mi300x.html): "
        "BF16 1,307.4, FP8 2,614.9, INT8 2,614.9 TOPS dense, 192 GB HBM3 at 5.3 TB/s, Infinity Fabric 7 x 128 GB/s",
        memory_source="rocm-smi's VRAM Total Memory 206158430208 bytes (192 GiB)",
    ),
    GpuSpec(
        name="MI325X",
        bf16_flops=1307.4 * T,
        fp8_flops=2614.9 * T,
        int8_ops=2614.9 * T,
        hbm_bytes=256 * GIB,
        hbm_bytes_per_s=6.0e12,
        interconnect="Infinity Fabric (xGMI)",
        interconnect_bytes_per_s=896e9,
        source="AMD Instinct MI325X datasheet (amd.com/en/products/accelerators/instinct/mi300/mi325x.html): "
        "BF16 1,307.4, FP8 2,614.9, INT8 2,614.9 TOPS dense, 256 GB HBM3E at 6 TB/s, Infinity Fabric 7 x 128 GB/s",
        memory_source="256 GiB assumed: 8 stacks of 32 GiB, reported in full as the MI300X's 192 GiB is; "
        "no rocm-smi line seen",
    ),
]
GPU_SPECS = {spec.name: spec for spec in _PARTS}

# other spellings -> the part: nvidia-smi's / NVML's names (less the vendor prefix) and common shorthands
_ALIASES = {
    "A100-40GB-SXM": ["A100-40GB", "A100-SXM-40GB", "A100-SXM4-40GB"],
    "A100-40GB-PCIe": ["A100-PCIe-40GB"],
    "A100-80GB-SXM": ["A100-80GB", "A100-SXM-80GB", "A100-SXM4-80GB"],
    "A100-80GB-PCIe": ["A100-PCIe-80GB"],
    "H100-SXM": ["H100", "H100-SXM5", "H100 SXM5 80GB", "H100-SXM-80GB", "H100 80GB", "H100 80GB HBM3"],
    "H100-PCIe": ["H100 PCIe 80GB"],
    "H100-NVL": ["H100 NVL 94GB"],
    "H200-SXM": ["H200", "H200 141GB", "H200 SXM 141GB"],
    "H200-NVL": [],
    "GH200-96GB": ["GH200 480GB", "GH200 120GB", "GH200 96GB HBM3"],
    "GH200-144GB": ["GH200 144G HBM3e", "GH200 144GB HBM3e"],
    "H20": ["H20 96GB"],
    "B200": ["B200-SXM", "HGX B200"],
    "MI300X": ["MI300X OAM"],
    "MI325X": ["MI325X OAM"],
}
# names that cover parts with different memory: refused with the parts they could be
_AMBIGUOUS = {
    "A100": ["A100-40GB-SXM", "A100-80GB-SXM", "A100-40GB-PCIe", "A100-80GB-PCIe"],
    "A100-SXM": ["A100-40GB-SXM", "A100-80GB-SXM"],
    "A100-SXM4": ["A100-40GB-SXM", "A100-80GB-SXM"],
    "A100-PCIe": ["A100-40GB-PCIe", "A100-80GB-PCIe"],
    "GH200": ["GH200-96GB", "GH200-144GB"],
}
_VENDOR_PREFIXES = ("nvidia", "tesla", "amdinstinct", "amd", "instinct")


def normalized_gpu_name(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h10080gbhbm3': lower case, no vendor prefix, letters and digits only."""
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    for prefix in _VENDOR_PREFIXES:
        if key.startswith(prefix) and len(key) > len(prefix):
            key = key[len(prefix) :]
    return key


_BY_KEY = {normalized_gpu_name(name): name for name in GPU_SPECS} | {
    normalized_gpu_name(alias): name for name, aliases in _ALIASES.items() for alias in aliases
}
_AMBIGUOUS_BY_KEY = {normalized_gpu_name(name): parts for name, parts in _AMBIGUOUS.items()}


def table_gpu_name(name: str) -> str | None:
    """The table's name for a part written any accepted way, None for a name it does not know (or ambiguous)."""
    return _BY_KEY.get(normalized_gpu_name(name))


def is_table_name(name: str) -> bool:
    """A name the table answers, or refuses as ambiguous: a custom GPU may not take it."""
    key = normalized_gpu_name(name)
    return key in _BY_KEY or key in _AMBIGUOUS_BY_KEY


def resolve_gpu(name: str, custom: dict[str, GpuSpec] | None = None) -> GpuSpec:
    """The part `name` means: one of `custom` (the scenario's plan.gpus, by the same loose matching), else the
    table's. GpuNameError (without the field's name: callers add it) for an unknown or ambiguous name."""
    key = normalized_gpu_name(name)
    for custom_name, spec in (custom or {}).items():
        if normalized_gpu_name(custom_name) == key:
            return spec
    if key in _AMBIGUOUS_BY_KEY:
        raise GpuNameError(f"names several parts; use one of {', '.join(_AMBIGUOUS_BY_KEY[key])}")
    if key not in _BY_KEY:
        extra = f"{', '.join(custom)} (plan.gpus) or " if custom else ""
        raise GpuNameError(
            f"not in the GPU table; use one of {extra}{', '.join(GPU_SPECS)}, or describe it under plan.gpus "
            "(docs/planner.md)"
        )
    return GPU_SPECS[_BY_KEY[key]]


def gpu_spec(name: str, field: str = "hardware") -> GpuSpec:
    """The table's part for `name`, or a ValueError naming `field` and the parts it could be."""
    try:
        return resolve_gpu(name)
    except GpuNameError as e:
        raise ValueError(f"{field} {name!r}: {e}") from None


def nvml_gpu(name: str | None) -> GpuSpec | None:
    """The part an NVML/ROCm device name ('NVIDIA H100 80GB HBM3', 'NVIDIA A100-SXM4-40GB', 'AMD Instinct
    MI300X') reports, None for a device the table does not know."""
    part = table_gpu_name(name) if name else None
    return GPU_SPECS[part] if part else None


def gpu_peaks(name: str | None) -> tuple[float, float] | None:
    """(dense BF16 FLOP/s, memory bytes/s) of the part an NVML device name reports, None when unknown."""
    spec = nvml_gpu(name)
    return (spec.bf16_flops, spec.hbm_bytes_per_s) if spec else None
