"""One simulated engine replica: the engine's own Scheduler and BlockManager on the simulator's clock.

`start_step` does what LLMEngine.step does to the scheduling state (schedule, count the chunks'
tokens as computed, offer full blocks to the prefix cache) without the forward pass; its StepShape
goes to the step model for the step's duration. `end_step`, at the step's end, appends each
sampled sequence's token and finishes those at their planned length, as the engine's
_process_token does with ignore_eos. A prefill replica of a disaggregated deployment (disaggregation.py) takes its
finished sequences out of the batch but keeps their KV blocks: they are freed once the transfer has sent them.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from harness.plan.deployment import Deployment
from harness.plan.step_model import StepShape
from native_engine.block_manager import BlockManager
from native_engine.scheduler import Scheduler
from native_engine.sequence import Sequence, SequenceStatus

OUTPUT_TOKEN_ID = 0  # what a simulated answer holds; its blocks hash under the prompt's chain, so never shared


@dataclass
class Step:
    shape: StepShape
    sampled: list[Sequence]
    start_s: float
    kv_blocks_used: int
    preemptions: int
    prefix_hit_tokens: int
    running: int = 0
    waiting: int = 0
    finished: list[Sequence] = field(default_factory=list)


class Replica:
    def __init__(self, name: str, deployment: Deployment, clock, role: str | None = None):
        self.name = name
        self.role = role  # "prefill" | "decode" in a disaggregated deployment; None: whole requests
        self.handoffs: list[Sequence] = []  # decode role: requests whose KV has arrived, admitted at the next step
        self.first_out: list[Sequence] = []  # decode role: admitted, their first token out when the next step ends
        self.max_model_len = deployment.max_model_len
        self.block_manager = BlockManager(
            deployment.num_kv_blocks,
            deployment.kv_block_size,
            deployment.enable_prefix_caching,
            deployment.prefix_cache,
        )
        self.scheduler = Scheduler(deployment.scheduler, self.block_manager, clock)
        self.clock = clock
        self.in_flight = None  # the Step or DecodeRun (decode_run.py) whose end event is pending

    def start_step(self) -> Step | None:
        """Schedules the next batch (None when nothing can run now) and advances its sequences' KV."""
        bm, sched = self.block_manager, self.scheduler
        seen_preemptions, seen_hits = sched.num_preemptions, bm.prefix_cache_hits_tokens
        chunks = sched.schedule()
        if not chunks:
            return None
        prefill_tokens = prefill_seqs = decode_seqs = context_tokens = pairs = 0
        sampled = []
        block_size = bm.block_size
        # The hot loop of the simulator (once per sequence per step): Sequence's properties and
        # ScheduledChunk.completes_prompt are written out on locals, same rules.
        for c in chunks:
            seq, n = c.seq, c.num_new_tokens
            known = len(seq.token_ids)
            if n == 1 and known > seq.num_prompt_tokens:
                decode_seqs += 1
            else:
                prefill_seqs += 1
                prefill_tokens += n
                pairs += n * seq.num_computed_tokens + n * (n + 1) // 2  # step_model.prefill_pairs
            computed = seq.num_computed_tokens + n
            if computed >= known:
                sampled.append(seq)
            seq.num_computed_tokens = computed
            context_tokens += computed
            if computed // block_size > seq.num_keyed_blocks:  # else cache_computed_blocks has nothing to do
                bm.cache_computed_blocks(seq)
        shape = StepShape(prefill_tokens, prefill_seqs, decode_seqs, context_tokens, pairs)
        return Step(
            shape,
            sampled,
            self.clock(),
            bm.num_blocks - bm.num_free_blocks,
            sched.num_preemptions - seen_preemptions,
            bm.prefix_cache_hits_tokens - seen_hits,
            len(sched.running),
            len(sched.waiting),
        )

    def end_step(self, step: Step) -> None:
        """Each sampled sequence gets its token at the step's end (now); finished ones go to step.finished."""
        now = self.clock()
        for seq in step.sampled:
            tokens = seq.token_ids
            tokens.append(OUTPUT_TOKEN_ID)
            if seq.first_token_s is None:
                seq.first_token_s = now
            seq.last_token_s = now
            if len(tokens) - seq.num_prompt_tokens >= seq.params.max_tokens or len(tokens) >= self.max_model_len:
                if self.role == "prefill":
                    self.hold_for_transfer(seq)
                else:
                    self.scheduler.finish(seq, "length")
                step.finished.append(seq)

    def hold_for_transfer(self, seq: Sequence) -> None:
        """Scheduler.finish but for the blocks: out of the batch, its KV kept until the transfer has sent it."""
        self.scheduler.running.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = "length"

    def admit_handoff(self, seq: Sequence, now_s: float) -> None:
        """A decode replica, at a step boundary: kv_handoff.admit and _process_token. The prompt's KV goes into blocks
        past any prefix this cache holds and the sequence runs, or (no room) it waits to be prefilled here as a
        preempted one is (QueueFullError when the queue is full); then the prefill worker's first token is appended,
        which ends an answer of one token."""
        bm, scheduler = self.block_manager, self.scheduler
        cached = bm.find_cached_prefix(seq)
        if bm.allocate(seq, seq.num_prompt_tokens - len(cached) * bm.block_size, cached):
            seq.num_computed_tokens = seq.num_prompt_tokens
            bm.cache_computed_blocks(seq)
            seq.status = SequenceStatus.RUNNING
            bisect.insort(scheduler.running, seq, key=lambda s: s.arrival_s)
        else:
            scheduler.add(seq)
        seq.scheduled_s = seq.first_token_s = seq.last_token_s = now_s
        seq.num_cached_tokens = seq.kv_transfer.get("cache_n", 0)
        seq.token_ids.append(OUTPUT_TOKEN_ID)
        if seq.num_output_tokens >= seq.params.max_tokens or len(seq.token_ids) >= self.max_model_len:
            scheduler.finish(seq, "length")
