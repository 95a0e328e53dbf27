"""`bench probe URL`: how much of the OpenAI API an endpoint really serves (Q11 of the README's questions).

Each check sends one small request (at most 32 output tokens, greedy where the answer is compared) and
judges what came back. A verdict is PASS (the feature works as OpenAI's API defines it), UNSUPPORTED (the
server refused it with an HTTP 4xx or 501: code that uses it gets a clear error) or FAIL (no answer, a
server error, or an answer that breaks the API: a field ignored, a stop string sent back, a broken stream).
The evidence says what came back. `/tokenize`, `/metrics` and their shapes are not OpenAI's; their rows say
which engine family they look like (vLLM's `{count, tokens}` or llama.cpp's `{tokens}`; metric prefixes).
Each answer is read into a small model of the shape the API defines (`ApiShape`, strict types): a body that
does not fit reads as the empty shape, so the check says what is missing.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from backends.api_dialects import DIALECTS
from backends.http import request
from backends.openai import StreamError

PASS, FAIL, UNSUPPORTED = "PASS", "FAIL", "UNSUPPORTED"
COUNTING_PROMPT = "Count from 1 to 30: 1, 2, 3, 4,"
METRIC_FAMILIES = ("vllm:", "sglang:", "llamacpp:", "native:", "trtllm_")
BOOLEAN_SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@dataclass
class Row:
    check: str
    verdict: str
    evidence: str


class ProbeDocument(BaseModel):
    """probe.json: the endpoint, the model probed, the metric family and every row."""

    url: str = Field(description="the endpoint's base URL, without a trailing /")
    model: str | None = Field(description="the model the checks named: --model, else /v1/models' first")
    metric_family: str | None = Field(
        description="vllm, sglang, llamacpp, native or trtllm: the engine /metrics' names look like; null if none"
    )
    rows: list[Row] = Field(description="one per check, in the table's order: check, verdict, evidence")


Shape = TypeVar("Shape", bound="ApiShape")


class ApiShape(BaseModel):
    """A part of an answer as the API defines it: strict types (a count is an int, a text a string), other keys
    ignored."""

    model_config = ConfigDict(strict=True, extra="ignore")

    @classmethod
    def read(cls: type[Shape], obj: Any) -> Shape:
        """`obj` (parsed JSON) read as this shape; the empty shape when it is not one (the check then finds what is
        missing)."""
        try:
            return cls.model_validate(obj)
        except ValidationError:
            return cls()


class FunctionCall(ApiShape):
    name: str | None = None
    arguments: str | None = None  # a JSON object, as text


class ToolCall(ApiShape):
    function: FunctionCall | None = None


class Message(ApiShape):
    """A chat choice's message, or a streamed chat chunk's delta."""

    content: str | None = None
    tool_calls: list[ToolCall] | None = None


class Choice(ApiShape):
    index: int | None = None
    text: str | None = None  # /v1/completions
    message: Message | None = None  # /v1/chat/completions
    delta: Message | None = None  # a chunk of a streamed chat answer
    finish_reason: str | None = None


class Usage(ApiShape):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class Completion(ApiShape):
    """A /v1/completions or /v1/chat/completions answer, or one chunk of its stream."""

    choices: list[Choice] = []
    usage: Usage | None = None

    def texts(self, api: str, stream: bool = False) -> list[str | None]:
        """Each choice's text: `text` (completions), `message.content` (chat) or `delta.content` (a chat chunk)."""
        if api == "completions":
            return [c.text for c in self.choices]
        parts = [c.delta if stream else c.message for c in self.choices]
        return [part.content if part else None for part in parts]

    def first_text(self, api: str) -> str:
        """The first choice's text, "" when there is none."""
        return (self.texts(api) or [""])[0] or ""

    def first_message(self) -> Message:
        return (self.choices[0].message if self.choices else None) or Message()

    @property
    def finish_reason(self) -> str | None:
        return self.choices[0].finish_reason if self.choices else None

    @property
    def completion_tokens(self) -> int | None:
        return self.usage.completion_tokens if self.usage else None


