"""Each engine's own flags in `backend.launch.args`, read as that engine reads them, into the settings of its profile
(harness/plan/engine_profiles.py) and the plan fields they share with the scenario's `plan:` block.

    vllm      --tensor-parallel-size/-tp  --max-num-seqs  --max-num-batched-tokens  --kv-cache-dtype  --quantization
              --[no-]enable-chunked-prefill  --gpu-memory-utilization  --[no-]enable-prefix-caching  --max-model-len
              --block-size  --data-parallel-size/-dp  --[no-]enforce-eager  --max-cudagraph-capture-size
              --enable-expert-parallel/-ep (EP = TP x DP)
    sglang    --tp-size/--tp  --max-running-requests  --chunked-prefill-size  --kv-cache-dtype  --quantization
              --disable-radix-cache  --mem-fraction-static  --dp-size/--dp  --schedule-policy  --page-size
              --ep-size/--ep ...
    trtllm    --tp_size  --max_batch_size  --max_num_tokens  --kv_cache_free_gpu_memory_fraction  --max_seq_len
              --enable_chunked_prefill  --ep_size  --extra_llm_api_options/--config FILE (kv_cache_config.dtype, ...)
    llamacpp  --parallel/-np  --ctx-size/-c  --batch-size/-b

Flags valid on the engine that change nothing a plan models (`--port`, `--host`, `--trust-remote-code`,
`--served-model-name`, ...) are accepted and ignored (each table's `ignored`); a flag the engine has but the plan
cannot simulate (pipeline parallelism, speculative decoding) is refused saying so; an unknown flag is refused in the
engine's own words (argparse's "unrecognized arguments: --foo", click's "No such option: --foo"), naming
backend.launch.args and the flags a plan reads. The native engine's flags stay `bench serve`'s (deployment.py).

Flags and plan fields that set the same thing (tensor parallelism, the weights' and the KV cache's dtype, the memory
fraction): a flag sets what the plan leaves unset, an explicit plan field sets what no flag sets, and an explicit plan
field that disagrees with an explicit flag is refused naming both. Data parallelism follows `bench serve`'s rule:
plan.replicas, when set, overrides the flag.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

PLACEHOLDERS = ("{port}", "{host}", "{model}")  # the launch templates' own (harness/engine/launch.py)
# the plan fields a flag may set, and the plan: block's name for each
PLAN_FIELDS = {
    "tensor_parallel": "plan.tensor_parallel",
    "weight_dtype": "plan.weight_dtype",
    "kv_cache_dtype": "plan.kv_cache_dtype",
    "memory_fraction": "plan.gpu_memory_utilization",
    "expert_parallel": "plan.expert_parallel",
}
# vLLM's --enable-expert-parallel: its EP size is TP x DP (vllm/config/parallel.py), known once both are
EXPERT_PARALLEL_OVER_TP_DP = "tp x dp"
# --quantization methods by the weights they store (harness/scenario/precision.py's WeightDtype): vLLM's and SGLang's
# method names (vllm/model_executor/layers/quantization/__init__.py QUANTIZATION_METHODS, SGLang's
# QUANTIZATION_CHOICES); a method whose bits the checkpoint decides (compressed-tensors, modelopt_mixed) is refused
QUANTIZATION_WEIGHTS = {
    "fp8": "fp8",
    "fbgemm_fp8": "fp8",
    "ptpc_fp8": "fp8",
    "modelopt": "fp8",
    "modelopt_fp8": "fp8",
    "w8a8_fp8": "fp8",
    "w8a8_int8": "int8",
    "experts_int8": "int8",
    "awq": "int4",
    "awq_marlin": "int4",
    "gptq": "int4",
    "gptq_marlin": "int4",
    "marlin": "int4",
    "bitsandbytes": "int4",
    "modelopt_fp4": "fp4",
    "mxfp4": "fp4",
}
KV_DTYPES = {  # the engines' --kv-cache-dtype spellings -> plan.kv_cache_dtype's
    "auto": "auto",
    "fp8": "fp8",
    "fp8_e4m3": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
}
SCHEDULE_POLICIES = {"fcfs": "fcfs", "lpm": "lpm"}  # SGLang's policies the native scheduler runs


class FlagError(ValueError):
    """A launch argument the engine, or the plan, refuses; the message is the engine's own shape."""


