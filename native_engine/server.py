"""OpenAI-compatible HTTP server (aiohttp) in front of the engine, with vLLM's response shapes.

The engine steps in its own thread (engine_thread.py); each request gets a RequestStream of outputs on this loop.
Bad input gets a 400 whose `param` names the field (sizes and timeouts: "request limits" below);
a full waiting queue gets a 503 with Retry-After. A client that goes away mid-request (handler
cancelled or write fails) aborts its request, which frees its KV blocks before the next step.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
import uuid
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from native_engine import messages_api, responses_api
from native_engine.content_encoding import ContentEncodingError, decoded_body
from native_engine.draining_runner import SHUTDOWN_GRACE_S, DrainingRunner
from native_engine.embeddings import ENCODING_FORMATS, Embedder, EmbeddingInputError, encoded, input_token_ids
from native_engine.engine_thread import EngineThread, RequestStream
from native_engine.guided import Grammar, GrammarError, grammar_from_request
from native_engine.head_deadline import HEAD_TIMEOUT_S, use_head_deadline
from native_engine.kv_transfer import KVTransferError, cache_shape, receive_handoff
from native_engine.llm_engine import LLMEngine
from native_engine.request_output import RequestOutput
from native_engine.rerank import rerank_answer, rerank_items
from native_engine.scheduler import QueueFullError
from native_engine.sequence import SamplingParams
from native_engine.tool_calls import (
    ToolCallError,
    ToolCallReader,
    ToolRequest,
    assistant_calls_text,
    check_tool_message,
    tool_grammar,
    tool_request,
    tool_schema_grammars,
    with_tools,
)
from native_engine.translated_chat import FieldError, renamed

SYSTEM_FINGERPRINT = "native-0.1.0"
ENGINE_KEY = web.AppKey("engine", LLMEngine)
ENGINE_THREAD_KEY = web.AppKey("engine_thread", EngineThread)
NAME_KEY = web.AppKey("served_model_name", str)  # the name answers carry
NAMES_KEY = web.AppKey("served_model_names", tuple)  # every name a request may ask for: the name and its aliases
EMBEDDER_KEY = web.AppKey("embedder", Embedder)


class RequestError(Exception):
    def __init__(self, message: str, param: str | None, status: int = 400, err_type: str = "BadRequestError"):
        super().__init__(message)
        self.message, self.param, self.status, self.err_type = message, param, status, err_type

    def response(self) -> web.Response:
        body = {"error": {"message": self.message, "type": self.err_type, "param": self.param, "code": self.status}}
        headers = {"Retry-After": "1"} if self.status == 503 else None
        return web.json_response(dumps=compact_json, data=body, status=self.status, headers=headers)


# ---- request limits --------------------------------------------------------------------------
# A body far larger than any prompt that fits the context (8192 tokens of at most 81 bytes for
# SmolLM2, about 660 KB) is refused unread past this size, with a 413.
MAX_BODY_BYTES = 4 * 2**20
BODY_READ_TIMEOUT_S = 30.0
# aiohttp closes a connection that has no complete request for this long (idle keep-alive ones); longer than
# the harness client's 15 s pool. One still sending its head has HEAD_TIMEOUT_S (native_engine/head_deadline.py).
IDLE_CONNECTION_TIMEOUT_S = 60.0
MAX_INT = 2**63 - 1


# ---- request parsing -------------------------------------------------------------------------
async def read_json(request: web.Request) -> dict:
    read_timeout_s = BODY_READ_TIMEOUT_S
    try:
        raw = await asyncio.wait_for(request.read(), read_timeout_s)
    except web.HTTPRequestEntityTooLarge:
        raise RequestError(
            f"request body is over this server's limit of {request.client_max_size} bytes; send a shorter prompt",
            "body",
            413,
            "RequestEntityTooLarge",
        ) from None
    except asyncio.TimeoutError:
        raise RequestError(
            f"request body did not arrive within {read_timeout_s:g} s", "body", 408, "RequestTimeout"
        ) from None
    try:
        raw = decoded_body(raw, request.headers.get("Content-Encoding", ""), request.client_max_size)
    except ContentEncodingError as exc:
        err_type = "RequestEntityTooLarge" if exc.status == 413 else "BadRequestError"
        raise RequestError(str(exc), exc.param, exc.status, err_type) from None
    charset = request.charset or "utf-8"
    try:
        body = json.loads(raw.decode(charset))
    except LookupError:
        raise RequestError(
            f"Content-Type names charset {charset!r}, which is unknown; send UTF-8", "Content-Type"
        ) from None
    except UnicodeDecodeError as exc:
        raise RequestError(f"request body is not valid {charset} ({exc}); send UTF-8 JSON", "body") from None
    except RecursionError:
        raise RequestError("request body is nested too deeply; send a flat JSON object", "body") from None
    except ValueError as exc:  # JSONDecodeError, and integers past Python's 4300-digit limit
        reason = "a number has more than 4300 digits" if "digits" in str(exc) else str(exc)
        raise RequestError(f"request body is not valid JSON ({reason}); send a JSON object", "body") from None
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object", "body")
    bad = path_of_lone_surrogate(body)
    if bad:
        raise RequestError(
            f"{bad} holds a lone UTF-16 surrogate (such as \\ud800), which is not text; send valid Unicode",
            bad.split(".")[0].split("[")[0],
        )
    return body


def path_of_lone_surrogate(body) -> str | None:
    """Where a JSON `\\ud800` escape left a string that UTF-8 (and so the tokenizer) cannot hold."""
    stack = [("", body)]
    while stack:  # not recursive: bodies may nest as deep as the JSON parser allows
        path, value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return path or "body"
        elif isinstance(value, dict):
            stack.extend((f"{path}.{k}" if path else k, v) for k, v in value.items())
            stack.extend((path or "body", k) for k in value)
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(value))
    return None


# Options this engine does not implement, and the values that ask for nothing (OpenAI's and vLLM's defaults,
# what clients send when the user set nothing); the last is the one an error message suggests.
NEUTRAL_VALUES = {
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "tools": (None, []),
    "functions": (None, []),
    "tool_choice": (None, "auto", "none"),  # with no tools, "auto" calls none
    "function_call": (None, "auto", "none"),
}
# what the chat endpoint serves of them (native_engine/tool_calls.py); /v1/completions refuses them
CHAT_TOOL_FIELDS = ("tools", "tool_choice")


def check_unsupported(body: dict, chat: bool) -> None:
    """Options this engine does not implement are refused unless they ask for nothing (NEUTRAL_VALUES)."""
    for name, allowed in NEUTRAL_VALUES.items():
        if chat and name in CHAT_TOOL_FIELDS:
            continue
        value = body.get(name)
        if not any(value is a or type(value) is type(a) and value == a for a in allowed):
            raise RequestError(
                f"{name} is not supported by this engine; leave it out (or send "
                f"{json.dumps(allowed[-1])}), got {json.dumps(value)[:40]}",
                name,
            )


def check_model(body: dict, names: tuple[str, ...]) -> None:
    """`model` absent or one of the names served (--served-model-name and its --served-model-aliases)."""
    model = body.get("model")
    if model is not None and model not in names:
        listed = " or ".join(f'"{n}"' for n in names)
        raise RequestError(f"model {model!r} is not served here; use {listed} (see GET /v1/models)", "model")


def typed(body: dict, name: str, kinds: tuple, default, kind_name: str):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise RequestError(f"{name} must be {kind_name}, got {json.dumps(value)[:40]}", name)
    if isinstance(value, float) and not math.isfinite(value) or isinstance(value, int) and abs(value) > MAX_INT:
        raise RequestError(
            f"{name} must be a finite number of magnitude below 2**63, got {json.dumps(value)[:40]}", name
        )
    return value


def is_token_list(value) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def check_text_fits(engine: LLMEngine, num_chars: int, field: str) -> None:
    """Refuse, before tokenizing it, text that cannot fit the context whatever its tokens."""
    limit = engine.max_model_len * engine.tokenizer.max_token_bytes
    if num_chars > limit:
        raise RequestError(
            f"{field} is {num_chars} characters; no text over {limit} characters fits this server's "
            f"context of {engine.max_model_len} tokens (a token spans at most "
            f"{engine.tokenizer.max_token_bytes} bytes); send a shorter {field}",
            field,
        )


def prompt_ids_of_completion(body: dict, engine: LLMEngine) -> list[int]:
    """Blocking (tokenizes): call it off the event loop."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and (isinstance(prompt[0], str) or is_token_list(prompt[0])):
        prompt = prompt[0]
    if isinstance(prompt, str):
        check_text_fits(engine, len(prompt), "prompt")
        return engine.tokenizer.encode(prompt, add_special=True)
    if is_token_list(prompt) and prompt:
        if min(prompt) < 0 or max(prompt) >= engine.model_config.vocab_size:
            raise RequestError(f"prompt token ids must lie in [0, {engine.model_config.vocab_size})", "prompt")
        return prompt
    if prompt is None:
        raise RequestError("prompt is required (a string or a list of token ids)", "prompt")
    raise RequestError("prompt must be a string, a list of token ids, or a one-element list of either", "prompt")


