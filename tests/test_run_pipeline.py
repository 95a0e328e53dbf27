"""The run pipeline called directly (harness.runs.run.run_scenario), without a subprocess: results folder rules,
token-count sources and their messages, failed runs, the profiler warning, launch command building."""

import json
import os
import sys
import threading
import time
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from groundtruth_server import GroundTruthConfig, GroundTruthProcess, gt_request

from backends import load_backend
from harness.client.load_site import LocalClients
from harness.client.workers import client_bound_advice, resolve_workers, workers_needed
from harness.engine.launcher import engine_command
from harness.engine.session import engine_session, engine_sizing
from harness.metrics.latencies import summarize
from harness.results.folder import ResultsError, ResultWriter, read_records
from harness.results.schema import ProfileStatus, Summary
from harness.runs.run import Reporter, RunSteps, run_scenario
from harness.scenario.scenario import LaunchConfig, ScenarioError, load_scenario
from harness.scenario.tokenizer_source import ApproximateTokenizer, LocalTokenizer, TokenizerError, resolve_tokenizer
from harness.scenario.workload import build_schedule


@pytest.fixture(scope="module")
def gt():
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=5, itl_ms=1)) as server:
        yield server


def scenario(
    tmp_path,
    backend: str,
    workload: str = "{kind: random, input_tokens: 16, output_tokens: 4}",
    load: str = "{arrival: constant, rate: 50, num_requests: 8}",
    name: str = "pipe",
):
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\nbackend: {backend}\nworkload: {workload}\nload: {load}\n")
    return load_scenario(path)


def test_a_run_writes_its_folder_refuses_to_mix_two_runs_and_says_counts_are_approximate(gt, tmp_path):
    scn = scenario(tmp_path, f"{{kind: openai, url: '{gt.url}', model: gt}}")
    reporter = Reporter()
    result = run_scenario(scn, tmp_path / "out", workers="1", reporter=reporter)
    assert result.summary.requests.completed == 8 and not result.mostly_failed
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == result.summary.model_dump(exclude_unset=True)
    assert any("prompt lengths are approximate" in line and "backend.tokenizer" in line for line in reporter.lines)
    assert result.run_info.token_count_method == "approximate"
    # a second run into the same folder would leave the first one's summary beside new records
    with pytest.raises(ResultsError, match="already holds a run.*--overwrite"):
        run_scenario(scn, tmp_path / "out", workers="1")
    (tmp_path / "out" / "telemetry.csv").write_text("stale")
    again = run_scenario(scn, tmp_path / "out", workers="1", overwrite=True)
    assert len(read_records(tmp_path / "out")) == 8 and again.summary.requests.measured == 8
    assert (tmp_path / "out" / "telemetry.csv").read_text() != "stale"


def test_the_run_steps_called_one_by_one_each_leave_what_the_next_reads(gt, tmp_path):
    scn = scenario(tmp_path, f"{{kind: openai, url: '{gt.url}', model: gt}}")
    writer = ResultWriter(tmp_path / "out", overwrite=False)
    with ExitStack() as cleanup:
        cleanup.callback(writer.close)
        steps = RunSteps(scn, writer, cleanup.enter_context(engine_session(scn, writer.dir / "engine.log")))
        steps.schedule_requests()
        assert len(steps.schedule.requests) == 8 and steps.schedule.token_count_method == "approximate"
        assert any("prompt lengths are approximate" in w for w in steps.warnings)
        assert not (writer.dir / "run.json").exists()

        steps.choose_load_site("1", cleanup)
        assert isinstance(steps.site, LocalClients) and steps.site.workers == 1

        steps.write_run_info()
        before = json.loads((writer.dir / "run.json").read_text())
        assert before["workers"] == 1 and before["backend"]["url"] == gt.url
        assert "t0_perf_counter_ns" not in before and "ray" not in before and read_records(writer.dir) == []

        steps.send_load()
        assert sorted(r.index for r in read_records(writer.dir)) == list(range(8))
        after = json.loads((writer.dir / "run.json").read_text())
        assert after["t0_perf_counter_ns"] == steps.outcome.t0_ns and not (writer.dir / "summary.json").exists()

        result = steps.write_summary()
    on_disk = json.loads((writer.dir / "summary.json").read_text())
    assert on_disk == result.summary.model_dump(exclude_unset=True) and on_disk["requests"]["completed"] == 8
    assert on_disk["workers"] == 1 and "client_capacity_measured" in on_disk and "ray_nodes" not in on_disk


