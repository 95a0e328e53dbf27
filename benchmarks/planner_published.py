"""How close `bench plan` comes to serving measurements others published for real GPUs (issue 38, part 5).

Each row of benchmarks/published/gpu_rows.yaml (MLPerf Inference, TensorRT-LLM's performance overview, SGLang's
engine comparison, NVIDIA NIM's concurrency sweep, a vLLM blog table) becomes the scenario a user would write for
that deployment: `plan:` with the GPU table's part, a built-in architecture, the roofline step model, the row's
tensor parallelism and precision; `backend:` with the engine and the flags the published setup states; the row's
lengths and load. The scenario is loaded by the scenario loader `bench plan` uses and simulated by `bench plan`'s
own simulator at its stated defaults. Nothing is tuned here: the script only reports.

Printed: per row and metric the published value, the planned one and the signed error (planned - published) /
published; MAPE per metric family (throughput, TTFT p50, TTFT mean, TPOT/ITL p50, ITL mean, E2E p50, p99s) and
the p50/p90 of the absolute errors (the error bands), separately for calibration and held-out rows; the rows the
planner cannot express, each with its reason; the knee check (where TTFT explodes along a sweep, published and
planned); the orderings (held-out pairs that differ in one of GPU, TP, load, replicas, KV dtype: is the planned
order the published one).

  PYTHONPATH=. python benchmarks/planner_published.py [--split heldout|calibration|all] [--rows ID,ID]
      [--no-engine-flags] [--json out.json] [--jobs N]

--no-engine-flags leaves backend.launch.args empty, so every row runs at its engine profile's defaults: what the
published settings change, and a way to run where a planner does not read an engine's own flags.
Which flags each row carries, and the lengths given for variable-length datasets: benchmarks/published/README.md.

Run 2026-12-07 18:59-19:18 UTC on the 2-core VM (load 2-4), `--split heldout --jobs 2`, engine flags on, commit
d1e5032 (compute and reads added per kernel group, mfu 0.6; MLPerf Server rows over LoadGen's 600 s): 73 rows,
1,113 s. Held-out MAPE: throughput 13.4% (p50 7.2%, p90 41.9%), TTFT p50 125.1% (p50 67.4%), TTFT mean 29.1%,
TPOT/ITL p50 32.9% (p50 20.2%), ITL mean 9.4%, E2E p50 37.1%. The serving-benchmark rows' TTFT p50 within 10% but
vLLM 0.6.0's (multi-step scheduling, -70%); MLPerf Server latencies follow the plan's capacity error, magnified: 60-90%
low where it is too high, TTFT +616% and +832% on the two v5.1 H200 Server rows where it is 17-20% too low.
Knees: the TensorRT-LLM QPS sweeps on the published step, NIM's one step late. Orderings: 158 of 158 held-out pairs
right. docs/planner.md, "Against published GPU measurements", has the table and the analysis.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.scenario.scenario import ScenarioError, load_scenario  # noqa: E402

ROWS_PATH = ROOT / "benchmarks" / "published" / "gpu_rows.yaml"
LENGTHS_PATH = ROOT / "benchmarks" / "published" / "lengths.yaml"


@dataclass(frozen=True)
class GpuPart:
    """The GPU table's part (harness/scenario/gpus.py) a row's `gpu` is simulated on, and why when it is a choice."""

    part: str
    note: str = ""


SXM_BY_DEFAULT = "form factor not stated: the SXM part, the table's default for a bare name"
GPU_PARTS = {
    "H100 SXM 80GB": GpuPart("H100-SXM"),
    "H100 80GB (form factor not stated)": GpuPart(
        "H100-SXM", f"{SXM_BY_DEFAULT} (SGLang ran 70B at TP4 and NIM at TP2 over NVLink-class links; PCIe 80GB too)"
    ),
    "H100 (variant not stated)": GpuPart("H100-SXM", f"{SXM_BY_DEFAULT}; could be the PCIe or NVL card"),
    "H100 NVL 94GB": GpuPart("H100-NVL"),
    "H100 PCIe 80GB": GpuPart("H100-PCIe"),
    "H200 SXM 141GB": GpuPart("H200-SXM"),
    "H200 NVL 141GB": GpuPart("H200-NVL"),
    "H200 141GB (form factor not stated)": GpuPart(
        "H200-SXM", f"{SXM_BY_DEFAULT}; TensorRT-LLM's v0.14-v0.17 pages predate the H200 NVL's launch"
    ),
    "GH200 144GB": GpuPart("GH200-144GB"),
    # "GH200 480GB" is nvidia-smi's name for the 96 GB HBM3 superchip (harness/scenario/gpus.py memory_source), and
    # TensorRT-LLM's later perf overview lists the part as "GH200 96GB HBM3 (480GB LPDDR5X)"
    # (nvidia.github.io/TensorRT-LLM/performance/perf-overview.html, Hardware)
    "GH200 480GB (as published)": GpuPart("GH200-96GB", "480 GB is HBM + LPDDR5X: the 96 GB HBM3 GH200"),
    "B200 SXM 180GB": GpuPart("B200"),
    "GB200 192GB": GpuPart("GB200", "one GPU of an NVL72 rack; the rack's NVLink domain is not modelled"),
    "A100 SXM 80GB": GpuPart("A100-80GB-SXM"),
    "A100 80GB (form factor not stated)": GpuPart("A100-80GB-SXM", SXM_BY_DEFAULT),
    "L40S 48GB": GpuPart("L40S"),
    "MI300X 192GB": GpuPart("MI300X"),
}
# Hugging Face model -> harness/plan/architectures.py BUILTIN (Instruct and base share one config)
ARCHITECTURES = {
    "meta-llama/Llama-2-70b-chat-hf": "llama-2-70b",
    "meta-llama/Llama-3.1-8B": "llama-3.1-8b",
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Llama-3.1-70B": "llama-3.1-70b",
    "meta-llama/Llama-3.1-70B-Instruct": "llama-3.1-70b",
    # Llama 3.3 70B keeps 3.1's architecture (80 layers, 8192 hidden, 64/8 heads, FFN 28672, vocab 128256)
    "meta-llama/Llama-3.3-70B-Instruct": "llama-3.1-70b",
    "meta-llama/Llama-3.1-405B-Instruct": "llama-3.1-405b",
}
# NIM runs a pre-built TensorRT-LLM engine for an "optimized" profile such as fp8 TP2 on H100 ("NIM for LLMs
# downloads pre-compiled TensorRT-LLM engines for optimized profiles"; generic profiles, named vllm or local_build,
# run where no optimized one fits: docs.nvidia.com/nim/large-language-models/1.5.0/profiles.html)
ENGINE_KINDS = {"vllm": "vllm", "sglang": "sglang", "trtllm": "trtllm", "nim": "trtllm"}
# The precisions the rows leave `unstated`, by row id prefix: (weights or None, kv_cache or None, why)
UNSTATED_PRECISION = {
    "mlperf41-nvidia-b200x1": (
        "fp4",
        "fp8",
        "NVIDIA's v4.1 calibration.md: on FP4-capable parts selected linear/MLP layers are FP4 and KV entries "
        "quantized; its v5.1 B200 configs say precision fp4 with kv_cache_dtype fp8. The planner puts every layer "
        "at fp4 (the mixed FP4/FP8 layer choice is not expressible)",
    ),
    "mlperf51-nvidia-b200x8-llama2-70b-interactive": (
        None,
        "auto",
        "the Interactive config (configs/B200-SXM-180GBx8/Interactive/llama2-70b.py) sets no trtllm_checkpoint_flags "
        "kv_cache_dtype where Offline and Server set fp8: the KV cache stays in the activations' 16 bits",
    ),
    "trt10-": (
        None,
        "auto",
        "TensorRT-LLM's PyTorch flow takes the KV dtype from the ModelOpt checkpoint, and nvidia/Llama-3.1-405B-"
        "Instruct-FP8's hf_quant_config.json says kv_cache_quant_algo null; the page's llm_options set none "
        "(TensorRT-LLM's quantization docs: FP8 KV is enabled by hand for checkpoints without it)",
    ),
    "nim180-": (
        None,
        "fp8",
        "NIM's fp8 profile is a TensorRT-LLM engine built with FP8 quantization, and TensorRT-LLM's v0.17 perf "
        "overview says FP8 quantization sets the KV cache to FP8 as well",
    ),
}


@dataclass(frozen=True, kw_only=True)
class EngineSettings:
    """What a published setup states beyond TP: its batch limit, token budget a step and memory share."""

    max_batch: int | None = None
    max_tokens: int | None = None
    memory_fraction: float | None = None
    extra: tuple[str, ...] = ()  # the engine's own flags, as written
    source: str = ""


MLPERF41 = "mlcommons/inference_results_v4.1 @ 198fc46799b3328b36ee4bcbdebfa2db5a8e6183"
MLPERF51 = "mlcommons/inference_results_v5.1 @ 965182b03376a00fcae415c54e560e1c83937932"
V41_TOKENS = 4096  # max_num_tokens of every v4.1 submitter's configs/llama2-70b/__init__.py GPUBaseConfig
V41_NV = f"{MLPERF41} closed/NVIDIA/configs/llama2-70b/{{}}/__init__.py"


def _v41(batch: int, fraction: float, where: str) -> EngineSettings:
    return EngineSettings(max_batch=batch, max_tokens=V41_TOKENS, memory_fraction=fraction, source=where)


def _v51(batch: int, tokens: int, fraction: float, where: str) -> EngineSettings:
    """v5.1's TensorRT-LLM configs: trtllm_runtime_flags max_num_tokens, kvcache_free_gpu_mem_frac and
    enable_chunked_context True, gpu_batch_size."""
    return EngineSettings(
        max_batch=batch,
        max_tokens=tokens,
        memory_fraction=fraction,
        extra=("--enable_chunked_prefill",),
        source=f"{MLPERF51} {where}",
    )


AMD41 = f"{MLPERF41} closed/AMD/code/llama2-70b-99/test_VllmFp8/test_VllmFp8_{{}}_perf.sh"
AMD51 = f"{MLPERF51} closed/AMD/code/llama2-70b-99/harness_llm/models/llama2-70b/{{}}_mi300x.yaml"
AMD51_FLAGS = ("--quantization", "fp8", "--max-model-len", "2048", "--max-num-batched-tokens", "40960")
AMD51_FLAGS += ("--no-enable-chunked-prefill", "--block-size", "32", "--no-enable-prefix-caching", "--enforce-eager")
AMD41_FLAGS = ("--quantization", "fp8", "--kv-cache-dtype", "fp8")
SGLANG_README = "sgl-project/sglang @ 120affb9613cc3f5bcd055ec09c7621d3ced0ebc benchmark/benchmark_vllm_060/README.md"
VLLM060_FLAGS = ("--disable-log-requests", "--max-model-len", "4096")
SGLANG8B_FLAGS = ("--enable-torch-compile", "--disable-radix-cache")
TRT_FRACTION = "TensorRT-LLM perf overview: kv_cache_free_gpu_mem_fraction 0.95 'in majority of cases' (0.90 on OOM)"
# The settings each published setup states, by row id or group (a group's rows share them). Rows absent ran at the
# engine's defaults (TensorRT-LLM v0.14 online: not stated; NIM: the profile's; vLLM blog: none but the KV dtype).
PUBLISHED_SETTINGS = {
    "mlperf41-nvidia-dgx-h100x8-llama2-70b-offline": _v41(896, 0.90, V41_NV.format("Offline")),
    "mlperf41-nvidia-dgx-h100x8-llama2-70b-server": _v41(1024, 0.90, V41_NV.format("Server")),
    "mlperf41-nvidia-h200x8-llama2-70b-offline": _v41(806, 0.90, V41_NV.format("Offline")),
    "mlperf41-nvidia-h200x8-llama2-70b-server": _v41(896, 0.90, V41_NV.format("Server")),
    "mlperf41-nvidia-gh200x1-llama2-70b": _v41(806, 0.90, V41_NV.format("Offline and Server")),
    "mlperf41-hpe-h100nvl-x4-llama2-70b-offline": _v41(
        1300, 0.95, f"{MLPERF41} closed/HPE/configs/llama2-70b/Offline/custom.py"
    ),
    "mlperf41-hpe-h100nvl-x4-llama2-70b-server": _v41(
        1024, 0.95, f"{MLPERF41} closed/HPE/configs/llama2-70b/Server/custom.py"
    ),
    "mlperf41-asus-h100pcie-x8-llama2-70b-offline": _v41(
        896, 0.97, f"{MLPERF41} closed/ASUSTeK/configs/llama2-70b/Offline/custom.py"
    ),
    "mlperf41-asus-h100pcie-x8-llama2-70b-server": _v41(
        896, 0.95, f"{MLPERF41} closed/ASUSTeK/configs/llama2-70b/Server/custom.py"
    ),
    "mlperf41-fujitsu-l40s-x8-llama2-70b": _v41(
        1024, 0.90, f"{MLPERF41} closed/Fujitsu/configs/llama2-70b/*/custom.py"
    ),
    "mlperf41-dell-h100sxm-x4-llama2-70b-offline": _v41(
        896, 0.90, f"{MLPERF41} closed/Dell/configs/llama2-70b/Offline/custom.py"
    ),
    "mlperf41-dell-h100sxm-x4-llama2-70b-server": _v41(
        1024, 0.90, f"{MLPERF41} closed/Dell/configs/llama2-70b/Server/custom.py"
    ),
    "mlperf41-amd-mi300x-x1-llama2-70b-offline": EngineSettings(
        memory_fraction=0.99, extra=(*AMD41_FLAGS, "--enforce-eager"), source=AMD41.format("Offline")
    ),
    "mlperf41-amd-mi300x-x8-llama2-70b-offline": EngineSettings(
        memory_fraction=0.99, extra=(*AMD41_FLAGS, "--enforce-eager"), source=AMD41.format("Offline")
    ),
    "mlperf41-amd-mi300x-x1-llama2-70b-server": EngineSettings(extra=AMD41_FLAGS, source=AMD41.format("AsyncServer")),
    "mlperf41-amd-mi300x-x8-llama2-70b-server": EngineSettings(extra=AMD41_FLAGS, source=AMD41.format("AsyncServer")),
    "mlperf51-nvidia-b200x8-llama2-70b-offline": _v51(
        2048, 3584, 0.95, "closed/NVIDIA/configs/B200-SXM-180GBx8/Offline/llama2-70b.py"
    ),
    "mlperf51-nvidia-b200x8-llama2-70b-server": _v51(
        2048, 3584, 0.95, "closed/NVIDIA/configs/B200-SXM-180GBx8/Server/llama2-70b.py"
    ),
    "mlperf51-nvidia-b200x8-llama2-70b-interactive": _v51(
        768, 768, 0.95, "closed/NVIDIA/configs/B200-SXM-180GBx8/Interactive/llama2-70b.py"
    ),
    "mlperf51-nvidia-b200x8-llama3.1-8b": _v51(
        6000, 12000, 0.90, "closed/NVIDIA/configs/B200-SXM-180GBx8/*/llama3_1-8b.py"
    ),
    "mlperf51-cisco-h200x8-llama2-70b-offline": _v51(
        2048, 1536, 0.90, "closed/Cisco/configs/C885_H200x8/Offline/llama2-70b.py"
    ),
    "mlperf51-cisco-h200x8-llama2-70b-server": _v51(
        2048, 1536, 0.90, "closed/Cisco/configs/C885_H200x8/Server/llama2-70b.py"
    ),
    "mlperf51-cisco-h200x8-llama2-70b-interactive": _v51(
        512, 256, 0.90, "closed/Cisco/configs/C885_H200x8/Interactive/llama2-70b.py"
    ),
    "mlperf51-dell-h200nvl-x8-llama2-70b-offline": _v51(
        2048, 1536, 0.90, "closed/Dell/configs/XE7745_H200_NVL_141GBx8/Offline/llama2-70b.py"
    ),
    "mlperf51-dell-h200nvl-x8-llama2-70b-server": _v51(
        2048, 1536, 0.90, "closed/Dell/configs/XE7745_H200_NVL_141GBx8/Server/llama2-70b.py"
    ),
    "mlperf51-dell-h200nvl-x8-llama2-70b-interactive": _v51(
        256, 256, 0.90, "closed/Dell/configs/XE7745_H200_NVL_141GBx8/Interactive/llama2-70b.py"
    ),
    "mlperf51-cisco-h200nvl-x8-llama3.1-8b": _v51(
        2048, 1536, 0.90, "closed/Cisco/configs/C845A_H200_NVLx8/*/llama3_1-8b.py"
    ),
    "mlperf51-amd-mi300x-x8-llama2-70b-offline": EngineSettings(
        max_batch=1792, memory_fraction=0.98, extra=AMD51_FLAGS, source=AMD51.format("offline")
    ),
    "mlperf51-amd-mi300x-x8-llama2-70b-server": EngineSettings(
        max_batch=650, memory_fraction=1.0, extra=AMD51_FLAGS, source=AMD51.format("server")
    ),
    "mlperf51-amd-mi300x-x8-llama2-70b-interactive": EngineSettings(
        max_batch=600, memory_fraction=1.0, extra=AMD51_FLAGS, source=AMD51.format("interactive")
    ),
    "trt017-": EngineSettings(memory_fraction=0.95, source=f"{TRT_FRACTION} (@258c754)"),
    "trt10-": EngineSettings(memory_fraction=0.95, source=f"{TRT_FRACTION} (@00f3768: 'in many cases')"),
    # vLLM 0.6.0 also ran --num-scheduler-steps 10, which no vLLM profile takes (multi-step scheduling is not
    # expressible: those rows' ITL is left out); --disable-log-requests and --enable-torch-compile change nothing a
    # plan models (accepted and ignored)
    "sglang030-vllm060-llama31-8b-a100-online-vllm": EngineSettings(extra=VLLM060_FLAGS, source=SGLANG_README),
    "sglang030-vllm060-llama31-8b-a100-offline-vllm": EngineSettings(extra=VLLM060_FLAGS, source=SGLANG_README),
    "sglang030-vllm060-llama31-70b-h100x4-online-vllm": EngineSettings(extra=VLLM060_FLAGS, source=SGLANG_README),
    "sglang030-vllm060-llama31-70b-h100x4-offline-vllm": EngineSettings(extra=VLLM060_FLAGS, source=SGLANG_README),
    "sglang030-vllm060-llama31-8b-a100-online-sglang": EngineSettings(extra=SGLANG8B_FLAGS, source=SGLANG_README),
    "sglang030-vllm060-llama31-8b-a100-offline-sglang": EngineSettings(extra=SGLANG8B_FLAGS, source=SGLANG_README),
    "sglang030-vllm060-llama31-70b-h100x4-online-sglang": EngineSettings(
        extra=("--disable-radix-cache",), source=SGLANG_README
    ),
    # published as --mem-frac 0.88 (argparse's abbreviation of --mem-fraction-static)
    "sglang030-vllm060-llama31-70b-h100x4-offline-sglang": EngineSettings(
        memory_fraction=0.88, extra=("--disable-radix-cache",), source=SGLANG_README
    ),
    "vllmblog-fp8kv-llama31-8b-h100-c8-kvfp8": EngineSettings(
        extra=("--kv-cache-dtype", "fp8"), source="vllm-project.github.io @ c3a01c4 _posts/2026-04-22-fp8-kvcache.md"
    ),
}
# Each engine's spelling of TP, batch limit, token budget a step and memory share (vLLM: vllm serve --help; SGLang:
# python -m sglang.launch_server --help; TensorRT-LLM: trtllm-serve --help); None: no such flag
ENGINE_FLAG_NAMES = {
    "vllm": ("--tensor-parallel-size", "--max-num-seqs", "--max-num-batched-tokens", "--gpu-memory-utilization"),
    "sglang": ("--tp-size", "--max-running-requests", None, "--mem-fraction-static"),
    "trtllm": ("--tp_size", "--max_batch_size", "--max_num_tokens", "--kv_cache_free_gpu_memory_fraction"),
}
# Metrics a row publishes that are not compared, and why
NOT_COMPARED = {
    "duration_s": "the run's length: output_tokens_per_s x duration_s is its token count, so it repeats that metric"
}
MULTI_STEP_ITL = "vLLM 0.6.0 ran --num-scheduler-steps 10 (tokens stream in bursts of 10): not expressible"


def settings_for(row: dict) -> EngineSettings | None:
    """The published settings of the row: by its id, its group, or an id prefix ending in '-'."""
    for key in (row["id"], row["group"]):
        if key in PUBLISHED_SETTINGS:
            return PUBLISHED_SETTINGS[key]
    prefixes = [k for k in PUBLISHED_SETTINGS if k.endswith("-") and row["id"].startswith(k)]
    return PUBLISHED_SETTINGS[prefixes[0]] if prefixes else None


def engine_flags(row: dict, kind: str) -> list[str]:
    """backend.launch.args as the published setup wrote them in the engine's own flags (NIM: none, its profile)."""
    if row["engine"] == "nim":
        return []
    tp_flag, batch_flag, tokens_flag, memory_flag = ENGINE_FLAG_NAMES[kind]
    args = [tp_flag, str(row["tensor_parallel"])]
    settings = settings_for(row)
    if settings is None:
        return args
    for flag, value in ((batch_flag, settings.max_batch), (tokens_flag, settings.max_tokens)):
        if flag is not None and value is not None:
            args += [flag, str(value)]
    if settings.memory_fraction is not None:
        args += [memory_flag, f"{settings.memory_fraction:g}"]
    return args + list(settings.extra)


