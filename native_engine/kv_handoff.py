"""This engine's end of a disaggregated KV handoff: a prefill worker's prompt KV out, a decode worker's in.

The file format and its checks are kv_transfer.py's; here the prompt's blocks leave this engine's cache
(`export`) or enter it (`admit`), and the request's timings and the engine's metrics say what that cost.
"""

from __future__ import annotations

import bisect
import os
import time

from native_engine.kv_transfer import KVHandoff, export_blocks, import_blocks
from native_engine.metrics import EngineMetrics
from native_engine.scheduler import Scheduler
from native_engine.sequence import Sequence, SequenceStatus


class PromptKVHandoff:
    """Moves a prompt's KV blocks between this engine's cache (the runner's) and the transfer directory."""

    def __init__(self, runner, scheduler: Scheduler, metrics: EngineMetrics):
        self.runner, self.scheduler, self.metrics = runner, scheduler, metrics
        self.block_manager = scheduler.block_manager

    def export(self, seq: Sequence) -> None:
        """A prefill worker's request finished with its first token: write the prompt's KV blocks out
        before the blocks are freed (and, uncached, reused)."""
        blocks = seq.block_table[: self.block_manager.blocks_needed(seq.num_prompt_tokens)]
        cost = export_blocks(
            seq.export_kv_to, self.runner, blocks, seq.prompt_token_ids, seq.token_ids[-1], seq.rng.bit_generator.state
        )
        self.metrics.record_kv_transfer("send", cost["bytes"], cost["blocks"], cost["seconds"])
        seq.kv_transfer.update(
            kv_file=os.path.basename(seq.export_kv_to),
            kv_transfer_bytes=cost["bytes"],
            kv_transfer_blocks=cost["blocks"],
            kv_export_ms=round(cost["seconds"] * 1e3, 3),
        )

    def admit(self, seq: Sequence, handoff: KVHandoff) -> None:
        """A decode worker's request: the prompt's KV goes into blocks of this cache (past any prefix this
        cache already holds) and the request runs, its first token (the prefill worker's) appended and
        timed now; without room for the blocks, it waits and is prefilled here, as a preempted one is."""
        start_s = time.perf_counter()
        bm = self.block_manager
        seq.rng.bit_generator.state = handoff.rng_state
        cached = bm.find_cached_prefix(seq)
        if bm.allocate(seq, seq.num_prompt_tokens - len(cached) * bm.block_size, cached):
            import_blocks(self.runner, handoff, seq.block_table[len(cached) :], first_block=len(cached))
            seq.num_computed_tokens = seq.num_prompt_tokens
            bm.cache_computed_blocks(seq)
            seq.status = SequenceStatus.RUNNING
            bisect.insort(self.scheduler.running, seq, key=lambda s: s.arrival_s)
            seconds = time.perf_counter() - start_s
            self.metrics.record_kv_transfer("receive", handoff.num_bytes, handoff.k_blocks.shape[1], seconds)
            seq.kv_transfer["kv_import_ms"] = round(seq.kv_transfer.get("kv_import_ms", 0) + seconds * 1e3, 3)
        else:
            self.scheduler.add(seq)
            seq.kv_transfer["kv_import_ms"] = None  # not imported: prefilled again here
        now = time.perf_counter()
        seq.scheduled_s = seq.first_token_s = seq.last_token_s = now
        seq.num_cached_tokens = seq.kv_transfer.get("cache_n", 0)  # the prefill worker's hits, as usage reports
        self.metrics.time_to_first_token.observe(now - seq.arrival_s)
        self.metrics.generation_tokens.inc()
        seq.token_ids.append(handoff.first_token_id)

    def abandon(self, seq: Sequence) -> None:
        """The request's admission failed part way: whatever it took (a slot, blocks) goes back."""
        if seq in self.scheduler.running or seq in self.scheduler.waiting:
            self.scheduler.finish(seq, "error")
        elif seq.block_table:
            self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
