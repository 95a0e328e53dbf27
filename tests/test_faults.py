"""Fault injection, client side: what a broken server, a killed worker or a crafted file does to a run.

Each test reproduces the fault (a ground-truth server told to misbehave, a SIGKILL, a file written to
break a reader) and asserts that the run says so instead of reporting wrong numbers or a traceback.
Marked `faults` (`pytest -m faults` runs just these); they are fast and run in the normal suite too.
"""

import asyncio
import json
import os
import signal
import threading
from pathlib import Path

import pytest
from aiohttp import web
from bench_process import bench, bench_started, wait_until_written
from groundtruth_server import GroundTruthConfig, GroundTruthProcess, GroundTruthServer, gt_request

from harness.client.runner import Runner, Target
from harness.client.workers import resolve_workers
from harness.limits import MAX_TOKENS_PER_REQUEST
from harness.metrics.latencies import summarize
from harness.scenario.scenario import ScenarioError, load_scenario
from harness.scenario.tokenizer_source import ApproximateTokenizer
from harness.scenario.traces import load_trace
from harness.scenario.workload import RequestSpec, build_schedule

pytestmark = pytest.mark.faults


async def run_against_gt(requests, **target_options):
    server = GroundTruthServer(GroundTruthConfig(ttft_ms=5, itl_ms=2))
    port = await server.start()
    try:
        return await Runner(Target(url=f"http://127.0.0.1:{port}", **target_options), requests).run()
    finally:
        await server.stop_listening()


async def test_aborted_and_short_streams_are_failures_outside_goodput():
    # 8 requests of 20 tokens: 3 aborted mid-way as the engine's loop aborts them, 1 cut short at "length"
    faults = {1: "abort_after_12", 4: "abort_after_15", 6: "abort_after_3", 7: "short_after_17"}
    reqs = [gt_request(i, 0.01 * i, 20, **({"fail": faults[i]} if i in faults else {})) for i in range(8)]
    out = await run_against_gt(reqs, ignore_eos=True)
    by_index = {r.index: r for r in out.records}
    for i in (1, 4, 6):
        assert by_index[i].error_reason == "finish_abort" and by_index[i].finish_reason == "abort"
        assert "'abort' after" in by_index[i].error_detail
    assert by_index[7].error_reason == "short_output" and "17 of the 20 tokens" in by_index[7].error_detail
    assert all(by_index[i].ok and by_index[i].output_tokens == 20 for i in (0, 2, 3, 5))
    summary = summarize(out.records, {"ttft_ms": 10_000})
    assert summary.requests.completed == 4 and summary.requests.failed == 4
    assert summary.failures == {"finish_abort": 3, "short_output": 1}
    assert summary.goodput.fraction == 0.5  # the cut answers meet the SLO but are not good
    assert summary.output_tokens == 80


async def test_an_answer_cut_at_length_before_max_tokens_fails_even_when_the_length_is_not_forced():
    # TEST06's check: only an EOS (finish_reason stop) may end an answer before the count asked
    out = await run_against_gt([gt_request(0, 0.0, 20, fail="short_after_17")], ignore_eos=False)
    rec = out.records[0]
    assert rec.error_reason == "early_length" and rec.output_tokens == 17
    assert "finish_reason 'length' after 17 of the 20 tokens asked" in rec.error_detail


async def test_an_endless_response_fails_at_the_byte_cap_and_the_run_goes_on():
    reqs = [gt_request(0, 0.0, 8, fail="endless"), gt_request(1, 0.0, 8, fail="endless_500"), gt_request(2, 0.01, 8)]
    out = await run_against_gt(reqs, max_response_bytes=1 << 20, request_timeout_s=120)
    by_index = {r.index: r for r in out.records}
    assert by_index[0].error_reason == "response_too_large"
    assert "backend.max_response_bytes=1048576" in by_index[0].error_detail
    assert by_index[0].token_times_s == []  # the buffered bytes were dropped
    assert by_index[1].error_reason == "http_5xx" and len(by_index[1].error_detail) < 400  # read a head only
    assert by_index[2].ok and by_index[2].output_tokens == 8


