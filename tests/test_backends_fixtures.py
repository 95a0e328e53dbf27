"""`bench run` end to end against engines that cannot run here: the fixture server replays each
engine's stream and /metrics formats, launched by bench like the real engine would be."""

import csv
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli.app import app
from harness.results.folder import read_records

FIXTURE_SERVER = Path(__file__).parent / "fixture_server.py"
# the tokens each replayed stream carries: a run asks for exactly that many (more would fail over_length)
FIXTURE_TOKENS = {"vllm": 16, "llamacpp": 24}


def bench_run(
    tmp_path: Path,
    kind: str,
    api: str = "completions",
    extra_backend: str = "",
    num_requests: int = 4,
    output: list | None = None,
    extra_args: str = "",
) -> tuple[Path, list[dict]]:
    log = tmp_path / "requests_seen.jsonl"
    command = f"{sys.executable} {FIXTURE_SERVER} --engine {kind} --port {{port}} --itl-ms 2 --log {log}{extra_args}"
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        f"name: fx\nbackend: {{kind: {kind}, api: {api}, model: smollm2, launch: {{command: '{command}', "
        f"ready_timeout_s: 30}}{extra_backend}}}\n"
        f"workload: {{kind: random, input_tokens: 8, output_tokens: {FIXTURE_TOKENS.get(kind, 8)}}}\n"
        f"load: {{arrival: constant, rate: 20, num_requests: {num_requests}}}\n"
        "telemetry: {interval_ms: 100, gpu: false}\n"
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", str(scenario), "--output", str(out), "--allow-client-bound"])
    assert result.exit_code == 0, result.output
    if output is not None:
        output.append(result.output)
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    return out, seen


def schema_rows(out: Path) -> dict[str, float]:
    with open(out / "server_metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows, "server_metrics.csv is empty"
    return {r["name"]: float(r["value"]) for r in rows if r["name"].startswith("bench:") and not r["labels"]}


@pytest.mark.parametrize(
    "kind, api, body_check, schema",
    [
        (
            "sglang",
            "native",
            lambda b: (
                b["sampling_params"]
                == {"max_new_tokens": 8, "ignore_eos": True, "min_new_tokens": 8, "temperature": 0.0}
            ),
            {
                "bench:running": 3.0,
                "bench:waiting": 3.0,
                "bench:kv_usage_fraction": 0.25,  # waiting: 1 queued + 2 grammar
                "bench:prefix_cache_hit_rate": 64 / 170,
                "bench:read_bytes": 8e9,
            },
        ),  # cached / prompt tokens, not the gauge
        (
            "sglang",
            "completions",
            lambda b: b["ignore_eos"] and b["min_tokens"] == 8,
            {"bench:generation_tokens": 80.0},
        ),
        (
            "trtllm",
            "chat",
            lambda b: b["ignore_eos"] and b["messages"][0]["role"] == "user",
            {"bench:kv_usage_fraction": 0.125, "bench:prefix_cache_hit_rate": 32 / 170, "bench:ttft_s_count": 10.0},
        ),
        (
            "vllm",
            "completions",
            lambda b: b["ignore_eos"] and b["min_tokens"] == 16 and b["temperature"] == 0.0,
            {"bench:generation_tokens": 56.0, "bench:itl_s_count": 53.0},
        ),
        ("llamacpp", "chat", lambda b: b["ignore_eos"] and "min_tokens" not in b, {"bench:generation_tokens": 1468.0}),
    ],
)
def test_bench_run_through_each_engine_format(tmp_path, kind, api, body_check, schema):
    out, seen = bench_run(tmp_path, kind, api)
    records = read_records(out)
    assert len(records) == 4 and all(r.ok for r in records), [r.error_detail for r in records]
    assert all(r.output_tokens == FIXTURE_TOKENS.get(kind, 8) and not r.token_count_mismatch for r in records)
    assert len(seen) == 4 and all(body_check(s["body"]) for s in seen)
    assert schema.items() <= schema_rows(out).items()
    run_info = json.loads((out / "run.json").read_text())
    assert run_info["backend"]["engine_version"] == f"{kind}-fixture"
    assert run_info["server_metrics"]["sampled"] is True
    phases = json.loads((out / "summary.json").read_text())["phases_ms"]
    if kind == "llamacpp":  # the replayed stream's own timings: prompt_ms is prefill, predicted_ms decode
        assert phases["source"] == "per request: llamacpp, queue_derived"
        assert phases["prefill"]["mean"] == pytest.approx(records[0].server_timings["prompt_ms"])
    else:  # a fixed replayed page: the histograms do not move over the run, so no engine phases
        assert phases["source"] is None and "queue" not in phases and phases["ttft_share"]["connect_send"] > 0


def test_ollama_native_stream_and_no_prometheus_page(tmp_path):
    printed = []
    out, seen = bench_run(tmp_path, "ollama", "chat", output=printed)
    assert "ollama cannot force the output length" in printed[0]
    records = read_records(out)
    assert all(r.ok and r.output_tokens == 8 and r.finish_reason == "length" for r in records)
    replayed = (Path(__file__).parent / "fixtures" / "engines" / "ollama_chat.ndjson").read_text().splitlines()
    eval_ns = json.loads(replayed[-1])["eval_duration"]  # Ollama's own account, in ns, on the final line
    assert all(r.server_timings["eval_s"] == pytest.approx(eval_ns / 1e9) for r in records)
    # bench pulled the model and loaded it with an empty generate before the load
    assert [s["path"] for s in seen[:2]] == ["/api/pull", "/api/generate"] and seen[0]["body"]["model"] == "smollm2"
    assert all(
        s["path"] == "/api/chat" and s["body"]["options"] == {"num_predict": 8, "temperature": 0.0} for s in seen[2:]
    )
    run_info = json.loads((out / "run.json").read_text())
    assert run_info["server_metrics"]["sampled"] is False
    assert "no Prometheus page" in run_info["server_metrics"]["reason"]


def test_profiler_hooks_wrap_the_load(tmp_path):
    out, seen = bench_run(tmp_path, "sglang", "completions", extra_backend=", profile: true", num_requests=2)
    paths = [s["path"] for s in seen]
    assert paths[0] == "/start_profile" and paths[-1] == "/stop_profile"
    assert paths[1:-1] == ["/v1/completions"] * 2
    assert json.loads((out / "run.json").read_text())["profile"] == {"start_http_status": 200, "stop_http_status": 200}


def test_trtllm_without_perf_metrics_says_why_there_is_no_page(tmp_path):
    # the user's own options file wins, and it lacks return_perf_metrics: trtllm-serve mounts no page
    options = tmp_path / "mine.yaml"
    options.write_text("kv_cache_config:\n  enable_block_reuse: true\n")
    out, _ = bench_run(tmp_path, "trtllm", "chat", extra_args=f" --extra_llm_api_options {options}")
    status = json.loads((out / "run.json").read_text())["server_metrics"]
    assert status["sampled"] is False
    assert "404" in status["reason"] and "return_perf_metrics: true" in status["reason"]


def test_replica_pages_named_in_the_scenario_are_scraped_with_their_label(tmp_path):
    """A vLLM-style deployment behind some router: backend.replica_metrics names each replica's page
    (here replays of real vLLM and SGLang pages), scraped beside the router's own."""
    import subprocess
    import time
    import urllib.request

    from harness.engine.launcher import free_port

    replicas = {}
    procs = []
    try:
        for name, engine in (("r0", "vllm"), ("r1", "sglang")):
            port = free_port()
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(FIXTURE_SERVER), "--engine", engine, "--port", str(port)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            replicas[name] = f"http://127.0.0.1:{port}/metrics"
        for url in replicas.values():
            deadline = time.monotonic() + 30
            while True:
                try:
                    urllib.request.urlopen(url, timeout=1).read()
                    break
                except OSError:
                    assert time.monotonic() < deadline, f"{url} never answered"
                    time.sleep(0.1)
        pages = ", ".join(f"{k}: '{v}'" for k, v in replicas.items())
        out, _ = bench_run(tmp_path, "vllm", extra_backend=f", replica_metrics: {{{pages}}}")
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)
    with open(out / "server_metrics.csv") as f:
        rows = list(csv.DictReader(f))
    last = {(r["name"], r["labels"]): float(r["value"]) for r in rows}
    assert last[("bench:generation_tokens", "")] == 56  # the router's own page (vLLM replay)
    assert last[("bench:generation_tokens", 'replica="r0"')] == 56  # vLLM's page
    assert last[("bench:kv_usage_fraction", 'replica="r1"')] == 0.25  # SGLang's token_usage
    assert any(name == "sglang:num_running_reqs" and 'replica="r1"' in labels for name, labels in last)
    assert json.loads((out / "run.json").read_text())["server_metrics"]["replicas"] == 2


