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
    served_model: str | None = None  # the `model` the stream's events name (its first, when they disagree)
    # what is wrong with a stream whose tokens still read (events after [DONE], a model switch): (reason, detail);
    # the record fails with it and keeps the tokens (RequestRecord.take_stream)
    malformed: tuple[str, str] | None = None
    # an answer that generates nothing (backend.api: embeddings, backends/embeddings_api.py): how many inputs it
    # embedded and the vectors' length; None for a generating stream. Such an answer has no token chunks.
    embedded_items: int | None = None
    embedding_dims: int | None = None

    @property
    def counted_tokens(self) -> int:
        return sum(self.tokens_per_chunk)

    def flag(self, reason: str, detail: str) -> None:
        """Notes the stream's first format fault that leaves its tokens readable."""
        if self.malformed is None:
            self.malformed = (reason, detail)

    def name_model(self, model: str | None, event: int) -> None:
        """The `model` of the stream's event number `event` (from 1): the first names the served model, a later
        one that differs is a switch mid-answer."""
        if model is None:
            return
        if self.served_model is None:
            self.served_model = model
        elif model != self.served_model:
            self.flag(
                "model_switch",
                f"event {event} names model {model!r}, the events before it {self.served_model!r}: the server "
                f"switched model mid-answer",
            )


def parse_sse(reads: list[bytes], read_times_ns: list[int]) -> ParsedStream:
    """Turn network reads into token events.

    An SSE event belongs to the read that delivered its terminating blank line, so it
    is timed by that read. A chunk carries one token unless the server sends running
    usage in token chunks (vLLM's continuous_usage_stats), whose delta then counts, or its final usage
    counts more tokens than came chunks (spread_usage).
    A chat chunk whose delta carries only reasoning (REASONING_FIELDS) is a token too, counted
    in reasoning_tokens; its text is not part of the answer's. A chunk with a `tool_calls` delta (a call's
    header, then its arguments in fragments, as vLLM streams them) is an answer token, its first one TTFT;
    each call goes into the answer's text as `name(arguments)`, after the content (a tool-call answer is
    not an empty one, and two runs' calls compare as text).
    """
    out = ParsedStream()
    payloads, payload_times = sse_payloads(reads, read_times_ns, out)
    texts: list[str] = []
    chunk_texts: list[str] = []  # each token chunk's text, answer and thinking (spread_usage weighs them)
    thinking_chunks: list[int] = []  # the token chunks that carry only thinking
    calls: dict[int, list[str]] = {}  # each tool call's [name, arguments] by its index, as the deltas build it
    last_usage_tokens = 0
    for event, (obj, t_ns) in enumerate(zip(_decoded(payloads), payload_times), start=1):
        check_event(obj)
        model = obj.get("model")
        if model is not None and model != out.served_model:
            out.name_model(model, event)
        usage = obj.get("usage")
        if obj.get("timings"):  # llama-server: prompt_ms, predicted_ms, ... on the last chunk
            out.server_timings = obj["timings"]
        text, thought, call = _event_pieces(obj, out, calls)
        if usage:
            out.usage_completion_tokens = usage.get("completion_tokens")
            out.usage_prompt_tokens = usage.get("prompt_tokens")
        if not text and not thought and call is None:
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
        chunk_texts.append(text + thought + (call or ""))
        if text or call is not None:
            texts.append(text)
            if out.first_answer_chunk is None:
                out.first_answer_chunk = len(out.token_times_ns) - 1
        else:
            thinking_chunks.append(len(out.token_times_ns) - 1)
    out.text = "".join(texts) + "".join(f"{name}({arguments})" for name, arguments in calls.values())
    spread_usage(out, chunk_texts)
    out.reasoning_tokens = sum(out.tokens_per_chunk[i] for i in thinking_chunks)
    return out


def _decoded(payloads: list[bytes]) -> list:
    """Each payload's JSON value: one decoder call for the whole stream; per event only to name the bad one."""
    try:
        objs = json.loads(b"[" + b",".join(payloads) + b"]") if payloads else []
    except ValueError:
        objs = None
    if objs is None or len(objs) != len(payloads):
        objs = [_loads_one(p) for p in payloads]
    return objs