@pytest.mark.parametrize("claimed", [str(10**12), "1e12", "-5"])
async def test_an_absurd_usage_count_fails_the_request_not_the_summary(claimed):
    out = await run_against_gt([gt_request(0, 0.0, 4, fail=f"usage_{claimed}"), gt_request(1, 0.0, 4)])
    by_index = {r.index: r for r in out.records}
    assert by_index[0].error_reason == "bad_usage"
    assert by_index[0].error_detail.startswith(f"usage.completion_tokens: {json.loads(claimed)!r} from the server")
    assert str(MAX_TOKENS_PER_REQUEST) in by_index[0].error_detail
    summary = summarize(out.records)  # once a MemoryError: 1e12 per-token gaps
    assert summary.failures == {"bad_usage": 1} and summary.output_tokens == 4


def test_bench_run_says_which_answers_were_cut(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"prompt": f"request {i} [gt id={i}{' fail=abort_after_3' * (i == 2)}]", "output_tokens": 6})
            + "\n"
            for i in range(4)
        )
    )
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=5, itl_ms=2)) as gt:
        scenario = tmp_path / "s.yaml"
        scenario.write_text(
            f"name: cut\nbackend: {{kind: openai, url: '{gt.url}', model: gt}}\n"
            f"workload: {{kind: file, path: {prompts}}}\n"
            "load: {arrival: constant, rate: 20, num_requests: 4}\n"
            "slo: {ttft_ms: 10000}\ntelemetry: {interval_ms: 200, gpu: false}\n"
        )
        res = bench(
            "run",
            scenario,
            "--output",
            tmp_path / "out",
            "--workers",
            "1",
            "--allow-client-bound",
            env={**os.environ, "COLUMNS": "200"},
        )
    assert "3 completed, 1 failed" in res.stderr and "failures: finish_abort=1" in res.stderr, res.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["failures"] == {"finish_abort": 1} and summary["goodput"]["fraction"] == 0.75


def _spawned_children(pid: int) -> list[int]:
    """The multiprocessing workers among a process's children (not its resource tracker)."""
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(c) for c in (task / "children").read_text().split()]
    return [c for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def test_a_killed_worker_marks_the_run_incomplete_and_exits_4(tmp_path):
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=5, itl_ms=5)) as gt:
        scenario = tmp_path / "s.yaml"
        scenario.write_text(
            f"name: kill\nbackend: {{kind: openai, url: '{gt.url}', model: gt}}\n"
            "workload: {kind: random, input_tokens: 8, output_tokens: 8}\n"
            "load: {arrival: constant, rate: 20, num_requests: 60}\n"
            "telemetry: {interval_ms: 200, gpu: false}\n"
        )
        out = tmp_path / "out"
        proc = bench_started("run", scenario, "--output", out, "--workers", "2", "--allow-client-bound")
        requests_file = out / "requests.jsonl"
        # 36 of 60 written: each worker has 30, so the one killed below has recorded some (a worker may
        # start its share later than the other) and, 1.2 s before the end, not all
        wait_until_written(requests_file, 36)
        workers = _spawned_children(proc.pid)
        assert len(workers) == 2, workers
        os.kill(workers[1], signal.SIGKILL)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 4, stderr
    said = " ".join(stderr.split())
    assert "run incomplete" in said and "killed by SIGKILL" in said
    summary = json.loads((out / "summary.json").read_text())
    assert summary["incomplete"] is True and summary["interrupted"] is False
    (lost,) = summary["lost_workers"]
    assert lost["pid"] == workers[1] and lost["exit"] == "was killed by SIGKILL"
    assert lost["planned"] == 30 and 0 < lost["recorded"] < 30
    never = 30 - lost["recorded"]  # its requests without a record are counted failed, not left out
    assert lost["worker_lost_failures"] == never and summary["failures"].get("worker_lost") == never
    assert (
        f"{lost['recorded']} of its 30 planned requests recorded, {never} more counted failed (worker_lost)"
        in summary["incomplete_reasons"][0]
    )
    req = summary["requests"]
    assert req["measured"] == 60 and req["failed"] >= never and summary["goodput"]["fraction"] <= 1 - never / 60
    assert f"{req['completed']} completed, {req['failed']} failed" in said and f"worker_lost={never}" in said
    written = [json.loads(line) for line in requests_file.read_text().splitlines()]
    assert len(written) == 60 and sum(r["error_reason"] == "worker_lost" for r in written) == never


