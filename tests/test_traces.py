"""Trace loaders (Mooncake, Azure, BurstGPT) and trace replay plans, incl. Mooncake prefix sharing."""

from pathlib import Path

import numpy as np
import pytest

from harness.scenario.scenario import Scenario, ScenarioError
from harness.scenario.tokenizer_source import LocalTokenizer
from harness.scenario.traces import detect_format, load_trace
from harness.scenario.workload import build_schedule, hash_block_ids

TINY_MOONCAKE = Path(__file__).resolve().parent.parent / "scenarios" / "traces" / "mooncake_tiny.jsonl"
AZURE_CSV = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:47.1805900,879,1
"""
BURSTGPT_CSV = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
118,GPT-4,417,276,693,API log
"""


@pytest.fixture(scope="module")
def smollm2():
    return LocalTokenizer("smollm2")


def trace_scenario(path: Path, **load) -> Scenario:
    return Scenario.model_validate(
        {
            "name": "t",
            "backend": {"kind": "openai", "url": "http://127.0.0.1:9"},
            "workload": {"kind": "random"},
            "seed": 0,
            "load": {"arrival": "trace", "trace": str(path), **load},
        }
    )


def test_mooncake_timestamps_are_milliseconds():
    rows = load_trace(TINY_MOONCAKE)
    assert len(rows) == 12 and rows[2].timestamp_s == pytest.approx(0.412)
    assert (rows[0].input_tokens, rows[0].output_tokens, rows[0].hash_ids) == (70, 24, (0, 1, 2, 3, 4))


def test_azure_and_burstgpt_rows(tmp_path):
    azure = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    azure.write_text(AZURE_CSV)
    rows = load_trace(azure)
    assert [r.input_tokens for r in rows] == [374, 879, 396]  # sorted by arrival
    assert rows[1].timestamp_s - rows[0].timestamp_s == pytest.approx(0.5)
    assert rows[2].timestamp_s - rows[0].timestamp_s == pytest.approx(4.314579)
    burst = tmp_path / "BurstGPT_1.csv"
    burst.write_text(BURSTGPT_CSV)
    rows = load_trace(burst)
    assert [(r.timestamp_s, r.input_tokens, r.output_tokens) for r in rows] == [
        (5, 472, 18),
        (45, 1087, 0),
        (118, 417, 276),
    ]


def test_format_detection(tmp_path):
    assert detect_format(TINY_MOONCAKE) == "mooncake"
    for name, text, expected in [("a.csv", AZURE_CSV, "azure"), ("b.csv", BURSTGPT_CSV, "burstgpt")]:
        (tmp_path / name).write_text(text)
        assert detect_format(tmp_path / name) == expected
    (tmp_path / "c.csv").write_text("time,prompt\n1,2\n")
    with pytest.raises(ScenarioError, match="neither Azure .* nor BurstGPT .*; set load.trace_format"):
        detect_format(tmp_path / "c.csv")
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(ScenarioError, match="set load.trace_format to one of mooncake, azure, burstgpt"):
        load_trace(tmp_path / "d.txt")


@pytest.mark.parametrize(
    "name, text, expected",
    [
        (
            "m.jsonl",
            '{"timestamp": 0, "input_length": 5, "output_length": 2}\n{"timestamp": 1, "output_length": 2}\n',
            "line 2: field 'input_length' is missing",
        ),
        (
            "m.jsonl",
            '{"timestamp": 0, "input_length": "many", "output_length": 2}\n',
            "line 1 field 'input_length': 'many' is not valid: must be a whole number",
        ),
        (
            "m.jsonl",
            '{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": 7}\n',
            "line 1 field 'hash_ids': 7 is not valid: must be a list of ints",
        ),
        ("m.jsonl", '{"timestamp": 0, "input_length": 5,\n', "line 1 column 36: not valid JSON"),
        ("a.csv", AZURE_CSV.replace("396", "3x6"), "line 3 column ContextTokens: '3x6' is not valid"),
        ("a.csv", AZURE_CSV.replace("2023-11-16 18:15:50", "yesterday"), "line 3 column TIMESTAMP: 'yesterday"),
        (
            "b.csv",
            BURSTGPT_CSV.replace("118,", "soon,"),
            "line 4 column Timestamp: 'soon' is not valid: must be a number",
        ),
    ],
)
def test_bad_rows_name_file_line_and_column(tmp_path, name, text, expected):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ScenarioError) as caught:
        load_trace(path)
    assert str(path) in str(caught.value) and expected in str(caught.value)


