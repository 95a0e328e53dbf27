"""The serving engines `bench plan` simulates, one typed profile each: vLLM V1 (`vllm`), SGLang (`sglang`),
TensorRT-LLM's trtllm-serve on its PyTorch backend (`trtllm`), llama.cpp's llama-server (`llamacpp`) and the native
engine (`native`). `backend.kind` picks the profile; the engine's own flags in `backend.launch.args` change its
settings as they change the engine's (harness/plan/engine_flags.py).

A profile is what the engine does when nobody tells it otherwise, read from its current source (each constant's
comment names the repository, path and commit): how many sequences one step may batch and how many tokens it may
compute, whether a long prompt is cut into chunks, the order prefills and decodes are batched in, what happens when
the KV cache runs out, the prefix cache, the KV block, the share of GPU memory it takes, the waiting queue's bound,
the decode batch sizes it captures CUDA graphs for, and what one step and one request cost beyond the kernels.

What the planner acts on: max sequences, token budget, chunked prefill on/off, prefix cache on/off and kind, KV
block size, memory fraction (and whether it is a share of the whole card or of what the weights leave), the
waiting-queue bound, CUDA-graph padding of decode batches (harness/plan/roofline_model.py), per-step and
per-request overheads. What it cannot act on yet is listed in each profile's `not_modelled`, printed with every plan.

The overheads (`Overheads`) are stated, not measured: one place per profile for the lead to set from the published
calibration rows (benchmarks/published/README.md). Engines whose KV page is finer than 16 tokens (SGLang's page of
one token, llama.cpp's cells) are simulated in 16-token blocks (SIMULATED_MIN_BLOCK): the native BlockManager keeps a
Python object per block, and a page of one on an 80 GB card would be half a million of them per replica.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from harness.scenario.gpus import GIB, MIB, GpuSpec

SIMULATED_MIN_BLOCK = 16  # tokens: a finer page is simulated in blocks of this many (the module's docstring)
VLLM = "vllm-project/vllm"
# vllm/engine/arg_utils.py @ 99d7eb5d6a512cfcc5a2b104f24ebf2d6cda772b, EngineArgs.get_batch_defaults
VLLM_ARG_UTILS = f"{VLLM} vllm/engine/arg_utils.py @ 99d7eb5d6a512cfcc5a2b104f24ebf2d6cda772b"
# vllm/config/vllm.py @ 09f030eaf851400a83ad3d99f730868f76df0ca7, VllmConfig._set_cudagraph_sizes
VLLM_GRAPHS = f"{VLLM} vllm/config/vllm.py @ 09f030eaf851400a83ad3d99f730868f76df0ca7"
VLLM_SCHEDULER = f"{VLLM} vllm/config/scheduler.py @ 01230b40128e570a58e54e75f7e55c4d5cd9246d"
# SGLang's ServerArgs and _handle_gpu_memory_settings as the search index stores the 2026 main branch (it gave no
# commit for that version); the model runner's max_running_requests rule from model_runner.py of the same branch
SGLANG_ARGS = "sgl-project/sglang python/sglang/srt/server_args.py (main, 2026: _handle_gpu_memory_settings)"
SGLANG_RUNNER = "sgl-project/sglang python/sglang/srt/model_executor/model_runner.py (main, 2026: max_num_reqs)"
TRTLLM_SERVE = "NVIDIA/TensorRT-LLM tensorrt_llm/commands/serve.py @ 4c05a74891e4df8066f08ed4ce14b0972abe4e25"
TRTLLM_ARGS = "NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py @ fcd3f31682808ae56118ae43c1d7864a3a945e6f"
LLAMACPP_COMMON = "ggml-org/llama.cpp common/common.h @ de93b991682fa46acabb813641f7f6b884ad5dd0"


@dataclass(frozen=True, kw_only=True)
class Overheads:
    """What one engine adds beyond the roofline's kernels: per step (scheduling, input preparation, sampling,
    detokenizing the step's tokens) and per request (HTTP, chat template, tokenizing; the server's share of TTFT).
    Stated, not measured: set them here, from the published calibration rows."""

    step_ms: float
    request_ms: float


@dataclass(frozen=True, kw_only=True)
class EngineSettings:
    """One engine's settings on one GPU: its defaults there (EngineProfile.defaults), then its flags."""

    max_num_seqs: int | None  # None: derived from the KV cache once it is known (SGLang's max_running_requests)
    max_num_batched_tokens: int  # tokens one step computes, prefill chunks and decodes together
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    kv_block_size: int  # tokens a KV block (page) holds, the engine's own
    memory_fraction: float  # of the card (memory_fraction_of "total") or of what weights leave ("free")
    max_waiting: int | None  # requests the waiting queue holds before the server refuses; None: no bound
    schedule_policy: str  # the native scheduler's admission order standing for the engine's: fcfs | lpm
    max_model_len: int | None  # tokens one sequence may hold; None: what the KV cache holds
    cuda_graph_max_batch: int  # the largest decode batch replayed from a CUDA graph; 0: no CUDA graphs
    cuda_graph_sizes: tuple[int, ...] | None = None  # given as a list (TRT-LLM's batch_sizes); None: the rule's
    cuda_graph_padding: bool = True  # a decode batch runs at the next captured size up (False: eager unless exact)