def test_a_sweep_point_with_a_killed_worker_is_failed_and_the_sweep_exits_4(tmp_path):
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=5, itl_ms=5)) as gt:
        scenario = tmp_path / "s.yaml"
        scenario.write_text(
            f"name: killsweep\nbackend: {{kind: openai, url: '{gt.url}', model: gt}}\n"
            "workload: {kind: random, input_tokens: 8, output_tokens: 8}\n"
            "load: {arrival: constant, num_requests: 60, sweep: [40, 80]}\n"
            "telemetry: {interval_ms: 200, gpu: false}\n"
        )
        out = tmp_path / "out"
        proc = bench_started("run", scenario, "--output", out, "--workers", "2", "--allow-client-bound")
        requests_file = out / "point-000-rate-40" / "requests.jsonl"
        wait_until_written(requests_file, 10)
        workers = _spawned_children(proc.pid)
        assert len(workers) == 2, workers
        os.kill(workers[1], signal.SIGKILL)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 4, stderr
    assert "run incomplete" in stderr and "killed by SIGKILL" in stderr
    assert "the points after it were not run" in stderr
    summary = json.loads((out / "point-000-rate-40" / "summary.json").read_text())
    assert summary["incomplete"] is True and summary["interrupted"] is False
    manifest = json.loads((out / "sweep.json").read_text())
    assert [p["status"] for p in manifest["points"]] == ["failed", "pending"]
    assert not (out / "point-001-rate-80").exists()


@pytest.mark.parametrize(
    "override, message",
    [
        ("load.rate=.inf", "load.rate: inf is not valid: must be a finite number"),
        ("load.rate=0.000001", "load.rate: 1e-06 requests/s for 10 requests spans 1e+07 s, more than the limit"),
        ("load.num_requests=100000000000", "load.num_requests: 100000000000 is not valid: must be <= 1000000"),
        ("load.concurrency=10000000000", "load.concurrency: 10000000000 is not valid: must be <= 100000"),
        (
            "workload.output_tokens=1000000000000",
            "workload.output_tokens: 1000000000000 is not valid: mean 1e+12 is more than the limit of 1e+06 tokens",
        ),
        ("backend.request_timeout_s=1.0e+300", "backend.request_timeout_s: 1e+300 is not valid: must be <= 604800"),
        (
            'backend.headers={Authorization: "Bearer x\\r\\nX-Admin: 1"}',
            "backend.headers.Authorization: the header value 'Bearer x\\r\\nX-Admin: 1' contains a line break",
        ),
        ("backend.headers={Bad Header Name: x}", "backend.headers: 'Bad Header Name' is not a valid HTTP header name"),
        ("backend.headers={'X-Key:': x}", "backend.headers: 'X-Key:' is not a valid HTTP header name"),
    ],
)
def test_numbers_and_headers_past_their_bounds_name_the_field(tmp_path, override, message):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "name: b\nbackend: {kind: openai, url: 'http://127.0.0.1:9'}\n"
        "load: {arrival: constant, rate: 4, num_requests: 10}\n"
    )
    with pytest.raises(ScenarioError) as caught:
        load_scenario(scenario, [override])
    assert message in str(caught.value)


def test_worker_count_is_bounded_by_the_cores():
    reqs = [gt_request(i, 0.1 * i) for i in range(4)]
    assert resolve_workers("4", reqs, None, None, cpu_count=2) == 4
    with pytest.raises(ValueError, match=r"load.workers: 1000 is not valid: at most 4 client processes"):
        resolve_workers("1000", reqs, None, None, cpu_count=2)


