"""Tool calls in the built-in engine (native_engine/tool_calls.py): tool_choice "required" or a named function
constrains the answer to one call whose arguments validate against the tool's schema, streamed and whole in
OpenAI's and vLLM's shapes; "auto" lets the grammar take text or a call; a history of calls and results is
rendered into the prompt; bad tools, choices and tool messages get 400s naming the field; the harness's stream
parser times a tool-call answer from its first tool_calls delta.

SmolLM2-135M on loopback, greedy, short answers: the point is the constrained path and the wire format.
"""

import json

import jsonschema
import pytest
from test_api_endpoints import LiveServer

from backends.openai import StreamError, parse_sse
from native_engine.tool_calls import ToolCallReader, call_text, tool_grammar, tool_request

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
CLOCK = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Forecast", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": CLOCK}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": CLOCK}
ASK = [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'},
}
HISTORY = [
    *ASK,
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'},
    {"role": "user", "content": "And the time there?"},
]
NAMED = {"type": "function", "function": {"name": "get_time"}}


@pytest.fixture(scope="module")
def served():
    server = LiveServer()
    yield server
    server.close()


def chat(served, stream: bool = False, **fields):
    body = {"messages": ASK, "tools": TOOLS, "max_tokens": 48, "temperature": 0, "stream": stream, **fields}
    if stream:
        body["stream_options"] = {"include_usage": True}
    status, reads = served.post("/v1/chat/completions", body)
    raw = b"".join(reads)
    if not stream or status != 200:
        return status, json.loads(raw)
    data = [block.removeprefix("data: ") for block in raw.decode().split("\n\n") if block.strip()]
    assert data[-1] == "[DONE]"
    return status, [json.loads(d) for d in data[:-1]]


def assert_valid_call(call: dict, names: set[str]) -> None:
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] in names
    jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])