def message_text(i: int, content) -> str:
    if isinstance(content, list):  # content parts: this engine reads text only
        for j, part in enumerate(content):
            where = f"messages[{i}].content[{j}]"
            if isinstance(part, dict) and part.get("type") not in (None, "text"):
                raise RequestError(
                    f"{where}.type: {json.dumps(part.get('type'))[:40]} is not supported: the model is text-only "
                    '(no vision or audio input); send text parts {"type": "text", "text": ...}',
                    "messages",
                )
            if not isinstance(part, dict) or part.get("type") != "text":
                raise RequestError(
                    f'{where} must be a text part {{"type": "text", "text": ...}}; this engine reads text only',
                    "messages",
                )
            if not isinstance(part.get("text"), str):
                raise RequestError(
                    f"{where}.text must be a string, got {json.dumps(part.get('text'))[:40]}", "messages"
                )
        return "".join(part["text"] for part in content)
    if not isinstance(content, str):
        raise RequestError(f"messages[{i}].content must be a string or a list of text parts", "messages")
    return content


def request_tools(body: dict) -> ToolRequest | None:
    """A chat request's tools and tool_choice (native_engine/tool_calls.py), None without tools."""
    try:
        return tool_request(body)
    except ToolCallError as exc:
        raise RequestError(exc.message, exc.param) from None


