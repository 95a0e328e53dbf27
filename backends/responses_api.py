"""backend.api: responses — OpenAI's Responses API (POST /v1/responses, stream: true): request and stream parse.

The stream is named SSE events (https://platform.openai.com/docs/api-reference/responses-streaming; vLLM
emits them in vllm/entrypoints/openai/responses/simple_streaming_events.py @ 90d7b6b). Read here:
response.created (the model), response.output_text.delta (answer text: a token chunk; the first one is
TTFT), response.reasoning_text.delta and response.reasoning_summary_text.delta (thinking: token chunks counted
in reasoning_tokens), response.function_call_arguments.delta (a tool call's arguments: token chunks, neither
answer nor thinking), and the terminal response.completed / response.incomplete, whose response.usage
{input_tokens, output_tokens} gives the counts; response.failed and error events fail the request. The
stream has no [DONE]: the terminal event ends it, and anything after it is flagged.
"""

from __future__ import annotations

import json

from backends.openai import ParsedStream, StreamError, check_field, spread_usage, sse_payloads

RESPONSES = "responses"
RESPONSES_FORMAT = "the Responses API's event format"
TEXT_DELTA = "response.output_text.delta"
THINKING_DELTAS = ("response.reasoning_text.delta", "response.reasoning_summary_text.delta")
TOOL_DELTAS = ("response.function_call_arguments.delta",)
TERMINAL = ("response.completed", "response.incomplete")
# response.incomplete's incomplete_details.reason -> the chat API's finish_reason the records use
INCOMPLETE_REASONS = {"max_output_tokens": "length", "content_filter": "content_filter"}


def build_responses_body(
    model: str,
    max_tokens: int,
    prompt: str | None = None,
    messages: list[dict] | None = None,
    ignore_eos: bool = False,
) -> dict:
    """A streamed response: `input` the prompt (a string) or the chat messages. ignore_eos (and min_tokens) are
    extensions the built-in engine and vLLM's sampling read; OpenAI's own API has neither."""
    body: dict = {
        "model": model,
        "input": messages if messages is not None else (prompt or ""),
        "max_output_tokens": max_tokens,
        "stream": True,
    }
    if ignore_eos:
        body["ignore_eos"] = True
        body["min_tokens"] = max_tokens
    return body


def parse_responses(reads: list[bytes], read_times_ns) -> ParsedStream:
    """Token chunks from the delta events, counts and finish from the terminal event."""
    out = ParsedStream()
    payloads, times = sse_payloads(reads, read_times_ns, out)
    texts, chunk_texts, thinking_chunks = [], [], []
    for number, (payload, t_ns) in enumerate(zip(payloads, times), start=1):
        obj = loaded_event(payload)
        kind = obj.get("type")
        check_field("type", kind, str, RESPONSES_FORMAT)
        if out.saw_done:
            out.flag("events_after_done", f"a {kind} event after the stream's terminal event: not counted")
            break
        if kind in ("error", "response.failed"):
            raise StreamError("server_error_event", json.dumps(obj)[:200])
        if kind == TEXT_DELTA or kind in THINKING_DELTAS or kind in TOOL_DELTAS:
            delta = obj.get("delta")
            check_field(f"{kind}.delta", delta, str, RESPONSES_FORMAT)
            if not delta:
                continue
            out.token_times_ns.append(t_ns)
            out.tokens_per_chunk.append(1)
            chunk_texts.append(delta)
            if kind == TEXT_DELTA:
                texts.append(delta)
                if out.first_answer_chunk is None:
                    out.first_answer_chunk = len(out.token_times_ns) - 1
            elif kind in THINKING_DELTAS:
                thinking_chunks.append(len(out.token_times_ns) - 1)
        elif kind == "response.created" or kind in TERMINAL:
            take_response(obj, kind, number, out)
    out.text = "".join(texts)
    spread_usage(out, chunk_texts)
    out.reasoning_tokens = sum(out.tokens_per_chunk[i] for i in thinking_chunks)
    return out


def loaded_event(payload: bytes) -> dict:
    try:
        obj = json.loads(payload)
    except ValueError as e:
        raise StreamError("malformed_json", f"{e}: {payload[:120]!r}") from None
    if not isinstance(obj, dict):
        raise StreamError("malformed_json", f"expected a JSON object, got {payload[:120]!r}")
    return obj


def take_response(obj: dict, kind: str, number: int, out: ParsedStream) -> None:
    """The `response` object of response.created (its model) or of a terminal event (usage, finish, timings)."""
    response = obj.get("response")
    check_field(f"{kind}.response", response, dict, RESPONSES_FORMAT)
    response = response or {}
    check_field(f"{kind}.response.model", response.get("model"), str, RESPONSES_FORMAT)
    out.name_model(response.get("model"), number)
    if kind not in TERMINAL:
        return
    out.saw_done = True
    usage = response.get("usage")
    check_field(f"{kind}.response.usage", usage, dict, RESPONSES_FORMAT)
    if usage:
        out.usage_prompt_tokens = usage.get("input_tokens")
        out.usage_completion_tokens = usage.get("output_tokens")
    if kind == "response.completed":
        out.finish_reason = "stop"
    else:
        details = response.get("incomplete_details")
        check_field(f"{kind}.response.incomplete_details", details, dict, RESPONSES_FORMAT)
        reason = (details or {}).get("reason")
        out.finish_reason = INCOMPLETE_REASONS.get(reason, str(reason))
    timings = response.get("timings")  # the built-in engine's own account (native_engine/responses_api.py)
    if isinstance(timings, dict):
        out.server_timings = timings