# ---- precision, lengths and load


def precision(row: dict) -> tuple[dict, list[str]]:
    """plan.weight_dtype and plan.kv_cache_dtype for the row, and the notes for what was chosen for it.
    ValueError when a precision is unstated and no rule above says what the published config ran."""
    weights, kv = row["precision"]["weights"], row["precision"]["kv_cache"]
    notes = []
    if "unstated" in (weights, kv):
        rule = next((v for k, v in UNSTATED_PRECISION.items() if row["id"].startswith(k)), None)
        if rule is None:
            raise ValueError(f"precision unstated (weights {weights}, KV cache {kv}) and no published default known")
        rule_weights, rule_kv, why = rule
        weights = rule_weights if weights == "unstated" else weights
        kv = rule_kv if kv == "unstated" else kv
        notes.append(f"unstated precision taken as weights {weights}, KV {kv}: {why}")
    if weights == "unstated" or kv == "unstated":
        raise ValueError(f"precision unstated (weights {weights}, KV cache {kv})")
    return {"weight_dtype": weights, "kv_cache_dtype": kv}, notes


def load_lengths(path: Path = LENGTHS_PATH) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def lengths(row: dict, datasets: dict) -> tuple[dict, dict]:
    """(input_tokens, output_tokens) as the scenario's distribution forms: fixed where the row states both lengths,
    else the dataset's entry in lengths.yaml with the row's own numbers where it says so."""
    workload, entry = row["workload"], datasets.get(row["workload"]["dataset"])
    if entry is None:
        if workload["input_tokens"] is None or workload["output_tokens"] is None:
            raise ValueError(f"variable lengths of dataset {workload['dataset']!r} and none in lengths.yaml")
        return _fixed(workload["input_tokens"]), _fixed(workload["output_tokens"])
    if "range_ratio" in entry:
        ratio = entry["range_ratio"]
        return _uniform(workload["input_tokens"], ratio), _uniform(workload["output_tokens"], ratio)
    output = dict(entry["output_tokens"])
    if "output_mean_from" in entry:
        mean = workload[entry["output_mean_from"]]
        output = {**{k: v for k, v in output.items() if k != "std_over_mean"}, "mean": mean}
        output["std"] = round(mean * entry["output_tokens"]["std_over_mean"], 1)
    return dict(entry["input_tokens"]), output