def _event_pieces(obj: dict, out: ParsedStream, calls: dict[int, list[str]]) -> tuple[str, str, str | None]:
    """(answer text, thinking text, tool-call text or None) of one event's choices: a chat `delta`'s content,
    reasoning and tool_calls (their names and arguments, also added to `calls`), or a completion's `text`; a
    choice's finish_reason goes into `out`. Each value is checked for OpenAI's type as it is read, with type()
    alone (naming each field as it was checked made parsing a stream 3x slower); an event with a value of another
    type is named by check_event_shape (StreamError)."""
    text = thought = ""
    call = None
    for c in obj.get("choices") or ():
        if type(c) is not dict:
            check_event_shape(obj)
        finish, index, completion = c.get("finish_reason"), c.get("index"), c.get("text")
        if not (_is_text(finish) and _is_text(completion) and (index is None or type(index) is int)):
            check_event_shape(obj)
        if "delta" in c:
            delta = c["delta"]
            if delta is not None and type(delta) is not dict:
                check_event_shape(obj)
            delta = delta or {}
            # REASONING_FIELDS, by name: a loop over them cost a fifth of a chat stream's parse
            content, reasoning_content, reasoning = (
                delta.get("content"),
                delta.get("reasoning_content"),
                delta.get("reasoning"),
            )
            if not (_is_text(content) and _is_text(reasoning_content) and _is_text(reasoning)):
                check_event_shape(obj)
            text += content or ""
            thought += (reasoning_content or "") + (reasoning or "")
            tool_calls = delta.get("tool_calls")
            if tool_calls:
                call = (call or "") + _tool_call_text(tool_calls, obj, calls)
        else:
            text += completion or ""
        if finish:
            out.finish_reason = finish
    return text, thought, call


def _tool_call_text(tool_calls, obj: dict, calls: dict[int, list[str]]) -> str:
    """The names and argument fragments of a delta's tool_calls, each added to its call in `calls` (OpenAI's shape,
    else check_event_shape names the field)."""
    if type(tool_calls) is not list:
        check_event_shape(obj)
    pieces = []
    for tool_call in tool_calls:
        function = tool_call.get("function") if type(tool_call) is dict else None
        if type(tool_call) is not dict or not (function is None or type(function) is dict):
            check_event_shape(obj)
        index, name, arguments = (
            tool_call.get("index", 0),
            (function or {}).get("name"),
            (function or {}).get("arguments"),
        )
        if not (type(index) is int and _is_text(name) and _is_text(arguments)):
            check_event_shape(obj)
        call = calls.setdefault(index, ["", ""])
        call[0] += name or ""
        call[1] += arguments or ""
        pieces.append((name or "") + (arguments or ""))
    return "".join(pieces)


def _is_text(value) -> bool:
    return value is None or type(value) is str


def spread_usage(out: ParsedStream, chunk_texts: list[str]) -> None:
    """When the final usage counts more tokens than came token chunks, some events carried several tokens: the
    accepted drafts of speculative decoding, or tokens a detokenizer held back (part of a character, a possible stop
    string) and sent with the next (vLLM, llama-server and the built-in engine each stream them as one event). The
    server's count is then taken, its extra tokens given to the chunks whose text is longer than a token's share of
    the bytes. Only when plausible: one token a chunk as counted (no running usage), and each extra token brought a
    byte of text at least; otherwise the chunks stay as counted and the record shows the mismatch."""
    usage, counts = out.usage_completion_tokens, out.tokens_per_chunk
    if not isinstance(usage, int) or isinstance(usage, bool) or any(k != 1 for k in counts):
        return
    extra = usage - len(counts)
    if extra <= 0:
        return
    chunk_bytes = [len(text.encode()) for text in chunk_texts]
    total_bytes = sum(chunk_bytes)
    if extra > total_bytes:
        return
    share = total_bytes / usage  # bytes a token
    want = [max(0.0, b / share - 1) for b in chunk_bytes]  # tokens past the first, as the chunk's length says
    exact = [w * extra / sum(want) for w in want]
    spread = [1 + int(e) for e in exact]
    # the tokens rounding left go to the largest remainders; on a tie the later chunk (an EOS token comes last)
    by_remainder = sorted(range(len(exact)), key=lambda i: (exact[i] - int(exact[i]), i), reverse=True)
    for i in by_remainder[: usage - sum(spread)]:
        spread[i] += 1
    out.tokens_per_chunk = spread


# where a chat delta carries a reasoning model's thinking: SGLang (python/sglang/srt/entrypoints/openai/protocol.py,
# DeltaMessage.reasoning_content) and older vLLM `reasoning_content`; vLLM now `reasoning`
# (vllm/entrypoints/openai/engine/protocol.py, DeltaMessage.reasoning)
REASONING_FIELDS = ("reasoning_content", "reasoning")
# the engine's `timings` the harness reads as numbers (harness/metrics/phases.py, diagnosis.py, plan/step_model.py)
NUMERIC_TIMINGS = (
    "queue_ms",
    "prefill_ms",
    "decode_ms",
    "prompt_ms",
    "predicted_ms",
    "prompt_n",
    "predicted_n",
    "cache_n",
    "preemptions",
)
OPENAI_FORMAT = "the OpenAI format"


def check_event(obj) -> None:
    """One decoded event: an object, not an error, of OpenAI's shape (StreamError otherwise)."""
    if not isinstance(obj, dict):
        raise StreamError("malformed_json", f"expected a JSON object, got {str(obj)[:120]!r}")
    if "error" in obj:
        raise StreamError("server_error_event", str(obj["error"])[:200])
    choices, usage, model = obj.get("choices"), obj.get("usage"), obj.get("model")
    if (
        (choices is not None and type(choices) is not list)
        or (usage is not None and type(usage) is not dict)
        or (model is not None and type(model) is not str)
        or obj.get("timings") is not None  # the last event's only: checked by name
    ):
        check_event_shape(obj)  # the choices' fields are checked as they are read (_event_pieces)


