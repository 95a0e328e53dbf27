"""Images in chat prompts (workload.images, issue 41): `bench run` against the fixture server replaying vLLM serving
Qwen2-VL (tests/fixture_server.py --multimodal), the built-in text-only engine's refusal, and the settings' errors."""

import base64
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import numpy as np
import pytest
from typer.testing import CliRunner

from harness.cli.app import app
from harness.metrics.latencies import summarize
from harness.results.folder import read_records
from harness.scenario.images import add_images, image_size, png_bytes
from harness.scenario.scenario import Scenario, ScenarioError, load_scenario
from harness.scenario.tokenizer_source import LocalTokenizer
from harness.scenario.workload import build_schedule
from native_engine.llm_engine import EngineConfig, LLMEngine
from native_engine.server import start_server
from reports.mix_rows import modality_rows

sys.path.insert(0, str(Path(__file__).parent))
from fixture_server import VISION_MODEL, decoded_image, qwen2_vl_image_tokens  # noqa: E402

FIXTURE_SERVER = Path(__file__).parent / "fixture_server.py"
TEXT_PROMPT_TOKENS = 37  # vllm_chat_image.sse's usage: the recorded text prompt's tokens
WIDTH, HEIGHT, COUNT = 40, 30, 2


def scenario_yaml(images: str, backend: str | None = None) -> str:
    backend = backend or "{kind: openai, api: chat, model: m, url: 'http://127.0.0.1:9'}"
    return (
        f"name: mm\nbackend: {backend}\n"
        f"workload: {{kind: random, input_tokens: 8, output_tokens: 8, images: {images}}}\n"
        "load: {arrival: constant, rate: 20, num_requests: 8}\ntelemetry: {interval_ms: 100, gpu: false}\n"
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One run of 8 requests, half of them (drawn) with 2 images of 40 x 30, against the vision replay."""
    tmp = tmp_path_factory.mktemp("mm")
    log = tmp / "seen.jsonl"
    command = f"{sys.executable} {FIXTURE_SERVER} --engine vllm --multimodal --port {{port}} --itl-ms 1 --log {log}"
    backend = f"{{kind: vllm, api: chat, model: {VISION_MODEL}, launch: {{command: '{command}', ready_timeout_s: 30}}}}"
    scenario = tmp / "s.yaml"
    scenario.write_text(scenario_yaml(f"{{count: {COUNT}, width: {WIDTH}, height: {HEIGHT}, share: 0.5}}", backend))
    out = tmp / "out"
    result = CliRunner().invoke(app, ["run", str(scenario), "--output", str(out), "--allow-client-bound"])
    assert result.exit_code == 0, result.output
    seen = [json.loads(line)["body"] for line in log.read_text().splitlines()]
    return out, seen


def image_parts(body: dict) -> list[dict]:
    content = body["messages"][0]["content"]
    return [part for part in content if part["type"] == "image_url"] if isinstance(content, list) else []


def test_each_body_carries_its_images_and_the_usage_counts_their_tokens(run):
    out, seen = run
    with_images = [body for body in seen if image_parts(body)]
    assert len(seen) == 8 and 0 < len(with_images) < 8  # share 0.5 of 8, drawn
    for body in with_images:
        content = body["messages"][0]["content"]
        assert content[0]["type"] == "text" and content[0]["text"]  # vLLM random-mm's order: text, then images
        urls = [part["image_url"]["url"] for part in image_parts(body)]
        assert len(urls) == COUNT and len(set(urls)) == COUNT  # each image its own pixels
        assert all(decoded_image(url) == ("image/png", WIDTH, HEIGHT) for url in urls)  # rows inflate to 40 x 30
    records = read_records(out)
    assert all(r.ok for r in records), [r.error_detail for r in records]
    image_tokens = COUNT * qwen2_vl_image_tokens(WIDTH, HEIGHT)
    prompts = sorted(r.prompt_tokens for r in records)
    expected = [TEXT_PROMPT_TOKENS] * (8 - len(with_images)) + [TEXT_PROMPT_TOKENS + image_tokens] * len(with_images)
    assert prompts == expected  # the server's usage, image tokens included


def test_records_carry_images_and_the_summary_splits_by_modality(run):
    out, seen = run
    records = read_records(out)
    sent = {r.index: r for r in records}
    assert all(r.image_count in (0, COUNT) for r in records)
    for r in records:
        if r.image_count:
            assert r.image_bytes > WIDTH * HEIGHT * 3  # iid pixels barely compress
    summary = json.loads((out / "summary.json").read_text())
    again = summarize(records, trim=True).model_dump(mode="json")["by_modality"]
    assert summary["by_modality"] == again and set(again) == {"text", "image"}
    assert again["image"]["images"] == COUNT * sum(1 for r in sent.values() if r.image_count)


def test_by_modality_groups_text_and_image_requests():
    from harness.results.folder import RequestRecord

    def rec(i, images):
        r = RequestRecord(index=i, intended_send_s=i * 0.1, actual_send_s=i * 0.1, end_s=i * 0.1 + 0.05)
        r.token_times_s = [i * 0.1 + 0.01 * (k + 1) for k in range(4)]
        r.output_tokens = r.output_tokens_counted = 4
        r.prompt_tokens = 37 + (16 if images else 0)
        r.image_count, r.image_bytes = images, 1000 * images
        return r

    records = [rec(i, 2 if i % 3 == 0 else 0) for i in range(9)]
    groups = summarize(records).by_modality
    assert groups["image"].requests == 3 and groups["text"].requests == 6
    assert groups["image"].images == 6 and groups["image"].image_bytes == 6000
    assert groups["image"].prompt_tokens_mean == 53 and groups["text"].prompt_tokens_mean == 37
    table = modality_rows([("run-a", SimpleNamespace(summary=summarize(records)))])
    assert [row[:6] for row in table] == [
        ["run-a", "image", "53", "6", "3", "0"],
        ["run-a", "text", "37", "0", "6", "0"],
    ]
    for r in records:
        r.image_count = r.image_bytes = None  # a run without images has no by_modality
    assert summarize(records).by_modality is None


def test_synthetic_images_follow_the_seed(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(scenario_yaml("{count: 1, width: 20, height: 16}"))
    first, second = (build_schedule(load_scenario(str(scenario)), LocalTokenizer("smollm2")) for _ in range(2))
    assert [r.messages for r in first.requests] == [r.messages for r in second.requests]
    url = first.requests[0].messages[0]["content"][1]["image_url"]["url"]
    data = base64.b64decode(url.removeprefix("data:image/png;base64,"))
    assert image_size(data) == ("image/png", 20, 16) and first.requests[0].image_bytes == len(data)


def test_a_folder_of_real_images_is_sent_as_each_file_is(tmp_path):
    folder = tmp_path / "pics"
    folder.mkdir()
    files = {}
    for name, (w, h) in {"a.png": (17, 23), "b.png": (64, 8)}.items():
        files[name] = png_bytes(np.full((h, w, 3), 7, np.uint8))
        (folder / name).write_bytes(files[name])
    scenario = tmp_path / "s.yaml"
    scenario.write_text(scenario_yaml("{count: 1, folder: pics}"))
    plan = build_schedule(load_scenario(str(scenario)), LocalTokenizer("smollm2"))
    sent = {r.messages[0]["content"][1]["image_url"]["url"] for r in plan.requests}
    assert sent == {"data:image/png;base64," + base64.b64encode(data).decode() for data in files.values()}
    (folder / "notes.png").write_text("not an image")
    with pytest.raises(ScenarioError, match=r"workload.images.folder: .*notes.png is not a PNG or JPEG"):
        build_schedule(load_scenario(str(scenario)), LocalTokenizer("smollm2"))


@pytest.mark.parametrize(
    "images, backend, message",
    [
        ("{count: 1, width: 64}", None, r"workload.images.height: missing; synthetic images need width and height"),
        ("{count: 1, folder: nowhere}", None, r"workload.images.folder: folder 'nowhere' not found"),
        ("{folder: '.', width: 64, height: 64}", None, r"workload.images.folder: real images keep their own size"),
        ("{count: 0, width: 64, height: 64}", None, r"workload.images.count: 0 is not valid: must be >= 1"),
        ("{width: 64, height: 64, format: gif}", None, r"workload.images.format: 'gif' is not valid"),
        (
            "{width: 64, height: 64}",
            "{kind: openai, api: completions, model: m, url: 'http://127.0.0.1:9'}",
            r"backend.api: workload.images sends image content parts in chat messages; set backend.api to chat",
        ),
    ],
)
def test_bad_settings_are_refused_naming_the_field(tmp_path, images, backend, message):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(scenario_yaml(images, backend))
    with pytest.raises(ScenarioError, match=message):
        load_scenario(str(scenario))


def test_images_need_a_kind_of_one_prompt_per_request():
    with pytest.raises(ScenarioError, match=r"workload.images: only with a workload.kind of one prompt per request"):
        Scenario.model_validate(
            {
                "name": "t",
                "backend": {"kind": "openai", "url": "http://127.0.0.1:9", "api": "chat", "model": "m"},
                "workload": {"kind": "multi_turn", "turns": 2, "images": {"width": 32, "height": 32}},
                "load": {"arrival": "poisson", "rate": 4.0, "num_requests": 4},
            }
        )


async def test_the_native_engine_refuses_images_naming_the_part(tiny, tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(scenario_yaml("{count: 1, width: 32, height: 32}"))
    spec = build_schedule(load_scenario(str(scenario)), LocalTokenizer("smollm2")).requests[0]
    engine = LLMEngine(EngineConfig(kv_cache_tokens=4096), tiny)
    runner, port = await start_server(engine, "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as http:
            body = {"messages": spec.messages, "max_tokens": 2}
            async with http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as resp:
                status, answer = resp.status, await resp.json()
    finally:
        await runner.cleanup()
    assert status == 400 and answer["error"]["param"] == "messages"
    assert answer["error"]["message"].startswith('messages[0].content[1].type: "image_url" is not supported')
    assert "text-only" in answer["error"]["message"]


def test_add_images_leaves_requests_that_draw_none_as_text():
    class Spec:
        prompt, messages = "hello", None

    specs = [Spec() for _ in range(200)]
    images = Scenario.model_validate(
        {
            "name": "t",
            "backend": {"kind": "openai", "url": "http://127.0.0.1:9", "api": "chat", "model": "m"},
            "workload": {"images": {"width": 16, "height": 16, "share": 0.25}},
            "load": {"arrival": "poisson", "rate": 4.0, "num_requests": 4},
        }
    ).workload.images
    add_images(specs, images, seed=3)
    carried = [s.image_count for s in specs]
    assert set(carried) == {0, 1} and 30 <= sum(carried) <= 70  # 25% of 200, within about 3.5 standard deviations
    assert all(s.messages is None for s in specs if s.image_count == 0)
