"""Per-engine request bodies and stream parsing, on real captures (vLLM, llama-server) and on
fixtures written from the engines' documented formats (SGLang, TensorRT-LLM, Ollama)."""

import json
import os
from pathlib import Path

import pytest
from bench_process import bench

from backends import available, load_backend
from backends.base import NATIVE, json_lines
from backends.openai import StreamError

FIXTURES = Path(__file__).parent / "fixtures" / "engines"
WORDS = " The cache keeps the keys and values."


def split_reads(path: Path, size: int) -> tuple[list[bytes], list[int]]:
    """The file cut into network reads of `size` bytes, read i arriving at (i + 1) * 1000 ns."""
    data = path.read_bytes()
    reads = [data[i : i + size] for i in range(0, len(data), size)]
    return reads, [(i + 1) * 1000 for i in range(len(reads))]


def test_every_builtin_is_registered_with_its_own_dialect():
    kinds = available()
    assert {"openai", "native", "vllm", "sglang", "trtllm", "llamacpp", "llamacpp_python", "ollama"} <= set(kinds)
    assert load_backend("trtllm").metrics_url("http://h:1") == "http://h:1/prometheus/metrics"
    assert load_backend("ollama").metrics_url("http://h:1") is None
    with pytest.raises(ValueError, match="backend.kind: 'nope' is not an installed backend"):
        load_backend("nope")


def test_bench_backends_lists_installed_backends():
    out = bench("backends", timeout_s=60)
    assert out.returncode == 0
    for kind in ("sglang", "trtllm", "ollama", "llamacpp_python"):
        assert kind in out.stdout