def _fixed(tokens: int) -> dict:
    return {"dist": "fixed", "mean": tokens}


def _uniform(tokens: int, ratio: float) -> dict:
    return {"dist": "uniform", "min": math.floor(tokens * (1 - ratio)), "max": math.ceil(tokens * (1 + ratio))}


# How many requests a row's simulation plays: the published count where it is small enough to play whole (the drain
# then weighs on throughput as it did there), else bounded. Offline: 3,000 a replica (trtllm-bench's own count for
# 1000/1000 and 2048/128), enough for a few full batches of ~700 70B sequences. Open loop without a published count
# (MLPerf Server and Interactive): LoadGen's shortest run, 600 s of the rate (`*.Server.min_duration = 600000`,
# mlcommons/inference loadgen/mlperf.conf @ 001712e9daf80386e0dda43f97b8f36981d792c4), at least 1,000 requests, at
# most 40,000 (350 s at the fastest 70B row's 114 req/s). Its answers take 10-150 s near capacity: 60 s of arrivals,
# the rule until 2026-12-07, ended while the replicas' batches were still filling, so the plan judged a half-empty
# engine against the submitters' full one. Closed loop: 10 requests per slot, at least 100.
PUBLISHED_COUNT_PLAYED_WHOLE = 5_000
OFFLINE_REQUESTS_PER_REPLICA = 3_000
OPEN_LOOP_S = 600.0
OPEN_LOOP_REQUESTS = (1_000, 40_000)
CLOSED_LOOP_REQUESTS_PER_SLOT, CLOSED_LOOP_MIN_REQUESTS = 10, 100