def positive_int(text: str) -> int:
    """An int >= 1; vLLM's human-readable form too (32k = 32,000, 32K = 32,768: arg_utils.human_readable_int)."""
    match = re.fullmatch(r"(\d+)([kKmM]?)", text.strip())
    if not match:
        raise ValueError(text)
    scale = {"": 1, "k": 1000, "K": 1024, "m": 10**6, "M": 2**20}[match.group(2)]
    value = int(match.group(1)) * scale
    if value < 1:
        raise ValueError(text)
    return value


def fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise ValueError(text)
    return value


def choice(table: dict[str, object]) -> Callable[[str], object]:
    def parse(text: str) -> object:
        if text not in table:
            raise ValueError(text)
        return table[text]

    parse.choices = tuple(table)  # type: ignore[attr-defined]  # named in the "invalid choice" message
    return parse


def quantization(text: str) -> str:
    if text not in QUANTIZATION_WEIGHTS:
        raise FlagError(
            f"--quantization {text}: bench plan cannot tell the bits of this method's weights; leave the flag out "
            f"and set plan.weight_dtype (one of bf16, fp16, fp8, int8, int4, fp4). It reads "
            f"{', '.join(QUANTIZATION_WEIGHTS)}"
        )
    return QUANTIZATION_WEIGHTS[text]


def sglang_chunk(text: str) -> int:
    """--chunked-prefill-size: tokens a prefill chunk takes; -1 turns chunking off (its docs)."""
    value = int(text)
    if value == -1 or value >= 1:
        return value
    raise ValueError(text)


VALUE_WORDS = {positive_int: "int", fraction: "float", sglang_chunk: "int"}  # argparse's words for a bad value


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]
    field: str  # an EngineSettings field, a PLAN_FIELDS key, "data_parallel", or "options_file"
    parse: Callable[[str], object] | None = None  # None: a switch
    value: object = True  # what the switch sets


@dataclass(frozen=True)
class FlagTable:
    kind: str
    program: str  # the command's name in its messages
    style: Literal["argparse", "click", "llama"]
    flags: tuple[Flag, ...]
    ignored: tuple[str, ...] = ()  # valid, take a value, change nothing a plan models
    ignored_switches: tuple[str, ...] = ()  # valid switches that change nothing a plan models
    unsupported: dict[str, str] = field(default_factory=dict)  # valid, not simulated: why
    dashes_for_underscores: bool = False  # vLLM's FlexibleArgumentParser reads --max_num_seqs as --max-num-seqs

    def find(self, name: str) -> Flag | None:
        if self.dashes_for_underscores and name.startswith("--"):
            name = "--" + name[2:].replace("_", "-")
        return next((f for f in self.flags if name in f.names), None)

    def known(self) -> str:
        return ", ".join("/".join(f.names) for f in self.flags)


def _switch(on: str, off: str, field: str) -> tuple[Flag, Flag]:
    return Flag((on,), field, None, True), Flag((off,), field, None, False)