@pytest.mark.parametrize(
    "attribute, wrong",
    [
        ("paths", {"completions": "/v1/completion", "chat": "/v1/chat/completions"}),  # one letter short
        ("metrics_path", "/v1/metrics"),
    ],
)
def test_a_wrong_path_in_a_backend_fails_against_the_engines_routes(tmp_path, monkeypatch, attribute, wrong):
    """The fixture server answers the engine's own routes (fixture_server.ROUTES, cited), never the constants
    of the code under test: a backend asking at a wrong path fails against it as it would against the engine."""
    from fixture_server import build_app

    from backends.vllm import VllmBackend

    monkeypatch.setattr(VllmBackend, attribute, wrong)
    served = {r.resource.canonical for r in build_app("vllm", 0.0, None).router.routes()}
    assert {"/v1/completions", "/metrics"} <= served
    assert not {"/v1/completion", "/v1/metrics"} & served
    log = tmp_path / "requests_seen.jsonl"
    command = f"{sys.executable} {FIXTURE_SERVER} --engine vllm --port {{port}} --itl-ms 2 --log {log}"
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        f"name: fx\nbackend: {{kind: vllm, api: completions, model: smollm2, launch: {{command: '{command}', "
        "ready_timeout_s: 30}}\nworkload: {kind: random, input_tokens: 8, output_tokens: 8}\n"
        "load: {arrival: constant, rate: 20, num_requests: 2}\ntelemetry: {interval_ms: 100, gpu: false}\n"
    )
    out = tmp_path / "out"
    CliRunner().invoke(app, ["run", str(scenario), "--output", str(out), "--allow-client-bound"])
    if attribute == "paths":
        records = read_records(out)
        assert len(records) == 2
        assert [r.http_status for r in records] == [404, 404], [r.error_detail for r in records]
    else:
        status = json.loads((out / "run.json").read_text())["server_metrics"]
        assert status["sampled"] is False
        assert "404" in status["reason"]