@pytest.mark.parametrize(
    "row, message",
    [
        (
            '{"timestamp": Infinity, "input_length": 8, "output_length": 8}',
            "line 2 field 'timestamp': inf is not valid: must be a finite number",
        ),
        (
            '{"timestamp": 1e15, "input_length": 8, "output_length": 8}',
            "line 2: its timestamp is 1e+12 s after the first request (line 1), more than the limit of 604800 s",
        ),
        (
            '{"timestamp": 5, "input_length": 100000000000, "output_length": 8}',
            "line 2 field 'input_length': 100000000000 is not valid: must be at most the limit of 1000000 tokens",
        ),
    ],
)
def test_trace_rows_past_their_bounds_name_the_line(tmp_path, row, message):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 8, "output_length": 8}\n' + row + "\n")
    with pytest.raises(ScenarioError) as caught:
        load_trace(trace)
    assert f"load.trace: {trace} {message}" in str(caught.value)


def test_non_utf8_files_are_named_with_exit_2_and_no_traceback(tmp_path):
    scenario = tmp_path / "latin1.yaml"
    scenario.write_bytes("name: caf\u00e9\nbackend: {kind: openai, url: 'http://127.0.0.1:9'}\n".encode("latin-1"))
    res = bench("validate", scenario, timeout_s=60, env={**os.environ, "COLUMNS": "500"})  # no wrapped path
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert f"{scenario} line 1: not UTF-8 text (byte 0xe9)" in " ".join(res.stderr.split())
    for name, field in (("t.jsonl", "load.trace"), ("t.csv", "load.trace")):
        trace = tmp_path / name
        good = (
            '{"timestamp": 0, "input_length": 8, "output_length": 8}\n'
            if name.endswith("jsonl")
            else "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n0,m,8,8,16,x\n"
        )
        trace.write_bytes(good.encode() + b"\xff\xfe broken\n")
        with pytest.raises(ScenarioError, match=f"{field}: {trace} line {good.count(chr(10)) + 1}: not UTF-8"):
            load_trace(trace)
    for name in ("w.jsonl", "w.json"):  # a prompt file, JSONL or ShareGPT
        (tmp_path / name).write_bytes(
            b'[{"prompt": "caf\xe9"}]\n' if name.endswith("json") else b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n'
        )
        scenario.write_text("name: w\nbackend: {kind: openai, url: 'http://127.0.0.1:9', api: chat}\n")
        workload = load_scenario(
            scenario,
            [f"workload={{kind: file, path: {tmp_path / name}}}", "load={arrival: constant, rate: 4, num_requests: 2}"],
        )
        line = 1 if name.endswith("json") else 2
        with pytest.raises(ScenarioError, match=f"workload.path: {tmp_path / name} line {line}: not UTF-8"):
            build_schedule(workload, ApproximateTokenizer())


def test_missing_records_make_a_run_incomplete_unless_it_was_cut_short_on_purpose():
    from harness.client.runner import RunOutcome
    from harness.client.workers import incomplete_reasons

    outcome = RunOutcome(records=[object()] * 7, loop_lag_s=[], t0_ns=0, interrupted=False)
    assert incomplete_reasons(outcome, 10, stops_at_duration=False) == ["3 of 10 planned requests have no record"]
    assert incomplete_reasons(outcome, 10, stops_at_duration=True) == []  # duration_s ended dispatching
    outcome.interrupted = True
    assert incomplete_reasons(outcome, 10, stops_at_duration=False) == []
    assert incomplete_reasons(outcome, 7, stops_at_duration=False) == []


# --- a server whose stream breaks OpenAI's format: what reaches the record ---------------------------------------

ENGINES = Path(__file__).parent / "fixtures" / "engines"


def _events(name: str) -> list[bytes]:
    """A recorded stream's events, each with its blank line."""
    return [e + b"\n\n" for e in (ENGINES / name).read_bytes().split(b"\n\n") if e.strip()]


