"""Fast-forward: a replica's stretch of pure-decode steps, committed at once instead of step by step.

Most of a simulation's steps change nothing but every sequence's length: no sequence waits (or none can
be admitted: the batch is full), every running one decodes (its KV covers all its known tokens but the
last sampled one), the token budget covers them all, none reaches its length limit, and the free KV
blocks cover the blocks they grow into. There the engine's Scheduler.schedule does the same trivial
thing every step: every running sequence gets one token, nothing is admitted or preempted.
`plan_decode_run` checks those conditions on the scheduler's own state, counts such steps up to the one
before the first sequence would finish (that step, and whatever follows, run as real steps), and times
each with the step model. `commit` then leaves the state those steps would: the block manager's own
`allocate` and `cache_computed_blocks` are called at the steps, and in the order, that the scheduler's
and Replica.start_step's loops would call them with effect (where a sequence's token starts a new block,
or fills one: at the other steps both return at once), then each sequence's tokens, computed count and
last token time move on. Where no allocation evicts a cached block, the allocations come first and the
cachings after, a sequence's consecutive ones merged into one call: the same state (`commit` says why).

An arrival routed to the replica mid-stretch, where the scheduler would admit it, cuts the run back
(`cut_back`) to the steps up to the one in flight when it came. tests/test_plan_fast_forward.py
simulates the same scenarios with and without fast-forward: the same records to every token time, the
same step trace, the same scheduler and block manager state.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from dataclasses import dataclass, field

import numpy as np

from harness.plan.replica import OUTPUT_TOKEN_ID, Replica
from harness.plan.step_model import FittedStepModel, StepModel, StepShape
from native_engine.scheduler import Scheduler
from native_engine.sequence import Sequence

ALLOCATE, CACHE = 0, 1  # within a step, the scheduler allocates every sequence's KV before any block is cached


@dataclass(frozen=True)
class DecodeRun:
    seqs: list[Sequence]  # the running batch, in the scheduler's order
    start_s: float
    ends_s: list[float]  # each step's end on the simulator's clock
    context_tokens: range  # each step's KV positions read (its StepShape's context_tokens): n more a step
    steps: int  # how many of them it commits: all, or fewer once an arrival cut it back
    waiting: int  # sequences queued at its start behind a full batch
    # (time, after_steps) of each sequence queued behind it since (the step trace's waiting counts)
    queued_s: list[tuple[float, bool]] = field(default_factory=list)

    @property
    def end_s(self) -> float:
        return self.ends_s[self.steps - 1]

    def cut_back(self, arrival_s: float, after_steps: bool) -> DecodeRun | None:
        """The run an arrival at arrival_s leaves (up to the step in flight then), None if it is this one.
        At equal times an arrival comes before a step's end, a released request after it (simulator.py)."""
        steps = (bisect.bisect_right if after_steps else bisect.bisect_left)(self.ends_s, arrival_s) + 1
        return dataclasses.replace(self, steps=steps) if steps < self.steps else None


def decode_run_steps(replica: Replica) -> int:
    """How many steps from now Scheduler.schedule would give every running sequence one token, with nothing
    else changing and no sequence finishing (0: the next step is not such a step)."""
    sched, bm = replica.scheduler, replica.block_manager
    running, bs = sched.running, bm.block_size
    if not running or len(running) > sched.config.max_num_batched_tokens or (sched.waiting and admits(sched)):
        return 0
    steps = max_len = replica.max_model_len
    for seq in running:
        known, computed = len(seq.token_ids), seq.num_computed_tokens
        decodes = known - computed == 1 and known > seq.num_prompt_tokens and not seq.spec_token_ids
        if not decodes or seq.num_keyed_blocks != computed // bs:
            return 0
        # Replica.end_step finishes it at the step whose token reaches max_tokens or max_model_len
        steps = min(steps, seq.params.max_tokens - (known - seq.num_prompt_tokens) - 1, max_len - known - 1)
    free = bm.num_free_blocks  # falls by one a block allocated, by nothing else while no sequence ends
    if steps > 0 and blocks_grown(running, steps, bs) > free:
        fits, fails = 0, steps
        while fails - fits > 1:
            mid = (fits + fails) // 2
            fits, fails = (mid, fails) if blocks_grown(running, mid, bs) <= free else (fits, mid)
        steps = fits
    return steps


def admits(scheduler: Scheduler) -> bool:
    """Whether Scheduler.schedule, past one token for each running sequence, looks at the waiting queue:
    static batching with a running batch, a full batch or a spent token budget stop it before."""
    config, running = scheduler.config, len(scheduler.running)
    return not config.static_batching and running < config.max_num_seqs and running < config.max_num_batched_tokens