def test_equal_hash_ids_give_identical_blocks(smollm2):
    def block(seed, hash_id):
        return hash_block_ids(smollm2, seed, hash_id, 16)

    assert np.array_equal(block(0, 7), block(0, 7)) and len(block(0, 7)) == 16
    assert not np.array_equal(block(0, 7), block(0, 8))
    assert not np.array_equal(block(0, 7), block(1, 7))  # another seed, other prompts


def test_mooncake_replay_shares_prefixes_at_the_token_level(smollm2):
    plan = build_schedule(trace_scenario(TINY_MOONCAKE, trace_block_size=16), smollm2)
    rows = load_trace(TINY_MOONCAKE)
    assert [r.prompt_tokens for r in plan.requests] == [row.input_tokens for row in rows]
    assert [r.output_tokens for r in plan.requests] == [row.output_tokens for row in rows]
    encoded = [smollm2.encode(r.prompt) for r in plan.requests]  # decode -> encode, as the engine sees it
    for i, a in enumerate(rows):
        for j, b in enumerate(rows[:i]):
            shared_blocks = 0
            while (
                shared_blocks < min(len(a.hash_ids), len(b.hash_ids))
                and a.hash_ids[shared_blocks] == b.hash_ids[shared_blocks]
            ):
                shared_blocks += 1
            shared_tokens = min(shared_blocks * 16, a.input_tokens, b.input_tokens)
            assert encoded[i][:shared_tokens] == encoded[j][:shared_tokens]
            common = next((k for k, (x, y) in enumerate(zip(encoded[i], encoded[j])) if x != y), None)
            if shared_blocks == 0:
                assert common is not None and common < 4, (i, j)  # unrelated rows diverge at once
    # rows 0 and 4 share blocks 0-4: 70 of row 0's tokens come first in row 4
    assert encoded[4][:70] == encoded[0]


def test_trace_replay_schedule_scale_warmup_and_duration(smollm2):
    plan = build_schedule(trace_scenario(TINY_MOONCAKE, time_scale=0.5, warmup_requests=2), smollm2)
    offsets = [r.intended_offset_s for r in plan.requests]
    assert offsets[:3] == [0.0, 0.0, pytest.approx(0.206)] and offsets[-1] == pytest.approx(2.99)
    assert [r.is_warmup for r in plan.requests] == [True, True] + [False] * 10
    capped = build_schedule(trace_scenario(TINY_MOONCAKE, num_requests=4, warmup_requests=1), smollm2)
    assert len(capped.requests) == 5
    timed = build_schedule(trace_scenario(TINY_MOONCAKE, duration_s=2.0, warmup_requests=3), smollm2)
    # measured window starts at the 4th row (1.130 s) and lasts 2 s: rows before 3.130 s
    assert timed.duration_s == pytest.approx(3.13) and len(timed.requests) == 7
    with pytest.raises(ScenarioError, match="load.warmup_requests: 12 is not valid: the trace has only 12"):
        build_schedule(trace_scenario(TINY_MOONCAKE, warmup_requests=12), smollm2)