def load_block(row: dict) -> dict:
    """The scenario's load: offline (all at once, fed as the engine admits), Poisson at the rate (MLPerf Server and
    the serving benchmarks draw Poisson gaps), or a closed loop at the concurrency."""
    load, replicas = row["load"], row["replicas"] or 1
    published = load.get("num_requests") or row["workload"].get("num_requests")
    if published is not None and published <= PUBLISHED_COUNT_PLAYED_WHOLE:
        count = published
    elif load["kind"] == "offline":
        count = min(published or math.inf, OFFLINE_REQUESTS_PER_REPLICA * replicas)
    elif load["kind"] == "rate":
        low, high = OPEN_LOOP_REQUESTS
        count = min(published or math.inf, max(low, min(high, round(OPEN_LOOP_S * load["value"]))))
    else:
        count = max(CLOSED_LOOP_MIN_REQUESTS, CLOSED_LOOP_REQUESTS_PER_SLOT * int(load["value"]))
    if load["kind"] == "offline":
        return {"arrival": "offline", "num_requests": int(count)}
    if load["kind"] == "rate":
        return {"arrival": "poisson", "rate": float(load["value"]), "num_requests": int(count)}
    return {"arrival": "closed", "concurrency": int(load["value"]), "num_requests": int(count)}


# ---- a row as the scenario `bench plan` reads