def flat_message(i: int, m, engine: LLMEngine, call_ids: set[str]) -> dict:
    """One message as {role, content} text: an assistant's tool_calls written after its content
    (tool_calls.py), a tool result checked against the calls before it (call_ids)."""
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise RequestError(f"messages[{i}] must have a string role and string content", "messages")
    if engine.tokenizer.control_tokens_in(m["role"]):
        raise RequestError(
            f"messages[{i}].role must be a role name (user, assistant, system, tool), got {json.dumps(m['role'])[:40]}",
            "messages",
        )
    try:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = assistant_calls_text(i, m["tool_calls"], call_ids)
            text = "" if m.get("content") is None else message_text(i, m["content"])
            return {"role": "assistant", "content": f"{text}\n{calls}" if text else calls}
        if m["role"] == "tool":
            check_tool_message(i, m, call_ids)
    except ToolCallError as exc:
        raise RequestError(exc.message, exc.param) from None
    return {"role": m["role"], "content": message_text(i, m.get("content"))}


def chat_prompt_ids(body: dict, engine: LLMEngine) -> list[int]:
    """Blocking (renders and tokenizes): call it off the event loop. Control tokens come only
    from the chat template; message text that spells one is tokenized as plain text."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError('messages is required: a non-empty list of {"role", "content"}', "messages")
    call_ids: set[str] = set()
    flat = [flat_message(i, m, engine, call_ids) for i, m in enumerate(messages)]
    flat = with_tools(flat, request_tools(body))
    check_text_fits(engine, sum(len(m["content"]) for m in flat), "messages")
    try:
        return engine.tokenizer.encode_chat(flat, add_generation_prompt=True)
    except ValueError as exc:  # the template's own checks (roles, order)
        raise RequestError(f"messages: {exc}", "messages") from None


async def off_loop(blocking, *args):
    """Run tokenizing work in a worker thread, so a long prompt does not stall other streams."""
    return await asyncio.get_running_loop().run_in_executor(None, blocking, *args)


def sampling_params(
    body: dict, prompt_len: int, max_model_len: int, default_max_tokens: int | None, prompt_field: str, vocab_size: int
) -> SamplingParams:
    if prompt_len == 0:
        raise RequestError(f"{prompt_field} is empty; send at least one token", prompt_field)
    if prompt_len >= max_model_len:
        raise RequestError(
            f"{prompt_field} is {prompt_len} tokens; this server's context (max_model_len) is "
            f"{max_model_len}, which must also hold at least one output token",
            prompt_field,
        )
    if typed(body, "n", (int,), 1, "an integer") != 1:
        raise RequestError("n must be 1 (one completion per request)", "n")
    number, integer = (int, float), (int,)
    max_tokens = typed(body, "max_tokens", integer, None, "an integer")
    max_tokens = typed(body, "max_completion_tokens", integer, max_tokens, "an integer")
    max_tokens = max_tokens if max_tokens is not None else (default_max_tokens or max_model_len - prompt_len)
    if max_tokens < 1 or prompt_len + max_tokens > max_model_len:
        raise RequestError(
            f"max_tokens must be in [1, {max_model_len - prompt_len}] (context {max_model_len} "
            f"minus the prompt's {prompt_len} tokens), got {max_tokens}",
            "max_tokens",
        )
    stop = typed(body, "stop", (str, list), [], "a string or a list of strings")
    stop = [stop] if isinstance(stop, str) else stop  # checked with the rest by SamplingParams (stop_strings.py)
    stop_token_ids = typed(body, "stop_token_ids", (list,), [], "a list of token ids")
    if not is_token_list(stop_token_ids) or any(not 0 <= t < vocab_size for t in stop_token_ids):
        raise RequestError(f"stop_token_ids must be a list of token ids in [0, {vocab_size})", "stop_token_ids")
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=float(typed(body, "temperature", number, 1.0, "a number")),
            top_k=typed(body, "top_k", integer, 0, "an integer"),
            top_p=float(typed(body, "top_p", number, 1.0, "a number")),
            min_p=float(typed(body, "min_p", number, 0.0, "a number")),
            seed=typed(body, "seed", integer, None, "an integer"),
            min_tokens=typed(body, "min_tokens", integer, 0, "an integer"),
            ignore_eos=typed(body, "ignore_eos", (bool,), False, "true or false"),
            stop=stop,
            stop_token_ids=stop_token_ids,
        )
    except ValueError as exc:  # SamplingParams messages start with the field name
        raise RequestError(str(exc), str(exc).split(":")[0]) from None


async def output_grammar(body: dict, engine: LLMEngine, tools: ToolRequest | None) -> Grammar | None:
    """response_format / guided_json / guided_regex, or tool_choice's grammar (tool_calls.py), compiled and
    started once to refuse what cannot run."""
    try:
        grammar = grammar_from_request(body)
        if tools is not None and tools.choice != "none":
            if grammar is not None:
                raise RequestError(
                    f"{grammar.param} and tools with tool_choice {tools.choice!r} each constrain the answer; "
                    'send one (tool_choice "none" keeps the tools and lets response_format shape the text)',
                    grammar.param,
                )
            await asyncio.to_thread(check_tool_schemas, engine, tools)
            grammar = tool_grammar(tools)
        if grammar is not None:
            await asyncio.to_thread(engine.guided.check, grammar)  # off the loop: a large schema takes a while
        return grammar
    except GrammarError as exc:
        raise RequestError(str(exc), exc.param) from None


def check_tool_schemas(engine: LLMEngine, tools: ToolRequest) -> None:
    """Each tool's parameters compiled alone, so a schema llguidance cannot use is named by its index."""
    for grammar in tool_schema_grammars(tools):
        try:
            engine.guided.check(grammar)
        except (GrammarError, ValueError) as exc:
            reason = exc.message if isinstance(exc, GrammarError) else str(exc)
            raise RequestError(
                f"{grammar.param} is not a JSON schema this engine can constrain to ({reason}); fix that schema",
                "tools",
            ) from None