# a server's P/D role flag (vLLM's KV connector role, SGLang's mode, trtllm-serve's server role) is one side of a
# prefill/decode pair launched apart; a plan of one launch cannot say how many of each there are
DISAGGREGATION = (
    "prefill/decode disaggregation is simulated for the native engine's --disaggregate prefill=P,decode=D "
    "(backend.kind native), which names both pools in one flag"
)
VLLM_FLAGS = FlagTable(
    kind="vllm",
    program="vllm serve",
    style="argparse",
    dashes_for_underscores=True,
    flags=(
        Flag(("--tensor-parallel-size", "-tp"), "tensor_parallel", positive_int),
        Flag(("--data-parallel-size", "-dp"), "data_parallel", positive_int),
        Flag(("--max-num-seqs",), "max_num_seqs", positive_int),
        Flag(("--max-num-batched-tokens",), "max_num_batched_tokens", positive_int),
        Flag(("--kv-cache-dtype",), "kv_cache_dtype", choice(KV_DTYPES)),
        Flag(("--quantization", "-q"), "weight_dtype", quantization),
        *_switch("--enable-chunked-prefill", "--no-enable-chunked-prefill", "enable_chunked_prefill"),
        Flag(("--gpu-memory-utilization",), "memory_fraction", fraction),
        *_switch("--enable-prefix-caching", "--no-enable-prefix-caching", "enable_prefix_caching"),
        Flag(("--max-model-len",), "max_model_len", positive_int),
        Flag(("--block-size",), "kv_block_size", positive_int),
        Flag(("--enforce-eager",), "cuda_graph_max_batch", None, 0),
        Flag(("--max-cudagraph-capture-size",), "cuda_graph_max_batch", positive_int),
        Flag(("--enable-expert-parallel", "-ep"), "expert_parallel", None, EXPERT_PARALLEL_OVER_TP_DP),
    ),
    ignored=(
        "--host",
        "--port",
        "--model",
        "--served-model-name",
        "--tokenizer",
        "--tokenizer-mode",
        "--dtype",
        "--seed",
        "--revision",
        "--download-dir",
        "--load-format",
        "--api-key",
        "--chat-template",
        "--generation-config",
        "--tool-call-parser",
        "--reasoning-parser",
        "--uvicorn-log-level",
        "--max-log-len",
        "--max-logprobs",
        "--root-path",
        "--swap-space",
        "--distributed-executor-backend",
        "--profiler-config",
    ),
    ignored_switches=(
        "--trust-remote-code",
        "--disable-log-requests",
        "--enable-log-requests",
        "--disable-log-stats",
        "--enable-auto-tool-choice",
        "--disable-custom-all-reduce",
        "--async-scheduling",
        "--no-async-scheduling",
        "--no-enforce-eager",
    ),
    unsupported={
        "--pipeline-parallel-size": "pipeline parallelism is not simulated; use tensor parallelism",
        "-pp": "pipeline parallelism is not simulated; use tensor parallelism",
        "--speculative-config": "speculative decoding is not simulated (acceptance depends on the text)",
        "--max-num-partial-prefills": "more than one partial prefill at a time is not simulated",
        "--kv-transfer-config": DISAGGREGATION,
    },
)
SGLANG_FLAGS = FlagTable(
    kind="sglang",
    program="sglang.launch_server",
    style="argparse",
    flags=(
        Flag(("--tp-size", "--tp", "--tensor-parallel-size"), "tensor_parallel", positive_int),
        Flag(("--dp-size", "--dp", "--data-parallel-size"), "data_parallel", positive_int),
        Flag(("--max-running-requests",), "max_num_seqs", positive_int),
        Flag(("--chunked-prefill-size",), "chunked_prefill_size", sglang_chunk),
        Flag(("--max-prefill-tokens",), "max_prefill_tokens", positive_int),
        Flag(("--kv-cache-dtype",), "kv_cache_dtype", choice(KV_DTYPES)),
        Flag(("--quantization",), "weight_dtype", quantization),
        Flag(("--disable-radix-cache",), "enable_prefix_caching", None, False),
        Flag(("--mem-fraction-static",), "memory_fraction", fraction),
        Flag(("--schedule-policy",), "schedule_policy", choice(SCHEDULE_POLICIES)),
        Flag(("--page-size",), "kv_block_size", positive_int),
        Flag(("--context-length",), "max_model_len", positive_int),
        Flag(("--max-queued-requests",), "max_waiting", positive_int),
        Flag(("--cuda-graph-max-bs",), "cuda_graph_max_batch", positive_int),
        Flag(("--disable-cuda-graph",), "cuda_graph_max_batch", None, 0),
        Flag(("--disable-cuda-graph-padding",), "cuda_graph_padding", None, False),
        Flag(("--enable-mixed-chunk",), "mixed_chunk", None, True),
        Flag(("--ep-size", "--ep", "--expert-parallel-size"), "expert_parallel", positive_int),
    ),
    ignored=(
        "--model-path",
        "--model",
        "--host",
        "--port",
        "--served-model-name",
        "--tokenizer-path",
        "--dtype",
        "--random-seed",
        "--log-level",
        "--api-key",
        "--chat-template",
        "--load-format",
        "--download-dir",
        "--watchdog-timeout",
        "--stream-interval",
        "--attention-backend",
        "--sampling-backend",
        "--grammar-backend",
        "--tool-call-parser",
        "--reasoning-parser",
        "--torch-compile-max-bs",
        "--schedule-conservativeness",
    ),
    ignored_switches=(
        "--trust-remote-code",
        "--enable-metrics",
        "--log-requests",
        "--show-time-cost",
        "--skip-server-warmup",
        "--enable-cache-report",
        "--disable-overlap-schedule",
        "--enable-torch-compile",
    ),
    unsupported={
        "--pp-size": "pipeline parallelism is not simulated; use tensor parallelism",
        "--speculative-algorithm": "speculative decoding is not simulated (acceptance depends on the text)",
        "--max-total-tokens": "a KV pool capped below what memory holds is not simulated; set plan.gpu_memory_"
        "utilization (or --mem-fraction-static) instead",
        "--enable-dp-attention": "data-parallel attention is not simulated",
        "--disaggregation-mode": DISAGGREGATION,
    },
)
TRTLLM_FLAGS = FlagTable(
    kind="trtllm",
    program="trtllm-serve",
    style="click",
    flags=(
        Flag(("--tp_size",), "tensor_parallel", positive_int),
        Flag(("--max_batch_size",), "max_num_seqs", positive_int),
        Flag(("--max_num_tokens",), "max_num_batched_tokens", positive_int),
        Flag(("--kv_cache_free_gpu_memory_fraction",), "memory_fraction", fraction),
        Flag(("--max_seq_len",), "max_model_len", positive_int),
        Flag(("--enable_chunked_prefill",), "enable_chunked_prefill", None, True),
        Flag(("--extra_llm_api_options", "--config"), "options_file", str),
        Flag(("--ep_size",), "expert_parallel", positive_int),
    ),
    ignored=(
        "--host",
        "--port",
        "--backend",
        "--log_level",
        "--tokenizer",
        "--max_beam_width",
        "--num_postprocess_workers",
        "--reasoning_parser",
        "--gpus_per_node",
        "--served_model_name",
        "--metadata_server_config_file",
        "--media_io_kwargs",
        "--cluster_size",
    ),
    ignored_switches=("--trust_remote_code", "--fail_fast_on_attention_window_too_large"),
    unsupported={
        "--pp_size": "pipeline parallelism is not simulated; use tensor parallelism",
        "--server_role": DISAGGREGATION,
        "--disagg_cluster_uri": DISAGGREGATION,
    },
)
LLAMACPP_FLAGS = FlagTable(
    kind="llamacpp",
    program="llama-server",
    style="llama",
    flags=(
        Flag(("--parallel", "-np"), "max_num_seqs", positive_int),
        Flag(("--ctx-size", "-c"), "max_model_len", positive_int),
        Flag(("--batch-size", "-b"), "max_num_batched_tokens", positive_int),
        Flag(("--cont-batching", "-cb"), "continuous_batching", None, True),
    ),
    ignored=(
        "--host",
        "--port",
        "--model",
        "-m",
        "--threads",
        "-t",
        "--n-gpu-layers",
        "-ngl",
        "--ubatch-size",
        "-ub",
        "--alias",
        "-a",
        "--flash-attn",
        "-fa",
        "--seed",
        "-s",
    ),
    ignored_switches=("--metrics", "--jinja", "--no-webui"),
    unsupported={
        "--no-cont-batching": "static batching is not simulated for llama-server",
        "-nocb": "static batching is not simulated for llama-server",
        "--model-draft": "speculative decoding is not simulated (acceptance depends on the text)",
    },
)
FLAG_TABLES = {t.kind: t for t in (VLLM_FLAGS, SGLANG_FLAGS, TRTLLM_FLAGS, LLAMACPP_FLAGS)}