@dataclass
class Converted:
    """A row as a scenario: the dict written (what a user would write), the loaded Scenario, and what was assumed."""

    row_id: str
    split: str
    data: dict
    scenario: object = field(repr=False)
    notes: list[str]
    left_out: dict[str, str]  # metric -> why it is not compared


@dataclass
class NotExpressible:
    row_id: str
    split: str
    reason: str


def scenario_data(row: dict, datasets: dict, with_engine_flags: bool = True) -> tuple[dict, list[str]]:
    """The scenario dict for the row and the notes on what it assumed; ValueError naming what cannot be expressed."""
    if row["tensor_parallel"] is None:
        raise ValueError("tensor parallelism not published")
    if row["gpu"] not in GPU_PARTS:
        raise ValueError(f"GPU {row['gpu']!r} has no part in the GPU table")
    if row["model"] not in ARCHITECTURES:
        raise ValueError(f"model {row['model']!r} has no built-in architecture")
    gpu, kind = GPU_PARTS[row["gpu"]], ENGINE_KINDS[row["engine"]]
    dtypes, notes = precision(row)
    input_tokens, output_tokens = lengths(row, datasets)
    plan = {"hardware": gpu.part, "model": ARCHITECTURES[row["model"]], "step_model": "roofline"}
    plan |= {"tensor_parallel": row["tensor_parallel"], "replicas": row["replicas"] or 1, **dtypes}
    args = engine_flags(row, kind) if with_engine_flags else []
    data = {
        "name": row["id"],
        "backend": {"kind": kind, "model": row["model"], "launch": {"args": args}},
        "workload": {"kind": "random", "input_tokens": input_tokens, "output_tokens": output_tokens},
        "load": load_block(row),
        "plan": plan,
    }
    data["workload"]["ignore_eos"] = True  # the plan plays each request's drawn length
    notes += [f"GPU {row['gpu']!r} -> {gpu.part}: {gpu.note}"] if gpu.note else []
    if row["engine"] == "nim":
        notes.append("NIM's fp8 TP2 profile is a TensorRT-LLM engine: simulated as trtllm")
    if row["load"]["kind"] == "rate" and not str(row["load"].get("arrival", "")).startswith("poisson"):
        notes.append(f"arrival {row['load'].get('arrival')!r}: Poisson assumed")
    return data, notes


def left_out_metrics(row: dict) -> dict[str, str]:
    """The row's metrics that are not compared, each with why."""
    left_out = {m: why for m, why in NOT_COMPARED.items() if m in row["metrics"]}
    if "--num-scheduler-steps 10" in row.get("launch", "") and "itl_p50_ms" in row["metrics"]:
        left_out["itl_p50_ms"] = MULTI_STEP_ITL
    return left_out


