"""Scheduler: decode-first budgets, chunked prefill, FCFS admission, preemption, static batching."""

import time

import pytest

from native_engine.block_manager import BlockManager
from native_engine.scheduler import QueueFullError, Scheduler, SchedulerConfig
from native_engine.sequence import SamplingParams, Sequence, SequenceStatus


def make(n_tokens, request_id, arrival_s):
    return Sequence(request_id, list(range(1, n_tokens + 1)), SamplingParams(max_tokens=8), arrival_s=arrival_s)


def run_step(scheduler):
    """Apply a schedule as the engine would: tokens become computed, a finished prefill samples a token."""
    chunks = scheduler.schedule()
    for c in chunks:
        done = c.completes_prompt
        c.seq.num_computed_tokens += c.num_new_tokens
        scheduler.block_manager.cache_computed_blocks(c.seq)
        if done:
            c.seq.token_ids.append(7)
    return {c.seq.request_id: c.num_new_tokens for c in chunks}


def make_scheduler(num_blocks=64, block_size=4, **kw):
    return Scheduler(SchedulerConfig(**kw), BlockManager(num_blocks, block_size))


def test_chunked_prefill_splits_long_prompt_across_steps_and_decodes_go_first():
    s = make_scheduler(max_num_batched_tokens=8)
    a = make(3, "a", 0.0)
    s.add(a)
    assert run_step(s) == {"a": 3}
    b = make(13, "b", 1.0)
    s.add(b)
    assert run_step(s) == {"a": 1, "b": 7}  # a's decode first, b gets the rest of the budget
    assert run_step(s) == {"a": 1, "b": 6}  # b's prompt finishes: it samples
    assert b.num_output_tokens == 1
    assert run_step(s) == {"a": 1, "b": 1}


def test_without_chunked_prefill_a_prompt_runs_whole():
    s = make_scheduler(max_num_batched_tokens=8, enable_chunked_prefill=False)
    s.add(make(3, "a", 0.0))
    run_step(s)
    s.add(make(8, "b", 1.0))
    s.add(make(20, "c", 2.0))
    assert run_step(s) == {"a": 1}  # b (8) does not fit next to a's decode, and is not split
    s.finish(s.running[0], "stop")
    assert run_step(s) == {"b": 8}
    s.finish(s.running[0], "stop")
    # c is longer than the budget: it runs alone rather than never (its first 8 tokens are b's,
    # cached, so 12 are computed).
    assert run_step(s) == {"c": 12}


def test_fcfs_and_max_num_seqs():
    s = make_scheduler(max_num_seqs=2, max_num_batched_tokens=100)
    for i in range(3):
        s.add(make(4, f"r{i}", float(i)))
    assert set(run_step(s)) == {"r0", "r1"}
    assert [q.request_id for q in s.waiting] == ["r2"]


def test_preemption_evicts_latest_arrival_and_requeues_it_first():
    # 6 blocks of 2 tokens: three 4-token prompts fill all six; the first decode needs a 7th.
    s = make_scheduler(num_blocks=6, block_size=2, max_num_batched_tokens=64)
    seqs = [make(4, f"r{i}", float(i)) for i in range(3)]
    for q in seqs:
        s.add(q)
    run_step(s)
    assert s.block_manager.num_free_blocks == 0
    scheduled = run_step(s)
    assert s.num_preemptions >= 1
    assert seqs[2].status == SequenceStatus.WAITING and s.waiting[0] is seqs[2]
    assert seqs[2].block_table == [] and seqs[2].num_computed_tokens == 0
    assert scheduled == {"r0": 1, "r1": 1}
    # The victim keeps its sampled token and will recompute prompt + output when readmitted.
    assert seqs[2].num_tokens == 5


def test_preempted_sequence_is_readmitted_and_recomputes_everything():
    s = make_scheduler(num_blocks=6, block_size=2, max_num_batched_tokens=64)
    seqs = [make(4, f"r{i}", float(i)) for i in range(3)]
    for q in seqs:
        s.add(q)
    run_step(s)
    run_step(s)  # r2 preempted
    s.finish(seqs[0], "stop")  # frees 3 blocks
    scheduled = run_step(s)
    assert scheduled["r1"] == 1
    assert 0 < scheduled["r2"] <= 5 and seqs[2].status == SequenceStatus.RUNNING


def test_static_batching_admits_only_when_batch_is_empty():
    s = make_scheduler(max_num_batched_tokens=100, static_batching=True)
    s.add(make(4, "a", 0.0))
    run_step(s)
    s.add(make(4, "b", 1.0))
    assert run_step(s) == {"a": 1}
    s.finish(s.running[0], "length")
    assert run_step(s) == {"b": 4}


def test_waiting_queue_is_bounded():
    s = make_scheduler(max_waiting=2)
    s.add(make(4, "a", 0.0))
    s.add(make(4, "b", 1.0))
    with pytest.raises(QueueFullError):
        s.add(make(4, "c", 2.0))


def test_finish_of_waiting_and_running_frees_blocks():
    s = make_scheduler(num_blocks=8, block_size=4, max_num_seqs=1)
    a, b = make(9, "a", 0.0), make(4, "b", 1.0)
    s.add(a)
    s.add(b)
    run_step(s)
    assert s.block_manager.num_free_blocks == 5
    s.finish(a, "abort")
    s.finish(b, "abort")
    assert s.block_manager.num_free_blocks == 8 and not s.has_work()


