"""Constrained decoding (llguidance): outputs match their JSON schema or regex, unconstrained requests in
the same batch are untouched, jump-forward saves steps, and bad grammars get a 400 naming the field.

The tiny random model has SmolLM2's real 49k vocabulary, so token boundaries are the real ones; sampled
hot, it wanders through everything the grammar allows (long strings, every enum, nested arrays).
"""

import json
import re
from pathlib import Path

import aiohttp
import jsonschema
import pytest
from helpers import assert_same_tokens_up_to_near_tie

from native_engine.guided import GrammarError, grammar_from_request
from native_engine.llm_engine import EngineConfig, LLMEngine, LoadedModel
from native_engine.sequence import SamplingParams
from native_engine.server import start_server
from native_engine.tiny_gguf import write_tiny_llama_gguf

SCHEMAS = [
    json.loads(line)
    for line in (Path(__file__).resolve().parents[1] / "scenarios/schemas/structured.jsonl").read_text().splitlines()
]
HOT = 4.0
PHONE = r"\(\d{3}\) \d{3}-\d{4}"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_tiny_llama_gguf(tmp_path_factory.mktemp("m") / "tiny.gguf", seed=0, tokenizer="smollm2")
    return LoadedModel.load(str(path))


def response_format(schema: dict) -> dict:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}


def run_counting_steps(engine: LLMEngine, prompts, params):
    """generate(), plus how many forward passes each request took part in."""
    steps: dict[str, int] = {}
    schedule = engine.scheduler.schedule

    def counting():
        chunks = schedule()
        for c in chunks:
            steps[c.seq.request_id] = steps.get(c.seq.request_id, 0) + 1
        return chunks

    engine.scheduler.schedule = counting
    outputs = engine.generate(prompts, params)
    return outputs, [steps[k] for k in sorted(steps, key=lambda k: int(k.rsplit("-", 1)[1]))]


def structured_batch(tokenizer, n: int):
    """n constrained requests cycling through the schemas, and 4 unconstrained ones."""
    prompts, params, schemas = [], [], []
    for i in range(n):
        row = SCHEMAS[i % len(SCHEMAS)]
        prompts.append(tokenizer.encode(row["prompt"]))
        params.append(
            SamplingParams(
                max_tokens=400, temperature=HOT, seed=i, grammar=grammar_from_request(response_format(row["schema"]))
            )
        )
        schemas.append(row["schema"])
    free = [tokenizer.encode(f"free text number {i}") for i in range(4)]
    free_params = [SamplingParams(max_tokens=12, temperature=HOT, seed=100 + i, ignore_eos=True) for i in range(4)]
    return prompts, params, schemas, free, free_params


def test_outputs_validate_beside_unconstrained_requests_and_jump_forward_saves_steps(tiny):
    prompts, params, schemas, free, free_params = structured_batch(tiny.tokenizer, 20)
    alone = LLMEngine(EngineConfig(kv_cache_tokens=32768), tiny).generate(free, free_params)
    results = {}
    for jump_forward in (True, False):
        engine = LLMEngine(EngineConfig(kv_cache_tokens=32768, enable_jump_forward=jump_forward), tiny)
        outputs, steps = run_counting_steps(engine, prompts + free, params + free_params)
        for out, schema in zip(outputs, schemas):
            assert out.finish_reason == "stop", out.text
            jsonschema.validate(json.loads(out.text), schema)
            assert tiny.tokenizer.decode(out.token_ids) == out.text
        # the constrained neighbours change nothing for unconstrained requests (up to a near tie: tests/helpers.py)
        for prompt, p, out, ref in zip(free, free_params, outputs[len(prompts) :], alone, strict=True):
            assert_same_tokens_up_to_near_tie(tiny, prompt, p, out.token_ids, ref.token_ids)
        forced = engine.metrics.jump_forward_tokens._value.get()
        results[jump_forward] = (steps[: len(prompts)], forced, outputs)
    (steps_on, forced_on, out_on), (steps_off, forced_off, _) = results[True], results[False]
    assert forced_off == 0 and forced_on > 0
    assert sum(steps_on) < 0.8 * sum(steps_off)
    # jump-forward tokens are output tokens like any other: counted and streamed
    assert sum(len(o.token_ids) for o in out_on[: len(prompts)]) >= forced_on


def test_regex_and_first_output_carries_tokens_forced_before_sampling(tiny):
    engine = LLMEngine(EngineConfig(kv_cache_tokens=4096), tiny)
    prompt = tiny.tokenizer.encode("call me")
    params = SamplingParams(
        max_tokens=40, temperature=HOT, seed=3, grammar=grammar_from_request({"guided_regex": PHONE})
    )
    engine.add_request("r", prompt, params)
    first = []
    while not first:
        first = engine.step()
    # "(" is forced before the first sample, so it comes with the first sampled token
    assert first[0].new_text.startswith("(") and len(first[0].new_token_ids) >= 2
    text = first[0].new_text
    while engine.has_work():
        text += "".join(o.new_text for o in engine.step())
    assert re.fullmatch(PHONE, text)


