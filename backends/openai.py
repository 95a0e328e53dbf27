"""The OpenAI-compatible streaming dialect: request bodies and SSE stream parsing.

The runner keeps the raw bytes of each network read with its arrival time and hands
them here only after the stream has ended, so parsing never delays a timestamp.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

COMPLETIONS = "completions"
CHAT = "chat"


class StreamError(Exception):
    """A stream that cannot be read as OpenAI SSE; `reason` is the failure category."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def build_request_body(
    api: str,
    model: str,
    max_tokens: int,
    prompt: str | None = None,
    messages: list[dict] | None = None,
    ignore_eos: bool = False,
) -> dict:
    """One streaming request; usage is asked for so token counts come from the server."""
    body: dict = {
        "model": model,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if api == CHAT:
        if messages is None:
            messages = [{"role": "user", "content": prompt or ""}]
        body["messages"] = messages
    elif api == COMPLETIONS:
        if prompt is None:
            prompt = "\n".join(str(m.get("content", "")) for m in messages or [])
        body["prompt"] = prompt
    else:
        raise ValueError(f"backend.api must be one of {sorted((CHAT, COMPLETIONS))}, got {api!r}")
    if ignore_eos:
        # vLLM and llama-server honour ignore_eos; min_tokens makes engines that
        # only know min_tokens (vLLM's sampling params) produce the full length too.
        body["ignore_eos"] = True
        body["min_tokens"] = max_tokens
    return body


@dataclass
class ParsedStream:
    token_times_ns: list[int] = field(default_factory=list)  # one per token-bearing chunk
    tokens_per_chunk: list[int] = field(default_factory=list)  # same length as token_times_ns
    text: str = ""
    usage_completion_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    finish_reason: str | None = None
    saw_done: bool = False
    server_timings: dict = field(default_factory=dict)  # the engine's own timings (llama.cpp, Ollama)
    # a reasoning model's thinking, streamed apart from the answer (vLLM, SGLang, Ollama): its chunks are tokens
    # in token_times_ns too; these say how many of the tokens were thinking and which chunk began the answer
    reasoning_tokens: int = 0
    first_answer_chunk: int | None = None  # an index into token_times_ns; None with reasoning tokens: no answer

    @property
    def counted_tokens(self) -> int:
        return sum(self.tokens_per_chunk)


def parse_sse(reads: list[bytes], read_times_ns: list[int]) -> ParsedStream:
    """Turn network reads into token events.

    An SSE event belongs to the read that delivered its terminating blank line, so it
    is timed by that read. A chunk carries one token unless the server sends running
    usage in token chunks (vLLM's continuous_usage_stats), whose delta then counts.
    A chat chunk whose delta carries only reasoning (REASONING_FIELDS) is a token too, counted
    in reasoning_tokens; its text is not part of the answer's.
    """
    out = ParsedStream()
    payloads, payload_times = sse_payloads(reads, read_times_ns, out)
    try:  # one decoder call for the whole stream; per event only to name the bad one
        objs = json.loads(b"[" + b",".join(payloads) + b"]") if payloads else []
    except ValueError:
        objs = None
    if objs is None or len(objs) != len(payloads):
        objs = [_loads_one(p) for p in payloads]
    texts: list[str] = []
    last_usage_tokens = 0
    for obj, t_ns in zip(objs, payload_times):
        if not isinstance(obj, dict):
            raise StreamError("malformed_json", f"expected a JSON object, got {str(obj)[:120]!r}")
        if "error" in obj:
            raise StreamError("server_error_event", str(obj["error"])[:200])
        check_event_shape(obj)
        usage = obj.get("usage")
        if obj.get("timings"):  # llama-server: prompt_ms, predicted_ms, ... on the last chunk
            out.server_timings = obj["timings"]
        text = thought = ""
        for c in obj.get("choices") or ():
            piece, reasoning = _choice_pieces(c)
            text += piece
            thought += reasoning
            if c.get("finish_reason"):
                out.finish_reason = c["finish_reason"]
        if usage:
            out.usage_completion_tokens = usage.get("completion_tokens")
            out.usage_prompt_tokens = usage.get("prompt_tokens")
        if not text and not thought:
            continue
        tokens = 1
        # a count that is not a number is not subtracted (RequestRecord.take_stream names it: bad_usage)
        if usage and isinstance(usage.get("completion_tokens"), (int, float)):
            tokens = max(1, usage["completion_tokens"] - last_usage_tokens)
            last_usage_tokens = usage["completion_tokens"]
        else:
            last_usage_tokens += 1
        out.token_times_ns.append(t_ns)
        out.tokens_per_chunk.append(tokens)
        if text:
            texts.append(text)
            if out.first_answer_chunk is None:
                out.first_answer_chunk = len(out.token_times_ns) - 1
        else:
            out.reasoning_tokens += tokens
    out.text = "".join(texts)
    return out


# where a chat delta carries a reasoning model's thinking: SGLang (python/sglang/srt/entrypoints/openai/protocol.py,
# DeltaMessage.reasoning_content) and older vLLM `reasoning_content`; vLLM now `reasoning`
# (vllm/entrypoints/openai/engine/protocol.py, DeltaMessage.reasoning)
REASONING_FIELDS = ("reasoning_content", "reasoning")


def _choice_pieces(choice: dict) -> tuple[str, str]:
    """(answer text, reasoning text) of one streamed choice: a chat `delta` or a completion's `text`."""
    if "delta" not in choice:
        return choice.get("text") or "", ""
    delta = choice["delta"] or {}
    return delta.get("content") or "", "".join(delta.get(f) or "" for f in REASONING_FIELDS)


def check_event_shape(obj: dict) -> None:
    """The parts of an event the parse reads must have OpenAI's shape, or the server is named as the cause (a
    `choices: [1]` was once an AttributeError recorded as the client's error)."""
    choices, usage = obj.get("choices"), obj.get("usage")
    if choices is not None and not isinstance(choices, list):
        _malformed("choices", choices, "a list")
    for i, c in enumerate(choices or ()):
        if not isinstance(c, dict):
            _malformed(f"choices[{i}]", c, "an object")
        if c.get("delta") is not None and not isinstance(c["delta"], dict):
            _malformed(f"choices[{i}].delta", c["delta"], "an object")
    if usage is not None and not isinstance(usage, dict):
        _malformed("usage", usage, "an object")


def _malformed(field: str, value, expected: str):
    raise StreamError(
        "malformed_event",
        f"{field} is {str(value)[:80]!r}, not {expected}: the server's stream is not in the OpenAI format",
    )


def _loads_one(payload: bytes):
    try:
        return json.loads(payload)
    except ValueError as e:
        raise StreamError("malformed_json", f"{e}: {payload[:120]!r}") from None


def sse_payloads(reads: list[bytes], read_times_ns: list[int], out: ParsedStream) -> tuple[list, list]:
    """The data payload of each event with the arrival time of the read that completed it."""
    payloads, times = [], []
    # The common case first: each read is one `data: {...}` event (a server's write, read in time);
    # from the first read that is not, the whole rest goes through the general parse below.
    first = 0
    for data, t_ns in zip(reads, read_times_ns):
        if not (data.startswith(b"data: {") and data.find(b"\n") == len(data) - 2 and data.endswith(b"\n\n")):
            break
        payloads.append(data[6:-2])
        times.append(t_ns)
        first += 1
    if first:
        reads, read_times_ns = reads[first:], read_times_ns[first:]
    raw = b"".join(reads)
    crlf = b"\r\n" in raw
    read_ends, pos = [], 0  # where each read ends in the (CRLF-normalised) whole stream
    for data in reads:
        pos += len(data.replace(b"\r\n", b"\n")) if crlf else len(data)
        read_ends.append(pos)
    if crlf:
        raw = raw.replace(b"\r\n", b"\n")
    read_i, start = 0, 0
    while True:
        sep = raw.find(b"\n\n", start)
        if sep < 0:
            break
        event = raw[start:sep]
        start = sep + 2
        while read_ends[read_i] < start:
            read_i += 1
        if event.startswith(b"data: {") and b"\n" not in event:
            payload = event[6:]  # the common case: one data line
        else:
            payload = _event_data(event)
            if payload is None:
                continue
            if payload == b"[DONE]":
                out.saw_done = True
                continue
        payloads.append(payload)
        times.append(read_times_ns[read_i])
    rest = raw[start:]
    if rest.strip():
        payload = _event_data(rest)
        if payload is not None and payload != b"[DONE]":
            raise StreamError("stream_cut", f"stream ended inside an event: {rest[:120]!r}")
        out.saw_done = out.saw_done or payload == b"[DONE]"
    return payloads, times


def _event_data(event: bytes) -> bytes | None:
    """The data of one SSE event; comments (':' lines) and other fields are skipped."""
    parts = []
    for line in event.split(b"\n"):
        if not line or line.startswith(b":"):
            continue
        if line.startswith(b"data:"):
            parts.append(line[5:].lstrip(b" "))
        elif line.split(b":", 1)[0] not in (b"event", b"id", b"retry"):
            raise StreamError("malformed_sse", f"not an SSE line: {line[:120]!r}")
    return b"\n".join(parts) if parts else None