# stream_options keys: include_usage (a last chunk with the usage); vLLM's continuous_usage_stats (the usage in
# every chunk), not done here; OpenAI's include_obfuscation (padding that hides event sizes), which a server
# may leave out, as this one does.
STREAM_OPTIONS = ("include_usage", "continuous_usage_stats", "include_obfuscation")


def stream_options_include_usage(body: dict) -> bool:
    options = typed(body, "stream_options", (dict,), {}, "an object")
    for key, value in options.items():
        if key not in STREAM_OPTIONS:
            raise RequestError(
                f"stream_options.{key} is not an option here; send include_usage (true or false)", "stream_options"
            )
        if value is not None and not isinstance(value, bool):
            raise RequestError(
                f"stream_options.{key} must be true or false, got {json.dumps(value)[:40]}", "stream_options"
            )
    if options.get("continuous_usage_stats"):
        raise RequestError(
            "stream_options.continuous_usage_stats (the usage in every chunk) is not supported by this engine; "
            "leave it out (or send false) and read the usage chunk that include_usage adds at the end",
            "stream_options",
        )
    return options.get("include_usage") is True


# ---- disaggregation: this server as a prefill or decode worker (native_engine/disaggregation.py) -------
# The coordinator adds `kv_transfer` to the client's body: {"role": "prefill"} to run the prompt to its
# first token and write its KV out; the prefill worker's answer (its `kv_transfer`: the file and the
# prefill's timings) to continue the request from that KV on a decode worker.
def kv_transfer_field(body: dict, engine: LLMEngine) -> dict | None:
    value = typed(body, "kv_transfer", (dict,), None, "an object")
    if value is not None and engine.config.kv_transfer_dir is None:
        raise RequestError(
            "kv_transfer is only for the workers of a disaggregated deployment (serve --disaggregate); leave it out",
            "kv_transfer",
        )
    if value is not None and value.get("role") != "prefill" and not isinstance(value.get("kv_file"), str):
        raise RequestError(
            'kv_transfer must be {"role": "prefill"} or a prefill worker\'s kv_transfer answer (with its kv_file)',
            "kv_transfer",
        )
    return value


# ---- OpenAI response shapes -------------------------------------------------------------------
def usage(out: RequestOutput) -> dict:
    return {
        "prompt_tokens": out.num_prompt_tokens,
        "total_tokens": out.num_prompt_tokens + out.num_output_tokens,
        "completion_tokens": out.num_output_tokens,
        "prompt_tokens_details": {"cached_tokens": out.num_cached_tokens},
    }


def stream_choice(chat: bool, text: str, out: RequestOutput) -> dict:
    finish = (
        {"finish_reason": out.finish_reason, "stop_reason": out.stop_reason}
        if out.finished
        else {"finish_reason": None}
    )
    if chat:
        return {"index": 0, "delta": {"content": text}, "logprobs": None, **finish, "token_ids": None}
    return {
        "index": 0,
        "text": text,
        "logprobs": None,
        **finish,
        "stop_reason": out.stop_reason,
        "prompt_token_ids": None,
        "token_ids": None,
    }


