"""The OpenAI-compatible server on 127.0.0.1: response shapes, errors, 503, disconnects, metrics."""

import asyncio
import json

import aiohttp
import pytest

from native_engine.llm_engine import EngineConfig, LLMEngine
from native_engine.scheduler import SchedulerConfig
from native_engine.server import start_server
from native_engine.tiny_gguf import write_tiny_llama_gguf

HOT = 8.0  # the tiny model's logits are very peaked; sample hot to get varied tokens


class Served:
    def __init__(self, engine, runner, port):
        self.engine, self.runner, self.url = engine, runner, f"http://127.0.0.1:{port}"
        self.http = aiohttp.ClientSession()

    async def post(self, path, payload=None, data=None):
        async with self.http.post(self.url + path, json=payload, data=data) as resp:
            return resp.status, await resp.json(), resp.headers

    async def sse(self, path, payload):
        async with self.http.post(self.url + path, json=payload) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
            events = [line[len("data: ") :] for line in (await resp.text()).split("\n\n") if line]
        assert events[-1] == "[DONE]"
        return [json.loads(e) for e in events[:-1]]

    async def metric(self, name):
        async with self.http.get(self.url + "/metrics") as resp:
            text = await resp.text()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


@pytest.fixture
async def serve(tiny):
    started = []

    async def start(kv_cache_tokens=4096, **scheduler):
        engine = LLMEngine(EngineConfig(kv_cache_tokens=kv_cache_tokens, scheduler=SchedulerConfig(**scheduler)), tiny)
        runner, port = await start_server(engine, "127.0.0.1", 0)
        started.append(Served(engine, runner, port))
        return started[-1]

    yield start
    for s in started:
        await s.http.close()
        await s.runner.cleanup()


async def test_completion_stream_has_vllm_chunk_shapes_and_usage(serve):
    s = await serve()
    chunks = await s.sse(
        "/v1/completions",
        {
            "model": "smollm2",
            "prompt": "hello",
            "max_tokens": 5,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        },
    )
    body, usage = chunks[:-1], chunks[-1]
    assert all(c["object"] == "text_completion" and c["id"].startswith("cmpl-") for c in chunks)
    assert set(body[0]["choices"][0]) == {
        "index",
        "text",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "prompt_token_ids",
        "token_ids",
    }
    assert [c["choices"][0]["finish_reason"] for c in body] == [None] * (len(body) - 1) + ["length"]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5
    prompt_tokens = len(s.engine.tokenizer.encode("hello"))
    assert usage["usage"]["prompt_tokens"] == prompt_tokens and usage["usage"]["total_tokens"] == prompt_tokens + 5


async def test_chat_stream_starts_with_role_and_matches_non_stream_text(serve):
    s = await serve()
    request = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "temperature": HOT,
        "seed": 1,
        "ignore_eos": True,
    }
    chunks = await s.sse("/v1/chat/completions", {**request, "stream": True})
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "usage" not in chunks[-1] and chunks[-1]["choices"][0]["finish_reason"] == "length"
    streamed = "".join(c["choices"][0]["delta"]["content"] for c in chunks)
    status, body, _ = await s.post("/v1/chat/completions", request)
    assert status == 200 and body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["choices"][0]["message"]["content"] == streamed
    assert body["usage"]["completion_tokens"] == 8


@pytest.mark.parametrize(
    "payload,param",
    [
        ({"max_tokens": 4}, "prompt"),
        ({"prompt": 12}, "prompt"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "max_tokens": 5000}, "max_tokens"),
        ({"prompt": "x", "max_tokens": "many"}, "max_tokens"),
        ({"prompt": "x", "model": "gpt-4"}, "model"),
        ({"prompt": "x", "temperature": -1}, "temperature"),
        ({"prompt": "x", "top_p": 2}, "top_p"),
        ({"prompt": "x", "stream": "yes"}, "stream"),
        ({"prompt": "x" * 3000}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": "x", "seed": -3}, "seed"),
        ({"prompt": "x", "stop": ["ok", 3]}, "stop"),
    ],
)
async def test_bad_completion_requests_get_400_naming_the_field(serve, payload, param):
    s = await serve(kv_cache_tokens=2048)
    status, body, _ = await s.post("/v1/completions", payload)
    assert status == 400
    assert body["error"]["param"] == param and param in body["error"]["message"]
    assert body["error"]["code"] == 400 and body["error"]["type"] == "BadRequestError"
    status, body, _ = await s.post("/v1/completions", {"prompt": "still serving", "max_tokens": 2})
    assert status == 200 and body["usage"]["completion_tokens"] >= 1