def test_an_output_folder_that_cannot_be_one_is_a_clear_error(gt, tmp_path, monkeypatch):
    scn = scenario(tmp_path, f"{{kind: openai, url: '{gt.url}', model: gt}}")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ResultsError, match="--output: .* is a file, not a folder"):
        run_scenario(scn, tmp_path / "file" / "out")
    (tmp_path / "ro").mkdir()
    if os.geteuid() != 0:  # root writes anywhere; elsewhere the real permission bits are tested
        (tmp_path / "ro").chmod(0o500)
    else:
        monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(ResultsError, match="--output: .*ro is not writable; choose a writable folder"):
        run_scenario(scn, tmp_path / "ro")


def test_most_requests_failing_makes_a_failed_run(gt, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": f"[gt fail=http_500 id={i}] hi" if i % 4 else "fine"}) + "\n" for i in range(8))
    )
    scn = scenario(
        tmp_path,
        f"{{kind: openai, url: '{gt.url}', model: gt}}",
        workload=f"{{kind: file, path: '{prompts}', output_tokens: 4}}",
    )
    result = run_scenario(scn, tmp_path / "out", workers="1")
    assert result.summary.requests.completed == 2 and result.completed_share == 0.25
    assert result.mostly_failed and result.summary.failures == {"http_5xx": 6}


def test_a_profiler_that_is_not_there_is_a_warning_naming_the_flag(gt, tmp_path):
    scn = scenario(tmp_path, f"{{kind: vllm, url: '{gt.url}', model: gt, profile: true}}")
    reporter = Reporter()
    result = run_scenario(scn, tmp_path / "out", workers="1", reporter=reporter)
    warning = next(line for line in reporter.lines if "backend.profile" in line)
    assert "POST /start_profile answered HTTP 404" in warning and "--profiler-config" in warning
    assert result.run_info.profile == ProfileStatus(start_http_status=404, error="answered HTTP 404")


class TokenizeServer:
    """/tokenize that answers `reply(text) -> (status, body bytes)`."""

    def __init__(self, reply):
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, data = reply(body["prompt"])
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(
    "status, body, said",
    [
        (500, b"boom", "answered HTTP 500: boom"),
        (200, b"<html>not json</html>", "answered b'<html>not json</html>', not {\"tokens\": [ids]}"),
        (200, b'{"tokens": ["a", "b"]}', 'not {"tokens": [ids]}'),
    ],
)
def test_a_tokenize_route_answering_errors_or_garbage_is_passed_over_with_a_warning(tmp_path, status, body, said):
    server = TokenizeServer(lambda text: (status, body))
    try:
        scn = scenario(tmp_path, f"{{kind: openai, url: '{server.url}', model: some-model}}")
        warnings = []
        assert isinstance(resolve_tokenizer(scn, warnings=warnings), ApproximateTokenizer)
        assert len(warnings) == 1 and said in warnings[0] and "counted locally instead" in warnings[0]
    finally:
        server.close()


