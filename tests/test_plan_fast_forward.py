"""`bench plan`'s fast-forward (harness/plan/decode_run.py) leaves exactly what single steps leave: the same
scenarios simulated with and without it give the same records (every token time), the same step trace and the
same scheduler, block manager and prefix cache state, on cases that preempt, hit the prefix cache (hash and
radix), chunk prefills, run multi-turn sessions, a closed loop, 3 replicas behind cache_aware, and an offline load
fed to 2 replicas as their queues have room."""

import pytest
import yaml

from harness.plan import decode_run
from harness.plan.architectures import load_architecture
from harness.plan.deployment import deployment_from_args
from harness.plan.roofline_model import RooflineStepModel
from harness.plan.simulator import Simulation, prompt_token_ids, run_simulation
from harness.plan.step_model import FittedStepModel
from harness.scenario.chat_trace import SessionTraceConfig, write_session_trace
from harness.scenario.gpus import gpu_spec
from harness.scenario.scenario import load_scenario
from harness.scenario.tokenizer_source import LocalTokenizer
from harness.scenario.workload import build_schedule

# stated step costs (what the simulator does with step times, not what they are): 20 ms a step, 0.5 ms a
# prompt token, 1.5 ms a decoding sequence, 1 us a KV position read
STATED = FittedStepModel(
    {
        "intercept_s": 0.02,
        "per_prefill_token_s": 5e-4,
        "per_prefill_seq_s": 0.0,
        "per_decode_seq_s": 1.5e-3,
        "per_context_token_s": 1e-6,
    },
    0.0,
    0.0,
    {},
    [],
)
CHAT = {"arrival": "trace", "trace": "trace.jsonl", "trace_block_size": 16}


def random_load(input_tokens: int, output_tokens: int, **load) -> dict:
    return {"workload": {"kind": "random", "input_tokens": input_tokens, "output_tokens": output_tokens}, "load": load}


CASES = {
    "preemption": (["--kv-cache-tokens", "384", "--max-num-seqs", "8"], random_load(48, 40, arrival="poisson", rate=8)),
    "hash_cache": ([], {"load": CHAT}),
    "radix_cache": (["--prefix-cache", "radix", "--kv-cache-tokens", "1024"], {"load": CHAT}),
    "lpm": (["--schedule-policy", "lpm", "--max-num-seqs", "4"], {"load": CHAT}),
    "chunked_prefill": ([], random_load(600, 30, arrival="poisson", rate=3)),
    "no_chunked_prefill": (["--no-chunked-prefill"], random_load(300, 30, arrival="poisson", rate=3)),
    "closed_loop": ([], random_load(40, 24, arrival="closed", concurrency=3)),
    "cache_aware": (["--data-parallel", "3", "--router-policy", "cache_aware"], {"load": CHAT}),
    # a finish releases the next request to another replica, mid-run
    "closed_loop_3_replicas": (
        ["--data-parallel", "3", "--router-policy", "round_robin"],
        random_load(40, 24, arrival="closed", concurrency=6),
    ),
    # a queue behind a full batch: decode runs go on while it waits
    "full_batch": (["--max-num-seqs", "3"], random_load(40, 40, arrival="poisson", rate=20)),
    "static_batching": (["--static-batching", "--max-num-seqs", "4"], random_load(40, 30, arrival="poisson", rate=6)),
    "roofline": ([], {"load": CHAT}),  # a step model whose times are taken one step at a time
    # every request held client-side and fed to 2 replicas as their waiting queues (of 3) have room
    "offline": (
        ["--data-parallel", "2", "--router-policy", "least_load", "--max-num-seqs", "3", "--max-waiting", "3"],
        random_load(40, 24, arrival="offline", num_requests=24),
    ),
}
STEP_MODELS = {"roofline": RooflineStepModel(load_architecture("llama-3.1-8b"), gpu_spec("L4"))}


