"""The run's validity verdict (harness/metrics/validity.py), and the history and the gate skipping an invalid run."""

import sqlite3

from helpers import synthetic_records, write_run
from typer.testing import CliRunner

from harness.cli.app import app
from harness.engine.server_metrics import counter_resets
from harness.metrics.latencies import summarize
from harness.metrics.validity import MAX_FAILED_SHARE, run_validity, served_models, thresholds
from harness.results.schema import Summary

SLO = {"ttft_ms": 200.0, "tpot_ms": 50.0}
UNFLAGGED = {"client_bound": False, "client_bound_reasons": [], "interrupted": False}
UNFLAGGED |= {"incomplete": False, "incomplete_reasons": [], "lost_workers": []}


def _summary(records, **flags) -> Summary:
    return Summary(**dict(summarize(records, SLO)), **(UNFLAGGED | flags))


def test_a_clean_run_is_valid_and_each_problem_is_a_reason_with_its_numbers():
    assert run_validity(_summary(synthetic_records(n=60))).model_dump() == {
        "valid": True,
        "reasons": [],
        "thresholds": thresholds().model_dump(),
    }
    failing = run_validity(_summary(synthetic_records(n=60, fail_every=10)))  # 6 of 60 failed
    assert not failing.valid and failing.reasons == [
        f"failure share: 6 of 60 measured requests failed (10.0% > {MAX_FAILED_SHARE:.0%}: http_5xx=6)"
    ]
    # the quickstart's 20 requests cannot bound a p90 (36 needed at 95%)
    (reason,) = run_validity(_summary(synthetic_records(n=20))).reasons
    assert reason == (
        "percentiles not established at 95%: ttft p90 (20 samples, needs 36), tpot p90 (20 samples, needs 36), "
        "e2e p90 (20 samples, needs 36)"
    )
    flagged = run_validity(
        _summary(
            synthetic_records(n=60),
            client_bound=True,
            client_bound_reasons=["send lag p99 9.0 ms > 5.0 ms"],
            incomplete=True,
            incomplete_reasons=["worker 1 lost"],
            engine_exited="exit code -9",
        ),
        restarted_counters=["generation_tokens"],
    )
    assert flagged.reasons == [
        "client-bound: send lag p99 9.0 ms > 5.0 ms",
        "incomplete: worker 1 lost",
        "engine restarted: it exited during the run (exit code -9)",
        "engine restarted: its counters fell during the run (generation_tokens); the run measured two engine lives",
    ]


def test_a_window_of_a_few_requests_long_is_too_short():
    records = synthetic_records(n=60, rate=4000.0, ttft_s=0.05)  # all sent within 15 ms, each ~200 ms long
    (reason,) = run_validity(_summary(records)).reasons
    assert reason.startswith("too short a window: 0.2") and "median E2Es" in reason


def test_a_counter_that_fell_between_scrapes_is_an_engine_restart(tmp_path):
    rows = ["t_s,name,value,labels"]
    rows += [f"{t},bench:generation_tokens,{v}," for t, v in ((0, 100), (1, 180), (2, 12), (3, 40))]
    rows += [f'{t},bench:prompt_tokens,{v},replica="1"' for t, v in ((0, 5), (1, 9))]
    (tmp_path / "m.csv").write_text("\n".join(rows) + "\n")
    assert counter_resets(tmp_path / "m.csv") == ["generation_tokens"]
    assert counter_resets(tmp_path / "missing.csv") == []


def _cli(*args):
    result = CliRunner().invoke(app, [*map(str, args)])
    return result.exit_code, " ".join(result.output.split())  # rich's wrapping undone


def test_history_and_gate_skip_an_invalid_run_naming_why_unless_told_to_keep_it(tmp_path):
    base = tmp_path / "base"
    for k in (1, 2):
        write_run(base / f"run-{k}", synthetic_records(n=60, seed=k), slo=SLO, verdict=True)
    cur = tmp_path / "cur"
    write_run(cur / "run-1", synthetic_records(n=60, seed=3), slo=SLO, verdict=True)
    write_run(cur / "run-2", synthetic_records(n=60, seed=4, fail_every=5), slo=SLO, verdict=True)  # 20% failed

    db = tmp_path / "h.db"
    code, out = _cli("history", "add", cur, "--db", db, "--commit", "c1", "--branch", "main")
    assert code == 0 and "added 1 run(s), 0 already there, 1 invalid skipped" in out
    assert "skipped" in out and "run-2: invalid: failure share: 12 of 60 measured requests failed" in out
    with sqlite3.connect(db) as conn:
        (path,) = conn.execute("SELECT path FROM runs").fetchone()
    assert path.endswith("run-1")
    code, out = _cli("history", "add", cur, "--db", db, "--keep-invalid")
    assert code == 0 and "added 1 run(s), 1 already there, 0 invalid skipped" in out

    code, out = _cli("gate", base, cur)
    assert code in (0, 5) and "runs (base / cur)" in out  # pass or inconclusive, never a regression
    assert "**Skipped** (`--keep-invalid` keeps it):" in out and "run-2: invalid: failure share: 12 of 60" in out
    assert "| 2 / 1 |" in out  # the current side is judged on its one valid run
    code, out = _cli("gate", base, cur, "--keep-invalid")
    assert "Skipped" not in out and "| 2 / 2 |" in out
    code, out = _cli("gate", base, cur / "run-2")
    assert code == 2 and "every run is invalid" in out and "--keep-invalid" in out


def _held_back(records, request_tokens: dict[int, int]) -> list:
    """The server's usage says more tokens than the chunks counted (a token held back as partial text)."""
    for i, missed in request_tokens.items():
        rec = records[i]
        rec.output_tokens_usage = rec.output_tokens = rec.output_tokens_counted + missed
        rec.token_count_mismatch = True
    return records


def test_token_count_mismatches_are_judged_by_the_tokens_they_miss_not_the_requests():
    # one token held back in one request of 60 (1.7% of requests, 0.1% of 960 tokens): ITL barely moves
    one = run_validity(_summary(_held_back(synthetic_records(n=60), {3: 1})))
    assert one.valid, one.reasons
    # 16 tokens missed in each of 2 requests: 32 of 992 output tokens (3.2%)
    two = run_validity(_summary(_held_back(synthetic_records(n=60), {3: 16, 7: 16})))
    assert two.reasons == [
        "token-count mismatches: the chunks counted and the server's usage differ by 32 of 992 output tokens "
        "(3.2% > 1%) in 2 of 60 completed requests"
    ]


def test_a_run_served_by_more_than_one_model_is_invalid_naming_each_and_its_requests():
    records = synthetic_records(n=60)
    for rec in records:
        rec.served_model = "smollm2"
    for rec in records[::20]:
        rec.served_model = "llama-70b"
    records[1].served_model = None  # a stream that named no model is no third one
    warmup = synthetic_records(n=1)[0]
    warmup.is_warmup, warmup.served_model = True, "tinyllama"  # nor is a warm-up request's
    served = served_models([*records, warmup])
    assert served == {"smollm2": 56, "llama-70b": 3}
    assert run_validity(_summary(records), models_served=served).reasons == [
        "model switch: 2 models served the measured requests ('smollm2' 56, 'llama-70b' 3, by the `model` of their "
        "streams); the figures mix them"
    ]
    assert run_validity(_summary(records), models_served={"smollm2": 60}).valid