def test_prefix_hit_skips_cached_tokens():
    s = make_scheduler(block_size=4, max_num_batched_tokens=100)
    s.add(make(10, "a", 0.0))
    run_step(s)
    s.add(make(10, "b", 1.0))
    assert run_step(s) == {"a": 1, "b": 2}  # two full blocks (8 tokens) come from the cache
    assert s.waiting == type(s.waiting)() and s.running[1].num_cached_tokens == 8


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        SchedulerConfig(max_num_batched_tokens=0)


def prefix_scheduler(policy, aging_s=60.0):
    """One running request at a time, with prefix [1..8] cached by an earlier request."""
    s = make_scheduler(
        block_size=4, max_num_seqs=1, max_num_batched_tokens=100, schedule_policy=policy, schedule_aging_s=aging_s
    )
    warm = Sequence("warm", list(range(1, 10)), SamplingParams(max_tokens=1))
    s.add(warm)
    run_step(s)
    s.finish(warm, "length")
    return s


def test_lpm_admits_longest_cached_prefix_first_fcfs_in_arrival_order():
    now = time.perf_counter()
    order = {}
    for policy in ("fcfs", "lpm"):
        s = prefix_scheduler(policy)
        s.add(Sequence("cold", [50] * 9, SamplingParams(max_tokens=1), arrival_s=now))
        s.add(Sequence("half", [1, 2, 3, 4] + [60] * 5, SamplingParams(max_tokens=1), arrival_s=now + 0.001))
        s.add(Sequence("hot", list(range(1, 9)) + [70], SamplingParams(max_tokens=1), arrival_s=now + 0.002))
        order[policy] = []
        while s.has_work():
            order[policy] += list(run_step(s))
            s.finish(s.running[0], "length")
    assert order["fcfs"] == ["cold", "half", "hot"]
    assert order["lpm"] == ["hot", "half", "cold"]


def test_lpm_aging_puts_a_long_waiting_request_first():
    s = prefix_scheduler("lpm", aging_s=5.0)
    now = time.perf_counter()
    s.add(Sequence("old", [50] * 9, SamplingParams(max_tokens=1), arrival_s=now - 6.0))
    s.add(Sequence("old2", [51] * 9, SamplingParams(max_tokens=1), arrival_s=now - 5.5))
    s.add(Sequence("hot", list(range(1, 9)) + [70], SamplingParams(max_tokens=1), arrival_s=now))
    assert list(run_step(s)) == ["old"]  # waited past the bound: ahead of the cached prefix
    s.finish(s.running[0], "length")
    assert list(run_step(s)) == ["old2"]  # aged requests keep their arrival order
    s.finish(s.running[0], "length")
    assert list(run_step(s)) == ["hot"]


def test_bad_schedule_policy_and_aging_name_the_field():
    with pytest.raises(ValueError, match="schedule_policy: must be one of fcfs, lpm"):
        SchedulerConfig(schedule_policy="lifo")
    with pytest.raises(ValueError, match="schedule_aging_s"):
        SchedulerConfig(schedule_aging_s=-1)


def test_prefill_apart_runs_prefill_chunks_in_steps_of_their_own():
    """SGLang's order: a waiting prompt gets a step without the running decodes; the decodes run between."""
    s = make_scheduler(max_num_batched_tokens=8, prefill_apart=True)
    s.add(make(3, "a", 0.0))
    assert run_step(s) == {"a": 3}  # a's prompt, alone
    s.add(make(13, "b", 1.0))
    assert run_step(s) == {"b": 8}  # b's first chunk: a's decode waits
    assert run_step(s) == {"b": 5}  # b is part-way: its next chunk comes first again, and it samples
    assert run_step(s) == {"a": 1, "b": 1}  # nothing to prefill: one decode step for both
    mixed = make_scheduler(max_num_batched_tokens=8)  # the default: decodes and chunks share each step
    mixed.add(make(3, "a", 0.0))
    run_step(mixed)
    mixed.add(make(13, "b", 1.0))
    assert run_step(mixed) == {"a": 1, "b": 7}


def test_reserve_max_tokens_admits_only_what_can_run_to_its_end():
    """12 blocks of 4 tokens; each request needs ceil((4 + 12) / 4) = 4 blocks to finish. With reservation c is
    admitted (a and b hold 1 block each and may take 3 more: 6 reserved + 4 <= 10 free), d is not (9 + 4 > 9)."""
    s = make_scheduler(num_blocks=12, block_size=4, reserve_max_tokens=True)
    for i, name in enumerate("abcd"):
        s.add(Sequence(name, [10 * i + t for t in range(1, 5)], SamplingParams(max_tokens=12), arrival_s=float(i)))
    assert run_step(s) == {"a": 4, "b": 4, "c": 4}  # 3 x 4 = 12 blocks spoken for
    assert [q.request_id for q in s.waiting] == ["d"]
    plain = make_scheduler(num_blocks=12, block_size=4)
    for i, name in enumerate("abcd"):
        plain.add(Sequence(name, [10 * i + t for t in range(1, 5)], SamplingParams(max_tokens=8), arrival_s=float(i)))
    assert run_step(plain) == {"a": 4, "b": 4, "c": 4, "d": 4}  # admitted by their prompts' one block each