async def test_malformed_json_and_bad_messages(serve):
    s = await serve()
    async with s.http.post(
        s.url + "/v1/completions", data=b"{not json", headers={"Content-Type": "application/json"}
    ) as resp:
        assert resp.status == 400 and (await resp.json())["error"]["param"] == "body"
    status, body, _ = await s.post("/v1/chat/completions", {"messages": [{"role": "user"}]})
    assert status == 400 and body["error"]["param"] == "messages"


async def test_full_waiting_queue_gets_503_with_retry_after(serve):
    s = await serve(max_num_seqs=1, max_waiting=1)
    slow = {"prompt": "busy", "max_tokens": 1500, "ignore_eos": True}
    results = await asyncio.gather(*[s.post("/v1/completions", slow) for _ in range(4)])
    rejected = [r for r in results if r[0] == 503]
    assert rejected and all(r[2]["Retry-After"] and r[1]["error"]["code"] == 503 for r in rejected)
    assert any(r[0] == 200 for r in results)


async def test_client_disconnect_mid_stream_frees_its_blocks(serve):
    s = await serve()
    request = {"prompt": "a long story " * 20, "max_tokens": 1800, "ignore_eos": True, "stream": True}
    async with aiohttp.ClientSession() as other:
        async with other.post(s.url + "/v1/completions", json=request) as resp:
            await resp.content.readline()
            assert s.engine.block_manager.usage > 0
    # The session is closed: the server notices, aborts the request and frees the blocks.
    for _ in range(300):
        if await s.metric("native:kv_cache_usage_perc") == 0 and await s.metric("native:num_requests_running") == 0:
            break
        await asyncio.sleep(0.02)
    bm = s.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    assert await s.metric("native:kv_cache_usage_perc") == 0
    assert await s.metric("native:generation_tokens_total") < 1800  # aborted, not run to the end


async def test_small_kv_cache_preempts_yet_outputs_match(serve):
    roomy, small = await serve(), await serve(kv_cache_tokens=160)
    requests = [
        {"prompt": f"request {i} wants tokens", "max_tokens": 40, "temperature": HOT, "seed": i, "ignore_eos": True}
        for i in range(6)
    ]

    async def texts(s):
        results = await asyncio.gather(*[s.post("/v1/completions", r) for r in requests])
        assert all(status == 200 for status, _, _ in results)
        return [body["choices"][0]["text"] for _, body, _ in results]

    assert await texts(small) == await texts(roomy)
    assert await small.metric("native:num_preemptions_total") > 0
    assert await roomy.metric("native:num_preemptions_total") == 0


async def test_prefix_cache_counters_on_metrics(serve):
    s = await serve()
    prompt = "shared system prompt " * 8
    for _ in range(2):
        status, _, _ = await s.post("/v1/completions", {"prompt": prompt, "max_tokens": 2})
        assert status == 200
    queries, hits = (
        await s.metric("native:prefix_cache_queries_total"),
        await s.metric("native:prefix_cache_hits_total"),
    )
    n = len(s.engine.tokenizer.encode(prompt))
    assert queries == 2 * n and hits == 16 * ((n - 1) // 16)
    assert await s.metric("native:prompt_tokens_total") == 2 * n
    assert await s.metric("native:generation_tokens_total") == 4
    assert await s.metric("native:time_to_first_token_seconds_count") == 2


async def test_models_health_tokenize_detokenize(serve):
    s = await serve()
    async with s.http.get(s.url + "/v1/models") as resp:
        models = await resp.json()
    assert models["data"][0]["id"] == "smollm2" and models["data"][0]["max_model_len"] == 2048
    async with s.http.get(s.url + "/health") as resp:
        assert resp.status == 200
    status, tok, _ = await s.post("/tokenize", {"model": "smollm2", "prompt": "the cat"})
    assert status == 200 and tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 2048
    status, detok, _ = await s.post("/detokenize", {"model": "smollm2", "tokens": tok["tokens"]})
    assert status == 200 and detok["prompt"] == "the cat"
    status, chat_tok, _ = await s.post("/tokenize", {"messages": [{"role": "user", "content": "the cat"}]})
    assert status == 200 and chat_tok["count"] > tok["count"]
    status, body, _ = await s.post("/detokenize", {"tokens": [-1]})
    assert status == 400 and body["error"]["param"] == "tokens"


async def test_python_m_native_engine_serve_starts_and_answers(tmp_path):
    import sys

    from harness.engine.launcher import free_port

    path = write_tiny_llama_gguf(tmp_path / "tiny.gguf", seed=1)
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "native_engine",
        "serve",
        "--model",
        str(path),
        "--port",
        str(port),
        "--kv-cache-tokens",
        "1024",
        "--served-model-name",
        "tiny",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=60)
        assert f"http://127.0.0.1:{port}" in line.decode()
        async with aiohttp.ClientSession() as http:
            async with http.post(
                f"http://127.0.0.1:{port}/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 3}
            ) as resp:
                assert resp.status == 200 and (await resp.json())["usage"]["completion_tokens"] == 3
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), timeout=30) == 0


