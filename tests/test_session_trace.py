"""`bench make-trace`: a Mooncake trace of multi-turn sessions, each turn extending the last one's blocks."""

import json
from pathlib import Path

import pytest
from bench_process import bench

from harness.scenario.chat_trace import SessionTraceConfig, session_trace_rows, write_session_trace
from harness.scenario.scenario import Scenario
from harness.scenario.tokenizer_source import LocalTokenizer
from harness.scenario.traces import load_trace
from harness.scenario.workload import build_schedule

SCENARIOS = Path(__file__).resolve().parent.parent / "scenarios"


def by_session(rows):
    sessions = {}
    for row in rows:
        sessions.setdefault(row["session_id"], []).append(row)
    return sessions


def test_each_turn_resends_the_conversation_and_adds_whole_blocks():
    config = SessionTraceConfig(sessions=6, turns=5, system_blocks=3, user_blocks=(2, 4), output_tokens=(5, 40))
    rows = session_trace_rows(config)
    assert len(rows) == 30 and [r["timestamp"] for r in rows] == sorted(r["timestamp"] for r in rows)
    sessions = by_session(rows)
    assert sorted(sessions) == list(range(6))
    for turns in sessions.values():
        assert [t["turn"] for t in turns] == list(range(5))
        assert turns[0]["hash_ids"][:3] == [0, 1, 2]  # the shared system prompt
        for before, after in zip(turns, turns[1:]):
            n = len(before["hash_ids"])
            assert after["hash_ids"][:n] == before["hash_ids"]
            # the answer (rounded up to whole blocks), then a user message of 2-4 blocks
            added = len(after["hash_ids"]) - n - -(-before["output_length"] // config.block_tokens)
            assert 2 <= added <= 4
            assert after["timestamp"] - before["timestamp"] >= 1000 * config.think_time_s[0] - 1
        for turn in turns:
            assert turn["input_length"] == len(turn["hash_ids"]) * config.block_tokens
            assert 5 <= turn["output_length"] <= 40
    # past the system prompt no block belongs to two sessions
    owners = {}
    for sid, turns in sessions.items():
        for h in turns[-1]["hash_ids"][3:]:
            assert owners.setdefault(h, sid) == sid
    # interleaved: some session starts before an earlier one has sent its last turn
    assert any(sessions[s + 1][0]["timestamp"] < sessions[s][-1]["timestamp"] for s in range(5))


def test_no_system_prompt_means_sessions_share_nothing():
    rows = session_trace_rows(SessionTraceConfig(sessions=4, turns=2, system_blocks=0))
    firsts = [turns[0]["hash_ids"][0] for turns in by_session(rows).values()]
    assert len(set(firsts)) == 4


def test_the_seed_fixes_the_file(tmp_path):
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    write_session_trace(SessionTraceConfig(seed=3), a)
    write_session_trace(SessionTraceConfig(seed=3), b)
    write_session_trace(SessionTraceConfig(seed=4), c)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()


def test_the_committed_trace_is_what_make_trace_writes_and_replays_prefix_exactly(tmp_path):
    out = tmp_path / "chat_sessions.jsonl"
    done = bench("make-trace", out)
    assert done.returncode == 0, done.stderr
    committed = SCENARIOS / "traces" / "chat_sessions.jsonl"
    assert out.read_bytes() == committed.read_bytes()
    rows = load_trace(committed)
    assert [r.hash_ids for r in rows] == [tuple(json.loads(line)["hash_ids"]) for line in out.read_text().splitlines()]
    scenario = Scenario.model_validate(
        {
            "name": "t",
            "backend": {"kind": "openai", "url": "http://127.0.0.1:9"},
            "workload": {"kind": "random"},
            "seed": 0,
            "load": {"arrival": "trace", "trace": str(committed), "trace_block_size": 16, "warmup_requests": 0},
        }
    )
    plan = build_schedule(scenario, LocalTokenizer("smollm2"))
    assert [r.prompt_tokens for r in plan.requests] == [r.input_tokens for r in rows]
    # turn k-1's prompt is the start of turn k's: the engine can serve it from its prefix cache
    rows_json = [json.loads(line) for line in committed.read_text().splitlines()]
    prompt_of = {(row["session_id"], row["turn"]): req.prompt for row, req in zip(rows_json, plan.requests)}
    for (session, turn), prompt in prompt_of.items():
        if turn:
            assert prompt.startswith(prompt_of[(session, turn - 1)])
    assert not prompt_of[(0, 1)].startswith(prompt_of[(1, 0)])


@pytest.mark.faults
@pytest.mark.parametrize(
    "args, message",
    [
        (["--user-blocks", "5", "2"], "--user-blocks: 5..2 is not valid"),
        (["--sessions", "0"], "--sessions: must be at least 1"),
        (["--turns", "100", "--user-blocks", "5000", "6000"], "more than the limit"),
    ],
)
def test_bad_options_name_the_option(tmp_path, args, message):
    done = bench("make-trace", tmp_path / "t.jsonl", *args)
    assert done.returncode == 2 and message in " ".join(done.stderr.split()), done.stderr
    assert not (tmp_path / "t.jsonl").exists()