@dataclass(frozen=True)
class EngineFlags:
    """What an engine's launch args set: {field: value}, and for each field the flag that set it."""

    values: dict[str, object]
    spelled: dict[str, str]  # field -> "--max-num-seqs 256" (the last flag that set it, as the engine keeps it)


def unknown_flag(table: FlagTable, arg: str) -> FlagError:
    said = {
        "argparse": f"{table.program}: error: unrecognized arguments: {arg}",
        "click": f"{table.program}: Error: No such option: {arg}",
        "llama": f"{table.program}: error: invalid argument: {arg}",
    }[table.style]
    ignored = ", ".join((*table.ignored, *table.ignored_switches))
    return FlagError(
        f"backend.launch.args: {said} (the flags a {table.kind} plan reads: {table.known()}; accepted and ignored: "
        f"{ignored})"
    )


def bad_value(table: FlagTable, name: str, text: str | None, parse) -> FlagError:
    if text is None:
        said = {
            "argparse": f"argument {name}: expected one argument",
            "click": f"Option '{name}' requires an argument.",
            "llama": f"error: expected value for argument: {name}",
        }[table.style]
    elif choices := getattr(parse, "choices", None):
        options = ", ".join(repr(c) for c in choices)
        said = f"argument {name}: invalid choice: {text!r} (choose from {options})"
    else:
        kind = VALUE_WORDS.get(parse, "value")
        said = {
            "argparse": f"argument {name}: invalid {kind} value: {text!r}",
            "click": f"Invalid value for '{name}': {text!r} is not a valid {kind}.",
            "llama": f"error: invalid value for {name}: {text!r}",
        }[table.style]
    return FlagError(f"backend.launch.args: {table.program}: {said}")