def blocks_grown(running: list[Sequence], steps: int, block_size: int) -> int:
    """KV blocks the running sequences take over `steps` more decode steps."""
    return sum(max(0, -(-(s.num_computed_tokens + steps) // block_size) - len(s.block_table)) for s in running)


def plan_decode_run(replica: Replica, step_model: StepModel, now_s: float) -> DecodeRun | None:
    """The decode run starting now, timed by the step model; None when the next step is not one."""
    steps = decode_run_steps(replica)
    if steps == 0:
        return None
    seqs = list(replica.scheduler.running)
    n = len(seqs)
    first = sum(s.num_computed_tokens for s in seqs) + n  # each sequence attends over one more position a step
    contexts = range(first, first + steps * n, n)
    # each end the one before plus the step's time, as the simulator adds each step's time to its clock
    ends_s = list(itertools.accumulate(step_times_s(step_model, n, contexts), initial=now_s))[1:]
    return DecodeRun(seqs, now_s, ends_s, contexts, steps, len(replica.scheduler.waiting))


def step_times_s(step_model: StepModel, decode_seqs: int, contexts: range | list[int]) -> list[float]:
    """The step model's time for each step of a decode run. The fitted model's formula is a sum of products,
    so numpy evaluates it over every step at once and gets, step by step, the same float as one call a step."""
    if isinstance(step_model, FittedStepModel):
        # a run's range made by arange: no list of it in between (~5 us of each of ~150,000 runs a 100k plan)
        array = np.arange(contexts.start, contexts.stop, contexts.step) if isinstance(contexts, range) else contexts
        return step_model.step_time_s(StepShape(0, 0, decode_seqs, np.asarray(array))).tolist()
    return [step_model.step_time_s(StepShape(0, 0, decode_seqs, c)) for c in contexts]


def commit(run: DecodeRun, replica: Replica) -> list[int]:
    """Leaves the scheduling state as run.steps single steps would; returns the KV blocks each step took."""
    bm, steps = replica.block_manager, run.steps
    bs = bm.block_size
    allocations, cachings = [], []  # (step, sequence's index) of each call
    for i, seq in enumerate(run.seqs):
        # step j allocates when its token, at position computed + j - 1, lies past the block table's end
        first = len(seq.block_table) * bs - seq.num_computed_tokens + 1
        allocations += [(j, i) for j in range(first, steps + 1, bs)]
        # after step j's schedule, start_step offers the block that computed + j tokens fill
        first = (seq.num_keyed_blocks + 1) * bs - seq.num_computed_tokens
        cachings += [(j, i) for j in range(first, steps + 1, bs)]
    allocations.sort()
    cachings.sort()
    computed_before = [s.num_computed_tokens for s in run.seqs]
    # every step's token at once: allocate reads none of them, and cache_computed_blocks only those whose
    # KV the computed count below says is there (the tokens sampled before that step)
    for seq in run.seqs:
        seq.token_ids += [OUTPUT_TOKEN_ID] * steps
    taken = [0] * steps

    def allocate(j: int, i: int) -> None:
        seq = run.seqs[i]
        seq.num_computed_tokens = computed_before[i] + j - 1
        if not bm.allocate(seq, 1):
            raise RuntimeError(f"fast-forward: step {j} of a decode run found no free KV block (decode_run_steps)")
        taken[j - 1] += 1

    def cache(j: int, i: int) -> None:
        run.seqs[i].num_computed_tokens = computed_before[i] + j
        bm.cache_computed_blocks(run.seqs[i])

    if len(allocations) <= len(bm.free_block_ids):
        # No allocation evicts a cached block, so allocating (the free list, the block tables) and caching (the
        # prefix cache, the computed hashes) touch apart state: every allocation, then every caching, each in the
        # steps' order, leave what the steps' interleaving leaves. A sequence's blocks cached one after the other
        # (no other sequence's between) are cached by one call: the same blocks, in the same order.
        for j, i in allocations:
            allocate(j, i)
        for k, (j, i) in enumerate(cachings):
            if k + 1 == len(cachings) or cachings[k + 1][1] != i:
                cache(j, i)
    else:  # some allocation evicts: the calls in the steps' order, the allocations first within a step
        for j, call, i in sorted([(j, ALLOCATE, i) for j, i in allocations] + [(j, CACHE, i) for j, i in cachings]):
            (allocate if call == ALLOCATE else cache)(j, i)
    for seq, computed in zip(run.seqs, computed_before):
        seq.num_computed_tokens = computed + steps
        seq.last_token_s = run.end_s
    return taken
