"""Prefill/decode disaggregation in `bench plan`: the KV handoff from a prefill to a decode replica, timed as a link.

What native_engine/disaggregation.py and kv_handoff.py do, on the simulator's clock (simulator.py drives it):
a request goes to the least busy prefill replica and runs there with max_tokens 1; once its first token is
sampled, the prompt's KV blocks (whole blocks, as kv_transfer.py writes them) cross the link for
`KVTransfer.seconds`, the prefill replica holding them until then; the least busy decode replica takes the
request at its next step boundary (replica.py `admit_handoff`, kv_handoff.admit's steps: the blocks into its cache past
any prefix it holds, else its waiting queue to be prefilled again), and the prefill worker's first token goes
out with that step's tokens, so TTFT includes the transfer and the decode replica's next step, as in the engine.

The link: a roofline plan's GPU link at half its both-ways figure plus one hop's latency, as tensor parallelism's
all-reduce uses it (roofline_model.py), each GPU of a TP group sending its own KV shard; a fitted plan's is the
handoffs measured in its runs (`kv_transfer_bytes` over `kv_export_ms + kv_import_ms`, the native engine's
timings), and is refused without them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from harness.results.folder import read_records
from native_engine.disaggregation import DisaggregationSpec

PREFILL, DECODE = "prefill", "decode"  # a replica's role, as the engine names its workers prefill-i, decode-i
PREFILL_TIMINGS = ("queue_ms", "prefill_ms", "prompt_n", "cache_n")  # the decode worker reports the prefill's


@dataclass(frozen=True, kw_only=True)
class KVTransfer:
    """A prompt's KV handoff: whole blocks of `bytes_per_token` x block_size over the link, plus a fixed latency."""

    bytes_per_token: float  # per GPU of the replica (a TP group's GPUs send their shards side by side)
    link_bytes_per_s: float
    latency_s: float
    block_size: int
    source: str  # where the constants came from, said in the plan

    def blocks(self, prompt_tokens: int) -> int:
        return -(-prompt_tokens // self.block_size)

    def bytes(self, prompt_tokens: int) -> float:
        return self.blocks(prompt_tokens) * self.block_size * self.bytes_per_token

    def seconds(self, prompt_tokens: int) -> float:
        return self.bytes(prompt_tokens) / self.link_bytes_per_s + self.latency_s

    def describe(self) -> dict:
        return {
            "form": "ceil(prompt tokens / block size) x block size x bytes_per_token / link_bytes_per_s + latency_s",
            **dataclasses.asdict(self),
        }

    def line(self) -> str:
        return (
            f"KV transfer {self.bytes_per_token:,.0f} bytes a token (whole {self.block_size}-token blocks) at "
            f"{self.link_bytes_per_s / 1e9:g} GB/s + {self.latency_s * 1e6:g} us ({self.source})"
        )


def roofline_transfer(model, block_size: int) -> KVTransfer:
    """Over the GPU link the roofline's all-reduce uses (RooflineStepModel: half the both-ways figure, one hop)."""
    return KVTransfer(
        bytes_per_token=model.kv_bytes_per_token_per_gpu,
        link_bytes_per_s=model.gpu.interconnect_bytes_per_s / 2,
        latency_s=model.params.allreduce_hop_latency_us / 1e6,
        block_size=block_size,
        source=f"{model.gpu.name}'s GPU link at half its both-ways {model.gpu.interconnect_bytes_per_s / 1e9:g} GB/s "
        "and one all-reduce hop's latency, as tensor parallelism's all-reduce; the KV cache's bytes per token per GPU",
    )


def measured_transfer(run_dirs: list[str | Path], block_size: int) -> KVTransfer | None:
    """The handoffs a disaggregated native run measured (its records' server_timings), None if none did: bytes per
    token from the blocks sent, the link as bytes over the copies' seconds (export + import), no fixed latency."""
    sent_bytes = blocks = seconds_ms = handoffs = 0
    for run_dir in run_dirs:
        for rec in read_records(run_dir) if (Path(run_dir) / "requests.jsonl").is_file() else []:
            t = rec.server_timings or {}
            if t.get("kv_transfer_bytes") and t.get("kv_import_ms") is not None:
                sent_bytes += t["kv_transfer_bytes"]
                blocks += t.get("kv_transfer_blocks") or 0
                seconds_ms += (t.get("kv_export_ms") or 0) + t["kv_import_ms"]
                handoffs += 1
    if not handoffs or not blocks or seconds_ms <= 0:
        return None
    return KVTransfer(
        bytes_per_token=sent_bytes / (blocks * block_size),
        link_bytes_per_s=sent_bytes / (seconds_ms / 1e3),
        latency_s=0.0,
        block_size=block_size,
        source=f"measured: {handoffs} handoffs' kv_export_ms + kv_import_ms in {', '.join(map(str, run_dirs))}",
    )


def plan_transfer(scenario, step_model, block_size: int) -> KVTransfer:
    """The plan's KV transfer: a roofline model's GPU link, or the handoffs measured in the fitted runs."""
    spec = scenario.plan.step_model
    if hasattr(step_model, "kv_bytes_per_token_per_gpu"):  # RooflineStepModel
        return roofline_transfer(step_model, block_size)
    measured = measured_transfer(spec.fitted or [], block_size) if spec.kind == "fitted" else None
    if measured is None:
        raise ValueError(
            "backend.launch.args --disaggregate with a fitted step model: its runs measured no KV handoff "
            "(server_timings kv_transfer_bytes, kv_export_ms, kv_import_ms); add a run of the native engine with "
            "--disaggregate to plan.step_model.fitted, or plan on a GPU with step_model: roofline"
        )
    return measured


def disaggregation_line(split: DisaggregationSpec, transfer: KVTransfer) -> str:
    """What the printed plan says of a disaggregated deployment."""
    return (
        f"disaggregated: {split.prefill} prefill + {split.decode} decode replicas, each request to the least busy "
        f"of each role; {transfer.line()}"
    )


def handoff_timings(prefill_timings: dict, prompt_tokens: int, transfer: KVTransfer) -> dict:
    """The decode worker's request timings from the prefill worker's (llm_engine request_timings: its queue and
    prefill phases, prompt and cached tokens) and the handoff's: what the engine's decode worker reports."""
    return {k: prefill_timings[k] for k in PREFILL_TIMINGS} | {
        "kv_transfer_bytes": transfer.bytes(prompt_tokens),
        "kv_transfer_blocks": transfer.blocks(prompt_tokens),
        "kv_transfer_ms": round(transfer.seconds(prompt_tokens) * 1e3, 3),
    }