def test_a_third_party_package_adds_a_backend_through_the_entry_point_group(tmp_path):
    site = tmp_path / "site"
    (site / "myplug").mkdir(parents=True)
    (site / "myplug" / "__init__.py").write_text(
        "from backends.base import Backend\n"
        "class MyEngine(Backend):\n    name = 'myengine'\n    description = 'a plug-in engine'\n"
        "    metrics_path = '/stats'\n"
    )
    dist = site / "myplug-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: myplug\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[bench.backends]\nmyengine = myplug:MyEngine\n")
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    listed = bench("backends", timeout_s=60, env=env)
    assert "myengine" in listed.stdout and "/stats" in listed.stdout
    scenario = tmp_path / "s.yaml"
    scenario.write_text("backend: {kind: myengine, url: 'http://127.0.0.1:9'}\nload: {arrival: poisson, rate: 1}\n")
    ok = bench("validate", scenario, timeout_s=60, env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    without = bench("validate", scenario, timeout_s=60)
    assert without.returncode == 2 and "backend.kind: 'myengine' is not valid" in without.stderr


@pytest.mark.parametrize(
    "kind, must_have, must_not_have",
    [
        ("vllm", {"ignore_eos": True, "min_tokens": 8}, ()),
        ("sglang", {"ignore_eos": True, "min_tokens": 8}, ()),
        ("trtllm", {"ignore_eos": True, "min_tokens": 8}, ()),
        ("native", {"ignore_eos": True}, ()),
        ("llamacpp", {"ignore_eos": True}, ("min_tokens",)),
        ("ollama", {"options": {"num_predict": 8}, "raw": True}, ("ignore_eos", "max_tokens")),
    ],
)
def test_exact_length_dialects(kind, must_have, must_not_have):
    body = load_backend(kind).request_body("completions", "m", 8, prompt="hi", ignore_eos=True)
    assert must_have.items() <= body.items()
    assert not set(must_not_have) & set(body)


def test_llama_cpp_python_biases_eos_away_or_says_what_is_missing():
    body = load_backend("llamacpp_python", eos_token_ids=(0, 2)).request_body(
        "chat", "m", 8, prompt="hi", ignore_eos=True
    )
    assert body["logit_bias"] == {"0": -100.0, "2": -100.0} and "ignore_eos" not in body
    with pytest.raises(ValueError, match="backend.eos_token_ids"):
        load_backend("llamacpp_python").request_body("chat", "m", 8, prompt="hi", ignore_eos=True)


def test_sglang_native_generate_body_and_unknown_api():
    sglang = load_backend("sglang")
    assert sglang.endpoint_path(NATIVE) == "/generate"
    body = sglang.request_body(NATIVE, "m", 8, prompt="hi", ignore_eos=True)
    assert body == {
        "text": "hi",
        "stream": True,
        "sampling_params": {"max_new_tokens": 8, "ignore_eos": True, "min_new_tokens": 8},
    }
    with pytest.raises(ValueError, match="backend.api: vllm supports"):
        load_backend("vllm").endpoint_path(NATIVE)


@pytest.mark.parametrize("read_size", [7, 64, 100000])
def test_sglang_generate_cumulative_text_and_meta_info(read_size):
    reads, times = split_reads(FIXTURES / "sglang_generate.sse", read_size)
    parsed = load_backend("sglang").parse_stream(NATIVE, reads, times)
    assert parsed.text == WORDS  # cumulative text is not concatenated again
    assert parsed.tokens_per_chunk == [1] * 8 and parsed.usage_completion_tokens == 8
    assert parsed.usage_prompt_tokens == 17 and parsed.finish_reason == "length" and parsed.saw_done
    assert parsed.token_times_ns == sorted(parsed.token_times_ns)


@pytest.mark.parametrize("read_size", [7, 4096])
def test_sglang_generate_incremental_text(read_size):
    # --incremental-streaming-output: each event's text is the new piece only
    reads, times = split_reads(FIXTURES / "sglang_generate_incremental.sse", read_size)
    parsed = load_backend("sglang").parse_stream(NATIVE, reads, times)
    assert parsed.text == WORDS and parsed.tokens_per_chunk == [1] * 8


def test_ollama_thinking_tokens_are_tokens_but_not_text():
    reads, times = split_reads(FIXTURES / "ollama_chat_thinking.ndjson", 64)
    parsed = load_backend("ollama").parse_stream("chat", reads, times)
    assert parsed.text == WORDS  # the answer only
    assert parsed.counted_tokens == 12 == parsed.usage_completion_tokens  # eval_count counts the thinking
    assert parsed.reasoning_tokens == 4 and parsed.first_answer_chunk == 4  # 4 thinking chunks, then the answer


def test_launch_args_for_what_the_run_asks(tmp_path):
    vllm = load_backend("vllm", profile=True)
    args = vllm.launch_args(tmp_path, ["python", "-m", "vllm.entrypoints.openai.api_server"])
    assert args[0] == "--profiler-config" and '"torch_profiler_dir"' in args[1]
    assert load_backend("vllm").launch_args(tmp_path, []) == []  # no profile asked: no flag
    trt = load_backend("trtllm")
    args = trt.launch_args(tmp_path, ["trtllm-serve", "m"])
    assert args[0] == "--extra_llm_api_options"
    assert (
        "return_perf_metrics: true" in open(args[1]).read() and "enable_iter_perf_stats: true" in open(args[1]).read()
    )
    assert trt.launch_args(tmp_path, ["trtllm-serve", "m", "--extra_llm_api_options", "mine.yaml"]) == []


@pytest.mark.parametrize(
    "kind, api, name, tokens, timings",
    [
        ("vllm", "completions", "vllm_completions", 16, False),
        ("vllm", "chat", "vllm_chat", None, False),
        ("llamacpp", "completions", "llamacpp_completions", 16, True),
        ("llamacpp", "chat", "llamacpp_chat", 24, True),
        ("sglang", "completions", "sglang_completions", 8, False),
        ("trtllm", "chat", "trtllm_chat", 8, False),
        ("trtllm", "completions", "trtllm_completions", 8, False),
    ],
)
def test_openai_streams_of_each_engine(kind, api, name, tokens, timings):
    reads, times = split_reads(FIXTURES / f"{name}.sse", 50)
    parsed = load_backend(kind).parse_stream(api, reads, times)
    assert parsed.saw_done and parsed.finish_reason == "length"
    # role-only first deltas and empty trailing chunks carry no token
    assert len(parsed.token_times_ns) == parsed.counted_tokens
    if tokens is not None:
        assert parsed.usage_completion_tokens == tokens == parsed.counted_tokens
    assert bool(parsed.server_timings) == timings
    if timings:
        assert parsed.server_timings["predicted_n"] == tokens


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_ollama_ndjson_with_server_durations(api):
    reads, times = split_reads(FIXTURES / f"ollama_{api}.ndjson", 33)
    parsed = load_backend("ollama").parse_stream(api, reads, times)
    assert parsed.text == WORDS and parsed.counted_tokens == 8 == parsed.usage_completion_tokens
    assert parsed.finish_reason == "length" and parsed.saw_done and parsed.usage_prompt_tokens == 17
    assert parsed.server_timings["prompt_eval_s"] == pytest.approx(0.035)
    assert parsed.server_timings["eval_s"] == pytest.approx(0.352)
    # a token line is timed by the read that completed it
    data = (FIXTURES / f"ollama_{api}.ndjson").read_bytes()
    first_newline = data.index(b"\n")
    assert parsed.token_times_ns[0] == (first_newline // 33 + 1) * 1000


def test_ndjson_cut_and_error_lines():
    with pytest.raises(StreamError, match="stream_cut"):
        json_lines([b'{"response": "a", "done": false}\n{"respo'], [1])
    with pytest.raises(StreamError, match="server_error_event"):
        json_lines([b'{"error": "model not found"}\n'], [1])


def test_sglang_version_falls_back_to_the_deprecated_route():
    import json as _json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class OldSglang(BaseHTTPRequestHandler):  # a server from before /server_info
        def do_GET(self):
            found = self.path == "/get_server_info"
            self.send_response(200 if found else 404)
            self.end_headers()
            if found:
                self.wfile.write(_json.dumps({"version": "0.4.9"}).encode())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), OldSglang)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert load_backend("sglang").version(url) == "0.4.9"
        assert load_backend("vllm").version(url) is None  # /version missing, no older route to ask
    finally:
        server.shutdown()


