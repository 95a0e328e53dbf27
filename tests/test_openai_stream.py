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


COMPLETION = {"id": "c", "model": "smollm2", "choices": [{"index": 0, "text": " tok", "finish_reason": None}]}
CHAT_CHUNK = {"id": "c", "model": "smollm2", "choices": [{"index": 0, "delta": {"content": " tok"}}]}


def _sse(*events, done: bool = True) -> bytes:
    raw = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return raw + b"data: [DONE]\n\n" * done


def _with(event: dict, path: str, value) -> dict:
    """`event` with the field at `path` (dots; [0] a list index) set to `value`."""
    event = json.loads(json.dumps(event))
    *parents, last = path.replace("[0]", ".0").split(".")
    node = event
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    node[int(last) if last.isdigit() else last] = value
    return event


@pytest.mark.faults
@pytest.mark.parametrize(
    "event, path, value, said",
    [
        (COMPLETION, "choices[0].text", 5, "choices[0].text is 5 (a number), not a string"),
        (
            COMPLETION,
            "choices[0].finish_reason",
            {"type": "length"},
            'choices[0].finish_reason is {"type": "length"} (an object), not a string',
        ),
        (COMPLETION, "choices[0].index", "0", 'choices[0].index is "0" (a string), not a whole number'),
        (COMPLETION, "choices[0].index", True, "choices[0].index is true (a boolean), not a whole number"),
        (CHAT_CHUNK, "choices[0].delta.content", [], "choices[0].delta.content is [] (a list), not a string"),
        (CHAT_CHUNK, "choices[0].delta.reasoning_content", 3, "choices[0].delta.reasoning_content is 3 (a number)"),
        (CHAT_CHUNK, "choices[0].delta.reasoning", {"a": 1}, 'choices[0].delta.reasoning is {"a": 1} (an object)'),
        (COMPLETION, "choices[0]", None, "choices[0] is null"),
        (COMPLETION, "usage", [16], "usage is [16] (a list), not an object"),
        (COMPLETION, "model", 7, "model is 7 (a number), not a string"),
        (COMPLETION, "timings", [1.5], "timings is [1.5] (a list), not an object"),
        (COMPLETION, "timings", {"prompt_ms": "fast"}, 'timings.prompt_ms is "fast" (a string), not a number'),
    ],
)
def test_a_field_of_the_wrong_type_is_the_servers_malformed_event_named(event, path, value, said):
    # each was once a TypeError or AttributeError (recorded as the client's own error), or passed unseen
    with pytest.raises(StreamError) as err:
        parse_sse([_sse(_with(event, path, value))], [1])
    assert err.value.reason == "malformed_event"
    assert err.value.detail.startswith(said) and "the server's stream is not in the OpenAI format" in err.value.detail


@pytest.mark.faults
@pytest.mark.parametrize("read_size", [7, 100_000])
def test_events_after_done_are_neither_counted_nor_timed_and_flag_the_stream(read_size):
    raw = _capture("vllm_completions.sse")
    late = _sse(COMPLETION, COMPLETION, done=False)
    parsed = parse_sse(*_reads_of(raw + b": keep-alive\n\n" + late, read_size))
    clean = parse_sse(*_reads_of(raw, read_size))
    assert parsed.token_times_ns == clean.token_times_ns and parsed.text == clean.text  # the answer up to [DONE]
    reason, detail = parsed.malformed
    assert reason == "events_after_done"
    assert detail.startswith('2 events after [DONE], the first b\'data: {"id": "c"')
    assert "an OpenAI client stops reading at [DONE]" in detail
    assert clean.malformed is None and parse_sse([raw + b": bye\n\n"], [1]).malformed is None  # comments are no events
    # a second [DONE] is an event after the first; so is an event cut off after it (not a stream_cut)
    assert parse_sse([raw + b"data: [DONE]\n\n"], [1]).malformed[1].startswith("1 event after [DONE]")
    assert parse_sse([raw + b'data: {"choi'], [1]).malformed[0] == "events_after_done"


@pytest.mark.faults
def test_the_served_model_is_named_and_a_switch_mid_stream_flags_it():
    parsed = parse_sse([_capture("llamacpp_chat.sse")], [1])
    assert parsed.served_model == "smollm2" and parsed.malformed is None
    switched = parse_sse([_sse(COMPLETION, COMPLETION, _with(COMPLETION, "model", "llama-70b"))], [1])
    assert switched.served_model == "smollm2" and switched.counted_tokens == 3
    assert switched.malformed == (
        "model_switch",
        "event 3 names model 'llama-70b', the events before it 'smollm2': the server switched model mid-answer",
    )
    assert parse_sse([_sse(_with(COMPLETION, "model", None), COMPLETION)], [1]).malformed is None  # unnamed: no switch


@pytest.mark.parametrize("name", ["native_spec_completions.sse", "native_spec_chat.sse"])
@pytest.mark.parametrize("read_size", [1, 7, 100_000])
def test_multi_token_chunks_take_the_servers_count_spread_by_their_text(name, read_size):
    # recorded from the built-in engine with --speculative ngram: 13 token events carry 24 tokens, each event of two
    # tokens (" values values", "\n\n") the accepted draft streamed with its verifying token
    raw = _capture(name)
    parsed = parse_sse(*_reads_of(raw, read_size))
    assert len(parsed.token_times_ns) == 13 and parsed.usage_completion_tokens == 24
    assert parsed.tokens_per_chunk == [1, 1] + [2] * 11  # once [1] * 13: 11 tokens "missing", a mismatch
    assert parsed.counted_tokens == 24


def test_multi_token_chunks_are_spread_where_the_text_is_and_an_implausible_count_is_not():
    texts = ["a", "bcd", "e", "fg"]  # 7 tokens of a byte each: the longer chunks carried several
    events = [_with(COMPLETION, "choices[0].text", t) for t in texts]
    usage = {"id": "c", "model": "smollm2", "choices": [], "usage": {"completion_tokens": 7, "prompt_tokens": 3}}
    assert parse_sse([_sse(*events, usage)], [1]).tokens_per_chunk == [1, 3, 1, 2]
    usage["usage"]["completion_tokens"] = 5  # one extra token: the chunk longest past its share holds it
    assert parse_sse([_sse(*events, usage)], [1]).tokens_per_chunk == [1, 2, 1, 1]
    even = [_with(COMPLETION, "choices[0].text", t) for t in "abcd"]  # on a tie the last (an EOS comes last)
    assert parse_sse([_sse(*even, usage)], [1]).tokens_per_chunk == [1, 1, 1, 2]
    # more extra tokens than bytes of text: no split explains them, the chunks stay as counted (a mismatch)
    usage["usage"]["completion_tokens"] = 12
    assert parse_sse([_sse(*events, usage)], [1]).tokens_per_chunk == [1, 1, 1, 1]
    usage["usage"]["completion_tokens"] = 3  # fewer than the chunks: the same
    assert parse_sse([_sse(*events, usage)], [1]).tokens_per_chunk == [1, 1, 1, 1]