class ModelCard(ApiShape):
    id: str


class ModelList(ApiShape):
    """/v1/models' answer."""

    data: list[ModelCard] = []


class Tokenized(ApiShape):
    """/tokenize's answer: vLLM's {count, max_model_len, tokens, ...} or llama.cpp's {tokens}."""

    tokens: list[int] = []


class ErrorDetail(ApiShape):
    message: str | None = None


class ErrorAnswer(ApiShape):
    """An error body: OpenAI's {"error": {"message": ...}}, or {"error": "text"}."""

    error: ErrorDetail | str | None = None


class BooleanAnswer(BaseModel):
    """An answer that fits BOOLEAN_SCHEMA: {"ok": true or false} and nothing else."""

    model_config = ConfigDict(strict=True, extra="forbid")
    ok: bool


@dataclass
class Stream:
    """An SSE body: each `data:` JSON object as a chunk, and whether `data: [DONE]` came."""

    chunks: list[Completion]
    done: bool


class Answer:
    """One HTTP exchange: the status (None: no answer), the body and its JSON (None if not JSON)."""

    def __init__(self, status: int | None, body: bytes, error: str = ""):
        self.status, self.body, self.error = status, body, error
        try:
            self.json = json.loads(body) if body else None
        except ValueError:
            self.json = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    def refusal(self) -> Row | None:
        """The row for an answer that is not a 2xx (None for a 2xx): 4xx and 501 refuse, the rest fail."""
        if self.ok:
            return None
        if self.status is None:
            return Row("", FAIL, f"no answer: {self.error}")
        verdict = UNSUPPORTED if 400 <= self.status < 500 or self.status == 501 else FAIL
        return Row("", verdict, f"HTTP {self.status}: {self.message()}")

    def message(self) -> str:
        """The server's error message, else the body."""
        error = ErrorAnswer.read(self.json).error
        text = error.message if isinstance(error, ErrorDetail) else error
        return short(text or self.body.decode(errors="replace"))


