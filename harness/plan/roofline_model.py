"""The `roofline` step model: one engine step's time on a GPU from the model's shapes and the GPU's datasheet.

    step_s = sum over kernels k of (flops_k / (peak_k x mfu) + bytes_k / (hbm_bytes_per_s x mbu))
             + allreduce_s + overhead_s

per GPU of a tensor-parallel group, over three kernel groups whose FLOPs and bytes keep one ratio through the
layers: the layers' GEMMs (their weights x the step's tokens), lm_head (its weights x the sequences sampled)
and attention (queries x attended positions; the KV cache read and written). A step's kernels run one after
another on one stream, so their times add: a decode batch's KV read is not hidden under a prefill chunk's
compute-bound GEMMs. Within a group, compute and memory time add too, rather than the ideal roofline's max: at
the batches engines decode at, a GEMM's tiles stream their weights and multiply them without hiding either, so
a measured decode step grows linearly from the weights' read, not flat until the compute roof. TensorRT-LLM
0.14's Llama-3.1-70B on 4 x H100 decodes at 21, 24, 32 and 66 ms a token at 2, 4, 8 and 16 req/s (the max form
said 19, 20, 23, 44); MLPerf v4.1's DGX-H100 Server runs ~850 sequences a replica at 156 ms a step, which is the
weights' ~15 ms plus 0.16 ms a sequence (its Offline throughput's inverse), where the max form's step stays at
~24 ms up to ~215 sequences (benchmarks/published/gpu_rows.yaml; docs/planner.md, "Against published GPU
measurements"). FLOPs are counted as the native engine's step trace counts them
(native_engine/step_trace.py): 2 per weight per token through the layers, 2 per lm_head weight per sequence
sampled, and 4 x layers x q_dim per (query token, attended position) (attention_pairs). Bytes: the weights
read once a step at their stored bits, the KV cache read over the attended context and written for the new
tokens at the KV cache's bytes; activations are left out (they stay in cache at these sizes).

Precision (harness/scenario/precision.py): the layers' GEMMs run at the tensor peak of the deployment's compute
precision (fp8 for W8A8, bf16 for weight-only int4); attention and lm_head at the bf16 peak.

Under TP each GPU does 1/TP of the FLOPs and reads 1/TP of the weights, and every layer ends its
attention and its FFN with an all-reduce of the step's hidden states (Megatron-style TP: two per layer),
a ring over the interconnect: each GPU sends and receives 2 x (TP-1)/TP of the message, at half the
datasheet's both-ways figure times the share NCCL moves data at (link_efficiency), plus a latency per ring hop.
NVLink at 0.82: NCCL's own model of a Hopper NVLink is 20.6 GB/s of the line's 25 GB/s a link (SM90_NVLINK_BW,
src/graph/topo.h, NVIDIA/nccl @ 5067397c), its maintainer's "450 GB/s is the line rate ... NCCL can get an effective
NVLink bandwidth of 370 GB/s" (NVIDIA/nccl-tests issue 212); A100's 20.0 and Blackwell's 40.1 of 25 and 50 GB/s
are 0.80. PCIe at 0.5: NCCL takes a Gen4 x16 link at 24 of its 32 GB/s one way (x100 Mb/s a lane / 80,
src/graph/topo.cc) and the link between two AMD CPUs at 16 GB/s (AMD_BW), which a group of 8 PCIe GPUs in a
two-socket server crosses: 16 / 32. Without them the TensorRT-LLM 0.17 Llama-3.1-70B calibration rows drifted with
TP (H100 TP8 +24%, L40S TP4 +36%, TP8 +68% output tok/s: too fast where the all-reduce is a large share).

CUDA graphs (`capture_sizes`, the engine profile's, harness/plan/engine_profiles.py): a decode-only step of n
sequences, n up to the largest captured size, runs the graph of the next captured size up, so its layers' GEMMs and
all-reduces compute that many rows (the padding rows' attention reads no KV, and lm_head samples the real rows only).
Past the largest size, or with `pad_to_capture` off (TensorRT-LLM's default: a batch between sizes runs eagerly), the
step computes its own rows.

Mixture of experts (harness/plan/architectures.py): a token's FLOPs go through its experts_per_token routed experts and
the shared ones (Architecture.active_matmul_params). A step reads the weights every token needs (attention, dense and
shared FFNs, routers, lm_head) and, per MoE layer, the routed experts its tokens were sent to. Routing is taken as
uniform and independent: each of B tokens picks k of E experts, so an expert is left untouched with probability
(1 - k/E)^B and a layer reads E x (1 - (1 - k/E)^B) experts on expectation (B = 1: k; B = 64 with k/E = 8/128:
125.9 of 128). Real routers are skewed, which touches fewer experts than this at a given batch.
Expert parallelism of size EP > 1 (each GPU holds whole experts, max(TP, EP) GPUs hold them all): the routed tokens of
EP / TP replicas stepping alike share those GPUs, so B is this step's tokens x max(TP, EP) / TP and each GPU reads its
1 / max(TP, EP) share of the touched experts; each MoE layer's FFN all-reduce becomes two all-to-alls (dispatch and
combine), each GPU sending its 1/TP of the step's tokens x k x hidden activations, (G-1)/G of them to other GPUs, over
the same link at the same rate as the all-reduce (link_efficiency), plus a hop latency per peer.
Sliding-window layers (GPT-OSS) attend to, and read the KV of, at most sliding_window positions a query.

MFU, MBU and the overhead are stated defaults (DEFAULTS; an engine profile's own per-step overhead), overridable in
the scenario, and fittable from one measured run (harness/plan/roofline_fit.py).
"""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass

from harness.plan.architectures import Architecture
from harness.plan.memory import expert_gpus, kv_bytes_per_token, kv_layer_bytes, pooled_layers
from harness.plan.precision import MODEL_PRECISION, Precision
from harness.plan.step_model import StepShape
from harness.scenario.gpus import GpuSpec


@dataclass(frozen=True)
class RooflineParams:
    mfu: float = 0.6  # share of the dense peak, with compute and reads added (set on the calibration rows)
    mbu: float = 0.7  # decode kernels stream weights and KV at ~60-80% of HBM bandwidth
    overhead_ms: float = 1.0  # scheduling, sampling, launches per step with CUDA graphs
    allreduce_hop_latency_us: float = 2.0  # one ring hop's fixed cost (NCCL over NVLink: a few microseconds)
    # the share of a link's one-way line rate a ring all-reduce moves data at (NCCL's busbw / line rate): see
    # link_efficiency() and docs/planner.md, "Roofline step model"
    nvlink_efficiency: float = 0.82  # NVLink, NVLink bridges, Infinity Fabric: NCCL's 20.6 of 25 GB/s a Hopper link
    pcie_efficiency: float = 0.5  # PCIe: NCCL's 16 GB/s between two CPUs over a Gen4 x16's 32 GB/s


DEFAULTS = RooflineParams()


def link_efficiency(gpu: GpuSpec, params: RooflineParams = DEFAULTS) -> float:
    """The share of `gpu`'s link (half its both-ways figure) that a tensor-parallel all-reduce moves data at:
    params.pcie_efficiency where the link is PCIe, params.nvlink_efficiency for a GPU fabric (NVLink, an NVLink
    bridge, AMD's Infinity Fabric)."""
    return params.pcie_efficiency if gpu.interconnect.startswith("PCIe") else params.nvlink_efficiency


@dataclass(frozen=True)
class KernelCost:
    """A group of kernels whose FLOPs and bytes keep one ratio through the layers: compute and reads, added."""

    flops: float
    bytes: float
    compute_s: float
    memory_s: float

    @property
    def time_s(self) -> float:
        return self.compute_s + self.memory_s


@dataclass(frozen=True)
class StepCosts:
    """One step per GPU: its three kernel groups, each its compute and reads, run one after another."""

    layers: KernelCost  # the layers' GEMMs: weights x tokens
    lm_head: KernelCost  # lm_head's GEMM: its weights x the sequences sampled
    attention: KernelCost  # attention: queries x the KV positions they attend, the KV cache read and written
    allreduce_s: float
    overhead_s: float
    all_to_all_s: float = 0.0  # expert parallelism's dispatch and combine, every MoE layer

    @property
    def kernels(self) -> tuple[KernelCost, KernelCost, KernelCost]:
        return self.layers, self.lm_head, self.attention

    @property
    def flops_per_gpu(self) -> float:
        return sum(k.flops for k in self.kernels)

    @property
    def bytes_per_gpu(self) -> float:
        return sum(k.bytes for k in self.kernels)

    @property
    def compute_s(self) -> float:
        return sum(k.compute_s for k in self.kernels)

    @property
    def memory_s(self) -> float:
        return sum(k.memory_s for k in self.kernels)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s > self.memory_s else "memory"

    @property
    def step_s(self) -> float:
        return sum(k.time_s for k in self.kernels) + self.allreduce_s + self.all_to_all_s + self.overhead_s