def _ndjson_with(name: str, line: int, **fields) -> bytes:
    """An Ollama capture with `fields` set on its line number `line` (0-based; -1 the last)."""
    lines = [json.loads(x) for x in (FIXTURES / name).read_text().splitlines()]
    lines[line].update(fields)
    return "".join(json.dumps(x) + "\n" for x in lines).encode()


@pytest.mark.faults
@pytest.mark.parametrize(
    "api, line, fields, said",
    [
        ("completions", 0, {"response": 5}, "response is 5 (a number), not a string"),
        ("completions", 0, {"thinking": ["a"]}, 'thinking is ["a"] (a list), not a string'),
        ("chat", 0, {"message": "hi"}, 'message is "hi" (a string), not an object'),
        ("chat", 0, {"message": {"content": {"x": 1}}}, 'message.content is {"x": 1} (an object), not a string'),
        ("completions", -1, {"done": "yes"}, 'done is "yes" (a string), not true or false'),
        ("completions", -1, {"done_reason": 1}, "done_reason is 1 (a number), not a string"),
        ("completions", -1, {"eval_duration": "352ms"}, 'eval_duration is "352ms" (a string), not a number'),
        ("completions", 2, {"model": False}, "model is false (a boolean), not a string"),
    ],
)
def test_ollama_fields_of_the_wrong_type_are_the_servers_malformed_event(api, line, fields, said):
    raw = _ndjson_with(f"ollama_{api}.ndjson", line, **fields)
    with pytest.raises(StreamError) as err:  # each was once a TypeError or AttributeError: the client's error
        load_backend("ollama").parse_stream(api, [raw], [1])
    assert err.value.reason == "malformed_event"
    assert err.value.detail == f"{said}: the server's stream is not in Ollama's format (docs/api.md)"


@pytest.mark.faults
def test_ollama_lines_after_done_and_a_model_switch_flag_the_stream_and_keep_the_answer():
    ollama = load_backend("ollama")
    raw = (FIXTURES / "ollama_completions.ndjson").read_bytes()
    late = ollama.parse_stream("completions", [raw + b'{"response": " more", "done": false}\n'], [1])
    assert late.text == WORDS and late.counted_tokens == 8 and late.served_model == "smollm2"
    assert late.malformed[0] == "events_after_done" and late.malformed[1].startswith("1 line after the one with done")
    switched = ollama.parse_stream("completions", [_ndjson_with("ollama_completions.ndjson", 3, model="llama3")], [1])
    assert switched.malformed == (
        "model_switch",
        "event 4 names model 'llama3', the events before it 'smollm2': the server switched model mid-answer",
    )
    # eval_count counting more tokens than lines: several tokens came in one line, spread by their text
    merged = [json.loads(x) for x in (FIXTURES / "ollama_completions.ndjson").read_text().splitlines()]
    merged[1]["response"] += merged.pop(2)["response"]  # " cache" + " keeps"
    parsed = ollama.parse_stream("completions", ["".join(json.dumps(x) + "\n" for x in merged).encode()], [1])
    assert parsed.tokens_per_chunk == [1, 2, 1, 1, 1, 1, 1] and parsed.text == WORDS


@pytest.mark.faults
@pytest.mark.parametrize(
    "old, new, said",
    [
        (b'"text":" The"', b'"text":5', "text is 5 (a number), not a string"),
        (b'"completion_tokens":2', b'"completion_tokens":"2"', 'meta_info.completion_tokens is "2" (a string)'),
        (b'"meta_info":{', b'"meta_info":[{', "meta_info is ["),
        (b'"finish_reason":null,"prompt_tokens":17,"completion_tokens":1,', b'"finish_reason":7,', "meta_info.finis"),
    ],
)
def test_sglang_generate_fields_of_the_wrong_type_are_the_servers_malformed_event(old, new, said):
    raw = (FIXTURES / "sglang_generate.sse").read_bytes()
    if new.startswith(b'"meta_info":['):  # an array where the object was: close it too
        raw = raw.replace(b',"e2e_latency":0.01}', b',"e2e_latency":0.01}]', 1)
    with pytest.raises(StreamError) as err:
        load_backend("sglang").parse_stream(NATIVE, [raw.replace(old, new, 1)], [1])
    assert err.value.reason == "malformed_event" and err.value.detail.startswith(said), err.value.detail
    assert err.value.detail.endswith("the server's stream is not in the format of SGLang's /generate")