@pytest.mark.parametrize("choice", ["required", NAMED], ids=["required", "named"])
def test_required_and_named_choices_give_one_valid_call_streamed_and_whole_alike(served, choice):
    names = {"get_time"} if choice == NAMED else {"get_weather", "get_time"}
    status, answer = chat(served, tool_choice=choice)
    assert status == 200, answer
    choice0 = answer["choices"][0]
    message = choice0["message"]
    assert choice0["finish_reason"] == "tool_calls" and message["content"] is None and len(message["tool_calls"]) == 1
    assert_valid_call(message["tool_calls"][0], names)
    assert answer["usage"]["completion_tokens"] > 0

    status, chunks = chat(served, stream=True, tool_choice=choice)
    assert status == 200
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    calls = [d["tool_calls"][0] for d in deltas if d.get("tool_calls")]
    header, fragments = calls[0], calls[1:]
    # vLLM's shape: the header once (id, type, name, arguments ""), then arguments alone, all at index 0
    assert header["function"]["arguments"] == "" and header["index"] == 0
    assert all(set(f) == {"index", "function"} and set(f["function"]) == {"arguments"} for f in fragments)
    assert not any(d.get("content") for d in deltas)
    whole = {
        **header,
        "function": {**header["function"], "arguments": "".join(f["function"]["arguments"] for f in fragments)},
    }
    assert_valid_call({k: v for k, v in whole.items() if k != "index"}, names)
    assert set(whole) - {"index"} == set(message["tool_calls"][0])  # same keys streamed as whole
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "tool_calls" and not any(finishes[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0

    # the harness reads it: the header is the first token (TTFT), each fragment a token, no answer text
    reads = [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]
    parsed = parse_sse(reads, list(range(len(reads))))
    header_event = next(i for i, c in enumerate(chunks) if c["choices"] and c["choices"][0]["delta"].get("tool_calls"))
    assert parsed.token_times_ns[0] == header_event and parsed.first_answer_chunk == 0
    assert len(parsed.token_times_ns) == len(calls) and parsed.finish_reason == "tool_calls"
    assert parsed.text == f"{whole['function']['name']}({whole['function']['arguments']})"  # not an empty answer


def test_auto_answers_text_or_a_valid_call_and_its_grammar_refuses_a_broken_call(served):
    status, answer = chat(served, tool_choice="auto", max_tokens=8)
    assert status == 200
    message = answer["choices"][0]["message"]
    if message["tool_calls"]:
        assert_valid_call(message["tool_calls"][0], set(SCHEMAS))
    else:
        assert isinstance(message["content"], str) and answer["choices"][0]["finish_reason"] in ("stop", "length")
    # the grammar itself: text may not open a call it does not finish; a whole call is accepted
    tokenizer, guided = served.engine.tokenizer, served.engine.guided
    grammar = tool_grammar(tool_request({"tools": TOOLS, "tool_choice": "auto"}))
    for text, ok in [
        ("Sunny, I think.", True),
        ("<tool_call>Sunny", False),
        (call_text("get_time", '{"zone": "UTC"}'), True),
    ]:
        matcher = guided.matcher(grammar)
        assert matcher.consume_tokens(tokenizer.encode(text)) == ok, text


def test_the_reader_streams_text_calls_and_holds_back_the_closing_tag():
    request = tool_request({"tools": TOOLS, "tool_choice": "auto"})
    reader = ToolCallReader(request)
    text = call_text("get_weather", '{"city": "Oslo", "days": 2}')
    deltas = [d for i in range(0, len(text), 5) for d in reader.feed(text[i : i + 5])] + reader.finish()
    assert deltas[0]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ""}
    assert "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas[1:]) == '{"city": "Oslo", "days": 2}'
    assert reader.finish_reason("stop") == "tool_calls"
    reader = ToolCallReader(request)
    deltas = reader.feed("<tool") + reader.feed("s are") + reader.finish()  # undecided, then text
    assert deltas == [{"content": "<tools are"}] and reader.message()["content"] == "<tools are"
    # cut short by max_tokens (finish_reason kept): inside the closing `}</tool_call>`, the arguments are the whole
    # object and nothing of the tail (CI saw '{"city": "Paris", ...}}</to' sent as arguments); inside the arguments,
    # as far as they came. The streamed fragments add up to the message's arguments either way.
    arguments = '{"city": "Oslo", "days": 2}'
    for cut, expected in ((8, arguments), (len("}</tool_call>") - 1, arguments), (17, arguments[:-4])):
        reader = ToolCallReader(request)
        streamed = [d for i in range(0, len(text) - cut, 3) for d in reader.feed(text[: len(text) - cut][i : i + 3])]
        streamed += reader.finish()
        sent = "".join(d["tool_calls"][0]["function"]["arguments"] for d in streamed if "tool_calls" in d)
        assert reader.finish_reason("length") == "length", cut
        assert reader.message()["tool_calls"][0]["function"]["arguments"] == sent == expected, cut


def tokenized(served, **body) -> list[int]:
    status, reads = served.post("/tokenize", body)
    assert status == 200, reads
    return json.loads(b"".join(reads))["tokens"]


def test_a_history_of_a_call_and_its_result_is_rendered_into_the_prompt(served):
    base = tokenized(served, messages=[*ASK, HISTORY[-1]], tools=TOOLS, tool_choice="required")
    full = tokenized(served, messages=HISTORY, tools=TOOLS, tool_choice="required")
    status, reads = served.post("/detokenize", {"tokens": full})
    prompt = json.loads(b"".join(reads))["prompt"]
    rendered_call = call_text("get_weather", CALL["function"]["arguments"])
    assert f"assistant\n{rendered_call}" in prompt and 'tool\n{"temp_c": 21}' in prompt
    assert "<tools>" in prompt and '"name": "get_time"' in prompt  # the tools' instructions in the system turn
    encode = served.engine.tokenizer.encode
    assert len(full) - len(base) >= len(encode(rendered_call)) + len(encode('{"temp_c": 21}'))
    none = tokenized(served, messages=HISTORY, tools=TOOLS, tool_choice="none")  # "none": no tools in the prompt
    assert len(none) < len(full)
    status, answer = chat(served, messages=HISTORY, tool_choice=NAMED, max_tokens=24)
    assert status == 200 and answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_time"


BAD = [
    ({"tools": {"name": "f"}}, "tools", "tools must be a list"),
    ({"tools": [{"type": "function"}]}, "tools", "tools[0] must be"),
    ({"tools": [{"type": "function", "function": {"name": "get weather"}}]}, "tools", "tools[0].function.name"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "tools", "tools[1].function.name 'get_weather' is given twice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools", "parameters must be"),
    (
        {"tools": [TOOLS[0], {"type": "function", "function": {"name": "f", "parameters": {"type": "foo"}}}]},
        "tools",
        "tools[1].function.parameters is not a JSON schema",
    ),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "'nope', which is not in"),
    ({"tool_choice": "sometimes"}, "tool_choice", 'tool_choice must be "none"'),
    ({"tools": None, "tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format", "send one"),
    ({"messages": [*HISTORY[:2], {"role": "tool", "content": "x"}]}, "messages", "messages[2].tool_call_id must be"),
    (
        {"messages": [*HISTORY[:2], {"role": "tool", "tool_call_id": "call_9", "content": "x"}]},
        "messages",
        "messages[2].tool_call_id 'call_9' answers no earlier",
    ),
    (
        {
            "messages": [
                ASK[0],
                {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "{"}}]},
            ]
        },
        "messages",
        "messages[1].tool_calls[0].function.arguments must be a JSON object",
    ),
]


@pytest.mark.parametrize("fields,param,said", BAD, ids=[b[2][:30] for b in BAD])
def test_bad_tools_choices_and_tool_messages_get_400_naming_the_field(served, fields, param, said):
    status, answer = chat(served, **{"tool_choice": "required", **fields})
    assert status == 400 and answer["error"]["param"] == param and said in answer["error"]["message"], answer


def test_a_tool_calls_delta_of_the_wrong_shape_is_the_servers_malformed_event_named():
    bad = {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": 5}}]}}]}
    with pytest.raises(StreamError) as caught:
        parse_sse([f"data: {json.dumps(bad)}\n\n".encode(), b"data: [DONE]\n\n"], [0, 1])
    assert caught.value.reason == "malformed_event"
    assert "choices[0].delta.tool_calls[0].function.arguments is 5" in str(caught.value)
