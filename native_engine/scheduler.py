"""Iteration-level scheduler: decides, every step, which sequences run and how many tokens each.

Each step first gives running sequences their next tokens (one for a decode, a chunk for a
prefill in progress), then admits waiting sequences (in schedule_policy's order, below) while the token
budget (max_num_batched_tokens) and max_num_seqs allow. When KV blocks run out, the most
recently arrived running sequence is preempted by recompute: its blocks are freed and it goes
back to the front of the waiting queue, to be prefilled again (prompt + output so far).

Two other batching orders, for `bench plan`'s engine profiles (harness/plan/engine_profiles.py):
`prefill_apart` (SGLang's): while a prompt is being prefilled or a waiting request can be admitted, a step
takes only prefill chunks, and the running sequences decode in the steps between; `reserve_max_tokens`
(TensorRT-LLM's GUARANTEED_NO_EVICT): a request is admitted only when the free KV blocks cover its prompt
and max_tokens beside what every running sequence may still grow into, so none is ever preempted.

Admission order (`schedule_policy`): "fcfs" takes the waiting queue in arrival order. "lpm"
(SGLang's longest prefix match) first sorts it by cached prefix length, longest first, so
requests that share a cached prefix run while it is cached instead of evicting each other's
(prefix thrashing). Aging bounds the unfairness: a request that has waited schedule_aging_s
(or was preempted) goes ahead of every younger one, in arrival order, so no request that
arrived after it is admitted before it from then on. Like SGLang, only the first LPM_WINDOW
waiting requests are matched each step, which bounds the lookup cost of a long queue.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from native_engine.block_manager import BlockManager
from native_engine.config import SchedulerConfig  # defined with the other settings; imported from here too
from native_engine.sequence import Sequence, SequenceStatus

LPM_WINDOW = 128


@dataclass
class ScheduledChunk:
    seq: Sequence
    num_new_tokens: int

    @property
    def completes_prompt(self) -> bool:
        """After this chunk every known token has KV, so its logits give the next token."""
        return self.seq.num_computed_tokens + self.num_new_tokens >= self.seq.num_tokens

    @property
    def num_draft_tokens(self) -> int:
        """Speculative tokens at the end of this chunk (seq.spec_token_ids scheduled past the known ones)."""
        return max(self.seq.num_computed_tokens + self.num_new_tokens - self.seq.num_tokens, 0)


class QueueFullError(Exception):
    pass


class Scheduler:
    def __init__(
        self, config: SchedulerConfig, block_manager: BlockManager, clock: Callable[[], float] = time.perf_counter
    ):
        self.config = config
        self.block_manager = block_manager
        self.clock = clock  # seconds; `bench plan` gives its virtual clock (harness/plan/simulator.py)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # kept sorted by arrival: the last is the preemption victim
        self.num_preemptions = 0
        self.num_cached_prompt_tokens = 0  # prefix-cache hits at each request's first admission

    def add(self, seq: Sequence) -> None:
        if len(self.waiting) >= self.config.max_waiting:
            raise QueueFullError(f"waiting queue is full ({self.config.max_waiting} requests); retry later")
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[ScheduledChunk]:
        if not self.config.prefill_apart:
            return self._schedule(prefill_only=False, decode_only=False)
        if self._prefill_ready():
            chunks = self._schedule(prefill_only=True, decode_only=False)
            if chunks:
                return chunks  # else no prompt could be admitted (KV): the decode batch runs
        return self._schedule(prefill_only=False, decode_only=True)

    def _prefill_ready(self) -> bool:
        """prefill_apart: a running prompt is part-way, or a waiting request may be admitted."""
        if any(s.num_tokens - s.num_computed_tokens > 1 for s in self.running):
            return True
        return bool(self.waiting) and len(self.running) < self.config.max_num_seqs

    def _schedule(self, prefill_only: bool, decode_only: bool) -> list[ScheduledChunk]:
        budget = self.config.max_num_batched_tokens
        if decode_only:  # SGLang's decode batch is bounded by its sequences, not by the prefill token budget
            budget = max(
                budget, len(self.running) * (1 + max((len(s.spec_token_ids) for s in self.running), default=0))
            )
        chunks: list[ScheduledChunk] = []
        preempted = False

        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if prefill_only and seq.num_tokens - seq.num_computed_tokens == 1:
                i += 1  # a decode waits for the prefill step to end
                continue
            num_new = min(seq.num_tokens - seq.num_computed_tokens + len(seq.spec_token_ids), budget)
            if seq.spec_token_ids and not self.block_manager.allocate(seq, num_new):
                seq.spec_token_ids = []  # no room for the drafts: decode without them rather than preempt
                num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.block_manager.allocate(seq, num_new):
                preempted = True
                victim = self.running.pop()
                self._preempt(victim)
                if victim is seq:
                    break
            else:
                chunks.append(ScheduledChunk(seq, num_new))
                budget -= num_new
                i += 1

        if preempted or decode_only or (self.config.static_batching and self.running):
            return chunks
        if self.config.schedule_policy == "lpm" and budget > 0 and len(self.running) < self.config.max_num_seqs:
            self._order_by_prefix_match()
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            cached = self.block_manager.find_cached_prefix(seq)
            num_new = seq.num_tokens - len(cached) * self.block_manager.block_size
            if num_new > budget:
                # Without chunked prefill a prompt runs whole; one larger than the whole budget
                # still runs, alone, rather than starving.
                if not self.config.enable_chunked_prefill and chunks:
                    break
                if self.config.enable_chunked_prefill:
                    num_new = budget
            if self.config.reserve_max_tokens and not self._fits_to_the_end(seq, cached):
                break
            if not self.block_manager.allocate(seq, num_new, cached):
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            if seq.scheduled_s is None:
                seq.scheduled_s = self.clock()
                seq.num_cached_tokens = len(cached) * self.block_manager.block_size
                self.num_cached_prompt_tokens += seq.num_cached_tokens
            bisect.insort(self.running, seq, key=lambda s: s.arrival_s)
            chunks.append(ScheduledChunk(seq, num_new))
            budget -= num_new
        return chunks

    def _fits_to_the_end(self, seq: Sequence, cached: list[int]) -> bool:
        """reserve_max_tokens: the free blocks cover seq's prompt and max_tokens (less its cached prefix) beside the
        blocks every running sequence may still take before its own max_tokens."""
        bm = self.block_manager
        reserved = sum(
            max(0, bm.blocks_needed(s.num_prompt_tokens + s.params.max_tokens) - len(s.block_table))
            for s in self.running
        )
        needed = bm.blocks_needed(seq.num_prompt_tokens + seq.params.max_tokens) - len(cached)
        return needed + reserved <= bm.num_free_blocks

    # ---- after the forward pass ----------------------------------------------------------------
    def postprocess(self, chunks: list[ScheduledChunk]) -> int:
        """The step's chunks have their KV: count it computed and put full blocks in the prefix cache.
        Draft positions hold KV only once accepted (accept_drafts); until then the sequence ends before
        them. Returns the KV positions the step's attention read."""
        kv_positions_read = 0
        for c in chunks:
            num_drafts = c.num_draft_tokens  # before the count moves, which changes it
            c.seq.num_computed_tokens += c.num_new_tokens - num_drafts
            kv_positions_read += c.seq.num_computed_tokens + num_drafts
            self.block_manager.cache_computed_blocks(c.seq)
        return kv_positions_read

    def accept_drafts(self, seq: Sequence, num_accepted: int) -> None:
        """Keep the accepted drafts' KV; roll back over the rejected ones and free their blocks."""
        seq.num_computed_tokens += num_accepted
        self.block_manager.cache_computed_blocks(seq)
        self.block_manager.trim(seq, seq.num_tokens)

    def rewind(self, chunk: ScheduledChunk, num_drafts: int) -> None:
        """Undo postprocess for a chunk whose tokens were not sampled: the next step computes it again."""
        chunk.seq.num_computed_tokens -= chunk.num_new_tokens - num_drafts  # drafts were never counted computed

    def _order_by_prefix_match(self) -> None:
        now = self.clock()
        window = [self.waiting.popleft() for _ in range(min(len(self.waiting), LPM_WINDOW))]

        def rank(seq: Sequence) -> tuple:
            if seq.num_preemptions or now - seq.arrival_s >= self.config.schedule_aging_s:
                return (0, 0, seq.arrival_s)
            return (1, -len(self.block_manager.find_cached_prefix(seq)), seq.arrival_s)

        window.sort(key=rank)
        self.waiting.extendleft(reversed(window))

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, finish_reason: str) -> None:
        """Remove seq wherever it is and free its blocks (also used for aborts)."""
        if seq.status == SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.block_manager.free(seq)
        elif seq.status == SequenceStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = finish_reason