def simulate(tmp_path, case: str, fast_forward: bool) -> tuple[Simulation, list]:
    launch_args, body = CASES[case]
    load = {"num_requests": 16, **body["load"]} if body["load"]["arrival"] != "trace" else body["load"]
    spec = {
        "name": "fast-forward",
        "seed": 0,
        "backend": {"kind": "native", "model": "smollm2", "launch": {"args": launch_args}},
        "workload": body.get("workload", {"kind": "random", "ignore_eos": True}),
        "load": load,
        "plan": {"step_model": "roofline"},
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    scenario = load_scenario(tmp_path / "s.yaml")
    tokenizer = LocalTokenizer("smollm2")
    plan = build_schedule(scenario, tokenizer)
    deployment = deployment_from_args(launch_args, "smollm2")
    sim, records = Simulation(deployment, STEP_MODELS.get(case, STATED), fast_forward=fast_forward), []
    token_ids = prompt_token_ids(plan.requests, tokenizer)
    offline = load["arrival"] == "offline"
    run_simulation(sim, plan.requests, token_ids, load.get("concurrency"), records.append, offline)
    return sim, records


def engine_state(sim: Simulation) -> list[dict]:
    """Every counter and structure the schedulers and block managers hold, per replica."""
    states = []
    for replica in sim.replicas.values():
        sched, bm, cache = replica.scheduler, replica.block_manager, replica.block_manager.cache
        state = {
            "scheduler": (
                sched.num_preemptions,
                sched.num_cached_prompt_tokens,
                len(sched.running),
                len(sched.waiting),
            ),
            "counters": (bm.prefix_cache_queries_tokens, bm.prefix_cache_hits_tokens, bm.recomputed_prefill_tokens),
            "free": list(bm.free_block_ids),
            "blocks": [(b.ref_count, b.block_hash, b.token_ids) for b in bm.blocks],
            "computed_hashes": list(bm._computed_hashes),
        }
        if hasattr(cache, "hash_to_block_id"):
            state["hash_cache"] = (list(cache.evictable), cache.hash_to_block_id)
        elif cache is not None:
            state["radix_cache"] = (cache.num_evictable, radix_tree(cache.root), [e[:2] for e in cache._heap])
        states.append(state)
    return states


def by_replica(steps: list[dict]) -> list[dict]:
    return sorted(steps, key=lambda s: s["replica"])  # stable: each replica's steps stay in their order


def radix_tree(node) -> tuple:
    children = sorted((key, radix_tree(child)) for key, child in node.children.items())
    return (node.block_tokens, node.block_ids, node.last_access, node.removed, children)


@pytest.mark.parametrize("case", CASES)
def test_fast_forward_leaves_what_single_steps_leave(tmp_path, case, monkeypatch):
    write_session_trace(
        SessionTraceConfig(sessions=8, turns=3, block_tokens=16, system_blocks=2, session_gap_s=0.7, seed=1),
        tmp_path / "trace.jsonl",
    )
    cuts = []
    real_cut_back = decode_run.DecodeRun.cut_back

    def counted_cut_back(run, arrival_s, after_steps):
        shorter = real_cut_back(run, arrival_s, after_steps)
        cuts.append(shorter is not None)
        return shorter

    monkeypatch.setattr(decode_run.DecodeRun, "cut_back", counted_cut_back)
    stepped, stepped_records = simulate(tmp_path, case, fast_forward=False)
    assert stepped.fast_forwarded_steps == 0 and not cuts
    forwarded, forwarded_records = simulate(tmp_path, case, fast_forward=True)

    assert [r.to_json() for r in forwarded_records] == [r.to_json() for r in stepped_records]
    # each replica's steps in its order (a decode run's are traced together, after other replicas' steps)
    assert by_replica(forwarded.steps) == by_replica(stepped.steps)
    assert (forwarded.engine_steps, forwarded.sequence_steps) == (stepped.engine_steps, stepped.sequence_steps)
    assert engine_state(forwarded) == engine_state(stepped)
    # the case exercises what it is named for, the fast-forward took steps, and arrivals cut some runs back
    assert len(stepped_records) >= 12 and all(r.ok for r in stepped_records)
    assert forwarded.fast_forwarded_steps > 0
    # these send or admit at a finish; offline feeds a queue that is never empty while requests are held
    if case not in ("closed_loop", "closed_loop_3_replicas", "static_batching", "offline"):
        assert any(cuts)
    timings = [r.server_timings for r in stepped_records]
    if case == "preemption":
        assert sum(t["preemptions"] for t in timings) > 0
    if case == "full_batch":
        assert max(s["waiting"] for s in stepped.steps) > 0 and max(s["running"] for s in stepped.steps) == 3
    if "cache" in case or case == "lpm":
        assert sum(t["cache_n"] for t in timings) > 0
    if case == "chunked_prefill":  # every 600-token prompt ran in chunks of the 256-token step budget
        assert max(s["prefill_tokens"] for s in stepped.steps) <= 256
    if case == "offline":  # both replicas fed, neither queue past its bound, a full batch decoding behind a queue
        assert {s["replica"] for s in stepped.steps} == {"replica-0", "replica-1"}
        assert max(s["waiting"] for s in stepped.steps) == 3 and max(s["running"] for s in stepped.steps) == 3
    if case == "cache_aware":
        assert all(state["counters"][0] > 0 for state in engine_state(stepped))  # all 3 replicas got requests