def read_flags(kind: str, launch_args: list[str], model: str) -> EngineFlags:
    """The engine's flags in launch_args, as it reads them; FlagError in its own words for one it refuses."""
    table = FLAG_TABLES[kind]
    args = [_fill(a, model) for a in launch_args]
    values, spelled = {}, {}
    i = 0
    while i < len(args):
        name, _, inline = args[i].partition("=")
        i += 1
        flag = table.find(name)
        if flag is None:
            i = _skip_ignored(table, name, inline, args, i)
            continue
        if flag.parse is None:
            values[flag.field], spelled[flag.field] = flag.value, name
            continue
        text = inline if inline else (args[i] if i < len(args) else None)
        i += 0 if inline else 1
        try:
            value = flag.parse(text) if text is not None else None
        except FlagError:
            raise
        except ValueError:
            value = None
        if value is None:
            raise bad_value(table, name, text, flag.parse)
        values[flag.field], spelled[flag.field] = value, f"{name} {text}"
    return EngineFlags(values, spelled)


def _fill(arg: str, model: str) -> str:
    for placeholder in PLACEHOLDERS:
        arg = arg.replace(placeholder, model if placeholder == "{model}" else "0")
    return arg


def _skip_ignored(table: FlagTable, name: str, inline: str, args: list[str], i: int) -> int:
    """The index past an ignored flag (and its value); FlagError for an unsupported or unknown one."""
    if name in table.unsupported:
        raise FlagError(f"backend.launch.args: {name}: {table.unsupported[name]}")
    if name in table.ignored_switches:
        return i
    if name in table.ignored:
        return i if inline or i >= len(args) or args[i].startswith("-") else i + 1
    raise unknown_flag(table, name if not inline else f"{name}={inline}")


# ---- TensorRT-LLM's extra options file: the keys a plan models ---------------------------------------------------