def attention_pairs(shape: StepShape) -> float:
    """(query, attended position) pairs: each decoding sequence's one query over its context, and the prefill
    chunks' causal pairs (shape.prefill_pairs: n x start + n(n+1)/2 a chunk). The step shape sums the context over
    all its sequences, so the prefill chunks' share of it is taken back out, exactly for one chunk or chunks of
    one length. A shape without prefill_pairs (0 beside prefill chunks) spreads the step's queries evenly over
    its sequences: up to n^2/2 pairs high for a chunk of n tokens."""
    if shape.prefill_seqs == 0:
        return shape.context_tokens
    if shape.prefill_pairs == 0:
        tokens, seqs = shape.prefill_tokens + shape.decode_seqs, shape.prefill_seqs + shape.decode_seqs
        return shape.context_tokens * tokens / seqs
    chunk = shape.prefill_tokens / shape.prefill_seqs
    starts = (shape.prefill_pairs - shape.prefill_tokens * (chunk + 1) / 2) / chunk  # the chunks' start positions
    return shape.prefill_pairs + shape.context_tokens - starts - shape.prefill_tokens


class RooflineStepModel:
    def __init__(
        self,
        arch: Architecture,
        gpu: GpuSpec,
        tensor_parallel: int = 1,
        params: RooflineParams = DEFAULTS,
        precision: Precision = MODEL_PRECISION,
        activation_bytes: float = 2,
        capture_sizes: tuple[int, ...] = (),
        pad_to_capture: bool = True,
        expert_parallel: int = 1,
    ):
        """`arch` at its stored bits (harness/scenario/precision.py stored_architecture); `precision` the compute and
        KV cache dtypes; `capture_sizes` the decode batches with a CUDA graph (ascending), padded up to when
        `pad_to_capture`; `expert_parallel` the EP size (1: experts split as TP splits them). A ValueError naming
        plan.compute_dtype where `gpu` has no tensor cores for it."""
        self.arch, self.gpu, self.tp, self.params = arch, gpu, tensor_parallel, params
        self.ep = expert_parallel
        self.precision, self.activation_bytes = precision, activation_bytes
        self.capture_sizes, self.pad_to_capture = tuple(capture_sizes), pad_to_capture
        # padded[n]: the rows a decode batch of n computes (a lookup: step_time_s is the simulator's inner loop)
        sizes = self.capture_sizes if pad_to_capture else ()
        self.padded = [
            n if not sizes else sizes[min(bisect.bisect_left(sizes, n), len(sizes) - 1)]
            for n in range((sizes[-1] if sizes else 0) + 1)
        ]
        self.matmul_peak_flops = precision.compute_flops(gpu)
        self.bf16_peak_flops = gpu.tensor_flops("bf16")
        self.weight_bytes_read = arch.step_weight_bytes()  # the layers' and lm_head's, every expert, the whole model's
        self.lm_head_weight_bytes = arch.lm_head_params() * arch.lm_head_bits / 8
        self.layer_weight_bytes = arch.always_read_bytes() - self.lm_head_weight_bytes  # the routed experts apart
        self.kv_bytes_per_token_per_gpu = kv_bytes_per_token(arch, precision.kv_bytes, tensor_parallel)
        # per GPU, the FLOPs a unit of work costs (a token through the layers, a sampled sequence through lm_head,
        # an attended pair) and each term's seconds: step_time_s is the simulator's inner loop
        tp, s_per_flop = tensor_parallel, 1 / (self.bf16_peak_flops * params.mfu)
        self.flops_per_token = 2 * arch.active_matmul_params() / tp
        self.flops_per_sample = 2 * arch.lm_head_params() / tp
        self.flops_per_pair = arch.attention_flops_per_pair() / tp
        self.token_s = self.flops_per_token / (self.matmul_peak_flops * params.mfu)
        self.sample_s, self.pair_s = self.flops_per_sample * s_per_flop, self.flops_per_pair * s_per_flop
        s_per_byte = 1 / (gpu.hbm_bytes_per_s * params.mbu)
        self.s_per_byte, self.s_per_flop = s_per_byte, s_per_flop
        self.layer_read_s, self.lm_head_read_s = (
            self.layer_weight_bytes / tp * s_per_byte,
            self.lm_head_weight_bytes / tp * s_per_byte,
        )
        self.kv_position_s = self.kv_bytes_per_token_per_gpu * s_per_byte
        # what an all-reduce or all-to-all moves a second each way: half the link's both-ways figure, at the share
        # NCCL gets of it (link_efficiency)
        self.link_bytes_per_s = gpu.interconnect_bytes_per_s / 2 * link_efficiency(gpu, params)
        # routed experts: per GPU, the bytes of one expert in every MoE layer over the GPUs holding them, and the
        # tokens routed over those GPUs per token of this replica's step
        self.expert_gpus = expert_gpus(tensor_parallel, expert_parallel)
        self.experts_bytes_each = arch.moe_layers * arch.one_expert_bytes() / self.expert_gpus
        self.routed_tokens_per_token = self.expert_gpus / tensor_parallel
        # sliding-window layers: their share of the per-layer KV and attention, capped at the window
        self.windowed_layers = arch.n_layers - pooled_layers(arch)
        self.window_position_bytes = self.windowed_layers * kv_layer_bytes(arch, precision.kv_bytes, tensor_parallel)
        self.pooled_share = pooled_layers(arch) / arch.n_layers  # of the attention FLOPs, uncapped

    def experts_touched(self, tokens: int) -> float:
        """Expected distinct routed experts of one MoE layer that `tokens` routed tokens touch, uniform routing:
        E x (1 - (1 - k/E)^tokens)."""
        e, k = self.arch.n_experts, self.arch.experts_per_token
        return e * (1 - (1 - k / e) ** tokens) if e and tokens else 0.0

    def layer_read_bytes(self, tokens: int) -> float:
        """The layers' weights one GPU reads in a step of `tokens` tokens: its share of what every token needs and
        of the routed experts the step's tokens (and, under EP past TP, its peers') touch."""
        if not self.arch.is_moe:
            return self.layer_weight_bytes / self.tp
        touched = self.experts_touched(round(tokens * self.routed_tokens_per_token))
        return self.layer_weight_bytes / self.tp + touched * self.experts_bytes_each

    def attention_cost(self, shape: StepShape, tokens: int, seqs: int) -> tuple[float, float]:
        """(FLOPs, bytes) of the step's attention on one GPU: the pairs and the KV positions read and written, the
        sliding-window layers' capped at the window (each sequence reads at most sliding_window positions)."""
        pairs, positions = attention_pairs(shape), shape.context_tokens + tokens
        if not self.windowed_layers:
            return self.flops_per_pair * pairs, positions * self.kv_bytes_per_token_per_gpu
        window = self.arch.sliding_window
        capped_pairs = min(pairs, window * tokens)
        flops = self.flops_per_pair * (self.pooled_share * pairs + (1 - self.pooled_share) * capped_pairs)
        capped_positions = min(shape.context_tokens, window * seqs) + tokens
        return flops, positions * self.kv_bytes_per_token_per_gpu + capped_positions * self.window_position_bytes

    def graph_rows(self, shape: StepShape) -> int:
        """The rows the layers' GEMMs compute: a decode-only batch at its CUDA graph's size, else its tokens."""
        tokens = shape.prefill_tokens + shape.decode_seqs
        if shape.prefill_tokens == 0 and tokens < len(self.padded):
            return self.padded[tokens]
        return tokens

    def costs(self, shape: StepShape) -> StepCosts:
        """The step's kernel groups, each with its FLOPs, bytes and both roofline terms."""
        tokens = shape.prefill_tokens + shape.decode_seqs
        seqs = shape.prefill_seqs + shape.decode_seqs
        rows = self.graph_rows(shape)
        layer_bytes = self.layer_read_bytes(tokens)
        attention_flops, attention_bytes = self.attention_cost(shape, tokens, seqs)
        return StepCosts(
            KernelCost(
                self.flops_per_token * rows,
                layer_bytes,
                self.token_s * rows,
                layer_bytes * self.s_per_byte,
            ),
            KernelCost(
                self.flops_per_sample * seqs,
                self.lm_head_weight_bytes / self.tp,
                self.sample_s * seqs,
                self.lm_head_read_s,
            ),
            KernelCost(
                attention_flops,
                attention_bytes,
                attention_flops * self.s_per_flop,
                attention_bytes * self.s_per_byte,
            ),
            self.allreduce_s(rows),
            self.params.overhead_ms / 1e3,
            self.all_to_all_s(rows),
        )

    def step_time_s(self, shape: StepShape) -> float:
        """costs(shape).step_s, summed in the same order without building the breakdown."""
        tokens = shape.prefill_tokens + shape.decode_seqs
        seqs = shape.prefill_seqs + shape.decode_seqs
        rows = self.padded[tokens] if shape.prefill_tokens == 0 and tokens < len(self.padded) else tokens
        if self.arch.is_moe or self.windowed_layers:  # routed experts, windows: what a dense model's terms skip
            attention_flops, attention_bytes = self.attention_cost(shape, tokens, seqs)
            kernels_s = (
                (self.token_s * rows + self.layer_read_bytes(tokens) * self.s_per_byte)
                + (self.sample_s * seqs + self.lm_head_read_s)
                + (attention_flops * self.s_per_flop + attention_bytes * self.s_per_byte)
            )
            return kernels_s + self.allreduce_s(rows) + self.all_to_all_s(rows) + self.params.overhead_ms / 1e3
        kernels_s = (
            (self.token_s * rows + self.layer_read_s)
            + (self.sample_s * seqs + self.lm_head_read_s)
            + (self.pair_s * attention_pairs(shape) + self.kv_position_s * (shape.context_tokens + tokens))
        )
        return kernels_s + self.allreduce_s(rows) + self.params.overhead_ms / 1e3

    def allreduce_s(self, tokens: int) -> float:
        """Ring all-reduces of the step's hidden states (tokens x hidden activations): two per layer, one after
        attention and one after the FFN, less the MoE layers' FFN one under expert parallelism (all_to_all_s)."""
        if self.tp == 1 or tokens == 0:
            return 0.0
        message_bytes = tokens * self.arch.hidden_size * self.activation_bytes
        ring_bytes = 2 * (self.tp - 1) / self.tp * message_bytes
        one = ring_bytes / self.link_bytes_per_s + 2 * (self.tp - 1) * (self.params.allreduce_hop_latency_us / 1e6)
        ffn_allreduces = self.arch.n_layers - (self.arch.moe_layers if self.ep > 1 else 0)
        return (self.arch.n_layers + ffn_allreduces) * one

    def all_to_all_s(self, tokens: int) -> float:
        """Expert parallelism's two all-to-alls per MoE layer (dispatch, combine): each GPU sends its 1/TP of the
        step's tokens to their k experts, (G-1)/G of them on other GPUs, hidden activations each, at half the link's
        both-ways figure times link_efficiency, plus a hop latency per peer. 0 without expert parallelism."""
        g = self.expert_gpus
        if self.ep == 1 or g == 1 or tokens == 0:
            return 0.0
        sent = tokens / self.tp * self.arch.experts_per_token * (g - 1) / g
        one = sent * self.arch.hidden_size * self.activation_bytes / self.link_bytes_per_s
        one += (g - 1) * self.params.allreduce_hop_latency_us / 1e6
        return 2 * self.arch.moe_layers * one

    def describe(self) -> dict:
        return {
            "kind": "roofline",
            "form": "sum over the layers' GEMMs, lm_head and attention of flops / (peak * mfu) + bytes / "
            "(bandwidth * mbu), + allreduce (link at nvlink_efficiency or pcie_efficiency) + overhead, per GPU of "
            "the TP group",
            "coefficients": dataclasses.asdict(self.params),
            "architecture": dataclasses.asdict(self.arch),
            "gpu": dataclasses.asdict(self.gpu),
            "tensor_parallel": self.tp,
            "expert_parallel": self.ep,
            "precision": dataclasses.asdict(self.precision) | {"kv_bytes": self.precision.kv_bytes},
            "peak_flops": {"matmuls": self.matmul_peak_flops, "attention_and_lm_head": self.bf16_peak_flops},
            "cuda_graph_sizes": list(self.capture_sizes),
            "cuda_graph_padding": self.pad_to_capture and bool(self.capture_sizes),
        }