@dataclass(frozen=True, kw_only=True)
class EngineProfile:
    """One engine's behaviour as a plan can simulate it; subclasses compute the defaults that depend on the GPU."""

    kind: str  # backend.kind
    name: str
    batching: Literal["mixed", "prefill_apart"]  # prefill chunks and decodes in one step, or in steps of their own
    admission: Literal["preempt", "reserve_max_tokens"]  # KV runs out: recompute the newest; or reserve at admission
    prefix_cache: str  # the native BlockManager's cache standing for the engine's: hash | radix
    prefix_cache_words: str  # the engine's own words for it
    memory_fraction_of: Literal["total", "free"]  # "free": of what the weights and activations leave (TRT-LLM)
    router_policy: str = "round_robin"  # how requests reach data-parallel replicas (native routing_policy's names)
    reserve_bytes: float  # activations, CUDA graphs and the runtime beside weights and KV, per GPU
    overheads: Overheads
    sources: tuple[str, ...]
    not_modelled: tuple[str, ...]

    def defaults(self, gpu: GpuSpec, tensor_parallel: int) -> EngineSettings:
        raise NotImplementedError

    def settle(self, settings: EngineSettings, gpu: GpuSpec, tensor_parallel: int, given: frozenset) -> EngineSettings:
        """The settings that follow from others once the flags are in (`given`: the fields flags set)."""
        return settings

    def capture_sizes(self, settings: EngineSettings) -> tuple[int, ...]:
        """The decode batch sizes with a captured CUDA graph, ascending (none: no graphs)."""
        return settings.cuda_graph_sizes or ()

    def max_running(self, settings: EngineSettings, kv_tokens: int, max_model_len: int) -> int:
        """Sequences one step may batch, once the KV cache's size is known."""
        return settings.max_num_seqs or 1

    def simulated_block_size(self, settings: EngineSettings) -> int:
        return max(settings.kv_block_size, SIMULATED_MIN_BLOCK)

    def kv_limits(self, settings: EngineSettings, kv_tokens: int) -> tuple[int, int]:
        """(KV tokens a replica holds, tokens one sequence may hold) once memory gave kv_tokens: max_model_len caps
        a sequence, not the cache."""
        return kv_tokens, min(kv_tokens, settings.max_model_len or kv_tokens)


def _vllm_large_gpu(gpu: GpuSpec) -> bool:
    """vLLM's test for its larger batch defaults: 70 GiB or more and not an A100 (arg_utils.get_batch_defaults;
    PR #17885 found the larger token budget slower on A100)."""
    return gpu.hbm_bytes >= 70 * GIB and "a100" not in gpu.name.lower()