TRTLLM_OPTION_KEYS = {
    ("tensor_parallel_size",): "tensor_parallel",
    ("max_batch_size",): "max_num_seqs",
    ("max_num_tokens",): "max_num_batched_tokens",
    ("max_seq_len",): "max_model_len",
    ("enable_chunked_prefill",): "enable_chunked_prefill",
    ("kv_cache_config", "free_gpu_memory_fraction"): "memory_fraction",
    ("kv_cache_config", "enable_block_reuse"): "enable_prefix_caching",
    ("kv_cache_config", "tokens_per_block"): "kv_block_size",
    ("kv_cache_config", "dtype"): "kv_cache_dtype",
    ("cuda_graph_config", "max_batch_size"): "cuda_graph_max_batch",
    ("cuda_graph_config", "batch_sizes"): "cuda_graph_sizes",
    ("cuda_graph_config", "enable_padding"): "cuda_graph_padding",
}


def read_trtllm_options(path_text: str) -> EngineFlags:
    """The keys of trtllm-serve's --extra_llm_api_options YAML that a plan models (TRTLLM_OPTION_KEYS; the others,
    such as return_perf_metrics, change nothing simulated and are ignored). They override the command line's flags,
    as trtllm-serve's update_llm_args_with_extra_dict does. `cuda_graph_config: null` turns CUDA graphs off."""
    path = Path(path_text).expanduser()
    where = f"backend.launch.args: --extra_llm_api_options {path_text}"
    if not path.is_file():
        raise FlagError(f"{where}: no such file (looked in {path.resolve()}); a relative path is read from here")
    try:
        options = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise FlagError(f"{where}: not YAML ({e})") from None
    if not isinstance(options, dict):
        raise FlagError(f"{where}: must hold a mapping of LLM API options")
    values, spelled = {}, {}
    if "cuda_graph_config" in options and options["cuda_graph_config"] is None:
        values["cuda_graph_max_batch"], spelled["cuda_graph_max_batch"] = 0, f"{path.name}: cuda_graph_config: null"
    for keys, target in TRTLLM_OPTION_KEYS.items():
        value = options
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            values[target] = _option_value(where, keys, target, value)
            spelled[target] = f"{path.name}: {'.'.join(keys)}"
    return EngineFlags(values, spelled)


def _option_value(where: str, keys: tuple[str, ...], target: str, value: object) -> object:
    """An option's value checked as its flag's would be."""
    name = ".".join(keys)
    if target == "kv_cache_dtype":
        if str(value) not in KV_DTYPES:
            raise FlagError(f"{where}: {name}: {value!r}; use one of {', '.join(KV_DTYPES)}")
        return KV_DTYPES[str(value)]
    if target == "cuda_graph_sizes":
        if not isinstance(value, list) or not all(isinstance(v, int) and v >= 1 for v in value) or not value:
            raise FlagError(f"{where}: {name}: {value!r} is not a list of batch sizes >= 1")
        return tuple(sorted(set(value)))
    if target in ("enable_chunked_prefill", "enable_prefix_caching", "cuda_graph_padding"):
        if not isinstance(value, bool):
            raise FlagError(f"{where}: {name}: {value!r} is not true or false")
        return value
    parse = fraction if target == "memory_fraction" else positive_int
    try:
        return parse(str(value))
    except ValueError:
        raise FlagError(f"{where}: {name}: {value!r} is not valid") from None


def engine_flags(kind: str, launch_args: list[str], model: str) -> EngineFlags:
    """read_flags, and for trtllm the options file it names, whose keys win over the flags."""
    flags = read_flags(kind, launch_args, model)
    if kind == "trtllm" and "options_file" in flags.values:
        options = read_trtllm_options(str(flags.values.pop("options_file")))
        flags.spelled.pop("options_file", None)
        flags.values.update(options.values)
        flags.spelled.update(options.spelled)
    return flags


def same_setting(plan_field: str, plan_value: object, flag_value: object) -> bool:
    """Whether an explicit plan field and a flag say the same: fp8 and fp8_e4m3 are one KV dtype (vLLM's fp8 is
    e4m3), a memory fraction within rounding."""
    if plan_field == "kv_cache_dtype":
        e4m3 = {"fp8", "fp8_e4m3"}
        return plan_value == flag_value or (plan_value in e4m3 and flag_value in e4m3)
    if plan_field == "memory_fraction":
        return abs(float(plan_value) - float(flag_value)) < 1e-9
    return plan_value == flag_value