def compact_json(payload) -> str:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


def sse(payload) -> bytes:
    return b"data: " + (payload if isinstance(payload, bytes) else compact_json(payload).encode()) + b"\n\n"


class TokenEvents:
    """SSE events of one request's stream. An unfinished output's event is the same bytes as sse() of its
    whole chunk, built once per request with a marker where the text goes, so a token encodes only its
    text (the stream's hot path: one event a token, for every stream, on the event loop)."""

    _MARKER = "\x00text\x00"

    def __init__(self, head: dict, chat: bool):
        self.head, self.chat = head, chat
        event = self.chunk_event(RequestOutput.unfinished(), self._MARKER)
        marker = compact_json(self._MARKER).encode()
        self._parts = event.split(marker) if event.count(marker) == 1 else None  # None: the marker is in head

    def chunk_event(self, out: RequestOutput, text: str, **extra) -> bytes:
        return sse({**self.head, "choices": [stream_choice(self.chat, text, out)], **extra})

    def token_event(self, out: RequestOutput) -> bytes:
        if self._parts is None or out.finished or out.stop_reason is not None:
            return self.chunk_event(out, out.new_text)
        return compact_json(out.new_text).encode().join(self._parts)


@dataclass(kw_only=True)
class StartedRequest:
    """A request the engine took: its stream, and how the client asked to be answered."""

    stream: RequestStream
    request_id: str
    streaming: bool
    include_usage: bool
    handoff: dict  # open_stream's disaggregation arguments (export_kv_to, handoff, handoff_timings)
    tools: ToolRequest | None = None  # a chat request whose answer may be a tool call (read by ToolCallReader)
    prompt_tokens: int = 0  # the prompt's length (the Messages API's message_start reports it before any token)


async def generate(request: web.Request, chat: bool) -> web.StreamResponse:
    engine_thread, served_name = request.app[ENGINE_THREAD_KEY], request.app[NAME_KEY]
    try:
        started = await start_request(request, engine_thread, served_name, chat)
    except RequestError as exc:
        return exc.response()
    head = {
        "id": started.request_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": served_name,
    }
    try:
        if not started.streaming:
            return await whole_response(started, head, chat)
        return await stream_response(request, started, head, chat)
    finally:
        started.stream.close()


async def start_request(
    request: web.Request, engine_thread: EngineThread, served_name: str, chat: bool, body: dict | None = None
) -> StartedRequest:
    """The request's body checked, its prompt tokenized and handed to the engine; RequestError names what is wrong.
    `body`: a chat body translated from another API's (native_engine/translated_chat.py); None: read from `request`."""
    engine = engine_thread.engine
    body = await read_json(request) if body is None else body
    check_model(body, request.app[NAMES_KEY])
    check_unsupported(body, chat)
    tools = request_tools(body) if chat else None
    kv_transfer = kv_transfer_field(body, engine)
    prompt_ids, prompt_field, handoff = await request_prompt(body, engine, chat, kv_transfer)
    params = sampling_params(
        body,
        len(prompt_ids),
        engine.max_model_len,
        None if chat else 16,
        prompt_field,
        engine.model_config.vocab_size,
    )
    params.grammar = await output_grammar(body, engine, tools)
    streaming = typed(body, "stream", (bool,), False, "true or false")
    include_usage = stream_options_include_usage(body)
    request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:16]}"
    if kv_transfer is not None and params.grammar is not None:
        raise RequestError(
            "kv_transfer: a constrained request (response_format, guided_*) is not handed off; "
            "send it whole to one worker",
            "kv_transfer",
        )
    if kv_transfer is not None and kv_transfer.get("role") == "prefill":
        params.max_tokens = 1  # the client's max_tokens was checked above; the decode worker runs the rest
        handoff["export_kv_to"] = os.path.join(engine.config.kv_transfer_dir, request_id + ".kv")
    try:
        stream = engine_thread.open_stream(request_id, prompt_ids, params, **handoff)
    except QueueFullError as exc:
        raise RequestError(f"{exc}; retry later", None, status=503, err_type="ServiceUnavailableError") from None
    return StartedRequest(
        stream=stream,
        request_id=request_id,
        streaming=streaming,
        include_usage=include_usage,
        handoff=handoff,
        prompt_tokens=len(prompt_ids),
        tools=tools if tools is not None and tools.choice != "none" else None,
    )