@pytest.mark.parametrize(
    "body,param,words",
    [
        ({"response_format": {"type": "xml"}}, "response_format", "json_schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", '"schema"'),
        ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
        ({"guided_regex": ""}, "guided_regex", "non-empty"),
        ({"guided_regex": "a", "guided_json": {}}, "guided_regex", "one of"),
    ],
)
def test_malformed_grammar_fields_name_the_field(body, param, words):
    with pytest.raises(GrammarError) as info:
        grammar_from_request(body)
    assert info.value.param == param and words in info.value.message


@pytest.fixture
async def served(tiny):
    engine = LLMEngine(EngineConfig(kv_cache_tokens=8192), tiny)
    runner, port = await start_server(engine, "127.0.0.1", 0)
    async with aiohttp.ClientSession(f"http://127.0.0.1:{port}", timeout=aiohttp.ClientTimeout(total=120)) as http:
        yield http
    await runner.cleanup()


async def test_both_endpoints_streamed_or_not_follow_response_format_and_regex(served):
    schema = SCHEMAS[3]["schema"]  # the order: nested objects, a pattern, bounded integers
    chat = {"messages": [{"role": "user", "content": "an order"}], "max_tokens": 300, "temperature": HOT, "seed": 5}
    completion = {"prompt": "an order:", "max_tokens": 300, "temperature": HOT, "seed": 6}
    for path, body, pick in (
        ("/v1/chat/completions", chat, lambda c: c["message"]["content"]),
        ("/v1/completions", completion, lambda c: c["text"]),
    ):
        async with served.post(path, json={**body, **response_format(schema)}) as resp:
            choice = (await resp.json())["choices"][0]
        jsonschema.validate(json.loads(pick(choice)), schema)
        async with served.post(path, json={**body, "guided_regex": PHONE, "stream": True}) as resp:
            events = [e[len("data: ") :] for e in (await resp.text()).split("\n\n") if e]
        deltas = [json.loads(e)["choices"][0] for e in events[:-1]]
        text = "".join(d["delta"].get("content", "") if "delta" in d else d["text"] for d in deltas)
        assert re.fullmatch(PHONE, text) and deltas[-1]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    "extra,param,words",
    [
        (response_format({"type": "strin"}), "response_format", "Invalid type: strin"),
        (response_format({"type": "integer", "minimum": 5, "maximum": 1}), "response_format", "Unsatisfiable"),
        ({"guided_json": {"enum": []}}, "guided_json", "Unsatisfiable"),
        ({"guided_regex": "(a"}, "guided_regex", "regex parse error"),
        ({"guided_regex": "(?!x)y"}, "guided_regex", "look-around"),
        ({"guided_regex": r"[^\x00-\x{10FFFF}]"}, "guided_regex", "cannot be used"),  # an empty language
    ],
)
async def test_bad_or_unsatisfiable_grammar_gets_400_naming_the_field(served, extra, param, words):
    for path, body in (
        ("/v1/completions", {"prompt": "x"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
    ):
        async with served.post(path, json={**body, "max_tokens": 8, "stream": True, **extra}) as resp:
            error = (await resp.json())["error"]
            assert resp.status == 400 and error["param"] == param and words in error["message"], error
    async with served.post("/v1/completions", json={"prompt": "still serving", "max_tokens": 2}) as resp:
        assert resp.status == 200


async def test_jump_forward_tokens_on_metrics(served):
    async with served.post(
        "/v1/completions",
        json={"prompt": "p", "max_tokens": 300, "temperature": HOT, "seed": 1, **response_format(SCHEMAS[0]["schema"])},
    ) as resp:
        assert resp.status == 200
    async with served.get("/metrics") as resp:
        page = await resp.text()
    forced = [
        float(line.rsplit(" ", 1)[1])
        for line in page.splitlines()
        if line.startswith("native:jump_forward_tokens_total{")
    ]
    assert forced and forced[0] >= 3  # at least the forced opening {"‧name‧":


@pytest.mark.slow
def test_real_smollm2_json_schema_json_object_and_regex_outputs_are_valid():
    loaded = LoadedModel.load("smollm2")
    engine = LLMEngine(EngineConfig(kv_cache_tokens=8192), loaded)
    tok = loaded.tokenizer

    def chat(content):
        return tok.encode(tok.apply_chat_template([{"role": "user", "content": content}]))

    rows = SCHEMAS[:3]  # benchmarks/structured.py runs all of them, 200 requests
    prompts = [chat(row["prompt"]) for row in rows] + [
        chat("Give a JSON object about a cat with its name and age."),
        chat("Write a US phone number."),
    ]
    grammars = [response_format(row["schema"]) for row in rows] + [
        {"response_format": {"type": "json_object"}},
        {"guided_regex": PHONE},
    ]
    params = [SamplingParams(max_tokens=120, temperature=0.0, grammar=grammar_from_request(g)) for g in grammars]
    outputs = engine.generate(prompts, params)
    assert [o.finish_reason for o in outputs] == ["stop"] * len(outputs)
    for out, row in zip(outputs, rows):
        jsonschema.validate(json.loads(out.text), row["schema"])
    assert isinstance(json.loads(outputs[-2].text), dict)
    assert re.fullmatch(PHONE, outputs[-1].text)
