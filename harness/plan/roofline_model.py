"""The `roofline` step model: one engine step's time on a GPU from the model's shapes and the GPU's datasheet.

    step_s = max(flops / (peak_flops x mfu), bytes / (hbm_bytes_per_s x mbu)) + allreduce_s + overhead_s

per GPU of a tensor-parallel group. FLOPs are counted as the native engine's step trace counts them
(native_engine/step_trace.py): 2 per weight per token through the layers, 2 per lm_head weight per
sequence sampled, and 4 x layers x q_dim per (query token, attended position). Bytes: the weights read
once a step, the KV cache read over the attended context and written for the new tokens; activations
are left out (they stay in cache at these sizes). Under TP each GPU does 1/TP of the FLOPs and reads
1/TP of the weights, and every layer ends its attention and its FFN with an all-reduce of the
step's hidden states (Megatron-style TP: two per layer), a ring over the interconnect: each GPU sends
and receives 2 x (TP-1)/TP of the message, at half the datasheet's both-ways figure, plus a latency per
ring hop. The attended-position count is an approximation: the step shape gives the context summed
over sequences, so a mixed step's queries are spread evenly over its sequences.

MFU, MBU and the overhead are stated defaults (DEFAULTS), overridable in the scenario, and fittable
from one measured run (harness/plan/roofline_fit.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from harness.plan.architectures import Architecture
from harness.plan.memory import kv_bytes_per_token
from harness.plan.step_model import StepShape
from harness.scenario.gpus import GpuSpec


@dataclass(frozen=True)
class RooflineParams:
    mfu: float = 0.5  # large GEMMs in vLLM/SGLang prefill reach about half the dense peak
    mbu: float = 0.7  # decode kernels stream weights and KV at ~60-80% of HBM bandwidth
    overhead_ms: float = 1.0  # scheduling, sampling, launches per step with CUDA graphs
    allreduce_hop_latency_us: float = 2.0  # one ring hop's fixed cost (NCCL over NVLink: a few microseconds)


DEFAULTS = RooflineParams()


@dataclass(frozen=True)
class StepCosts:
    flops_per_gpu: float
    bytes_per_gpu: float
    compute_s: float
    memory_s: float
    allreduce_s: float
    overhead_s: float

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s > self.memory_s else "memory"

    @property
    def step_s(self) -> float:
        return max(self.compute_s, self.memory_s) + self.allreduce_s + self.overhead_s


class RooflineStepModel:
    def __init__(
        self,
        arch: Architecture,
        gpu: GpuSpec,
        tensor_parallel: int = 1,
        params: RooflineParams = DEFAULTS,
        kv_bytes: float = 2,
        activation_bytes: float = 2,
    ):
        self.arch, self.gpu, self.tp, self.params = arch, gpu, tensor_parallel, params
        self.kv_bytes, self.activation_bytes = kv_bytes, activation_bytes
        self.weight_bytes_read = (arch.matmul_params() + arch.lm_head_params()) * arch.weight_bits / 8
        self.kv_bytes_per_token_per_gpu = kv_bytes_per_token(arch, kv_bytes, tensor_parallel)

    def costs(self, shape: StepShape) -> StepCosts:
        a, p, tp = self.arch, self.params, self.tp
        tokens = shape.prefill_tokens + shape.decode_seqs
        seqs = shape.prefill_seqs + shape.decode_seqs
        attended_pairs = shape.context_tokens * tokens / seqs if seqs else 0
        flops = (
            2 * a.matmul_params() * tokens
            + 2 * a.lm_head_params() * seqs
            + 4 * a.n_layers * a.n_heads * a.head_dim * attended_pairs
        ) / tp
        moved = self.weight_bytes_read / tp + (shape.context_tokens + tokens) * self.kv_bytes_per_token_per_gpu
        return StepCosts(
            flops,
            moved,
            flops / (self.gpu.tensor_flops("bf16") * p.mfu),
            moved / (self.gpu.hbm_bytes_per_s * p.mbu),
            self.allreduce_s(tokens),
            p.overhead_ms / 1e3,
        )

    def allreduce_s(self, tokens: int) -> float:
        """Two ring all-reduces per layer of the step's hidden states (tokens x hidden activations)."""
        if self.tp == 1 or tokens == 0:
            return 0.0
        message_bytes = tokens * self.arch.hidden_size * self.activation_bytes
        ring_bytes = 2 * (self.tp - 1) / self.tp * message_bytes
        one = ring_bytes / (self.gpu.interconnect_bytes_per_s / 2) + 2 * (self.tp - 1) * (
            self.params.allreduce_hop_latency_us / 1e6
        )
        return 2 * self.arch.n_layers * one

    def step_time_s(self, shape: StepShape) -> float:
        return self.costs(shape).step_s

    def describe(self) -> dict:
        return {
            "kind": "roofline",
            "form": "max(flops / (peak * mfu), bytes / (bandwidth * mbu)) + allreduce + "
            "overhead, per GPU of the TP group",
            "coefficients": dataclasses.asdict(self.params),
            "architecture": dataclasses.asdict(self.arch),
            "gpu": dataclasses.asdict(self.gpu),
            "tensor_parallel": self.tp,
            "kv_bytes": self.kv_bytes,
        }