def check_event_shape(obj: dict) -> None:
    """Every field of an event the parse reads must have OpenAI's type, or the server is named as the cause (a
    `choices: [1]` was once an AttributeError, a `text: 5` a TypeError, each recorded as the client's error)."""
    choices = obj.get("choices")
    check_field("choices", choices, list)
    for i, c in enumerate(choices or ()):
        if not isinstance(c, dict):
            malformed(f"choices[{i}]", c, dict)
        check_field(f"choices[{i}].index", c.get("index"), int)
        check_field(f"choices[{i}].text", c.get("text"), str)
        check_field(f"choices[{i}].finish_reason", c.get("finish_reason"), str)
        delta = c.get("delta")
        check_field(f"choices[{i}].delta", delta, dict)
        for name in ("content", *REASONING_FIELDS):
            check_field(f"choices[{i}].delta.{name}", (delta or {}).get(name), str)
        check_tool_calls_shape(f"choices[{i}].delta.tool_calls", (delta or {}).get("tool_calls"))
    check_field("usage", obj.get("usage"), dict)  # its counts: RequestRecord.take_stream (bad_usage)
    check_field("model", obj.get("model"), str)
    timings = obj.get("timings")
    check_field("timings", timings, dict)
    for name in NUMERIC_TIMINGS:
        check_field(f"timings.{name}", (timings or {}).get(name), float)


def check_tool_calls_shape(path: str, tool_calls) -> None:
    check_field(path, tool_calls, list)
    for j, tool_call in enumerate(tool_calls or ()):
        if not isinstance(tool_call, dict):
            malformed(f"{path}[{j}]", tool_call, dict)
        check_field(f"{path}[{j}].index", tool_call.get("index"), int)
        function = tool_call.get("function")
        check_field(f"{path}[{j}].function", function, dict)
        for name in ("name", "arguments"):
            check_field(f"{path}[{j}].function.{name}", (function or {}).get(name), str)


KINDS = {
    list: "a list",
    dict: "an object",
    str: "a string",
    int: "a whole number",
    float: "a number",
    bool: "true or false",
}


def check_field(name: str, value, kind: type, fmt: str = OPENAI_FORMAT) -> None:
    """A field that is null or absent, or of `kind` (float: any number; int and float never a boolean); else
    StreamError malformed_event naming it."""
    if value is None:
        return
    wanted = (int, float) if kind is float else kind
    if not isinstance(value, wanted) or (kind in (int, float) and isinstance(value, bool)):
        malformed(name, value, kind, fmt)


def malformed(name: str, value, kind: type, fmt: str = OPENAI_FORMAT):
    raise StreamError(
        "malformed_event",
        f"{name} is {_shown(value)}, not {KINDS[kind]}: the server's stream is not in {fmt}",
    )


def _shown(value) -> str:
    """A value as the server sent it (JSON), shortened, with its JSON type."""
    text = json.dumps(value)
    text = text if len(text) <= 80 else text[:77] + "..."
    kind = {bool: "a boolean", str: "a string", list: "a list", dict: "an object"}.get(type(value), "a number")
    return f"{text} ({kind})"


def json_object(raw: bytes) -> dict:
    """One whole JSON answer (a line of NDJSON, an embeddings or rerank body): an object that is no error, else
    StreamError (malformed_json, or server_error_event with the server's error)."""
    obj = _loads_one(raw)
    if not isinstance(obj, dict):
        raise StreamError("malformed_json", f"expected a JSON object, got {raw[:120]!r}")
    if obj.get("error"):
        raise StreamError("server_error_event", str(obj["error"])[:200])
    return obj


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
                _after_done(raw[start:], out)
                return payloads, times
        payloads.append(payload)
        times.append(read_times_ns[read_i])
    rest = raw[start:]
    if rest.strip():
        payload = _event_data(rest)
        if payload is not None and payload != b"[DONE]":
            raise StreamError("stream_cut", f"stream ended inside an event: {rest[:120]!r}")
        out.saw_done = out.saw_done or payload == b"[DONE]"
    return payloads, times


def _after_done(after: bytes, out: ParsedStream) -> None:
    """What a stream sent after its [DONE]: an OpenAI client has stopped reading there, so none of it is counted or
    timed, and an event (anything but comments and blank lines) flags the stream."""
    events = [e for e in after.split(b"\n\n") if any(line and not line.startswith(b":") for line in e.split(b"\n"))]
    if events:
        out.flag(
            "events_after_done",
            f"{len(events)} event{'s' * (len(events) > 1)} after [DONE], the first {events[0][:120]!r}: an OpenAI "
            f"client stops reading at [DONE], so they were neither counted nor timed",
        )


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
