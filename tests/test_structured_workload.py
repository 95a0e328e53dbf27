"""The `structured` workload: each request carries a JSON schema from a file (response_format), sent by the
runner to the built-in engine on 127.0.0.1; and the jump-forward counter's growth in summary.json."""

import json
from pathlib import Path

import pytest

from harness.client.runner import Runner, Target
from harness.engine.server_metrics import counter_deltas
from harness.scenario.scenario import Scenario, ScenarioError
from harness.scenario.tokenizer_source import LocalTokenizer
from harness.scenario.workload import build_schedule
from native_engine.llm_engine import EngineConfig, LLMEngine, LoadedModel
from native_engine.server import start_server
from native_engine.tiny_gguf import write_tiny_llama_gguf

SCHEMAS = Path(__file__).resolve().parents[1] / "scenarios" / "schemas" / "structured.jsonl"


def scenario(workload: dict, url: str = "http://127.0.0.1:9", num_requests: int = 7) -> Scenario:
    return Scenario.model_validate(
        {
            "name": "t",
            "backend": {"kind": "openai", "url": url, "api": "chat", "model": "smollm2"},
            "workload": {
                "kind": "structured",
                "schemas": str(SCHEMAS),
                "ignore_eos": False,
                "output_tokens": 300,
                **workload,
            },
            "load": {"arrival": "poisson", "rate": 50.0, "num_requests": num_requests, "warmup_requests": 1},
        }
    )


@pytest.fixture(scope="module")
def smollm2():
    return LocalTokenizer("smollm2")


def test_requests_cycle_through_the_schema_file(smollm2):
    rows = [json.loads(line) for line in SCHEMAS.read_text().splitlines()]
    plan = build_schedule(scenario({}), smollm2)
    assert len(plan.requests) == 8
    for i, r in enumerate(plan.requests):
        row = rows[i % len(rows)]
        assert r.extra_body == {
            "response_format": {"type": "json_schema", "json_schema": {"name": row["name"], "schema": row["schema"]}}
        }
        assert r.prompt == row["prompt"] and r.prompt_tokens == len(smollm2.encode(row["prompt"]))


def test_a_row_without_prompt_asks_for_its_schema_and_bad_rows_name_file_and_line(tmp_path, smollm2):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"schema": {"type": "boolean"}}) + "\n")
    plan = build_schedule(scenario({"schemas": str(path)}), smollm2)
    assert '{"type": "boolean"}' in plan.requests[0].prompt
    path.write_text(json.dumps({"schema": {"type": "boolean"}}) + "\n" + json.dumps({"prompt": "no schema"}) + "\n")
    with pytest.raises(ScenarioError, match=r"workload.schemas: .*s.jsonl line 2: needs \"schema\""):
        build_schedule(scenario({"schemas": str(path)}), smollm2)


@pytest.mark.parametrize(
    "workload,words",
    [
        ({"ignore_eos": True}, "workload.ignore_eos: set it to false"),
        ({"schemas": None}, "workload.schemas: missing"),
        ({"schemas": "nowhere.jsonl"}, "workload.schemas: file 'nowhere.jsonl' not found"),
    ],
)
def test_scenario_errors_name_the_field(workload, words):
    with pytest.raises(Exception, match=words):
        scenario(workload)


def test_schemas_only_with_kind_structured():
    with pytest.raises(Exception, match="workload.schemas: only used when workload.kind is structured"):
        Scenario.model_validate(
            {
                "name": "t",
                "backend": {"kind": "openai", "url": "http://127.0.0.1:9"},
                "workload": {"kind": "random", "schemas": str(SCHEMAS)},
                "load": {"arrival": "poisson", "rate": 1.0, "num_requests": 1},
            }
        )


async def test_runner_sends_response_format_and_answers_end_at_the_grammar(tmp_path, smollm2):
    loaded = LoadedModel.load(str(write_tiny_llama_gguf(tmp_path / "tiny.gguf", seed=0)))  # a 269-token vocabulary
    engine = LLMEngine(EngineConfig(kv_cache_tokens=8192), loaded)
    seen = []
    add_request = engine.add_request
    engine.add_request = lambda rid, ids, params: (seen.append(params.grammar), add_request(rid, ids, params))[1]
    runner, port = await start_server(engine, "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{port}"
        plan = build_schedule(scenario({}, url=url, num_requests=4), smollm2)  # prompts are text: any vocabulary
        outcome = await Runner(Target(url=url, api="chat", model="smollm2"), plan.requests).run()
    finally:
        await runner.cleanup()
    assert len(outcome.records) == 5 and all(r.ok for r in outcome.records)
    assert {r.finish_reason for r in outcome.records} == {"stop"}  # the grammar ended them, not max_tokens
    assert len(seen) == 5 and all(g is not None and g.param == "response_format" for g in seen)
    assert engine.metrics.jump_forward_tokens._value.get() > 0


def test_counter_deltas_from_server_metrics_csv(tmp_path):
    path = tmp_path / "server_metrics.csv"
    path.write_text(
        "t_s,name,value,labels\n0.1,bench:jump_forward_tokens,40,\n0.1,bench:running,3,\n"
        '0.6,native:jump_forward_tokens_total,95,model_name="x"\n0.6,bench:jump_forward_tokens,95,\n'
    )
    assert counter_deltas(path) == {"jump_forward_tokens": 55.0}
    assert counter_deltas(tmp_path / "missing.csv") == {}
