"""`bench probe URL`: how much of the OpenAI API an endpoint really serves (Q11 of the README's questions).

Each check sends one small request (at most 32 output tokens, greedy where the answer is compared) and
judges what came back. A verdict is PASS (the feature works as OpenAI's API defines it), UNSUPPORTED (the
server refused it with an HTTP 4xx or 501: code that uses it gets a clear error) or FAIL (no answer, a
server error, or an answer that breaks the API: a field ignored, a stop string sent back, a broken stream).
The evidence says what came back. `/tokenize`, `/metrics` and their shapes are not OpenAI's; their rows say
which engine family they look like (vLLM's `{count, tokens}` or llama.cpp's `{tokens}`; metric prefixes).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass

from backends.http import request

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
        error = (self.json or {}).get("error") if isinstance(self.json, dict) else None
        text = error.get("message", error) if isinstance(error, dict) else error or self.body.decode(errors="replace")
        return short(str(text))


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
        return rows

    # ---- the checks, one row each ----------------------------------------------------------------
    def models(self) -> Row:
        answer = self.send("/v1/models")
        row = _named("/v1/models", answer.refusal())
        if row:
            return row
        ids = [m.get("id") for m in (answer.json or {}).get("data") or [] if isinstance(m, dict)]
        if not ids:
            return Row("/v1/models", FAIL, f"200 without a data list of models: {short(answer.body.decode())}")
        self.model = self.model or ids[0]
        return Row("/v1/models", PASS, f"models: {', '.join(map(str, ids[:4]))}")

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
        texts = choice_texts(answer.json, api)
        usage = (answer.json or {}).get("usage") or {}
        if not texts or not isinstance(texts[0], str):
            return Row(check, FAIL, f"200 without choices[0] text: {short(answer.body.decode())}")
        return Row(
            check,
            PASS,
            f"finish_reason {answer.json['choices'][0].get('finish_reason')}, "
            f"usage {usage.get('completion_tokens', 'missing')} tokens: {texts[0]!r}",
        )

    def streaming(self) -> Row:
        answer = self.generate("chat", 8, temperature=0, stream=True)
        row = _named("streaming", answer.refusal())
        if row:
            return row
        events = sse_events(answer.body)
        chunks = [e for e in events if isinstance(e, dict)]
        pieces = [t for e in chunks for t in choice_texts(e, "chat", stream=True) if t]
        if not pieces or "[DONE]" not in events:
            return Row("streaming", FAIL, f"not an SSE stream ending in [DONE]: {short(answer.body.decode())}")
        unasked = any(e.get("usage") for e in chunks)
        return Row(
            "streaming",
            PASS,
            f"{len(chunks)} chunks, {len(pieces)} with text, then [DONE]"
            + ("; usage sent without stream_options" if unasked else ""),
        )

    def stream_usage(self) -> Row:
        answer = self.generate(self.text_api, 8, temperature=0, stream=True, stream_options={"include_usage": True})
        row = _named("usage in the stream", answer.refusal())
        if row:
            return row
        usage = [e["usage"] for e in sse_events(answer.body) if isinstance(e, dict) and e.get("usage")]
        if not usage or not isinstance(usage[-1].get("completion_tokens"), int):
            return Row("usage in the stream", FAIL, "include_usage asked, no chunk carried usage.completion_tokens")
        last = usage[-1]
        return Row(
            "usage in the stream",
            PASS,
            f"prompt_tokens {last.get('prompt_tokens')}, completion_tokens {last['completion_tokens']}",
        )

    def stop_strings(self) -> Row:
        """The greedy answer without a stop string, then with one taken from its middle: the second must be
        the first cut just before that string's first occurrence, the string itself left out."""
        check = "stop strings"
        reference = self.generate(self.text_api, 16, temperature=0)
        row = _named(check, reference.refusal())
        if row:
            return row
        full = (choice_texts(reference.json, self.text_api) or [""])[0] or ""
        stop = pick_stop(full)
        if stop is None:
            return Row(check, FAIL, f"cannot test: the greedy answer {full!r} has no 2 characters to stop at")
        stopped = self.generate(self.text_api, 16, temperature=0, stop=[stop])
        row = _named(check, stopped.refusal())
        if row:
            return row
        got = (choice_texts(stopped.json, self.text_api) or [""])[0] or ""
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
        usage = (answer.json or {}).get("usage") or {}
        count, finish = usage.get("completion_tokens"), ((answer.json or {}).get("choices") or [{}])[0]
        finish = finish.get("finish_reason")
        seen = f"max_tokens 5: {count} tokens, finish_reason {finish}"
        if not isinstance(count, int):
            return Row("max_tokens", FAIL, f"no usage.completion_tokens to count: {short(answer.body.decode())}")
        if count == 5 and finish == "length" or count < 5 and finish == "stop":
            return Row("max_tokens", PASS, seen)
        return Row("max_tokens", FAIL, seen)

    def n_choices(self) -> Row:
        answer = self.generate(self.text_api, 4, n=2, temperature=1.0, seed=0)
        row = _named("n > 1", answer.refusal())
        if row:
            return row
        indices = sorted(c.get("index") for c in (answer.json or {}).get("choices") or [])
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
        content = (choice_texts(answer.json, "chat") or [None])[0]
        try:
            obj = json.loads(content)
        except (TypeError, ValueError):
            return Row(check, FAIL, f"json_schema asked, not JSON back: {content!r}")
        if isinstance(obj, dict) and set(obj) == {"ok"} and isinstance(obj["ok"], bool):
            return Row(check, PASS, f"json_schema {{ok: boolean}}: {content!r}")
        return Row(check, FAIL, f"JSON that breaks the schema {{ok: boolean}}: {content!r}")

    def tool_calls(self) -> Row:
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]
        answer = self.generate(
            "chat", 32, temperature=0, messages=messages, tools=[WEATHER_TOOL], tool_choice="required"
        )
        row = _named("tool calls", answer.refusal())
        if row:
            return row
        message = (((answer.json or {}).get("choices") or [{}])[0]).get("message") or {}
        calls = message.get("tool_calls") or []
        if not calls:
            return Row("tool calls", FAIL, f"tool_choice required, no tool_calls: content {message.get('content')!r}")
        function = calls[0].get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "")
        except ValueError:
            arguments = None
        seen = f"{function.get('name')}({function.get('arguments')})"
        if function.get("name") == "get_weather" and isinstance(arguments, dict):
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
            tokens = (answer.json or {}).get("tokens") if isinstance(answer.json, dict) else None
            if answer.ok and tokens and all(isinstance(t, int) for t in tokens):
                keys = ", ".join(sorted(answer.json))
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


def _named(check: str, row: Row | None) -> Row | None:
    if row is not None:
        row.check = check
    return row


def choice_texts(obj, api: str, stream: bool = False) -> list:
    """Each choice's text: `text` (completions), `message.content` (chat) or `delta.content` (a chat chunk)."""
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if not isinstance(choices, list):
        return []
    if api == "completions":
        return [c.get("text") for c in choices if isinstance(c, dict)]
    part = "delta" if stream else "message"
    return [(c.get(part) or {}).get("content") for c in choices if isinstance(c, dict)]


def sse_events(body: bytes) -> list:
    """The `data:` payloads of an SSE body: JSON objects, and the string "[DONE]"."""
    events = []
    for line in body.decode(errors="replace").splitlines():
        if line.startswith("data:"):
            payload = line[5:].strip()
            try:
                events.append(payload if payload == "[DONE]" else json.loads(payload))
            except ValueError:
                events.append(payload)
    return events


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


def probe_document(prober: Prober, rows: list[Row]) -> dict:
    """probe.json: the endpoint, the model probed, the metric family and every row."""
    return {
        "url": prober.url,
        "model": prober.model,
        "metric_family": prober.metric_family,
        "rows": [asdict(r) for r in rows],
    }