@pytest.mark.faults
def test_a_tokenize_route_that_never_answers_is_passed_over_with_a_warning(tmp_path):
    server = TokenizeServer(lambda text: time.sleep(7) or (200, b'{"tokens": [1]}'))
    try:
        scn = scenario(tmp_path, f"{{kind: openai, url: '{server.url}', model: some-model}}")
        warnings = []
        assert isinstance(resolve_tokenizer(scn, warnings=warnings), ApproximateTokenizer)
        assert warnings == [
            f"backend.url: POST {server.url}/tokenize did not answer within 5 s; prompt lengths are "
            "counted locally instead"
        ]
    finally:
        server.close()


def test_a_tokenize_route_that_breaks_after_the_probe_is_a_tokenizer_error(tmp_path):
    server = TokenizeServer(lambda text: (200, b'{"tokens": [1]}') if text == "hello" else (500, b"overloaded"))
    try:
        scn = scenario(tmp_path, f"{{kind: openai, url: '{server.url}', model: some-model}}")
        with pytest.raises(TokenizerError, match="/tokenize answered HTTP 500: overloaded"):
            build_schedule(scn, resolve_tokenizer(scn))
    finally:
        server.close()


def test_a_scenario_key_gives_a_local_hugging_face_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from harness.scenario.tokenizer_source import WORDS

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}
    hf = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    (tmp_path / "tok").mkdir()
    hf.save(str(tmp_path / "tok" / "tokenizer.json"))
    scn = scenario(
        tmp_path,
        "{kind: openai, url: 'http://127.0.0.1:9', model: m, tokenizer: tok}",
        workload="{kind: random, input_tokens: 40, output_tokens: 4}",
    )
    assert scn.backend.tokenizer == str((tmp_path / "tok").resolve())
    source = resolve_tokenizer(scn)
    assert isinstance(source, LocalTokenizer) and source.method == "local_tokenizer"
    plan = build_schedule(scn, source)
    assert all(r.prompt_tokens == 40 and len(hf.encode(r.prompt).ids) == 40 for r in plan.requests)
    with pytest.raises(ScenarioError, match="backend.tokenizer: './missing.gguf' not found"):
        scenario(tmp_path, "{kind: openai, url: 'http://127.0.0.1:9', tokenizer: ./missing.gguf}")


def test_launch_program_replaces_only_the_program_and_llama_server_is_sized_for_the_run(tmp_path):
    native = load_backend("native")
    command = engine_command(
        native, LaunchConfig(program="/venv/bin/python", args=["--blas-threads", "1"]), 8123, "smollm2"
    )
    assert command == [
        "/venv/bin/python",
        "-m",
        "native_engine",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--blas-threads",
        "1",
    ]
    scn = scenario(
        tmp_path,
        "{kind: llamacpp, model: m.gguf, launch: {}}",
        workload="{kind: random, input_tokens: {dist: uniform, min: 100, max: 300}, output_tokens: 64}",
        load="{arrival: closed, concurrency: 12, num_requests: 8}",
    )
    sizing = engine_sizing(scn)
    llama = engine_command(load_backend("llamacpp"), scn.backend.launch, 8124, "m.gguf", sizing)
    flag = {llama[i]: llama[i + 1] for i in range(len(llama) - 1)}
    assert int(flag["-t"]) == sizing.threads >= 1
    assert int(flag["-np"]) >= 12 and int(flag["-c"]) >= 12 * (300 + 64)
    # a flag the user gives wins over the sizing, and is given once
    mine = engine_command(load_backend("llamacpp"), LaunchConfig(args=["-c", "2048"]), 8124, "m.gguf", sizing)
    assert mine.count("-c") == 1 and mine[mine.index("-c") + 1] == "2048"