VLLM = _events("vllm_completions.sse")  # 16 token events, a usage event, [DONE]


def _scripted(fault: str) -> list[bytes]:
    """vLLM's recorded stream with one fault (the request's prompt names it)."""
    events = list(VLLM)
    if fault == "text_5":
        events[2] = events[2].replace(b'"text":"\\n"', b'"text":5')
    elif fault == "finish_reason_object":
        events[15] = events[15].replace(b'"finish_reason":"length"', b'"finish_reason":{"type":"length"}')
    elif fault == "after_done":  # two token events more after [DONE]
        events += [VLLM[0], VLLM[1]]
    elif fault == "model_switch":  # from the 9th event on, another model answers
        events[8:16] = [e.replace(b'"model":"smollm2"', b'"model":"llama-70b"') for e in events[8:16]]
    elif fault == "multi_token":  # the built-in engine's speculative decoding: 13 events carry 24 tokens
        events = _events("native_spec_completions.sse")
    return events


class ScriptedServer:
    """/v1/completions on 127.0.0.1, in a thread of its own (so a `bench run` subprocess can use it too): each request
    is answered as `answer(prompt, n)` says, n counting the requests from 0: a list of SSE events, or a web.Response
    (a redirect)."""

    def __init__(self, answer):
        self.answer, self.requests = answer, 0
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n, self.requests = self.requests, self.requests + 1
        answer = self.answer(body["prompt"], n)
        if isinstance(answer, web.Response):
            return answer
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in answer:
            await resp.write(event)
        await resp.write_eof()
        return resp

    async def _start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/completions", self._serve)
        app.router.add_get("/v1/models", _models)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    def __enter__(self) -> str:
        self.thread.start()
        return asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=30)

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"data": [{"id": "smollm2"}]})


def _answer(fault: str, n: int):
    if fault.startswith("redirect_"):
        status = int(fault.removeprefix("redirect_"))
        return web.Response(status=status, headers={"Location": "http://127.0.0.1:9/v2/completions"}, text="moved")
    return _scripted(fault)


async def _record(url: str, fault: str, stamps: str, output_tokens: int = 16):
    spec = RequestSpec(
        index=0, intended_offset_s=0.0, prompt=fault, messages=None, prompt_tokens=5, output_tokens=output_tokens
    )
    (rec,) = (await Runner(Target(url=url, model="smollm2", stamps=stamps), [spec]).run()).records
    return rec


@pytest.mark.parametrize("stamps", ["kernel", "loop"])
@pytest.mark.parametrize(
    "fault, reason, said",
    [
        ("text_5", "malformed_event", "choices[0].text is 5 (a number), not a string: the server's stream is not in"),
        ("finish_reason_object", "malformed_event", 'choices[0].finish_reason is {"type": "length"} (an object)'),
    ],
)
async def test_a_choice_field_of_the_wrong_type_is_the_servers_fault_not_the_clients(stamps, fault, reason, said):
    # once recorded as client_error "parsing the stream failed: TypeError: can only concatenate str (not "int")"
    # (text) and "TypeError: unhashable type: 'dict'" (finish_reason)
    with ScriptedServer(_answer) as url:
        rec = await _record(url, fault, stamps)
    assert rec.error_reason == reason and rec.error_detail.startswith(said), rec.error_detail


@pytest.mark.parametrize("stamps", ["kernel", "loop"])
async def test_events_after_done_fail_the_stream_and_the_answer_up_to_done_is_kept(stamps):
    with ScriptedServer(_answer) as url:
        rec = await _record(url, "after_done", stamps)
        clean = await _record(url, "none", stamps)
    assert clean.ok and clean.output_tokens == 16
    assert rec.error_reason == "events_after_done" and rec.partial  # once ok, with the two late tokens timed too
    assert rec.error_detail.startswith('2 events after [DONE], the first b\'data: {"id":"cmpl-8a1007f35f4f62a4"')
    assert rec.output_tokens == rec.output_tokens_counted == 16 and len(rec.token_times_s) == 16
    assert rec.token_times_s[-1] <= rec.end_s