@dataclass(frozen=True, kw_only=True)
class VllmProfile(EngineProfile):
    """vLLM V1 (`vllm serve`): one scheduler loop, running requests first (decodes and unfinished prefill chunks),
    then waiting ones while the token budget and max_num_seqs allow: the native scheduler's own order. KV blocks
    run out: the newest running request is preempted and recomputed (V1's only preemption mode)."""

    def defaults(self, gpu: GpuSpec, tensor_parallel: int) -> EngineSettings:
        large = _vllm_large_gpu(gpu)
        return EngineSettings(
            # OPENAI_API_SERVER: 1024 sequences and 8192 tokens on >= 70 GiB GPUs other than A100, else 256 and
            # 2048 (VLLM_ARG_UTILS, get_batch_defaults)
            max_num_seqs=1024 if large else 256,
            max_num_batched_tokens=8192 if large else 2048,
            enable_chunked_prefill=True,  # VLLM_SCHEDULER: enable_chunked_prefill = True
            enable_prefix_caching=True,  # V1 turns prefix caching on for generative models (VLLM_ARG_UTILS)
            kv_block_size=16,  # CUDA platforms' default block_size (vllm/platforms/cuda.py check_and_update_config)
            memory_fraction=0.9,  # EngineArgs.gpu_memory_utilization = CacheConfig's 0.9
            max_waiting=None,  # the V1 scheduler's waiting queue has no bound: requests queue, none is refused
            schedule_policy="fcfs",  # SchedulerConfig.policy = "fcfs" (VLLM_SCHEDULER)
            max_model_len=None,
            cuda_graph_max_batch=0,  # settled from max_num_seqs (settle)
        )

    def settle(self, settings: EngineSettings, gpu: GpuSpec, tensor_parallel: int, given: frozenset) -> EngineSettings:
        if "cuda_graph_max_batch" in given:
            return settings
        # VLLM_GRAPHS: max_cudagraph_capture_size = min(max_num_seqs x 2, 512), then at most max_num_batched_tokens
        largest = min(settings.max_num_seqs * 2, 512, settings.max_num_batched_tokens)
        return dataclasses.replace(settings, cuda_graph_max_batch=largest)

    def capture_sizes(self, settings: EngineSettings) -> tuple[int, ...]:
        """VLLM_GRAPHS: 1, 2, 4, then every 8 below 256, then every 16 up to the largest."""
        largest = settings.cuda_graph_max_batch
        if largest <= 0:
            return ()
        sizes = [s for s in (1, 2, 4) if s <= largest]
        sizes += list(range(8, min(largest + 1, 256), 8)) + list(range(256, largest + 1, 16))
        return tuple(sizes)


def _sglang_memory_tier(gpu: GpuSpec, tensor_parallel: int) -> tuple[int, int]:
    """(chunked_prefill_size, cuda_graph_max_bs) by the card's memory in MiB (SGLANG_ARGS _handle_gpu_memory_settings:
    T4-class, A10-class, A100-40GB/L40-class, H100-class, H200-class, B200-class)."""
    mib = gpu.hbm_bytes / MIB
    small_tp = tensor_parallel < 4
    if mib < 20 * 1024:
        return 2048, 8
    if mib < 35 * 1024:
        return 2048, 24 if small_tp else 80
    if mib < 60 * 1024:
        return 4096, 32 if small_tp else 160
    if mib < 160 * 1024:
        return 8192, 256 if small_tp else 512
    return 16384, 512


def sglang_mem_fraction_static(gpu: GpuSpec, tensor_parallel: int, chunked_prefill_size: int, graph_max: int) -> float:
    """SGLANG_ARGS: (memory - reserved) / memory in MiB, reserved = 512 + 1.5 x max(chunk, 2048) + 2 x cuda_graph_max_bs
    + TP x PP / 8 x 1024, at least 10 GiB on cards over 60 GiB; rounded to 3 places as SGLang rounds it."""
    mib = gpu.hbm_bytes / MIB
    reserved = 512 + max(chunked_prefill_size, 2048) * 1.5 + graph_max * 2 + tensor_parallel / 8 * 1024
    if mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((mib - reserved) / mib, 3)


