"""backend.api: anthropic_messages — Anthropic's Messages API (POST /v1/messages, stream: true): request and parse.

The stream (https://platform.claude.com/docs/en/build-with-claude/streaming; vLLM's translation in
vllm/entrypoints/anthropic/serving.py @ 82df3f4) is named SSE events: message_start (the model and
usage.input_tokens), content_block_start, ping, content_block_delta (text_delta: answer text, a token chunk, the
first one TTFT; thinking_delta: thinking, counted in reasoning_tokens; input_json_delta: a tool call's
arguments, token chunks that are neither), content_block_stop, message_delta (delta.stop_reason and usage with
the cumulative output_tokens), message_stop (the end; vLLM adds a `data: [DONE]` after it, Anthropic does not);
an `error` event fails the request. stop_reason is read in the chat API's terms: end_turn and stop_sequence ->
stop, max_tokens -> length, tool_use -> tool_calls.
"""

from __future__ import annotations

import json

from backends.openai import ParsedStream, StreamError, check_field, spread_usage, sse_payloads
from backends.responses_api import loaded_event

ANTHROPIC_MESSAGES = "anthropic_messages"
MESSAGES_FORMAT = "Anthropic's Messages stream format"
STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls"}
DELTA_FIELDS = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}


def build_messages_body(
    model: str,
    max_tokens: int,
    prompt: str | None = None,
    messages: list[dict] | None = None,
    ignore_eos: bool = False,
) -> dict:
    """A streamed message. Anthropic has no system role: system messages go to the top-level `system`. ignore_eos
    (and min_tokens) are extensions the built-in engine reads; Anthropic's own API refuses unknown fields."""
    turns = messages if messages is not None else [{"role": "user", "content": prompt or ""}]
    system = "\n".join(str(m.get("content", "")) for m in turns if m.get("role") == "system")
    body: dict = {
        "model": model,
        "max_tokens": max_tokens,
        "messages": [m for m in turns if m.get("role") != "system"],
        "stream": True,
    }
    if system:
        body["system"] = system
    if ignore_eos:
        body["ignore_eos"] = True
        body["min_tokens"] = max_tokens
    return body


def parse_messages(reads: list[bytes], read_times_ns) -> ParsedStream:
    """Token chunks from the content_block_delta events; counts from message_start and the last message_delta."""
    out = ParsedStream()
    payloads, times = sse_payloads(reads, read_times_ns, out)
    texts, chunk_texts, thinking_chunks = [], [], []
    ended = False
    for number, (payload, t_ns) in enumerate(zip(payloads, times), start=1):
        obj = loaded_event(payload)
        kind = obj.get("type")
        check_field("type", kind, str, MESSAGES_FORMAT)
        if ended:
            out.flag("events_after_done", f"a {kind} event after message_stop: not counted")
            break
        if kind == "error":
            raise StreamError("server_error_event", json.dumps(obj.get("error"))[:200])
        if kind == "content_block_delta":
            piece, delta_type = delta_text(obj)
            if not piece:
                continue
            out.token_times_ns.append(t_ns)
            out.tokens_per_chunk.append(1)
            chunk_texts.append(piece)
            if delta_type == "text_delta":
                texts.append(piece)
                if out.first_answer_chunk is None:
                    out.first_answer_chunk = len(out.token_times_ns) - 1
            elif delta_type == "thinking_delta":
                thinking_chunks.append(len(out.token_times_ns) - 1)
        elif kind == "message_start":
            message = obj.get("message")
            check_field("message_start.message", message, dict, MESSAGES_FORMAT)
            out.name_model((message or {}).get("model"), number)
            take_usage((message or {}).get("usage"), "message_start.message.usage", out)
        elif kind == "message_delta":
            take_message_delta(obj, out)
        elif kind == "message_stop":
            out.saw_done = ended = True
    out.text = "".join(texts)
    spread_usage(out, chunk_texts)
    out.reasoning_tokens = sum(out.tokens_per_chunk[i] for i in thinking_chunks)
    return out


def delta_text(obj: dict) -> tuple[str, str | None]:
    """(the text a content_block_delta carries, its delta type); ("", type) for deltas without text (signature)."""
    delta = obj.get("delta")
    check_field("content_block_delta.delta", delta, dict, MESSAGES_FORMAT)
    delta_type = (delta or {}).get("type")
    field = DELTA_FIELDS.get(delta_type)
    if field is None:
        return "", delta_type
    piece = delta.get(field)
    check_field(f"content_block_delta.delta.{field}", piece, str, MESSAGES_FORMAT)
    return piece or "", delta_type


def take_usage(usage, where: str, out: ParsedStream) -> None:
    check_field(where, usage, dict, MESSAGES_FORMAT)
    usage = usage or {}
    if usage.get("input_tokens") is not None:
        out.usage_prompt_tokens = usage["input_tokens"]
    if usage.get("output_tokens") is not None and where.startswith("message_delta"):
        out.usage_completion_tokens = usage["output_tokens"]  # cumulative: the last one is the total


def take_message_delta(obj: dict, out: ParsedStream) -> None:
    delta = obj.get("delta")
    check_field("message_delta.delta", delta, dict, MESSAGES_FORMAT)
    reason = (delta or {}).get("stop_reason")
    check_field("message_delta.delta.stop_reason", reason, str, MESSAGES_FORMAT)
    if reason is not None:
        out.finish_reason = STOP_REASONS.get(reason, reason)
    take_usage(obj.get("usage"), "message_delta.usage", out)
    timings = obj.get("timings")  # the built-in engine's own account (native_engine/messages_api.py)
    if isinstance(timings, dict):
        out.server_timings = timings
