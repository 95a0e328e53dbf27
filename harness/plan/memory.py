"""GPU memory planning: weights, the KV cache a token costs, and how many KV blocks are left for it.

An engine such as vLLM takes `gpu_memory_utilization` of the GPU's memory, loads its shard of the
weights, sets aside what the forward pass itself needs (activations, CUDA graphs, the runtime's
context: `reserve_bytes` here, a stated figure rather than a profile) and splits the rest into KV
blocks of `kv_block_size` tokens. TensorRT-LLM's fraction is of what is free after the weights and that
reserve (`memory_fraction_of="free"`: its kv_cache_free_gpu_memory_fraction); each engine's profile says which
(harness/plan/engine_profiles.py). Under tensor parallelism each GPU holds 1/TP of the weights and of
the KV heads; with fewer KV heads than GPUs the heads are replicated (vLLM does the same), so a
GPU never holds less than one head.

Mixture of experts: every expert is stored. Under tensor parallelism alone each GPU holds 1/TP of every expert; with
expert parallelism of size EP the routed experts are spread over max(TP, EP) GPUs (EP > TP: over EP / TP replicas'
GPUs, as vLLM's --enable-expert-parallel spreads them over TP x DP), the rest of the weights still 1/TP a GPU. MLA's
latent KV (kv_lora_rank + qk_rope_head_dim a token a layer) is held whole on every GPU of a TP group. A sliding-window
layer keeps at most `sliding_window` tokens of a sequence: `bench memory`'s fit counts them so (load_fit), while the
simulated block pool counts the full-attention layers only (kv_bytes_per_token; a window's KV is at most
sliding_window tokens a sequence, GPT-OSS's 128 beside a context of thousands).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from harness.plan.architectures import Architecture
from harness.plan.precision import Precision
from harness.scenario.precision import KV_CACHE_DTYPE_BYTES

GIB = 2**30
DEFAULT_RESERVE_BYTES = 1 * GIB  # activations and runtime context: vLLM's profile run typically finds 0.5-2 GiB
KV_DTYPE_BYTES = KV_CACHE_DTYPE_BYTES  # plan.kv_cache_dtype's and bench memory --kv-cache-dtype's choices
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1e3,
    "mb": 1e6,
    "gb": 1e9,
    "tb": 1e12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": GIB,
    "tib": 2**40,
}


def parse_bytes(text: str | float, field: str = "memory") -> float:
    """'16GiB', '80GB', '141e9' or a number -> bytes."""
    if isinstance(text, (int, float)):
        return float(text)
    match = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"{field}: {text!r} is not a size; write e.g. 16GiB, 80GB or 24e9")
    return float(match.group(1)) * _UNITS[match.group(2).lower()]


def weights_bytes(arch: Architecture) -> float:
    """Every stored weight at its precision (a quantized deployment's embedding and lm_head at 16 bits)."""
    return arch.stored_bytes()


def expert_gpus(tensor_parallel: int, expert_parallel: int = 1) -> int:
    """The GPUs the routed experts are spread over: the TP group, or EP GPUs when expert parallelism spans more."""
    return max(tensor_parallel, expert_parallel)


def weights_bytes_per_gpu(arch: Architecture, tensor_parallel: int = 1, expert_parallel: int = 1) -> float:
    """One GPU's weights: 1/TP of the dense weights (attention, dense and shared FFNs, routers, embeddings) and
    1/max(TP, EP) of the routed experts."""
    experts = arch.routed_expert_bytes()
    return (arch.stored_bytes() - experts) / tensor_parallel + experts / expert_gpus(tensor_parallel, expert_parallel)


def expert_parallel_problem(arch: Architecture, tensor_parallel: int, expert_parallel: int) -> str | None:
    """Why an expert-parallel size is not simulated, None when it is: 1 (experts split as TP splits them), or a
    multiple of TP dividing the experts (each GPU holds whole experts; past TP, other replicas' GPUs hold the rest)."""
    if expert_parallel == 1:
        return None
    if not arch.is_moe:
        return f"{arch.name} has no experts to spread"
    if expert_parallel % tensor_parallel:
        return (
            f"{expert_parallel} is not a multiple of tensor parallel {tensor_parallel} (an expert-parallel group "
            "smaller than the TP group, SGLang's moe_tp, is not simulated)"
        )
    if arch.n_experts % expert_parallel:
        return f"{expert_parallel} does not divide {arch.name}'s {arch.n_experts} routed experts"
    return None


def tensor_parallel_problem(arch: Architecture, tensor_parallel: int) -> str | None:
    """Why vLLM refuses to split this model over `tensor_parallel` GPUs, None when it accepts: the attention
    heads must divide evenly (ModelConfig.verify_with_parallel_config), and so must the KV heads, or with more
    GPUs than KV heads, the GPUs over the heads (QKVParallelLinear replicates each head on TP / KV GPUs)."""
    tp, kv = tensor_parallel, arch.n_kv_heads
    if arch.n_heads % tp:
        return f"{tp} does not divide {arch.name}'s {arch.n_heads} attention heads"
    if tp <= kv and kv % tp:
        return f"{tp} does not divide {arch.name}'s {kv} KV heads"
    if tp > kv and tp % kv:
        return f"{tp} is not a multiple of {arch.name}'s {kv} KV heads (each GPU holds whole, replicated heads)"
    return None


def valid_tensor_parallel_sizes(arch: Architecture, most: int = 64) -> list[int]:
    return [tp for tp in range(1, most + 1) if tensor_parallel_problem(arch, tp) is None]


def check_tensor_parallel(arch: Architecture, tensor_parallel: int, field: str = "tensor_parallel") -> None:
    """A ValueError naming `field` and the sizes that work, for a size the engines refuse."""
    if (problem := tensor_parallel_problem(arch, tensor_parallel)) is not None:
        sizes = ", ".join(str(tp) for tp in valid_tensor_parallel_sizes(arch))
        raise ValueError(f"{field}: {problem}; use one of {sizes}")


def kv_layer_bytes(arch: Architecture, kv_bytes: float = 2, tensor_parallel: int = 1) -> float:
    """One layer's KV of one token on one GPU: K and V over this GPU's KV heads x head_dim (MLA: the latent, whole)."""
    return arch.kv_elements_per_token_layer(tensor_parallel) * kv_bytes


def pooled_layers(arch: Architecture) -> int:
    """Layers whose KV grows with the sequence: the full-attention ones (all of them when every layer is windowed:
    the pool then counts them whole)."""
    return arch.full_attention_layers or arch.n_layers


def kv_bytes_per_token(arch: Architecture, kv_bytes: float = 2, tensor_parallel: int = 1) -> float:
    """A token's KV in the block pool: every full-attention layer's K and V over its KV heads (this GPU's share under
    TP), head_dim elements of `kv_bytes` each; MLA's latent instead; sliding-window layers apart (window_kv_bytes)."""
    return pooled_layers(arch) * kv_layer_bytes(arch, kv_bytes, tensor_parallel)


def window_kv_bytes(arch: Architecture, context_tokens: int, kv_bytes: float = 2, tensor_parallel: int = 1) -> float:
    """The sliding-window layers' KV of one sequence of `context_tokens`: at most sliding_window tokens a layer."""
    windowed = arch.n_layers - pooled_layers(arch)
    return windowed * min(context_tokens, arch.sliding_window) * kv_layer_bytes(arch, kv_bytes, tensor_parallel)


@dataclass(frozen=True)
class MemoryPlan:
    gpu_memory_bytes: float
    gpu_memory_utilization: float
    tensor_parallel: int
    weights_bytes_per_gpu: float
    reserve_bytes: float
    kv_budget_bytes_per_gpu: float  # what is left for the KV cache (negative: the weights do not fit)
    kv_bytes_per_token: float  # the whole model's, summed over the TP group's GPUs
    kv_bytes_per_token_per_gpu: float
    kv_block_size: int
    num_kv_blocks: int  # per replica: every GPU of a TP group holds the same blocks' share
    memory_fraction_of: str = "total"  # gpu_memory_utilization's share: of the card, or of what weights leave
    expert_parallel: int = 1
    # the sliding-window layers' KV a token costs on a GPU, up to sliding_window tokens a sequence (load_fit)
    window_kv_bytes_per_token_per_gpu: float = 0.0
    sliding_window: int = 0

    def window_blocks(self, context_tokens: int) -> int:
        """The pool's blocks a sequence's sliding-window KV takes (its bytes at the pool's bytes a block)."""
        windowed = min(context_tokens, self.sliding_window) * self.window_kv_bytes_per_token_per_gpu
        return math.ceil(windowed / (self.kv_block_size * self.kv_bytes_per_token_per_gpu))

    @property
    def weights_fit(self) -> bool:
        return self.num_kv_blocks > 0

    @property
    def kv_tokens(self) -> int:
        return self.num_kv_blocks * self.kv_block_size


def plan_memory(
    arch: Architecture,
    gpu_memory_bytes: float,
    gpu_memory_utilization: float = 0.9,
    tensor_parallel: int = 1,
    kv_bytes: float = 2,
    kv_block_size: int = 16,
    reserve_bytes: float = DEFAULT_RESERVE_BYTES,
    memory_fraction_of: str = "total",
    expert_parallel: int = 1,
) -> MemoryPlan:
    """The KV blocks a GPU's memory leaves: memory x utilization - weights - reserve ("total"), or (memory - weights
    - reserve) x utilization ("free", TensorRT-LLM's kv_cache_free_gpu_memory_fraction). Weights per GPU:
    weights_bytes_per_gpu (the routed experts over max(TP, `expert_parallel`) GPUs)."""
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization: {gpu_memory_utilization} is not in (0, 1]; vLLM's default is 0.9")
    if tensor_parallel < 1:
        raise ValueError(f"tensor_parallel: {tensor_parallel}; use 1 or more GPUs")
    check_tensor_parallel(arch, tensor_parallel)
    if (problem := expert_parallel_problem(arch, tensor_parallel, expert_parallel)) is not None:
        raise ValueError(f"expert_parallel: {problem}")
    weights = weights_bytes_per_gpu(arch, tensor_parallel, expert_parallel)
    if memory_fraction_of == "free":
        budget = (gpu_memory_bytes - weights - reserve_bytes) * gpu_memory_utilization
    else:
        budget = gpu_memory_bytes * gpu_memory_utilization - weights - reserve_bytes
    per_token_gpu = kv_bytes_per_token(arch, kv_bytes, tensor_parallel)
    blocks = max(0, math.floor(budget / (per_token_gpu * kv_block_size)))
    return MemoryPlan(
        gpu_memory_bytes,
        gpu_memory_utilization,
        tensor_parallel,
        weights,
        reserve_bytes,
        budget,
        kv_bytes_per_token(arch, kv_bytes),
        per_token_gpu,
        kv_block_size,
        blocks,
        memory_fraction_of,
        expert_parallel,
        (arch.n_layers - pooled_layers(arch)) * kv_layer_bytes(arch, kv_bytes, tensor_parallel),
        arch.sliding_window,
    )


def load_fit(plan: MemoryPlan, context_tokens: int, concurrency: int) -> dict:
    """Whether `concurrency` sequences of `context_tokens` each fit in the KV blocks, and the limits either way.
    A sequence holds whole blocks, so it costs ceil(context / block) of them, and its sliding-window layers' KV (at
    most the window's tokens) in blocks of the pool's bytes."""
    blocks_per_seq = math.ceil(context_tokens / plan.kv_block_size) + plan.window_blocks(context_tokens)
    needed_blocks = blocks_per_seq * concurrency
    return {
        "kv_bytes_needed_per_gpu": needed_blocks * plan.kv_block_size * plan.kv_bytes_per_token_per_gpu,
        "kv_blocks_needed": needed_blocks,
        "fits": plan.weights_fit and needed_blocks <= plan.num_kv_blocks,
        "max_concurrency_at_context": plan.num_kv_blocks // blocks_per_seq,
        "max_context_at_concurrency": max(
            0, (plan.num_kv_blocks // concurrency - plan.window_blocks(context_tokens)) * plan.kv_block_size
        ),
    }


def memory_lines(
    arch: Architecture, plan: MemoryPlan, context_tokens: int, concurrency: int, precision: Precision
) -> list[str]:
    """`bench memory`'s answer: weights, KV per token, KV for the asked load, and what fits."""
    fit = load_fit(plan, context_tokens, concurrency)
    gb = 1e9
    active = f", {arch.active_params() / 1e9:.2f} B active a token" if arch.is_moe else ""
    lines = [f"model {arch.name}: {arch.param_count() / 1e9:.2f} B parameters{active} ({arch.source or 'built-in'})"]
    lines.append(f"precision: weights {precision.weights_text(arch)}, KV cache {precision.kv_cache_text()}")
    ep = f", expert parallel {plan.expert_parallel}" if plan.expert_parallel > 1 else ""
    lines.append(
        f"weights: {weights_bytes(arch) / gb:.2f} GB, {plan.weights_bytes_per_gpu / gb:.2f} GB per GPU "
        f"at tensor parallel {plan.tensor_parallel}{ep}"
    )
    lines.append(f"KV cache: {plan.kv_bytes_per_token:,.0f} bytes per token ({kv_formula(arch, precision)})")
    lines.append(
        f"the load: {concurrency} sequences x {context_tokens:,} tokens = "
        f"{fit['kv_bytes_needed_per_gpu'] / gb:.2f} GB of KV per GPU"
    )
    lines.append(
        f"GPU memory: {plan.gpu_memory_bytes / gb:.2f} GB ({plan.gpu_memory_bytes / GIB:.2f} GiB) x "
        f"{plan.gpu_memory_utilization:g} utilization, "
        f"less weights and {plan.reserve_bytes / gb:.2f} GB reserve = "
        f"{plan.kv_budget_bytes_per_gpu / gb:.2f} GB for KV: {plan.num_kv_blocks:,} blocks of "
        f"{plan.kv_block_size} tokens ({plan.kv_tokens:,} tokens)"
    )
    if not plan.weights_fit:
        lines.append(
            "fits: NO, the weights alone fill the memory: fewer weight bits, a bigger GPU or more tensor parallelism"
        )
    else:
        verdict = "yes" if fit["fits"] else "NO"
        lines.append(
            f"fits: {verdict}; at {context_tokens:,} tokens up to {fit['max_concurrency_at_context']:,} "
            f"sequences, at {concurrency} sequences up to {fit['max_context_at_concurrency']:,} tokens each"
        )
    return lines


def kv_formula(arch: Architecture, precision: Precision) -> str:
    """How bench memory's KV bytes per token are made: the layers, the elements a layer keeps, the bytes each."""
    b = precision.kv_bytes
    each = f"{b} byte{'s' * (b != 1)}"
    layers = pooled_layers(arch)
    if arch.is_mla:
        text = (
            f"{precision.kv_cache_resolved}: MLA's latent, {layers} layers x ({arch.kv_lora_rank} + "
            f"{arch.qk_rope_head_dim}) x {each}, on every GPU"
        )
    else:
        text = (
            f"{precision.kv_cache_resolved}: 2 x {layers} layers x {arch.n_kv_heads} KV heads x {arch.head_dim} "
            f"head dim x {each}"
        )
    if layers < arch.n_layers:
        text += f"; {arch.n_layers - layers} sliding-window layers beside, at most {arch.sliding_window} tokens each"
    return text