def convert_row(row: dict, datasets: dict, with_engine_flags: bool = True) -> Converted | NotExpressible:
    """The row as a loaded scenario, or why it cannot be one."""
    try:
        data, notes = scenario_data(row, datasets, with_engine_flags)
        scenario = load_yaml_scenario(data)
    except (ValueError, ScenarioError) as e:
        return NotExpressible(row["id"], row["split"], str(e))
    return Converted(row["id"], row["split"], data, scenario, notes, left_out_metrics(row))


def load_yaml_scenario(data: dict):
    """The scenario as `bench plan SCENARIO` loads it: written to a YAML file, read by the scenario loader."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{data['name']}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        return load_scenario(path)


# ---- prediction and its errors

# published metric -> (summary.json section, statistic) of the plan's summary
PLANNED_FIELDS = {
    "output_tokens_per_s": ("throughput", "output_tokens_per_s"),
    "requests_per_s": ("throughput", "requests_per_s"),
    "total_tokens_per_s": ("throughput", "total_tokens_per_s"),
    "ttft_p50_ms": ("ttft_ms", "p50"),
    "ttft_mean_ms": ("ttft_ms", "mean"),
    # NIM prints TTFT and ITL without a statistic: compared with the mean, which AIPerf's report leads with
    "ttft_ms": ("ttft_ms", "mean"),
    "ttft_p99_ms": ("ttft_ms", "p99"),
    "tpot_p50_ms": ("tpot_ms", "p50"),
    "tpot_p99_ms": ("tpot_ms", "p99"),
    "itl_p50_ms": ("itl_ms", "p50"),
    "itl_mean_ms": ("itl_ms", "mean"),
    "itl_ms": ("itl_ms", "mean"),
    "e2e_p50_ms": ("e2e_ms", "p50"),
    "e2e_p99_ms": ("e2e_ms", "p99"),
}
FAMILIES = {
    "throughput": ("output_tokens_per_s", "requests_per_s", "total_tokens_per_s"),
    "ttft_p50": ("ttft_p50_ms",),
    "ttft_mean": ("ttft_mean_ms", "ttft_ms"),
    "tpot_itl_p50": ("tpot_p50_ms", "itl_p50_ms"),
    "itl_mean": ("itl_mean_ms", "itl_ms"),
    "e2e_p50": ("e2e_p50_ms",),
    "p99": ("ttft_p99_ms", "tpot_p99_ms", "e2e_p99_ms"),
}
FAMILY_OF = {metric: family for family, metrics in FAMILIES.items() for metric in metrics}


def signed_error_pct(planned: float, published: float) -> float:
    """(planned - published) / published in percent: + means the plan says more (slower latency, more tok/s)."""
    return 100.0 * (planned - published) / published


@dataclass
class MetricError:
    metric: str
    family: str
    published: float
    planned: float | None
    error_pct: float | None


@dataclass
class RowResult:
    row_id: str
    split: str
    status: str  # predicted | not_expressible | refused (the planner's own error)
    reason: str = ""
    errors: list[MetricError] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    launch_args: list[str] = field(default_factory=list)
    wall_s: float = 0.0


def planned_value(summary, metric: str) -> float | None:
    section, statistic = PLANNED_FIELDS[metric]
    value = getattr(getattr(summary, section, None), statistic, None)
    return None if value is None or not math.isfinite(value) else float(value)


def metric_errors(published: dict[str, float], summary, left_out: dict[str, str]) -> list[MetricError]:
    """Each published metric the plan predicts, with its signed error."""
    errors = []
    for metric, value in published.items():
        if metric in left_out or metric not in PLANNED_FIELDS:
            continue
        planned = planned_value(summary, metric) if summary is not None else None
        error = signed_error_pct(planned, value) if planned is not None else None
        errors.append(MetricError(metric, FAMILY_OF[metric], float(value), planned, error))
    return errors


def predict_row(row: dict, converted: Converted | NotExpressible) -> RowResult:
    """The plan of the row's scenario against what the row publishes."""
    if isinstance(converted, NotExpressible):
        return RowResult(row["id"], row["split"], "not_expressible", converted.reason)
    from harness.plan.simulator import simulate_scenario  # the simulator's imports are heavy: only when simulating

    args = converted.data["backend"]["launch"]["args"]
    base = {"left_out": converted.left_out, "notes": converted.notes, "launch_args": args}
    started_s = time.perf_counter()
    try:
        summary = simulate_scenario(converted.scenario)
    except (ValueError, ScenarioError) as e:
        return RowResult(row["id"], row["split"], "refused", f"bench plan: {e}", **base)
    errors = metric_errors(row["metrics"], summary, converted.left_out)
    wall_s = time.perf_counter() - started_s
    return RowResult(row["id"], row["split"], "predicted", errors=errors, wall_s=wall_s, **base)


# ---- what the errors add up to


def family_stats(results: list[RowResult], split: str) -> dict[str, dict]:
    """Per metric family, over the split's predicted rows: n, MAPE and the p50/p90 of the absolute errors."""
    stats = {}
    for family in FAMILIES:
        errors = [
            abs(e.error_pct)
            for r in results
            if r.split == split and r.status == "predicted"
            for e in r.errors
            if e.family == family and e.error_pct is not None
        ]
        if errors:
            p50, p90 = np.percentile(errors, [50, 90])
            stats[family] = {"n": len(errors), "mape_pct": float(np.mean(errors)), "p50_pct": p50, "p90_pct": p90}
    return stats


def metric_stats(results: list[RowResult], split: str) -> dict[str, dict]:
    """MAPE and the mean signed error per published metric name, over the split's predicted rows."""
    by_metric: dict[str, list[float]] = {}
    for r in results:
        for e in r.errors if r.split == split and r.status == "predicted" else ():
            if e.error_pct is not None:
                by_metric.setdefault(e.metric, []).append(e.error_pct)
    return {
        m: {"n": len(v), "mape_pct": float(np.mean(np.abs(v))), "mean_signed_pct": float(np.mean(v))}
        for m, v in sorted(by_metric.items())
    }


