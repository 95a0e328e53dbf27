"""The embeddings, rerank, Responses and Anthropic Messages endpoints: the built-in engine serving them for real
(SmolLM2 on 127.0.0.1), the harness's builders and parsers reading what it sends, the runner driving each, and a
400 naming the field for a bad request to each."""

import asyncio
import base64
import json

import aiohttp
import numpy as np
import pytest
from bench_process import bench

from backends import load_backend
from backends.anthropic_messages import ANTHROPIC_MESSAGES, build_messages_body, parse_messages
from backends.embeddings_api import EMBEDDINGS, parse_embeddings
from backends.openai import StreamError
from backends.rerank_api import DOCUMENTS_PER_REQUEST, RERANK, parse_rerank, split_query_and_documents
from backends.responses_api import RESPONSES, build_responses_body, parse_responses
from harness.client.runner import Runner, Target, run_blocking
from harness.metrics.latencies import summarize
from harness.scenario.scenario import Scenario, ScenarioError
from harness.scenario.workload import RequestSpec
from native_engine.embeddings import final_hidden_states
from native_engine.llm_engine import EngineConfig, LLMEngine, LoadedModel
from native_engine.model_runner import SeqChunk
from native_engine.server import start_server
from native_engine.tiny_gguf import write_tiny_llama_gguf

SMOLLM2_HIDDEN = 576  # SmolLM2-135M's hidden size (its GGUF's llama.embedding_length)