async def request_prompt(body: dict, engine: LLMEngine, chat: bool, kv_transfer: dict | None):
    """(prompt token ids, the field they came from, open_stream's handoff arguments): a decode worker's
    request brings its prompt tokenized, with its KV; any other is tokenized here (off the loop)."""
    if kv_transfer is not None and "kv_file" in kv_transfer:
        try:
            received, timings = receive_handoff(kv_transfer, engine.config.kv_transfer_dir, cache_shape(engine.runner))
        except KVTransferError as exc:
            raise RequestError(f"kv_transfer: {exc}", "kv_transfer") from None
        handoff = {"handoff": received, "handoff_timings": timings}
        return received.prompt_token_ids, "messages" if chat else "prompt", handoff
    if chat:
        return await off_loop(chat_prompt_ids, body, engine), "messages", {}
    return await off_loop(prompt_ids_of_completion, body, engine), "prompt", {}


async def whole_response(started: StartedRequest, head: dict, chat: bool) -> web.Response:
    """The finished request as one JSON answer (stream: false)."""
    text, last = "", None
    async for last in started.stream:
        text += last.new_text
    if last.finish_reason in ("abort", "error"):
        return RequestError(
            "the engine failed while running this request (its log says why)", None, 500, "InternalServerError"
        ).response()
    choice = {
        "index": 0,
        "logprobs": None,
        "finish_reason": last.finish_reason,
        "stop_reason": last.stop_reason,
    }
    if chat and started.tools is not None:
        reader = ToolCallReader(started.tools)
        reader.feed(text)
        reader.finish()
        choice["message"], choice["finish_reason"] = reader.message(), reader.finish_reason(last.finish_reason)
    elif chat:
        choice["message"] = {"role": "assistant", "content": text, "tool_calls": []}
    else:
        choice = {
            "index": 0,
            "text": text,
            **{k: v for k, v in choice.items() if k != "index"},
            "prompt_logprobs": None,
        }
    head["object"] = "chat.completion" if chat else "text_completion"
    if "export_kv_to" in started.handoff:  # a prefill worker's answer: where the KV is and what it cost
        head["kv_transfer"] = last.timings
    elif "handoff" in started.handoff:  # the coordinator reads the handoff's cost there (streams: last chunk)
        head["timings"] = last.timings
    return web.json_response(
        dumps=compact_json,
        data={**head, "choices": [choice], "usage": usage(last), "system_fingerprint": SYSTEM_FINGERPRINT},
    )


async def stream_response(request: web.Request, started: StartedRequest, head: dict, chat: bool) -> web.StreamResponse:
    """The request's outputs as server-sent events, as they come (stream: true)."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    if chat:
        first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        await response.write(sse({**head, "choices": [first], "prompt_token_ids": None, "prompt_text": None}))
    if started.tools is not None:
        await write_tool_call_events(response, started, head)
    else:
        await write_token_events(response, started, head, chat)
    await response.write(sse(b"[DONE]"))
    await response.write_eof()
    return response


def last_chunk_extra(started: StartedRequest, out: RequestOutput) -> dict:
    extra = {"timings": out.timings} if out.timings else {}  # like llama-server's: the engine's own account
    if not started.include_usage:
        extra["system_fingerprint"] = SYSTEM_FINGERPRINT
    return extra


async def write_usage_event(response: web.StreamResponse, started: StartedRequest, head: dict, out) -> None:
    if started.include_usage:
        await response.write(
            sse({**head, "choices": [], "usage": usage(out), "system_fingerprint": SYSTEM_FINGERPRINT})
        )


async def write_token_events(response: web.StreamResponse, started: StartedRequest, head: dict, chat: bool) -> None:
    """A text answer: one event a token with text, the last with finish_reason (then the usage)."""
    events = TokenEvents(head, chat)
    async for out in started.stream:
        if not out.new_text and not out.finished:
            continue  # a token whose text is held back (partial UTF-8 or a possible stop string)
        if not out.finished:
            await response.write(events.token_event(out))
            continue
        await response.write(events.chunk_event(out, out.new_text, **last_chunk_extra(started, out)))
        await write_usage_event(response, started, head, out)


async def write_tool_call_events(response: web.StreamResponse, started: StartedRequest, head: dict) -> None:
    """An answer that may be a tool call (tool_calls.py): content or tool_calls deltas as the reader releases
    them, the last event with finish_reason ("tool_calls" for a whole call), then the usage."""
    reader = ToolCallReader(started.tools)

    def event(delta: dict, finish: dict | None = None, **extra) -> bytes:
        choice = {
            "index": 0,
            "delta": delta,
            "logprobs": None,
            **(finish or {"finish_reason": None}),
            "token_ids": None,
        }
        return sse({**head, "choices": [choice], **extra})

    async for out in started.stream:
        deltas = reader.feed(out.new_text)
        if not out.finished:
            for delta in deltas:
                await response.write(event(delta))
            continue
        deltas += reader.finish()
        for delta in deltas[:-1]:
            await response.write(event(delta))
        finish = {"finish_reason": reader.finish_reason(out.finish_reason), "stop_reason": out.stop_reason}
        await response.write(event(deltas[-1] if deltas else {}, finish, **last_chunk_extra(started, out)))
        await write_usage_event(response, started, head, out)


async def completions(request: web.Request) -> web.StreamResponse:
    return await generate(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await generate(request, chat=True)


# ---- other APIs: embeddings, and the Responses and Messages APIs translated onto the chat path ----------------
async def embeddings(request: web.Request) -> web.Response:
    """POST /v1/embeddings (native_engine/embeddings.py): OpenAI's response shape, one vector per input in order."""
    engine = request.app[ENGINE_KEY]
    try:
        body = await read_json(request)
        check_model(body, request.app[NAMES_KEY])
        encoding_format = typed(body, "encoding_format", (str,), "float", "a string")
        if encoding_format not in ENCODING_FORMATS:
            raise RequestError(f"encoding_format must be float or base64, got {encoding_format!r}", "encoding_format")
        if body.get("dimensions") is not None:
            raise RequestError("dimensions is not supported: this model's embeddings have one size", "dimensions")
        if getattr(engine.runner, "weights", None) is None:
            raise RequestError(
                "embeddings are computed by the numpy runtime only; start the server with --runtime numpy",
                None,
                501,
                "NotImplementedError",
            )
        args = (body.get("input"), engine.tokenizer, engine.model_config.vocab_size, engine.max_model_len)
        items = await off_loop(input_token_ids, *args)
    except EmbeddingInputError as exc:
        return RequestError(str(exc), exc.param).response()
    except RequestError as exc:
        return exc.response()
    vectors = await request.app[EMBEDDER_KEY].embed(items)
    data = [
        {"object": "embedding", "index": i, "embedding": encoded(v, encoding_format)} for i, v in enumerate(vectors)
    ]
    tokens = sum(len(ids) for ids in items)
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    answer = {"object": "list", "data": data, "model": request.app[NAME_KEY], "usage": usage}
    return web.json_response(dumps=compact_json, data=answer)