def short(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Prober:
    """The checks against one endpoint; `run()` returns the rows in the table's order."""

    def __init__(self, url: str, model: str | None = None, timeout_s: float = 60.0, headers: dict | None = None):
        self.url, self.model, self.timeout_s, self.headers = url.rstrip("/"), model, timeout_s, headers or {}
        self.text_api = "completions"  # where stop, max_tokens and n are tried: chat if completions is refused
        self.metric_family: str | None = None  # vllm, sglang, llamacpp, native, trtllm: what /metrics looked like

    def send(self, path: str, body: dict | None = None) -> Answer:
        try:
            status, data = request(self.url + path, body, self.headers, self.timeout_s)
        except OSError as e:
            return Answer(None, b"", f"{type(e).__name__}: {getattr(e, 'reason', e)} (timeout {self.timeout_s:g} s)")
        return Answer(status, data)

    def generate(self, api: str, max_tokens: int, **extra) -> Answer:
        body = {"model": self.model, "max_tokens": max_tokens, **extra}
        if api == "chat":
            body.setdefault("messages", [{"role": "user", "content": COUNTING_PROMPT}])
            return self.send("/v1/chat/completions", body)
        return self.send("/v1/completions", {"prompt": COUNTING_PROMPT, **body})

    def run(self) -> list[Row]:
        rows = [self.models()]
        for check in (
            self.chat,
            self.completions,
            self.streaming,
            self.stream_usage,
            self.stop_strings,
            self.max_tokens,
            self.n_choices,
            self.json_mode,
            self.tool_calls,
            self.tokenize,
            self.metrics,
        ):
            rows.append(check())
        rows += [self.other_api(api) for api in DIALECTS]
        return rows

    # ---- the checks, one row each ----------------------------------------------------------------
    def models(self) -> Row:
        answer = self.send("/v1/models")
        row = _named("/v1/models", answer.refusal())
        if row:
            return row
        ids = [card.id for card in ModelList.read(answer.json).data]
        if not ids:
            return Row("/v1/models", FAIL, f"200 without a data list of models: {short(answer.body.decode())}")
        self.model = self.model or ids[0]
        return Row("/v1/models", PASS, f"models: {', '.join(ids[:4])}")

    def chat(self) -> Row:
        return self._plain("chat completions", "chat")

    def completions(self) -> Row:
        row = self._plain("completions", "completions")
        if row.verdict != PASS:
            self.text_api = "chat"
        return row

    def _plain(self, check: str, api: str) -> Row:
        answer = self.generate(api, 8, temperature=0)
        row = _named(check, answer.refusal())
        if row:
            return row
        completion = Completion.read(answer.json)
        texts = completion.texts(api)
        if not texts or texts[0] is None:
            return Row(check, FAIL, f"200 without choices[0] text: {short(answer.body.decode())}")
        tokens = "missing" if completion.completion_tokens is None else completion.completion_tokens
        return Row(check, PASS, f"finish_reason {completion.finish_reason}, usage {tokens} tokens: {texts[0]!r}")

    def streaming(self) -> Row:
        answer = self.generate("chat", 8, temperature=0, stream=True)
        row = _named("streaming", answer.refusal())
        if row:
            return row
        stream = read_stream(answer.body)
        pieces = [t for chunk in stream.chunks for t in chunk.texts("chat", stream=True) if t]
        if not pieces or not stream.done:
            return Row("streaming", FAIL, f"not an SSE stream ending in [DONE]: {short(answer.body.decode())}")
        unasked = any(chunk.usage for chunk in stream.chunks)
        return Row(
            "streaming",
            PASS,
            f"{len(stream.chunks)} chunks, {len(pieces)} with text, then [DONE]"
            + ("; usage sent without stream_options" if unasked else ""),
        )

    def stream_usage(self) -> Row:
        answer = self.generate(self.text_api, 8, temperature=0, stream=True, stream_options={"include_usage": True})
        row = _named("usage in the stream", answer.refusal())
        if row:
            return row
        usages = [chunk.usage for chunk in read_stream(answer.body).chunks if chunk.usage]
        if not usages or usages[-1].completion_tokens is None:
            return Row("usage in the stream", FAIL, "include_usage asked, no chunk carried usage.completion_tokens")
        last = usages[-1]
        return Row(
            "usage in the stream",
            PASS,
            f"prompt_tokens {last.prompt_tokens}, completion_tokens {last.completion_tokens}",
        )

    def stop_strings(self) -> Row:
        """The greedy answer without a stop string, then with one taken from its middle: the second must be
        the first cut just before that string's first occurrence, the string itself left out."""
        check = "stop strings"
        reference = self.generate(self.text_api, 16, temperature=0)
        row = _named(check, reference.refusal())
        if row:
            return row
        full = Completion.read(reference.json).first_text(self.text_api)
        stop = pick_stop(full)
        if stop is None:
            return Row(check, FAIL, f"cannot test: the greedy answer {full!r} has no 2 characters to stop at")
        stopped = self.generate(self.text_api, 16, temperature=0, stop=[stop])
        row = _named(check, stopped.refusal())
        if row:
            return row
        got = Completion.read(stopped.json).first_text(self.text_api)
        expected = full[: full.index(stop)]
        seen = f"stop {stop!r}: {got!r} (without it: {full!r})"
        if got == expected:
            return Row(check, PASS, seen)
        if stop in got:
            return Row(check, FAIL, f"the stop string came back in the text; {seen}")
        return Row(check, FAIL, f"not cut where the stop string begins; {seen}")

    def max_tokens(self) -> Row:
        answer = self.generate(self.text_api, 5, temperature=0)
        row = _named("max_tokens", answer.refusal())
        if row:
            return row
        completion = Completion.read(answer.json)
        count, finish = completion.completion_tokens, completion.finish_reason
        seen = f"max_tokens 5: {count} tokens, finish_reason {finish}"
        if count is None:
            return Row("max_tokens", FAIL, f"no usage.completion_tokens to count: {short(answer.body.decode())}")
        if count == 5 and finish == "length" or count < 5 and finish == "stop":
            return Row("max_tokens", PASS, seen)
        return Row("max_tokens", FAIL, seen)

    def n_choices(self) -> Row:
        answer = self.generate(self.text_api, 4, n=2, temperature=1.0, seed=0)
        row = _named("n > 1", answer.refusal())
        if row:
            return row
        indices = sorted(c.index for c in Completion.read(answer.json).choices if c.index is not None)
        if indices == [0, 1]:
            return Row("n > 1", PASS, "n 2: choices 0 and 1")
        return Row("n > 1", FAIL, f"n 2 answered with choices {indices}: n was ignored")

    def json_mode(self) -> Row:
        check = "JSON mode (response_format)"
        schema = {"type": "json_schema", "json_schema": {"name": "probe", "schema": BOOLEAN_SCHEMA}}
        messages = [{"role": "user", "content": "Is the sky blue? Answer in JSON."}]
        answer = self.generate("chat", 32, temperature=0, messages=messages, response_format=schema)
        row = _named(check, answer.refusal())
        if row:
            return row
        content = (Completion.read(answer.json).texts("chat") or [None])[0]
        try:
            obj = json.loads(content)
        except (TypeError, ValueError):
            return Row(check, FAIL, f"json_schema asked, not JSON back: {content!r}")
        try:
            BooleanAnswer.model_validate(obj)
        except ValidationError:
            return Row(check, FAIL, f"JSON that breaks the schema {{ok: boolean}}: {content!r}")
        return Row(check, PASS, f"json_schema {{ok: boolean}}: {content!r}")

    def tool_calls(self) -> Row:
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]
        answer = self.generate(
            "chat", 32, temperature=0, messages=messages, tools=[WEATHER_TOOL], tool_choice="required"
        )
        row = _named("tool calls", answer.refusal())
        if row:
            return row
        message = Completion.read(answer.json).first_message()
        if not message.tool_calls:
            return Row("tool calls", FAIL, f"tool_choice required, no tool_calls: content {message.content!r}")
        function = message.tool_calls[0].function or FunctionCall()
        try:
            arguments = json.loads(function.arguments or "")
        except ValueError:
            arguments = None
        seen = f"{function.name}({function.arguments})"
        if function.name == "get_weather" and isinstance(arguments, dict):
            return Row("tool calls", PASS, f"tool_calls: {seen}")
        return Row("tool calls", FAIL, f"a tool call that is not get_weather with JSON arguments: {seen}")

    def tokenize(self) -> Row:
        """vLLM's (and SGLang's, the native engine's) body first, then llama.cpp's."""
        tried = []
        for dialect, body in (
            ("vLLM", {"model": self.model, "prompt": "Hello world"}),
            ("llama.cpp", {"content": "Hello world"}),
        ):
            answer = self.send("/tokenize", body)
            tokens = Tokenized.read(answer.json).tokens
            if answer.ok and tokens:
                keys = ", ".join(sorted(answer.json))  # the shape: vLLM's keys or llama.cpp's
                return Row("/tokenize", PASS, f"{dialect} shape: {keys}; 'Hello world' is {len(tokens)} tokens")
            tried.append(f"{dialect} body: HTTP {answer.status}" + (f" {answer.message()}" if not answer.ok else ""))
        refused = all(a.startswith(("vLLM body: HTTP 4", "llama.cpp body: HTTP 4")) for a in tried)
        return Row("/tokenize", UNSUPPORTED if refused else FAIL, "; ".join(tried))

    def metrics(self) -> Row:
        for path in ("/metrics", "/prometheus/metrics"):  # the second is TensorRT-LLM's
            answer = self.send(path)
            names = metric_names(answer.body.decode(errors="replace")) if answer.ok else []
            if names:
                self.metric_family = metric_family(names)
                return Row("/metrics", PASS, metric_family_text(names, path))
        return _named("/metrics", answer.refusal()) or Row("/metrics", FAIL, "200 without Prometheus lines")

    def other_api(self, api: str) -> Row:
        """/v1/embeddings, /v1/rerank, /v1/responses, /v1/messages: one request built and read as `bench run` builds
        and reads it with that backend.api (backends/api_dialects.py), so a PASS here is an API a run can drive."""
        dialect = DIALECTS[api]
        answer = self.send(dialect.path, dialect.build(self.model, 8, COUNTING_PROMPT, None, False))
        row = _named(dialect.path, answer.refusal())
        if row:
            return row
        try:
            parsed = dialect.parse([answer.body], [0])
        except StreamError as e:
            return Row(dialect.path, FAIL, f"{e.reason}: {short(e.detail)}")
        if parsed.embedded_items is not None:  # embeddings: vectors; rerank: documents scored
            items = (
                f"{parsed.embedded_items} vector(s) of {parsed.embedding_dims} numbers"
                if parsed.embedding_dims is not None
                else f"{parsed.embedded_items} documents scored"
            )
            return Row(dialect.path, PASS, f"{items}, usage {parsed.usage_prompt_tokens} prompt tokens")
        if not parsed.token_times_ns:
            return Row(dialect.path, FAIL, f"a stream with no text: {short(answer.body.decode(errors='replace'))}")
        return Row(
            dialect.path,
            PASS,
            f"{len(parsed.token_times_ns)} text events, usage {parsed.usage_completion_tokens} tokens, finish "
            f"{parsed.finish_reason}: {parsed.text!r}",
        )