# A TTFT that grows KNEE_RATIO-fold from one load step to the next is queueing: prefill alone grows with the batch's
# added prompt tokens, which no step of these sweeps more than doubles. Set before any planned value was seen.
KNEE_RATIO = 3.0
TTFT_METRICS = ("ttft_p50_ms", "ttft_mean_ms", "ttft_ms")


def knee(loads: list[float], ttfts: list[float]) -> tuple[float, float] | None:
    """The first pair of consecutive loads between which TTFT grows KNEE_RATIO-fold; None if it never does."""
    for i in range(len(loads) - 1):
        if ttfts[i] > 0 and ttfts[i + 1] / ttfts[i] >= KNEE_RATIO:
            return loads[i], loads[i + 1]
    return None


def sweep_groups(rows: list[dict]) -> dict[str, list[dict]]:
    """Groups of three or more rows of one configuration at increasing loads (offline last: an unbounded rate)."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        if any(m in row["metrics"] for m in TTFT_METRICS):
            groups.setdefault(row["group"], []).append(row)
    return {g: sorted(rs, key=load_value) for g, rs in groups.items() if len(rs) >= 3}


def load_value(row: dict) -> float:
    return math.inf if row["load"]["kind"] == "offline" else float(row["load"]["value"])


def knee_checks(rows: list[dict], results: dict[str, RowResult]) -> list[dict]:
    """Per sweep: the published knee, the planned one, and how many load steps apart they are."""
    checks = []
    for group, members in sweep_groups(rows).items():
        metric = next(m for m in TTFT_METRICS if m in members[0]["metrics"])
        planned = [_planned(results.get(r["id"]), metric) for r in members]
        if any(p is None for p in planned):
            continue
        loads = [load_value(r) for r in members]
        published_knee = knee(loads, [r["metrics"][metric] for r in members])
        planned_knee = knee(loads, planned)
        steps = [loads.index(k[1]) if k else len(loads) for k in (published_knee, planned_knee)]
        checks.append(
            {
                "group": group,
                "split": members[0]["split"],
                "metric": metric,
                "loads": loads,
                "published_knee": published_knee,
                "planned_knee": planned_knee,
                "steps_apart": abs(steps[0] - steps[1]),
            }
        )
    return checks


def _planned(result: RowResult | None, metric: str) -> float | None:
    if result is None or result.status != "predicted":
        return None
    return next((e.planned for e in result.errors if e.metric == metric), None)


# Held-out pairs whose configurations differ in exactly one of these; the rest (source, engine, model, precision,
# lengths, load kind) equal. A pair whose published values differ by under TIE_PCT is a tie and not judged: the
# tables print 3-4 digits and serving benchmarks repeat within a few percent.
ORDERING_DIMENSIONS = {
    "gpu": lambda r: r["gpu"],
    "tp": lambda r: r["tensor_parallel"],
    "load": load_value,
    "replicas": lambda r: r["replicas"],
    "kv_cache": lambda r: r["precision"]["kv_cache"],
}
TIE_PCT = 2.0
# Throughput follows the offered rate when the load differs: only latencies say anything about a rate pair
RATE_FOLLOWING = ("output_tokens_per_s", "requests_per_s", "total_tokens_per_s")


def configuration(row: dict) -> tuple:
    source = row["source"]
    workload = row["workload"]
    return (
        source.get("repository", source.get("url")),
        source.get("commit"),
        row["engine"],
        row["model"],
        row["precision"]["weights"],
        workload["dataset"],
        workload["input_tokens"],
        workload["output_tokens"],
        row["load"]["kind"],
    )


def differing_dimension(a: dict, b: dict) -> str | None:
    """The one dimension two rows of one configuration differ in; None for none or several."""
    if configuration(a) != configuration(b):
        return None
    differ = [name for name, value in ORDERING_DIMENSIONS.items() if value(a) != value(b)]
    return differ[0] if len(differ) == 1 else None


def orderings(rows: list[dict], results: dict[str, RowResult]) -> list[dict]:
    """Each judged (pair, metric): whether the planned order is the published one."""
    held_out = [r for r in rows if r["split"] == "heldout"]
    judged = []
    for i, a in enumerate(held_out):
        for b in held_out[i + 1 :]:
            dimension = differing_dimension(a, b)
            if dimension is None:
                continue
            for metric in sorted(set(a["metrics"]) & set(b["metrics"]) & set(PLANNED_FIELDS)):
                if dimension == "load" and metric in RATE_FOLLOWING:
                    continue
                judged += _ordering(a, b, dimension, metric, results)
    return judged


def _ordering(a: dict, b: dict, dimension: str, metric: str, results: dict[str, RowResult]) -> list[dict]:
    published = a["metrics"][metric], b["metrics"][metric]
    planned = _planned(results.get(a["id"]), metric), _planned(results.get(b["id"]), metric)
    if None in planned or abs(published[0] - published[1]) < TIE_PCT / 100 * max(published):
        return []
    right = (published[0] < published[1]) == (planned[0] < planned[1])
    return [
        {
            "a": a["id"],
            "b": b["id"],
            "differs_in": dimension,
            "metric": metric,
            "published": published,
            "planned": planned,
            "right": right,
        }
    ]


# ---- the report


def row_lines(results: list[RowResult]) -> list[str]:
    lines = [f"{'row':<58} {'split':<5} {'metric':<20} {'published':>11} {'planned':>11} {'error':>8}"]
    for r in results:
        if r.status != "predicted":
            continue
        for e in r.errors:
            planned = f"{e.planned:11.4g}" if e.planned is not None else f"{'-':>11}"
            error = f"{e.error_pct:+7.1f}%" if e.error_pct is not None else f"{'-':>8}"
            lines.append(f"{r.row_id[:58]:<58} {r.split[:5]:<5} {e.metric:<20} {e.published:11.4g} {planned} {error}")
    return lines


def summary_lines(results: list[RowResult], splits: list[str]) -> list[str]:
    lines = []
    for split in splits:
        families = family_stats(results, split)
        if not families:
            continue
        lines += ["", f"{split}: MAPE and error bands (|error| p50, p90) per metric family"]
        lines += [f"  {'family':<14} {'n':>4} {'MAPE':>8} {'p50':>8} {'p90':>8}"]
        for family, s in families.items():
            lines.append(f"  {family:<14} {s['n']:>4} {s['mape_pct']:7.1f}% {s['p50_pct']:7.1f}% {s['p90_pct']:7.1f}%")
        lines += [f"{split}: per metric (MAPE, mean signed error)"]
        for metric, s in metric_stats(results, split).items():
            lines.append(f"  {metric:<20} {s['n']:>4} {s['mape_pct']:7.1f}% {s['mean_signed_pct']:+8.1f}%")
    return lines


def unexpressed_lines(results: list[RowResult]) -> list[str]:
    lines = []
    for status, title in (
        ("not_expressible", "rows the planner cannot express"),
        ("refused", "rows bench plan refused"),
    ):
        chosen = [r for r in results if r.status == status]
        if chosen:
            lines += ["", f"{title} ({len(chosen)}):"] + [f"  {r.row_id} [{r.split}]: {r.reason}" for r in chosen]
    left_out = [(r.row_id, m, why) for r in results for m, why in r.left_out.items()]
    if left_out:
        lines += ["", "metrics not compared:"] + [f"  {rid} {m}: {why}" for rid, m, why in left_out]
    return lines


def check_lines(knees: list[dict], judged: list[dict]) -> list[str]:
    lines = ["", f"knees (TTFT grows {KNEE_RATIO:g}x from one load to the next):"]
    for k in knees:
        lines.append(
            f"  {k['group']} [{k['split']}] {k['metric']}: published {_pair(k['published_knee'])}, planned "
            f"{_pair(k['planned_knee'])} ({k['steps_apart']} load steps apart)"
        )
    right = sum(j["right"] for j in judged)
    lines += ["", f"orderings of held-out pairs: {right} of {len(judged)} right"]
    for dimension in ORDERING_DIMENSIONS:
        of = [j for j in judged if j["differs_in"] == dimension]
        if of:
            lines.append(f"  {dimension:<9} {sum(j['right'] for j in of)} of {len(of)}")
    for j in judged:
        if not j["right"]:
            lines.append(
                f"  wrong: {j['a']} vs {j['b']} {j['metric']}: published {j['published'][0]:.4g} vs "
                f"{j['published'][1]:.4g}, planned {j['planned'][0]:.4g} vs {j['planned'][1]:.4g}"
            )
    return lines


def _pair(pair: tuple[float, float] | None) -> str:
    if pair is None:
        return "none"
    return "between " + " and ".join("offline" if math.isinf(v) else f"{v:g}" for v in pair)


def jsonable(value):
    """json.dumps cannot write infinity as JSON: an offline load's rate becomes the string 'offline'."""
    if isinstance(value, float) and math.isinf(value):
        return "offline"
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def plan_row(row: dict, with_engine_flags: bool) -> RowResult:
    return predict_row(row, convert_row(row, load_lengths(), with_engine_flags))