async def rerank(request: web.Request) -> web.Response:
    """POST /v1/rerank (native_engine/rerank.py): vLLM's rerank answer, the documents best first."""
    engine = request.app[ENGINE_KEY]
    try:
        body = await read_json(request)
        check_model(body, request.app[NAMES_KEY])
        if getattr(engine.runner, "weights", None) is None:
            raise RequestError(
                "rerank scores are computed by the numpy runtime only; start the server with --runtime numpy",
                None,
                501,
                "NotImplementedError",
            )
        args = (body, engine.tokenizer, engine.model_config.vocab_size, engine.max_model_len)
        items, documents, top_n = await off_loop(rerank_items, *args)
    except EmbeddingInputError as exc:
        return RequestError(str(exc), exc.param).response()
    except RequestError as exc:
        return exc.response()
    vectors = await request.app[EMBEDDER_KEY].embed(items)
    answer = rerank_answer(request.app[NAME_KEY], vectors, documents, items, top_n)
    return web.json_response(dumps=compact_json, data=answer)


def translated_route(api):
    """The handler of an API translated onto the chat path (native_engine/translated_chat.py); `api` is its module
    (responses_api, messages_api): chat_body, NAMES, error_body and Answer (its events, or its whole object)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        engine_thread, served_name = request.app[ENGINE_THREAD_KEY], request.app[NAME_KEY]
        try:
            body = await read_json(request)
            started = await start_request(request, engine_thread, served_name, True, api.chat_body(body))
        except FieldError as exc:
            return api_error(api, exc.message, exc.param, 400, "BadRequestError")
        except RequestError as exc:
            return api_error(api, *renamed(exc.message, exc.param, api.NAMES), exc.status, exc.err_type)
        answer = api.Answer(served_name, started.prompt_tokens)
        try:
            if started.streaming:
                return await translated_stream(request, started, answer)
            text, last = "", None
            async for last in started.stream:
                text += last.new_text
            if last.finish_reason in ("abort", "error"):
                return api_error(api, "the engine failed while running this request", None, 500, "InternalServerError")
            return web.json_response(dumps=compact_json, data=answer.whole(text, last))
        finally:
            started.stream.close()

    return handle


def api_error(api, message: str, param: str | None, status: int, err_type: str) -> web.Response:
    headers = {"Retry-After": "1"} if status == 503 else None
    body = api.error_body(message, param, status, err_type)
    return web.json_response(dumps=compact_json, data=body, status=status, headers=headers)


async def translated_stream(request: web.Request, started: StartedRequest, answer) -> web.StreamResponse:
    """The answer's events as its tokens come: the opening ones at once, a delta per token with text, the closing."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    await response.write(answer.opening())
    text = ""
    async for out in started.stream:
        if out.new_text:
            text += out.new_text
            await response.write(answer.delta(out.new_text))
        if out.finished:
            await response.write(answer.closing(text, out))
    await response.write_eof()
    return response