def test_serve_rejects_bad_options_naming_them(tmp_path):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "native_engine", "serve", "--model", str(tmp_path / "nope.gguf")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "nope.gguf" in result.stderr and "model" in result.stderr


@pytest.mark.slow
async def test_real_smollm2_answers_through_the_server():
    engine = LLMEngine(EngineConfig(kv_cache_tokens=2048))
    runner, port = await start_server(engine, "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as http:
            request = {
                "model": "smollm2",
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": 12,
                "temperature": 0,
            }
            async with http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=request) as resp:
                body = await resp.json()
        assert resp.status == 200 and "Paris" in body["choices"][0]["message"]["content"]
        assert body["choices"][0]["finish_reason"] in ("stop", "length")
    finally:
        await runner.cleanup()


async def test_metrics_page_has_vllm_names_under_native_prefix(serve):
    s = await serve()
    await s.post("/v1/completions", {"prompt": "count me", "max_tokens": 3})
    async with s.http.get(s.url + "/metrics") as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    for name in (
        "num_requests_running",
        "num_requests_waiting",
        "kv_cache_usage_perc",
        "prefix_cache_queries_total",
        "prefix_cache_hits_total",
        "num_preemptions_total",
        "prompt_tokens_total",
        "generation_tokens_total",
        "time_to_first_token_seconds_bucket",
        "inter_token_latency_seconds_count",
        "e2e_request_latency_seconds_sum",
        "request_queue_time_seconds_count",
        "weight_bytes_read_total",
        "kv_bytes_read_total",
    ):
        assert f"native:{name}" in names, name
    assert 'model_name="smollm2"' in text
    assert await s.metric("native:weight_bytes_read_total") >= 3 * s.engine.runner.weight_bytes * 0.9
    assert await s.metric("native:kv_bytes_read_total") > 0
    assert await s.metric("native:e2e_request_latency_seconds_count") == 1


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("model", ["smollm2", 'odd \x00text\x00 "name"'])
def test_token_events_are_the_bytes_of_the_whole_chunk(chat, model):
    """A token's event is built from a per-request template; it must equal sse() of the chunk dict for any
    text (quotes, escapes, non-ASCII, a marker-like string), and a head that holds the marker falls back."""
    from native_engine.request_output import RequestOutput
    from native_engine.server import TokenEvents, sse, stream_choice

    head = {
        "id": "cmpl-1",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": 7,
        "model": model,
    }
    events = TokenEvents(head, chat)
    for text in ["hi", ' "quoted" \\ back', "line\nbreak\ttab", "é漢字 🙂", "\x00text\x00", "\u2028"]:
        out = RequestOutput(
            request_id="cmpl-1",
            new_token_ids=[5],
            new_text=text,
            finished=False,
            finish_reason=None,
            stop_reason=None,
            num_prompt_tokens=3,
            num_output_tokens=1,
            num_cached_tokens=0,
        )
        assert events.token_event(out) == sse({**head, "choices": [stream_choice(chat, text, out)]})
    done = RequestOutput(
        request_id="cmpl-1",
        new_token_ids=[5],
        new_text="end",
        finished=True,
        finish_reason="stop",
        stop_reason="</s>",
        num_prompt_tokens=3,
        num_output_tokens=2,
        num_cached_tokens=0,
    )
    assert events.token_event(done) == sse({**head, "choices": [stream_choice(chat, "end", done)]})