@dataclass(frozen=True, kw_only=True)
class SglangProfile(EngineProfile):
    """SGLang (`python -m sglang.launch_server`): a prefill batch (new requests, chunked at chunked_prefill_size)
    runs in a step of its own, ahead of the decode batch; the radix cache shares prefixes at any token. Requests are
    admitted while the KV pool covers their prompt and an estimate of their answer, and decodes are retracted when it
    runs out."""

    def defaults(self, gpu: GpuSpec, tensor_parallel: int) -> EngineSettings:
        chunk, graph_max = _sglang_memory_tier(gpu, tensor_parallel)
        return EngineSettings(
            max_num_seqs=None,  # max_running_requests: None, derived from the KV pool (max_running)
            max_num_batched_tokens=chunk,  # chunked_prefill_size: the prefill tokens of one step
            enable_chunked_prefill=True,  # chunked_prefill_size > 0 (-1 turns it off)
            enable_prefix_caching=True,  # disable_radix_cache: False
            kv_block_size=1,  # page_size None: 1 on the FlashInfer and FA3 backends
            memory_fraction=sglang_mem_fraction_static(gpu, tensor_parallel, chunk, graph_max),
            max_waiting=None,  # max_queued_requests: None (no bound)
            schedule_policy="fcfs",  # ServerArgs.schedule_policy = "fcfs"
            max_model_len=None,
            cuda_graph_max_batch=graph_max,
        )

    def settle(self, settings: EngineSettings, gpu: GpuSpec, tensor_parallel: int, given: frozenset) -> EngineSettings:
        """SGLang sets mem_fraction_static from the chunk and the CUDA-graph batch it ends up with (flags included)."""
        if "memory_fraction" in given:
            return settings
        chunk = settings.max_num_batched_tokens if settings.enable_chunked_prefill else 16384  # max_prefill_tokens
        fraction = sglang_mem_fraction_static(gpu, tensor_parallel, chunk, settings.cuda_graph_max_batch)
        return dataclasses.replace(settings, memory_fraction=fraction)

    def capture_sizes(self, settings: EngineSettings) -> tuple[int, ...]:
        """SGLANG_ARGS _generate_cuda_graph_batch_sizes: 1, 2, 4, 8, 12, every 8 to 256, every 16 to 496, every 32."""
        largest = settings.cuda_graph_max_batch
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, largest + 1, 32)]
        return tuple(s for s in sizes if s <= largest)

    def max_running(self, settings: EngineSettings, kv_tokens: int, max_model_len: int) -> int:
        """SGLANG_RUNNER: max(min(tokens / context x 512, 4096), 2048), at most tokens / 2; the model's context is
        taken as the plan's max_model_len (the architectures here do not carry it)."""
        if settings.max_num_seqs is not None:
            return min(settings.max_num_seqs, max(kv_tokens // 2, 1))
        estimated = max(min(int(kv_tokens / max(max_model_len, 1) * 512), 4096), 2048)
        return max(min(estimated, kv_tokens // 2), 1)


@dataclass(frozen=True, kw_only=True)
class TrtllmProfile(EngineProfile):
    """TensorRT-LLM's `trtllm-serve` on the PyTorch backend: in-flight batching (contexts and generations in one
    step, generations first), a context run whole unless chunked prefill is on, GUARANTEED_NO_EVICT admission
    (a request starts only when the KV blocks for its prompt and max_tokens are free, and is never evicted)."""

    def defaults(self, gpu: GpuSpec, tensor_parallel: int) -> EngineSettings:
        return EngineSettings(
            # TRTLLM_SERVE passes BuildConfig's max_batch_size 2048 and max_num_tokens 8192 (the defaults the
            # TensorRT-LLM docs' "Tuning Max Batch Size and Max Num Tokens" page states)
            max_num_seqs=2048,
            max_num_batched_tokens=8192,
            enable_chunked_prefill=False,  # TRTLLM_SERVE: --enable_chunked_prefill is_flag, default False
            enable_prefix_caching=True,  # TRTLLM_ARGS KvCacheConfig.enable_block_reuse = True
            kv_block_size=32,  # KvCacheConfig.tokens_per_block = 32 (llm_args.py of 2026 main)
            memory_fraction=0.9,  # TRTLLM_SERVE: --kv_cache_free_gpu_memory_fraction 0.9, of the free memory
            max_waiting=None,  # the executor's request queue has no bound by default
            schedule_policy="fcfs",
            max_model_len=None,
            # TRTLLM_ARGS CudaGraphConfig: on by default for decode-only batches, max_batch_size 0 -> 128, sizes
            # 1..31, 32, 64, 128, enable_padding False (a batch between sizes runs eagerly)
            cuda_graph_max_batch=128,
            cuda_graph_padding=False,
        )

    def capture_sizes(self, settings: EngineSettings) -> tuple[int, ...]:
        if settings.cuda_graph_sizes is not None:
            return tuple(sorted(settings.cuda_graph_sizes))
        largest = settings.cuda_graph_max_batch
        if settings.cuda_graph_padding:  # TRTLLM_ARGS _generate_cuda_graph_batch_sizes with enable_padding
            sizes = [1, 2, 4, *(8 * i for i in range(1, 17))]
        else:
            sizes = [*range(1, 32), 32, 64, 128]
        sizes += [2**i for i in range(8, max(largest, 1).bit_length())]
        return tuple(sorted({s for s in sizes if s <= largest} | ({largest} if largest else set())))


@dataclass(frozen=True, kw_only=True)
class LlamacppProfile(EngineProfile):
    """llama.cpp's `llama-server`: --parallel slots, each a sequence; one llama_decode a step takes every slot's
    next token and prompt tokens up to --batch-size (continuous batching on); the KV cache is --ctx-size tokens,
    split evenly over the slots."""

    def defaults(self, gpu: GpuSpec, tensor_parallel: int) -> EngineSettings:
        return EngineSettings(
            max_num_seqs=1,  # LLAMACPP_COMMON: n_parallel = 1
            max_num_batched_tokens=2048,  # n_batch = 2048 (the logical batch a llama_decode takes)
            enable_chunked_prefill=True,  # a prompt longer than n_batch is fed n_batch tokens at a time
            enable_prefix_caching=True,  # the server reuses a slot's cached prompt prefix (cache_prompt)
            kv_block_size=1,  # KV cells, one a token
            memory_fraction=1.0,  # no fraction: it allocates what --ctx-size asks (max_model_len caps it)
            max_waiting=None,  # requests wait for a free slot, none is refused
            schedule_policy="fcfs",
            max_model_len=4096,  # n_ctx = 4096, the whole cache: each of n_parallel slots gets n_ctx / n_parallel
            cuda_graph_max_batch=0,  # CUDA graphs of ggml's backend (batch-one decode) not modelled: no padding
        )

    def max_running(self, settings: EngineSettings, kv_tokens: int, max_model_len: int) -> int:
        return settings.max_num_seqs or 1

    def kv_limits(self, settings: EngineSettings, kv_tokens: int) -> tuple[int, int]:
        """--ctx-size is the whole cache (at most what memory holds), split evenly over the --parallel slots."""
        total = min(kv_tokens, settings.max_model_len or kv_tokens)
        return total, max(total // (settings.max_num_seqs or 1), 1)


@dataclass(frozen=True, kw_only=True)
class NativeProfile(EngineProfile):
    """The native engine (`bench serve`): its settings are `bench serve`'s flags, parsed by its own command line
    (harness/plan/deployment.py), exactly as before profiles existed."""

    def defaults(self, gpu: GpuSpec, tensor_parallel: int) -> EngineSettings:
        raise ValueError("the native engine's settings are bench serve's flags (harness/plan/deployment.py)")


PROFILES: dict[str, EngineProfile] = {
    p.kind: p
    for p in (
        NativeProfile(
            kind="native",
            name="native engine",
            batching="mixed",
            admission="preempt",
            prefix_cache="hash",
            prefix_cache_words="hash chain of 16-token blocks (or --prefix-cache radix)",
            memory_fraction_of="total",
            reserve_bytes=1 * GIB,  # harness/plan/memory.py DEFAULT_RESERVE_BYTES: what plans always assumed
            overheads=Overheads(step_ms=1.0, request_ms=0.0),  # roofline_model.DEFAULTS' 1 ms; none per request
            sources=("native_engine/config.py",),
            not_modelled=(),
        ),
        VllmProfile(
            kind="vllm",
            name="vLLM V1",
            batching="mixed",
            admission="preempt",
            prefix_cache="hash",
            prefix_cache_words="hash chain of full blocks (automatic prefix caching)",
            memory_fraction_of="total",
            # --data-parallel-size: the front end sends a request to the engine with the fewest waiting x 4 + running
            # (vllm/v1/engine/core_client.py DPLBAsyncMPClient, commit not looked up): least_load stands for it
            router_policy="least_load",
            # the profile run's activation peak and the CUDA graphs' memory, beside weights: 0.5-2 GiB measured on
            # 8B-70B models (harness/plan/memory.py DEFAULT_RESERVE_BYTES)
            reserve_bytes=1 * GIB,
            overheads=Overheads(step_ms=2.0, request_ms=10.0),  # stated: API server + engine core IPC, uncalibrated
            sources=(VLLM_ARG_UTILS, VLLM_GRAPHS, VLLM_SCHEDULER),
            not_modelled=(
                "async scheduling (off by default) and the CPU work it overlaps",
                "steps beyond the largest CUDA graph run eagerly at the same per-step overhead",
                "--max-num-partial-prefills > 1 (one partial prefill at a time, as the default)",
            ),
        ),
        SglangProfile(
            kind="sglang",
            name="SGLang",
            batching="prefill_apart",
            admission="preempt",
            prefix_cache="radix",
            prefix_cache_words="radix tree of token pages (RadixAttention)",
            memory_fraction_of="total",
            reserve_bytes=0.0,  # activations and CUDA graphs are the 1 - mem_fraction_static SGLang leaves
            overheads=Overheads(step_ms=1.5, request_ms=8.0),  # stated: tokenizer manager + scheduler, uncalibrated
            sources=(SGLANG_ARGS, SGLANG_RUNNER),
            not_modelled=(
                "admission by the KV pool's room for prompt + new_token_ratio x max_new_tokens, and retraction: "
                "the plan admits by the prompt's blocks and preempts the newest (recompute)",
                f"page size 1: simulated in {SIMULATED_MIN_BLOCK}-token blocks (a sequence's KV rounded up to 16 "
                "tokens, prefix hits in whole blocks)",
                "overlap scheduling (the CPU's next batch prepared during the GPU's step)",
            ),
        ),
        TrtllmProfile(
            kind="trtllm",
            name="TensorRT-LLM (trtllm-serve, PyTorch backend)",
            batching="mixed",
            admission="reserve_max_tokens",
            prefix_cache="hash",
            prefix_cache_words="KV block reuse (enable_block_reuse, 32-token blocks)",
            memory_fraction_of="free",
            reserve_bytes=1 * GIB,  # activations and CUDA graphs, taken before the free fraction
            overheads=Overheads(step_ms=1.0, request_ms=10.0),  # stated: OpenAI server + executor, uncalibrated
            sources=(TRTLLM_SERVE, TRTLLM_ARGS),
            not_modelled=(
                "decode batches between CUDA-graph sizes run eagerly at the same per-step overhead",
                "partial block reuse (enable_partial_reuse): prefix hits in whole 32-token blocks",
            ),
        ),
        LlamacppProfile(
            kind="llamacpp",
            name="llama.cpp (llama-server)",
            batching="mixed",
            admission="preempt",
            prefix_cache="radix",
            prefix_cache_words="each slot's cached prompt, reused up to the first differing token",
            memory_fraction_of="total",
            reserve_bytes=1 * GIB,  # compute buffers beside weights and the KV cache
            overheads=Overheads(step_ms=0.5, request_ms=2.0),  # stated: one C++ process, uncalibrated
            sources=(LLAMACPP_COMMON,),
            not_modelled=(
                "a slot's prompt cache is per slot; the plan shares prefixes across slots (a radix cache)",
                f"KV cells of one token: simulated in {SIMULATED_MIN_BLOCK}-token blocks",
                "tensor parallelism: llama.cpp splits layers (--split-mode layer), the plan's TP all-reduces",
            ),
        ),
    )
}


def engine_profile(kind: str) -> EngineProfile:
    """backend.kind's profile; a ValueError naming backend.kind and the kinds a plan simulates."""
    if kind not in PROFILES:
        raise ValueError(
            f"backend.kind {kind!r}: bench plan has no profile of it; it simulates {', '.join(PROFILES)} "
            "(harness/plan/engine_profiles.py)"
        )
    return PROFILES[kind]