def test_csv_traces_replay_with_their_lengths(tmp_path, smollm2):
    path = tmp_path / "burst.csv"
    path.write_text(BURSTGPT_CSV)
    plan = build_schedule(trace_scenario(path, time_scale=0.01), smollm2)
    assert [r.intended_offset_s for r in plan.requests] == [0.0, pytest.approx(0.4), pytest.approx(1.13)]
    assert [r.prompt_tokens for r in plan.requests] == [472, 1087, 417]
    assert [r.output_tokens for r in plan.requests] == [18, 1, 276]  # a 0-token answer still asks for 1


def _mooncake(path: Path, timestamps_ms: list[float]) -> Path:
    path.write_text("".join(f'{{"timestamp": {t}, "input_length": 8, "output_length": 2}}\n' for t in timestamps_ms))
    return path


def test_rows_out_of_order_and_negative_timestamps_are_said_not_fixed_silently(tmp_path, smollm2):
    # lines 3, 5 and 6 come before a row above them; line 4's -2.5 s is the earliest of two negative timestamps
    path = _mooncake(tmp_path / "x.jsonl", [0, 1000, 500, -2500, -100, 900, 3000])
    warnings = []
    rows = load_trace(path, warnings=warnings)
    assert [r.line for r in rows] == [4, 5, 1, 3, 6, 2, 7]  # sorted, as before
    assert warnings == [
        f"load.trace: {path}: 4 rows out of timestamp order (first at line 3) were sorted into place; "
        "2 negative timestamps (first at line 4; the earliest -2.5 s, at line 4): the replay starts at the "
        "earliest, so every row is sent 2.5 s later than its timestamp says"
    ]
    plan = build_schedule(trace_scenario(path), smollm2)
    assert plan.requests[0].intended_offset_s == 0.0 and plan.requests[2].intended_offset_s == pytest.approx(2.5)
    assert plan.warnings == warnings  # bench run prints a schedule's warnings (test below)
    one = []
    load_trace(_mooncake(tmp_path / "one.jsonl", [0, 200, 100]), warnings=one)
    assert one == [f"load.trace: {tmp_path / 'one.jsonl'}: 1 row out of timestamp order (line 3) was sorted into place"]


def test_a_trace_in_order_is_not_a_warning(tmp_path):
    warnings = []
    load_trace(TINY_MOONCAKE, warnings=warnings)  # two rows at 0 ms: equal timestamps are in order
    load_trace(_mooncake(tmp_path / "late.jsonl", [5000, 6000]), warnings=warnings)  # any origin: no shift said
    burst = tmp_path / "BurstGPT_1.csv"
    burst.write_text(BURSTGPT_CSV)
    load_trace(burst, warnings=warnings)
    assert warnings == []
    azure = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    azure.write_text(AZURE_CSV.replace("2023-11-16", "1969-07-20"))  # absolute times: before 1970 is no shift
    load_trace(azure, warnings=warnings)
    assert warnings == [f"load.trace: {azure}: 1 row out of timestamp order (line 4) was sorted into place"]


@pytest.mark.faults
def test_bench_run_says_the_trace_reordering_on_the_console(tmp_path):
    from bench_process import bench
    from groundtruth_server import GroundTruthConfig, GroundTruthProcess

    trace = _mooncake(tmp_path / "x.jsonl", [0, 300, 100, -200])
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=2, itl_ms=1)) as gt:
        scenario = tmp_path / "s.yaml"
        scenario.write_text(
            f"name: t\nbackend: {{kind: openai, url: '{gt.url}', model: gt, tokenizer: smollm2}}\n"
            f"workload: {{kind: random}}\nload: {{arrival: trace, trace: '{trace}', workers: 1}}\n"
        )
        res = bench("run", scenario, "--output", tmp_path / "out", "--allow-client-bound")
    assert res.returncode == 0, res.stderr
    said = (
        f"load.trace: {trace}: 2 rows out of timestamp order (first at line 3) were sorted into place; "
        "1 negative timestamp (line 4, -0.2 s): the replay starts at the earliest, so every row is sent 0.2 s "
        "later than its timestamp says"
    )
    assert said in " ".join((res.stdout + res.stderr).split())  # the console wraps long lines