def _named(check: str, row: Row | None) -> Row | None:
    if row is not None:
        row.check = check
    return row


def read_stream(body: bytes) -> Stream:
    """An SSE body's `data:` payloads: each JSON object read as a chunk (other payloads skipped), and [DONE]."""
    stream = Stream(chunks=[], done=False)
    for line in body.decode(errors="replace").splitlines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            stream.done = True
            continue
        try:
            obj = json.loads(payload)
        except ValueError:
            continue
        if isinstance(obj, dict):
            stream.chunks.append(Completion.read(obj))
    return stream


def pick_stop(text: str) -> str | None:
    """Two characters from the middle of `text` that occur there first, not starting with a space (tokenizers
    glue spaces on to the next word)."""
    for start in range(len(text) // 2, len(text) - 1):
        candidate = text[start : start + 2]
        if not candidate[0].isspace() and text.index(candidate) == start:  # its first occurrence: a cut mid-text
            return candidate
    return None


def metric_names(page: str) -> list[str]:
    names = []
    for line in page.splitlines():
        if line and not line.startswith("#"):
            names.append(line.split("{")[0].split(" ")[0])
    return sorted(set(names))


def metric_family(names: list[str]) -> str | None:
    counts = Counter(prefix for name in names for prefix in METRIC_FAMILIES if name.startswith(prefix))
    return counts.most_common(1)[0][0].rstrip(":_") if counts else None


def metric_family_text(names: list[str], path: str) -> str:
    family = metric_family(names)
    own = [n for n in names if family and n.startswith(family)]
    plain = [n for n in own or names if not n.endswith(("_bucket", "_count", "_sum", "_created"))]
    shown = ", ".join((plain or own or names)[:3])
    where = "" if path == "/metrics" else f" at {path}"
    if family is None:
        return f"{len(names)} names{where}, no known engine prefix: {shown}"
    return f"{family} names{where} ({len(own)} of {len(names)}): {shown}"


def probe_document(prober: Prober, rows: list[Row]) -> ProbeDocument:
    """probe.json's content."""
    return ProbeDocument(url=prober.url, model=prober.model, metric_family=prober.metric_family, rows=rows)