def run(rows: list[dict], with_engine_flags: bool, jobs: int = 1) -> list[RowResult]:
    """Every row converted and, where it converts, planned, in `jobs` processes (a row's simulation is one
    process's work: the rows are independent); each row's progress and errors on stderr as it ends."""
    by_id: dict[str, RowResult] = {}
    with ProcessPoolExecutor(jobs) as pool:
        futures = [pool.submit(plan_row, row, with_engine_flags) for row in rows]
        for done, future in enumerate(as_completed(futures), 1):
            result = future.result()
            by_id[result.row_id] = result
            errors = " ".join(f"{e.metric} {e.error_pct:+.1f}%" for e in result.errors if e.error_pct is not None)
            print(
                f"[{done}/{len(rows)}] {result.row_id}: {result.status} {result.wall_s:.1f} s {errors}",
                file=sys.stderr,
                flush=True,
            )
    return [by_id[row["id"]] for row in rows]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=("heldout", "calibration", "all"), default="all")
    parser.add_argument("--rows", help="comma-separated row ids (default: every row of the split)")
    parser.add_argument("--json", type=Path, help="write rows, errors, families, knees and orderings here")
    parser.add_argument("--no-engine-flags", action="store_true", help="leave backend.launch.args empty")
    parser.add_argument("--jobs", type=int, default=1, help="rows planned at once, one process each (default 1)")
    return parser.parse_args(argv)


def select_rows(rows: list[dict], split: str, ids: str | None) -> list[dict]:
    chosen = [r for r in rows if split == "all" or r["split"] == split]
    if ids:
        wanted = ids.split(",")
        unknown = sorted(set(wanted) - {r["id"] for r in rows})
        if unknown:
            raise SystemExit(f"--rows: no such row {', '.join(unknown)} in {ROWS_PATH.name}")
        chosen = [r for r in chosen if r["id"] in wanted]
    return chosen


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started_s = time.perf_counter()
    rows = select_rows(yaml.safe_load(ROWS_PATH.read_text(encoding="utf-8")), args.split, args.rows)
    results = run(rows, with_engine_flags=not args.no_engine_flags, jobs=args.jobs)
    by_id = {r.row_id: r for r in results}
    knees, judged = knee_checks(rows, by_id), orderings(rows, by_id)
    splits = ["calibration", "heldout"] if args.split == "all" else [args.split]
    wall_s = time.perf_counter() - started_s
    lines = row_lines(results) + summary_lines(results, splits) + unexpressed_lines(results)
    lines += check_lines(knees, judged)
    lines += ["", f"{len(rows)} rows, engine flags {'off' if args.no_engine_flags else 'on'}, wall time {wall_s:.0f} s"]
    print("\n".join(lines))
    if args.json:
        report = {
            "engine_flags": not args.no_engine_flags,
            "wall_s": wall_s,
            "rows": [asdict(r) for r in results],
            "families": {split: family_stats(results, split) for split in splits},
            "metrics": {split: metric_stats(results, split) for split in splits},
            "knees": knees,
            "orderings": judged,
        }
        args.json.write_text(json.dumps(jsonable(report), indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