class LiveServer:
    """SmolLM2 served on a free loopback port by a loop in a thread of its own, so the runner can drive it."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.engine = LLMEngine(EngineConfig(kv_cache_tokens=2048), LoadedModel.load("smollm2"))
        import threading

        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runner, port = asyncio.run_coroutine_threadsafe(
            start_server(self.engine, "127.0.0.1", 0), self.loop
        ).result(120)
        self.url = f"http://127.0.0.1:{port}"

    def post(self, path: str, body: dict) -> tuple[int, list[bytes]]:
        """(status, the body's reads) of one POST, made from the test's own loop."""

        async def go():
            async with aiohttp.ClientSession() as http:
                async with http.post(self.url + path, json=body) as resp:
                    return resp.status, [chunk async for chunk in resp.content.iter_any()]

        return asyncio.run(go())

    def close(self):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def served():
    server = LiveServer()
    yield server
    server.close()


def events_of(reads: list[bytes]) -> list[tuple[str, dict]]:
    """(event name, data) of each named SSE event."""
    out = []
    for block in b"".join(reads).decode().split("\n\n"):
        if block.strip():
            name, data = block.split("\n", 1)
            out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def test_hidden_states_give_the_engines_own_logits(tiny):
    # the cache-free forward the embeddings use must be the engine's forward: its last row through lm_head is the
    # engine's logits for the same prompt (same weights, same ops; measured equal to the last bit on SmolLM2)
    engine = LLMEngine(EngineConfig(kv_cache_tokens=256), tiny)
    ids = [1, 5, 9, 13, 200, 7, 42]
    mine = final_hidden_states(engine.runner, ids)[-1] @ engine.runner.weights.lm_head
    theirs = engine.runner.forward([SeqChunk(token_ids=ids, start_pos=0, block_table=[0], need_logits=True)])[0]
    assert np.allclose(mine, theirs, atol=1e-4)


def test_embeddings_are_mean_pooled_unit_vectors_with_usage(served):
    texts = ["the cat sat on the mat", "a dog ran in the park", "the cat sat on the mat"]
    status, reads = served.post("/v1/embeddings", {"model": "smollm2", "input": texts})
    assert status == 200
    body = json.loads(b"".join(reads))
    vectors = np.array([d["embedding"] for d in body["data"]])
    assert [d["index"] for d in body["data"]] == [0, 1, 2] and vectors.shape == (3, SMOLLM2_HIDDEN)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)  # L2-normalized
    assert np.allclose(vectors[0], vectors[2]) and not np.allclose(vectors[0], vectors[1])  # same text, same vector
    tokens = sum(len(served.engine.tokenizer.encode(t, add_special=True)) for t in texts)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    parsed = parse_embeddings(reads, [0] * len(reads))
    assert (parsed.embedded_items, parsed.embedding_dims, parsed.usage_prompt_tokens) == (3, SMOLLM2_HIDDEN, tokens)
    assert parsed.token_times_ns == [] and parsed.served_model == "smollm2"
    # base64: the same float32 numbers, little-endian; the parser reads 576 numbers from its 3,072 characters
    status, reads = served.post("/v1/embeddings", {"input": texts[0], "encoding_format": "base64"})
    packed = json.loads(b"".join(reads))["data"][0]["embedding"]
    assert np.allclose(np.frombuffer(base64.b64decode(packed), "<f4"), vectors[0], atol=1e-6)
    assert parse_embeddings(reads, [0] * len(reads)).embedding_dims == SMOLLM2_HIDDEN


def test_responses_stream_has_the_specs_events_and_the_parser_reads_them(served):
    body = build_responses_body("smollm2", 5, prompt="Say hello.", ignore_eos=True)
    status, reads = served.post("/v1/responses", body)
    assert status == 200
    events = events_of(reads)
    kinds = [name for name, _ in events]
    assert all(name == data["type"] for name, data in events)  # the event line names the data's type
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    deltas = [data["delta"] for name, data in events if name == "response.output_text.delta"]
    # 4 opening events, a delta per token with text (the engine may hold a partial character back), 4 closing ones;
    # 5 tokens asked with ignore_eos end on the cap: response.incomplete, reason max_output_tokens
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    final = events[-1][1]["response"]
    assert final["incomplete_details"] == {"reason": "max_output_tokens"} and final["usage"]["output_tokens"] == 5
    parsed = parse_responses(reads, list(range(len(reads))))
    assert parsed.text == "".join(deltas) == events[-4][1]["text"]
    assert (parsed.usage_completion_tokens, parsed.finish_reason, parsed.saw_done) == (5, "length", True)
    assert parsed.counted_tokens == 5 and parsed.first_answer_chunk == 0
    assert parsed.usage_prompt_tokens == final["usage"]["input_tokens"] and "prefill_ms" in parsed.server_timings


def test_messages_stream_has_the_specs_events_and_the_parser_reads_them(served):
    body = build_messages_body(
        "smollm2", 4, messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    )
    assert body["system"] == "Be brief." and body["messages"] == [{"role": "user", "content": "Hi"}]
    status, reads = served.post("/v1/messages", {**body, "ignore_eos": True})
    assert status == 200
    events = events_of(reads)
    kinds = [name for name, _ in events]
    assert kinds[:3] == ["message_start", "content_block_start", "ping"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[3:-3]) == {"content_block_delta"}
    start, last_delta = events[0][1]["message"], events[-2][1]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    assert last_delta["delta"]["stop_reason"] == "max_tokens" and last_delta["usage"]["output_tokens"] == 4
    parsed = parse_messages(reads, list(range(len(reads))))
    texts = [data["delta"]["text"] for name, data in events if name == "content_block_delta"]
    assert parsed.text == "".join(texts) and parsed.counted_tokens == 4 and parsed.finish_reason == "length"
    assert parsed.usage_prompt_tokens == start["usage"]["input_tokens"] and parsed.saw_done


@pytest.mark.parametrize("api", [RESPONSES, ANTHROPIC_MESSAGES])
def test_the_runner_drives_each_streaming_api(served, api):
    # three requests of 4 tokens each with ignore_eos: each record ok, 4 tokens from the server's usage, TTFT to the
    # first answer token (no thinking), the prompt's length from the usage, the engine's timings kept
    specs = [RequestSpec(i, "Count to ten.", None, 5, 4, intended_offset_s=0.05 * i) for i in range(3)]
    target = Target(url=served.url, api=api, kind="native", model="smollm2", ignore_eos=True)
    out = run_blocking(lambda: Runner(target, specs))
    records = sorted(out.records, key=lambda r: r.index)
    assert [r.status for r in records] == ["ok"] * 3, [r.error_detail for r in records]
    for r in records:
        assert r.output_tokens == r.output_tokens_usage == 4 and r.finish_reason == "length"
        assert r.first_answer_token_s == r.token_times_s[0] and r.prompt_tokens > 5  # the chat template's tokens
        assert r.server_timings["predicted_n"] == 4


@pytest.mark.parametrize("api", [RESPONSES, ANTHROPIC_MESSAGES])
def test_bench_run_drives_each_streaming_api_against_a_launched_engine(tmp_path, api):
    # the whole path: bench starts the built-in engine (a tiny GGUF, loaded in milliseconds), sends 6 requests of
    # 8 tokens each with ignore_eos in the API's dialect, and summarizes them: 6 completed, 6 x 8 = 48 output tokens,
    # a TTFT for each (to its first text delta), every request's engine timings kept
    model = write_tiny_llama_gguf(tmp_path / "tiny.gguf", tokenizer="smollm2")
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        f'name: api\nbackend: {{kind: native, api: {api}, launch: {{args: ["--model", "{model}"], '
        "ready_timeout_s: 60}}\n"
        "workload: {kind: random, input_tokens: 16, output_tokens: 8, ignore_eos: true}\n"
        "load: {arrival: poisson, rate: 20, num_requests: 6, warmup_requests: 0}\n"
        "telemetry: {interval_ms: 200, gpu: false}\n"
    )
    res = bench("run", scenario, "--output", tmp_path / "out", "--allow-client-bound", timeout_s=180)
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["requests"]["completed"] == 6 and summary["output_tokens"] == 48
    records = [json.loads(line) for line in (tmp_path / "out" / "requests.jsonl").read_text().splitlines()]
    assert all(r["output_tokens_usage"] == 8 and r["server_timings"]["predicted_n"] == 8 for r in records)
    # a TPOT for each (8 tokens); it may be 0 where the tiny model's 8 deltas arrive in one read of the socket
    assert summary["ttft_ms"]["p50"] > 0 and summary["tpot_ms"]["p50"] is not None
    assert "items_per_s" not in summary["throughput"]  # a generating API counts tokens, not items


def test_the_runner_drives_embeddings_and_the_summary_has_no_ttft(served):
    # three one-input requests: each record ok with 1 item, no token times and no output tokens (nothing streams),
    # its prompt_tokens the server's usage; the summary has 3 E2E samples and no TTFT, ITL or TPOT at all
    specs = [RequestSpec(i, f"embed this sentence {i}", None, 5, 4, intended_offset_s=0.05 * i) for i in range(3)]
    target = Target(url=served.url, api=EMBEDDINGS, kind="native", model="smollm2", ignore_eos=True)
    records = sorted(run_blocking(lambda: Runner(target, specs)).records, key=lambda r: r.index)
    assert [r.status for r in records] == ["ok"] * 3, [r.error_detail for r in records]
    tokens = [len(served.engine.tokenizer.encode(s.prompt, add_special=True)) for s in specs]
    assert [(r.embedded_items, r.token_times_s, r.output_tokens) for r in records] == [(1, [], 0)] * 3
    assert [r.prompt_tokens for r in records] == tokens
    summary = summarize(records)
    assert summary.e2e_ms.p50 > 0 and summary.ttft_ms.p50 is None and summary.itl_ms.p50 is None
    assert summary.throughput.items_per_s == pytest.approx(summary.throughput.requests_per_s)  # one input each
    assert summary.output_tokens == 0 and summary.requests.completed == 3


def test_rerank_puts_a_copy_of_the_query_first_and_scores_by_the_embeddings_cosine(served):
    # a document that is the query has cosine 1 with it; the others are ordered by their cosine, computed here from
    # the engine's own /v1/embeddings vectors; top_n keeps the best 2; usage counts every text's tokens
    query = "The cat sat on the mat."
    documents = ["Stock prices fell sharply today.", query, "A kitten rested on the rug.", "Quantum fields vary."]
    status, reads = served.post("/v1/rerank", {"model": "smollm2", "query": query, "documents": documents, "top_n": 2})
    answer = json.loads(b"".join(reads))
    assert status == 200 and answer["model"] == "smollm2" and answer["id"].startswith("rerank-")
    _, embedded = served.post("/v1/embeddings", {"input": [query, *documents]})
    vectors = np.array([item["embedding"] for item in json.loads(b"".join(embedded))["data"]])
    cosines = vectors[1:] @ vectors[0]
    best = list(np.argsort(-cosines, kind="stable")[:2])
    assert [r["index"] for r in answer["results"]] == best and best[0] == 1
    assert answer["results"][0]["relevance_score"] == pytest.approx(1.0, abs=1e-5)
    assert [r["relevance_score"] for r in answer["results"]] == pytest.approx(list(cosines[best]), abs=1e-5)
    assert [r["document"]["text"] for r in answer["results"]] == [documents[i] for i in best]
    tokens = sum(len(served.engine.tokenizer.encode(t, add_special=True)) for t in [query, *documents])
    assert answer["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


def test_the_runner_drives_rerank_a_query_and_four_documents_cut_from_each_prompt(served):
    specs = [
        RequestSpec(i, f"which of these words is closest {i} " * 5, None, 30, 4, intended_offset_s=0.05 * i)
        for i in range(3)
    ]
    target = Target(url=served.url, api=RERANK, kind="native", model="smollm2", ignore_eos=True)
    records = sorted(run_blocking(lambda: Runner(target, specs)).records, key=lambda r: r.index)
    assert [r.status for r in records] == ["ok"] * 3, [r.error_detail for r in records]
    for spec, rec in zip(specs, records):
        query, documents = split_query_and_documents(spec.prompt)
        assert " ".join([query, *documents]).split() == spec.prompt.split()  # every word once, in order
        tokens = sum(len(served.engine.tokenizer.encode(t, add_special=True)) for t in [query, *documents])
        assert (rec.embedded_items, rec.token_times_s, rec.prompt_tokens) == (DOCUMENTS_PER_REQUEST, [], tokens)
    assert summarize(records).ttft_ms.p50 is None


def test_bench_run_drives_rerank_against_a_launched_engine(tmp_path):
    # the whole path for an API that streams nothing: 6 requests, each 4 documents scored, summarized with E2E only
    model = write_tiny_llama_gguf(tmp_path / "tiny.gguf", tokenizer="smollm2")
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        f'name: rerank\nbackend: {{kind: native, api: rerank, launch: {{args: ["--model", "{model}"], '
        "ready_timeout_s: 60}}\n"
        "workload: {kind: random, input_tokens: 40, output_tokens: 8}\n"
        "load: {arrival: poisson, rate: 20, num_requests: 6, warmup_requests: 0}\n"
        "telemetry: {interval_ms: 200, gpu: false}\n"
    )
    res = bench("run", scenario, "--output", tmp_path / "out", "--allow-client-bound", timeout_s=180)
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["requests"]["completed"] == 6 and summary["output_tokens"] == 0
    assert summary["e2e_ms"]["p50"] > 0 and summary["ttft_ms"]["p50"] is None
    # documents scored per second: 4 a request, over the same window as the requests
    throughput = summary["throughput"]
    assert throughput["items_per_s"] == pytest.approx(DOCUMENTS_PER_REQUEST * throughput["requests_per_s"])
    records = [json.loads(line) for line in (tmp_path / "out" / "requests.jsonl").read_text().splitlines()]
    assert [r["embedded_items"] for r in records] == [DOCUMENTS_PER_REQUEST] * 6


def test_the_rerank_parser_reads_older_vllm_usage_and_refuses_a_score_that_is_no_number():
    older = {"id": "r", "model": "m", "usage": {"total_tokens": 9}, "results": [{"index": 0, "relevance_score": 0.5}]}
    parsed = parse_rerank([json.dumps(older).encode()], [0])
    assert (parsed.embedded_items, parsed.usage_prompt_tokens, parsed.embedding_dims) == (1, 9, None)
    broken = {**older, "results": [{"index": 0, "relevance_score": "high"}]}
    with pytest.raises(StreamError, match=r"results\[0\].relevance_score is 'high'"):
        parse_rerank([json.dumps(broken).encode()], [0])
    with pytest.raises(StreamError, match="results is empty"):
        parse_rerank([json.dumps({**older, "results": []}).encode()], [0])


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/v1/rerank", {"documents": ["a"]}, "query"),
        ("/v1/rerank", {"query": "q", "documents": []}, "documents"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": -1}, "top_n"),
        ("/v1/embeddings", {"input": []}, "input"),
        ("/v1/embeddings", {"input": [[1, 2, 10**6]]}, "input"),
        ("/v1/embeddings", {"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ("/v1/embeddings", {"input": "x", "model": "gpt-4"}, "model"),
        ("/v1/responses", {"input": "x", "max_output_tokens": 0, "stream": True}, "max_output_tokens"),
        ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input"),
        ("/v1/responses", {"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ("/v1/responses", {}, "input"),
        ("/v1/messages", {"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "tool", "content": "x"}]}, "messages"),
        (
            "/v1/messages",
            {"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "stop_sequences": "."},
            "stop",
        ),
    ],
)
def test_a_bad_request_gets_a_400_naming_its_field(served, path, body, field):
    status, reads = served.post(path, body)
    answer = json.loads(b"".join(reads))
    assert status == 400
    if path == "/v1/messages":  # Anthropic's error shape: the message opens with the field
        assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
        assert answer["error"]["message"].startswith({"stop": "stop_sequences"}.get(field, field))
    else:
        assert answer["error"]["param"] == field and field in answer["error"]["message"]


def test_parsers_read_vllms_variants_and_refuse_what_is_broken():
    # vLLM's Messages stream ends with a `data: [DONE]` after message_stop and puts input_tokens in message_delta too
    vllm_stream = [
        b'event: message_start\ndata: {"type":"message_start","message":{"model":"m","usage":{"input_tokens":7}}}\n\n',
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"thinking_delta","thinking":"hm"}}\n\n',
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":1,'
        b'"delta":{"type":"text_delta","text":"Hi"}}\n\n',
        b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
        b'"usage":{"input_tokens":7,"output_tokens":2}}\n\n',
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
        b"data: [DONE]\n\n",
    ]
    parsed = parse_messages(vllm_stream, list(range(6)))
    # one thinking chunk then one answer chunk: reasoning_tokens 1, the answer begins at chunk 1
    assert (parsed.text, parsed.reasoning_tokens, parsed.first_answer_chunk) == ("Hi", 1, 1)
    assert (parsed.finish_reason, parsed.usage_prompt_tokens, parsed.usage_completion_tokens) == ("stop", 7, 2)
    assert parsed.token_times_ns == [1, 2] and parsed.malformed is None
    with pytest.raises(StreamError, match="server_error_event"):
        parse_messages([b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error"}}\n\n'], [0])
    with pytest.raises(StreamError, match="content_block_delta.delta.text"):
        parse_messages([b'data: {"type":"content_block_delta","delta":{"type":"text_delta","text":5}}\n\n'], [0])
    with pytest.raises(StreamError, match="server_error_event"):
        parse_responses([b'data: {"type":"response.failed","response":{"error":{"code":"x"}}}\n\n'], [0])
    late = parse_responses(
        [
            b'data: {"type":"response.output_text.delta","delta":"a"}\n\n',
            b'data: {"type":"response.completed","response":{"usage":{"input_tokens":3,"output_tokens":1}}}\n\n',
            b'data: {"type":"response.output_text.delta","delta":"b"}\n\n',
        ],
        [0, 1, 2],
    )
    assert late.text == "a" and late.finish_reason == "stop" and late.malformed[0] == "events_after_done"
    with pytest.raises(StreamError, match="data"):
        parse_embeddings([b'{"data": {}, "usage": {}}'], [0])


def scenario(**backend) -> dict:
    return {
        "name": "t",
        "backend": {"kind": "native", "url": "http://127.0.0.1:9", **backend},
        "workload": {"kind": "random", "input_tokens": 8, "output_tokens": 4},
        "load": {"arrival": "poisson", "rate": 1.0, "num_requests": 4},
    }


def test_scenario_takes_the_new_apis_and_refuses_what_embeddings_cannot_carry():
    for api in (EMBEDDINGS, RESPONSES, ANTHROPIC_MESSAGES):
        assert Scenario.model_validate(scenario(api=api)).backend.api == api
    # nothing is sampled: workload.sampling's fields (greedy by default) stay out of an embeddings request
    native = load_backend("native")
    body = native.request_body(EMBEDDINGS, "smollm2", 4, prompt="x", ignore_eos=True)
    native.add_sampling(body, EMBEDDINGS, {"temperature": 0.0, "seed": 1})
    assert body == {"model": "smollm2", "input": "x", "encoding_format": "float"}
    multi = {"kind": "multi_turn", "turns": 3, "input_tokens": 8, "output_tokens": 4}
    with pytest.raises(ScenarioError, match="backend.api: embeddings answers carry no text"):
        Scenario.model_validate({**scenario(api=EMBEDDINGS), "workload": multi})
    # llama-server's request builder knows completions and chat only: a clear refusal, not a malformed request
    with pytest.raises(ValueError, match="backend.api: llamacpp supports"):
        load_backend("llamacpp").endpoint_path(RESPONSES)