# ---- other endpoints ------------------------------------------------------------------------
async def models(request: web.Request) -> web.Response:
    engine, name = request.app[ENGINE_KEY], request.app[NAME_KEY]
    return web.json_response(
        dumps=compact_json,
        data={
            "object": "list",
            "data": [
                {
                    "id": served,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "native_engine",
                    "root": name,
                    "parent": None,
                    "max_model_len": engine.max_model_len,
                }
                for served in request.app[NAMES_KEY]
            ],
        },
    )


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def tokenize(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    try:
        body = await read_json(request)
        check_model(body, request.app[NAMES_KEY])
        if "messages" in body:
            tokens = await off_loop(chat_prompt_ids, body, engine)
        elif isinstance(body.get("prompt"), str):
            check_text_fits(engine, len(body["prompt"]), "prompt")
            tokens = await off_loop(
                engine.tokenizer.encode, body["prompt"], body.get("add_special_tokens", True) is True
            )
        else:
            raise RequestError("prompt (a string) or messages is required", "prompt")
    except RequestError as exc:
        return exc.response()
    return web.json_response(
        dumps=compact_json,
        data={"count": len(tokens), "max_model_len": engine.max_model_len, "tokens": tokens, "token_strs": None},
    )


async def detokenize(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    try:
        body = await read_json(request)
        check_model(body, request.app[NAMES_KEY])
        tokens = body.get("tokens")
        if not is_token_list(tokens) or any(t < 0 or t >= engine.model_config.vocab_size for t in tokens):
            raise RequestError(f"tokens must be a list of token ids in [0, {engine.model_config.vocab_size})", "tokens")
    except RequestError as exc:
        return exc.response()
    return web.json_response(dumps=compact_json, data={"prompt": engine.tokenizer.decode(tokens)})


async def step_trace(request: web.Request) -> web.Response:
    trace = request.app[ENGINE_KEY].step_trace
    if trace is None:
        return RequestError(
            "the step trace is off; start the server with --step-trace", None, 404, "NotFoundError"
        ).response()
    return web.json_response(dumps=compact_json, data=trace.as_dict())


async def reset_prefix_cache(request: web.Request) -> web.Response:
    """vLLM's route: forget the cached prefixes (done before the engine's next step), e.g. between two
    benchmark points, so the second does not start warm."""
    request.app[ENGINE_KEY].reset_prefix_cache()
    return web.Response(status=200)


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[ENGINE_KEY].metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})


def build_app(engine: LLMEngine) -> web.Application:
    """The app starts the engine thread on startup and stops it on cleanup."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    engine_thread = EngineThread(engine)
    app[ENGINE_KEY], app[ENGINE_THREAD_KEY] = engine, engine_thread
    app[NAME_KEY] = engine.config.served_model_name
    app[NAMES_KEY] = engine.config.served_model_names()

    async def start_engine(app):
        engine_thread.start(asyncio.get_running_loop())

    async def stop_engine(app):
        engine_thread.stop()

    app.on_startup.append(start_engine)
    app.on_cleanup.append(stop_engine)
    app[EMBEDDER_KEY] = embedder = Embedder(engine.runner)

    async def stop_embedder(app):
        embedder.close()

    app.on_cleanup.append(stop_embedder)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/step_trace", step_trace)
    app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
    app.router.add_post("/v1/embeddings", embeddings)
    for path in ("/v1/rerank", "/rerank"):  # vLLM serves both
        app.router.add_post(path, rerank)
    app.router.add_post("/v1/responses", translated_route(responses_api))
    app.router.add_post("/v1/messages", translated_route(messages_api))
    return app


async def start_server(
    engine: LLMEngine,
    host: str = "127.0.0.1",
    port: int = 0,
    idle_connection_timeout_s: float = IDLE_CONNECTION_TIMEOUT_S,
    shutdown_grace_s: float = SHUTDOWN_GRACE_S,
    head_timeout_s: float = HEAD_TIMEOUT_S,
) -> tuple[web.AppRunner, int]:
    """Serve in the running loop; returns the runner (await runner.cleanup() to stop) and the bound port.
    runner.cleanup() stops listening at once, gives the requests in flight shutdown_grace_s to finish, then
    cancels the rest (each aborts its engine request; its client sees the stream cut): draining_runner.py."""
    # handler_cancellation: a client that disconnects cancels its handler, whose finally aborts the request.
    # auto_decompress off: read_json undoes Content-Encoding (content_encoding.py): a body that lies gets a 400.
    runner = DrainingRunner(
        build_app(engine),
        grace_s=shutdown_grace_s,
        handler_cancellation=True,
        auto_decompress=False,
        access_log=None,
        keepalive_timeout=idle_connection_timeout_s,
    )
    await runner.setup()
    use_head_deadline(runner, head_timeout_s)
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]