@pytest.mark.parametrize("stamps", ["kernel", "loop"])
async def test_the_served_model_is_recorded_and_a_switch_mid_stream_fails_it(stamps):
    with ScriptedServer(_answer) as url:
        rec = await _record(url, "model_switch", stamps)
        clean = await _record(url, "none", stamps)
    assert clean.ok and clean.served_model == "smollm2"
    assert rec.error_reason == "model_switch" and rec.partial and rec.served_model == "smollm2"
    assert rec.error_detail == (
        "event 9 names model 'llama-70b', the events before it 'smollm2': the server switched model mid-answer"
    )


@pytest.mark.parametrize("stamps", ["kernel", "loop"])
@pytest.mark.parametrize("status", [307, 302, 308])
async def test_a_redirect_fails_as_a_redirect_naming_the_status_and_where_it_points(stamps, status):
    with ScriptedServer(_answer) as url:
        rec = await _record(url, f"redirect_{status}", stamps)
    # once malformed_sse (kernel stamps: the body "moved" read as SSE) or connect_error (loop stamps: aiohttp followed
    # the redirect and re-sent the request to where it pointed)
    assert rec.error_reason == "http_redirect" and rec.http_status == status
    assert rec.error_detail == (
        f"HTTP {status} redirect to http://127.0.0.1:9/v2/completions: bench does not follow redirects; set "
        f"backend.url to the address the server redirects to"
    )


@pytest.mark.parametrize("stamps", ["kernel", "loop"])
async def test_the_built_in_engines_multi_token_chunks_agree_with_its_usage(stamps):
    # recorded from `bench serve --speculative ngram`: 13 token events carrying 24 tokens; once 13 counted against a
    # usage of 24, a token-count mismatch on every request that made a run against the engine itself INVALID
    with ScriptedServer(_answer) as url:
        rec = await _record(url, "multi_token", stamps, output_tokens=24)
    assert rec.ok and not rec.token_count_mismatch, rec.error_detail
    assert rec.output_tokens == rec.output_tokens_usage == rec.output_tokens_counted == 24
    assert rec.tokens_per_chunk == [1, 1] + [2] * 11
    summary = summarize([rec])
    assert summary.token_count_mismatches == 0 and summary.output_tokens == 24


def test_a_run_served_by_two_models_is_invalid_naming_them(tmp_path):
    def two_models(prompt: str, n: int) -> list[bytes]:  # every third request answered by another model
        model = b"llama-70b" if n % 3 == 2 else b"smollm2"
        return [e.replace(b'"model":"smollm2"', b'"model":"%s"' % model) for e in VLLM]

    with ScriptedServer(two_models) as url:
        scenario = tmp_path / "s.yaml"
        scenario.write_text(
            f"name: switch\nbackend: {{kind: openai, url: '{url}', model: smollm2}}\n"
            "workload: {kind: random, input_tokens: 8, output_tokens: 16}\n"
            "load: {arrival: constant, rate: 50, num_requests: 12}\n"
            "telemetry: {interval_ms: 200, gpu: false}\n"
        )
        res = bench("run", scenario, "--output", tmp_path / "out", "--workers", "1", "--allow-client-bound")
    records = [json.loads(line) for line in (tmp_path / "out" / "requests.jsonl").read_text().splitlines()]
    served = [r["served_model"] for r in records if not r["is_warmup"]]
    assert len(served) == 12 and served.count("llama-70b") == 4 and served.count("smollm2") == 8, served
    validity = json.loads((tmp_path / "out" / "summary.json").read_text())["validity"]
    assert not validity["valid"]
    assert (
        "model switch: 2 models served the measured requests ('smollm2' 8, 'llama-70b' 4, by the `model` of their "
        "streams); the figures mix them" in validity["reasons"]
    ), (validity, res.stderr)
