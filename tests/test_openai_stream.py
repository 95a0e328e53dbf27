"""The OpenAI SSE dialect against real captured streams and hand-made edge cases."""

import json
from pathlib import Path

import pytest

from backends.base import Backend
from backends.openai import StreamError, build_request_body, parse_sse

# Streams recorded from the real servers (vLLM 0.32 CPU, llama.cpp's llama-server, llama-cpp-python's server)
CAPTURES = Path(__file__).parent / "fixtures" / "engines"


def _capture(name: str) -> bytes:
    return (CAPTURES / name).read_bytes()  # a missing capture fails the test: it is part of the repository


def _reads_of(raw: bytes, size: int) -> tuple[list[bytes], list[int]]:
    """Split a stream into fixed-size reads, as a network would, timed 1..n."""
    reads = [raw[i : i + size] for i in range(0, len(raw), size)]
    return reads, list(range(1, len(reads) + 1))


def _expected_tokens(raw: bytes) -> tuple[int, str]:
    count, text = 0, []
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {"):
            obj = json.loads(line[6:])
            for c in obj["choices"]:
                piece = c["delta"].get("content") if "delta" in c else c.get("text")
                if piece:
                    count += 1
                    text.append(piece)
    return count, "".join(text)


@pytest.mark.parametrize(
    "name,usage",
    [
        ("vllm_chat.sse", 24),
        ("vllm_completions_no_usage.sse", None),
        ("vllm_completions.sse", 16),
        ("llamacpp_chat.sse", 24),
        ("llamacpp_completions.sse", 16),
        ("llamacpp_python_chat.sse", None),  # llama-cpp-python: no usage in streams
        ("llamacpp_python_completions.sse", None),
    ],
)
@pytest.mark.parametrize("read_size", [1, 7, 100_000])
def test_real_captures_parse_whatever_the_read_boundaries(name, usage, read_size):
    raw = _capture(name)
    want_count, want_text = _expected_tokens(raw)
    parsed = parse_sse(*_reads_of(raw, read_size))
    assert parsed.saw_done
    assert parsed.counted_tokens == want_count
    assert parsed.text == want_text
    assert parsed.usage_completion_tokens == usage
    assert parsed.finish_reason == "length"
    if usage is not None:
        assert parsed.counted_tokens == usage


def test_role_only_first_delta_and_empty_final_chunk_are_not_tokens():
    raw = _capture("llamacpp_python_chat.sse")
    parsed = parse_sse([raw], [5])
    events = [e for e in raw.split(b"\n\n") if e.startswith(b"data: {")]
    # first event is role-only, last data event is the empty delta with finish_reason
    assert len(parsed.token_times_ns) == len(events) - 2


def test_event_is_timed_by_the_read_that_completes_it():
    ev = b'data: {"choices":[{"text":"a","index":0}]}\n\n'
    reads = [ev[:10], ev[10:], ev + ev[:-1], b"\n", b"data: [DONE]\n\n"]
    parsed = parse_sse(reads, [100, 200, 300, 400, 500])
    assert parsed.token_times_ns == [200, 300, 400]
    assert parsed.saw_done


def test_running_usage_gives_tokens_per_chunk():
    events = [
        {"choices": [{"text": "ab", "index": 0}], "usage": {"completion_tokens": 2, "prompt_tokens": 3}},
        {"choices": [{"text": "cde", "index": 0}], "usage": {"completion_tokens": 5, "prompt_tokens": 3}},
        {"choices": [], "usage": {"completion_tokens": 5, "prompt_tokens": 3}},
    ]
    raw = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    parsed = parse_sse([raw], [1])
    assert parsed.tokens_per_chunk == [2, 3]
    assert parsed.counted_tokens == 5 == parsed.usage_completion_tokens


def test_crlf_line_endings_and_comments():
    raw = b': keep-alive\r\n\r\ndata: {"choices":[{"delta":{"content":"x"}}]}\r\n\r\ndata: [DONE]\r\n\r\n'
    parsed = parse_sse([raw], [9])
    assert parsed.text == "x" and parsed.saw_done


@pytest.mark.parametrize(
    "raw,reason",
    [
        (b"data: {not json}\n\n", "malformed_json"),
        (b"this is not sse\n\n", "malformed_sse"),
        (b'data: {"error": {"message": "overloaded"}}\n\n', "server_error_event"),
        (b'data: {"choices":[{"text":"a"}]}\n\ndata: {"choi', "stream_cut"),
    ],
)
def test_bad_streams_raise_with_a_reason(raw, reason):
    with pytest.raises(StreamError) as err:
        parse_sse([raw], [1])
    assert err.value.reason == reason


def test_request_bodies():
    chat = build_request_body("chat", "m", 8, prompt="hi", ignore_eos=True)
    assert chat["messages"] == [{"role": "user", "content": "hi"}]
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    assert chat["ignore_eos"] is True and chat["min_tokens"] == 8 and chat["max_tokens"] == 8
    comp = build_request_body(
        "completions", "m", 4, messages=[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    )
    assert comp["prompt"] == "a\nb" and "ignore_eos" not in comp
    assert Backend().endpoint_path("chat") == "/v1/chat/completions"
    with pytest.raises(ValueError, match="backend.api"):
        Backend().endpoint_path("generate")
