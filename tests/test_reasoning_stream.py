"""A reasoning model's thinking, streamed apart from its answer, is tokens: TTFT counts the first token of
either kind, ttft_answer the first answer token, and records keep how many tokens were thinking.

Fixtures in the engines' stream formats, from their source: vLLM `delta.reasoning`
(vllm/entrypoints/openai/engine/protocol.py, DeltaMessage; chunks written without unset fields, as in the
recorded vllm_chat.sse), SGLang `delta.reasoning_content` (python/sglang/srt/entrypoints/openai/protocol.py,
DeltaMessage, every field written). Each streams 4 thinking tokens, then the 8-token answer WORDS.
"""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from backends import load_backend
from harness.cli.app import app
from harness.metrics.latencies import request_latency, summarize
from harness.results.folder import RequestRecord, read_records

FIXTURES = Path(__file__).parent / "fixtures" / "engines"
WORDS = " The cache keeps the keys and values."
STREAMS = {"vllm": "vllm_chat_reasoning.sse", "sglang": "sglang_chat_reasoning.sse"}


def events(name: str) -> list[bytes]:
    return [e + b"\n\n" for e in (FIXTURES / name).read_bytes().split(b"\n\n") if e.strip()]


@pytest.mark.parametrize("kind", sorted(STREAMS))
@pytest.mark.parametrize("per_read", [1, 3])
def test_thinking_chunks_are_tokens_counted_apart(kind, per_read):
    chunks = events(STREAMS[kind])
    reads = [b"".join(chunks[i : i + per_read]) for i in range(0, len(chunks), per_read)]
    times = [(i + 1) * 1000 for i in range(len(reads))]
    parsed = load_backend(kind).parse_stream("chat", reads, times)
    assert parsed.text == WORDS  # the answer only
    assert parsed.counted_tokens == 12 == parsed.usage_completion_tokens  # the engine counts the thinking too
    assert parsed.reasoning_tokens == 4
    # the role-only chunk carries no token: the 4 thinking chunks come first, then the answer's
    assert parsed.first_answer_chunk == 4 and parsed.token_times_ns[4] > parsed.token_times_ns[0]


def test_a_stream_without_reasoning_has_its_first_token_as_the_answers():
    chunks = events("vllm_chat.sse")
    parsed = load_backend("vllm").parse_stream("chat", chunks, [(i + 1) * 1000 for i in range(len(chunks))])
    rec = RequestRecord(index=0, intended_send_s=0.0)
    rec.take_stream(parsed, 0)
    assert parsed.reasoning_tokens == 0 and rec.reasoning_tokens == 0
    assert rec.first_answer_token_s == rec.token_times_s[0]


def test_ttft_answer_is_after_the_thinking_and_none_without_an_answer():
    rec = RequestRecord(
        index=0,
        intended_send_s=1.0,
        token_times_s=[1.1, 1.2, 1.3, 1.4],
        tokens_per_chunk=[1] * 4,
        end_s=1.4,
        output_tokens=4,
        reasoning_tokens=2,
        first_answer_token_s=1.3,
    )
    lat = request_latency(rec)
    assert lat.ttft_s == pytest.approx(0.1) and lat.ttft_answer_s == pytest.approx(0.3)
    thinking_only = RequestRecord(**{**rec.__dict__, "index": 1, "reasoning_tokens": 4, "first_answer_token_s": None})
    assert request_latency(thinking_only).ttft_answer_s is None
    summary = summarize([rec, thinking_only])
    assert summary.reasoning_tokens == 6 and summary.ttft_answer_ms.max == pytest.approx(300)
    assert summary.ttft_ms.max == pytest.approx(100)


class _ReasoningEngine(BaseHTTPRequestHandler):
    """vLLM's routes on loopback; the chat stream replays the vLLM fixture, one event every GAP_S."""

    protocol_version = "HTTP/1.1"
    GAP_S = 0.02

    def do_GET(self):
        bodies = {
            "/health": b"",
            "/v1/models": b'{"data": [{"id": "smollm2"}]}',
            "/version": b'{"version": "reasoning-fixture"}',
        }
        self._reply(200 if self.path in bodies else 404, bodies.get(self.path, b"not found"))

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != "/v1/chat/completions":
            return self._reply(404, b"not found")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in events(STREAMS["vllm"]):
            time.sleep(self.GAP_S)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def _reply(self, status: int, body: bytes):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def reasoning_engine():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ReasoningEngine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_bench_run_reports_ttft_and_ttft_answer(tmp_path, reasoning_engine):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        f"name: think\nbackend: {{kind: vllm, api: chat, url: '{reasoning_engine}', model: smollm2}}\n"
        "workload: {kind: random, input_tokens: 8, output_tokens: 12}\n"
        "load: {arrival: constant, rate: 10, num_requests: 3}\ntelemetry: {gpu: false}\n"
    )
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", str(scenario), "--output", str(out), "--allow-client-bound"])
    assert result.exit_code == 0, result.output
    records = read_records(out)
    assert all(
        r.ok and r.reasoning_tokens == 4 and r.output_tokens == 12 and not r.token_count_mismatch for r in records
    ), [r.error_detail for r in records]
    lines = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert all(
        line["reasoning_tokens"] == 4 and line["first_answer_token_s"] > line["token_times_s"][0] for line in lines
    )
    summary = json.loads((out / "summary.json").read_text())
    # 4 thinking events, GAP_S apart, lie between the first token and the first answer token
    gap_ms = 4 * _ReasoningEngine.GAP_S * 1e3
    # (half of it as the bound: a loaded client may read the first thinking chunk late)
    assert summary["ttft_answer_ms"]["mean"] - summary["ttft_ms"]["mean"] >= 0.5 * gap_ms
    assert summary["reasoning_tokens"] == 12
    assert "ttft_answer" in result.output and "12 of 36 output tokens were reasoning" in result.output
