"""A server whose stream is broken mid-way or carries values that are not what they claim: what reaches the record.

The server replays vLLM's recorded completions stream (tests/fixtures/engines/vllm_completions.sse, 16 tokens and a
final usage) on 127.0.0.1, broken as the prompt asks: cut after some tokens, stalled after the first, a usage count
that is not a count, `choices` that are not objects. Both client paths (kernel stamps, the event loop's) are run.
"""

import asyncio
import json
import math
from pathlib import Path

import pytest
from aiohttp import web

from harness.client.runner import Runner, Target
from harness.metrics.latencies import summarize
from harness.scenario.workload import RequestSpec

pytestmark = pytest.mark.faults
EVENTS = [
    e + b"\n\n"
    for e in (Path(__file__).parent / "fixtures" / "engines" / "vllm_completions.sse").read_bytes().split(b"\n\n")
    if e.strip()
]
TOKEN_EVENTS = [e for e in EVENTS if b'"text":"' in e and b'"choices":[]' not in e]
PLANNED_PROMPT_TOKENS = 7


def broken(fault: str) -> list[bytes]:
    """The recorded events with one fault; [] means: the stream stops there (see serve)."""
    events = list(EVENTS)
    if fault == "prompt_tokens_-1":
        events[-2] = events[-2].replace(b'"prompt_tokens":5', b'"prompt_tokens":-1')
    elif fault == "completion_tokens_NaN":
        events[-2] = events[-2].replace(b'"completion_tokens":16', b'"completion_tokens":NaN')
    elif fault == "running_usage_1e12":  # vLLM's continuous_usage_stats: each token chunk carries the count so far
        events = [
            e.replace(
                b"]}\n\n",
                b'],"usage":{"prompt_tokens":5,"completion_tokens":%d}}\n\n' % (n + 1 if n != 1 else 1_000_000_000_006),
            )
            for n, e in enumerate(TOKEN_EVENTS)
        ]
        events += EVENTS[len(TOKEN_EVENTS) :]
    elif fault == "choices_1":
        events[1] = events[1][: events[1].index(b'"choices":[')] + b'"choices":[1]}\n\n'
    return events


async def serve(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    fault = body["prompt"]
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    if fault.startswith(("cut_after_", "stall_after_")):
        for event in EVENTS[: int(fault.rsplit("_", 1)[1])]:
            await resp.write(event)
        if fault.startswith("stall"):
            await asyncio.sleep(3600)
        request.transport.close()  # no terminating chunk: the stream is cut mid-way
        return resp
    for event in broken(fault):
        await resp.write(event)
    await resp.write_eof()
    return resp


@pytest.fixture
async def url():
    app = web.Application()
    app.router.add_post("/v1/completions", serve)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    await runner.cleanup()


async def record_of(url: str, fault: str, stamps: str, **target):
    spec = RequestSpec(
        index=0,
        intended_offset_s=0.0,
        prompt=fault,
        messages=None,
        prompt_tokens=PLANNED_PROMPT_TOKENS,
        output_tokens=16,
    )
    outcome = await Runner(Target(url=url, model="smollm2", stamps=stamps, **target), [spec]).run()
    (rec,) = outcome.records
    strict = json.loads(rec.to_json(), parse_constant=lambda name: pytest.fail(f"{name} in the record"))
    return rec, strict


@pytest.mark.parametrize("stamps", ["kernel", "loop"])
@pytest.mark.parametrize("fault, reason, tokens", [("cut_after_5", "stream_cut", 5), ("stall_after_1", "timeout", 1)])
async def test_a_failed_stream_keeps_the_tokens_and_times_that_arrived(url, stamps, fault, reason, tokens):
    rec, _ = await record_of(url, fault, stamps, request_timeout_s=1.0)
    assert rec.error_reason == reason and rec.partial
    assert rec.output_tokens == rec.output_tokens_counted == tokens and len(rec.token_times_s) == tokens
    assert rec.tokens_per_chunk == [1] * tokens and rec.stamp_source == stamps
    assert 0 < rec.token_times_s[0] <= rec.token_times_s[-1] <= rec.end_s
    summary = summarize([rec])  # a failed request's times enter no latency figure; its tokens are said apart
    assert summary.partial.model_dump() == {"requests": 1, "output_tokens": tokens}
    assert summary.output_tokens == 0 and summary.ttft_ms.p50 is None and summary.itl_ms.p50 is None


@pytest.mark.parametrize("stamps", ["kernel", "loop"])
@pytest.mark.parametrize(
    "fault, said",
    [
        ("prompt_tokens_-1", "usage.prompt_tokens: -1 from the server is not valid"),
        ("completion_tokens_NaN", "usage.completion_tokens: nan from the server is not valid"),
        ("running_usage_1e12", "tokens counted from running usage: 1000000000005 from the server is not valid"),
    ],
)
async def test_a_servers_count_that_is_not_one_is_null_and_the_local_count_stays(url, stamps, fault, said):
    rec, strict = await record_of(url, fault, stamps)
    assert rec.error_reason == "bad_usage" and rec.error_detail.startswith(said), rec.error_detail
    assert "(stored as null; the local count is kept)" in rec.error_detail
    assert rec.prompt_tokens == (5 if fault != "prompt_tokens_-1" else PLANNED_PROMPT_TOKENS)
    assert rec.output_tokens_counted == 16 and rec.tokens_per_chunk == [1] * 16
    assert strict["output_tokens_usage"] in ((None,) if fault == "completion_tokens_NaN" else (16, None))
    assert all(math.isfinite(v) for v in strict["tokens_per_chunk"])


@pytest.mark.parametrize("stamps", ["kernel", "loop"])
async def test_choices_that_are_not_objects_are_the_servers_fault_named_by_field(url, stamps):
    rec, _ = await record_of(url, "choices_1", stamps)
    assert rec.error_reason == "malformed_event", rec.error_detail
    said = "choices[0] is 1 (a number), not an object: the server's stream is not in the OpenAI format"
    assert rec.error_detail == said