def test_client_bound_advice_suggests_workers_only_where_a_core_is_spare():
    unflagged = {"client_bound": True, "client_bound_reasons": [], "interrupted": False}
    unflagged |= {"incomplete": False, "incomplete_reasons": [], "lost_workers": []}
    summary = summarize([]).model_dump() | unflagged
    summary |= {"workers": 2, "concurrency": {"mean": 400.0, "max": 512}, "client_cpu_s": 9.0, "run_span_s": 10.0}

    def advice(**fields) -> str:
        return client_bound_advice(Summary.model_validate(summary | fields), cpu_count=2)

    on_16 = client_bound_advice(Summary.model_validate(summary), cpu_count=16)
    assert on_16.startswith("use --workers 15 (up to one per core but one")
    # a 2-core machine: auto already chose 1 process (one core stays for the rest), so no --workers advice
    reqs = [gt_request(i, i * 0.001, 99) for i in range(1001)]  # ~99,000 tokens/s: many processes' worth
    assert workers_needed(reqs, None, None) == 20 and resolve_workers("auto", reqs, None, None, cpu_count=2) == 1
    assert resolve_workers("auto", reqs, None, None, cpu_count=64) == 20  # auto takes what it needs where it can
    said = advice(workers=1, workers_needed=20)
    assert "--workers" not in said and "more client processes cannot help" in said and "2 core(s)" in said
    assert "this load needs about 20 client processes (5,000 streamed tokens/s each, a planning figure)" in said
    assert "fewer streams (up to 512 each in this run)" in said and "more cores" in said and "--ray" in said
    assert "its processes used 0.90 cores in all on average" in said
    node = {"node_ip": "10.0.0.1", "node_id": "n", "planned": 1, "recorded": 1, "completed": 1, "failed": 0}
    on_ray = advice(ray_nodes=[{**node, "actor_lost_failures": 0, "lost": None}] * 2)
    assert "2 Ray node(s)" in on_ray and "add nodes" in on_ray and "--workers" not in on_ray


def test_scenarios_that_would_misplace_the_engine_or_the_results_are_refused(tmp_path):
    base = "{kind: openai, model: m, launch: {command: '%s'}}"
    with pytest.raises(
        ScenarioError, match=r"backend.launch.command: .* has no \{port\}.*\{port\}, \{host\}, \{model\}"
    ):
        scenario(tmp_path, base % "/opt/llama-server -m model.gguf")
    assert scenario(tmp_path, base % f"{sys.executable} server.py --port {{port}}").backend.launch.command
    with pytest.raises(ScenarioError, match="launch.program: give either launch.command"):
        scenario(tmp_path, "{kind: openai, model: m, launch: {command: 'x --port {port}', program: y}}")
    bad_name = tmp_path / "escape.yaml"
    bad_name.write_text(
        "name: ../../etc/x\nbackend: {kind: openai, url: 'http://127.0.0.1:9'}\nload: {arrival: constant, rate: 1}\n"
    )
    with pytest.raises(ScenarioError, match=r"name: .*\(it names the results folder\)"):
        load_scenario(bad_name)


def test_default_output_dir_never_leaves_results():
    from harness.results.folder import default_output_dir

    assert default_output_dir("quickstart").parent == Path("results")
    for name in ("../../etc/x", "a/b", ".hidden"):
        with pytest.raises(ResultsError, match="cannot name a results folder"):
            default_output_dir(name)


def test_a_sweep_folder_holding_results_is_refused_unless_overwritten(tmp_path):
    from harness.results.folder import prepare_sweep_dir, read_statuses, write_manifest
    from harness.results.schema import SweepPoint

    out = tmp_path / "sweep"
    prepare_sweep_dir(out).release()  # new: fine (the lock a sweep holds while it runs, let go)
    (out / "point-000-rate-1").mkdir()
    (out / "point-000-rate-1" / "requests.jsonl").write_text("")
    point = SweepPoint(index=0, offered_load=1.0, dir="point-000-rate-1", status="completed", client_bound=False)
    write_manifest(out, "rate", {}, [point])
    assert read_statuses(out) == {"point-000-rate-1": "completed"}
    with pytest.raises(ResultsError, match="already holds results .*--overwrite"):
        prepare_sweep_dir(out)
    prepare_sweep_dir(out, overwrite=True).release()
    assert list(out.iterdir()) == []
