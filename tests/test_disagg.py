"""Prefill/decode disaggregation on 127.0.0.1: tiny engines in this process as a prefill and a decode worker
behind the coordinator (outputs equal the colocated engine's, the handoff's cost), the transfer file's
checks, and `serve --disaggregate` as real processes (killed workers, nothing left behind)."""

import asyncio
import glob
import json
import math
import os
import re
import signal
import struct
import sys
import time

import aiohttp
import pytest
from helpers import alive, metric, post, streamed_text, wait_gone

from native_engine.disaggregation import DisaggregationSpec, Disaggregator
from native_engine.kv_transfer import KVTransferError, block_bytes, cache_shape, export_blocks, read_handoff
from native_engine.llm_engine import EngineConfig, LLMEngine, LoadedModel
from native_engine.router import start_router
from native_engine.server import start_server

DOC = "Paged attention stores the key and value cache in fixed-size blocks shared between requests. " * 3
CACHE_TOKENS = 4096


@pytest.fixture
async def disaggregated(tiny, tmp_path):
    """A prefill and a decode worker (engines in this process) behind the coordinator, and a colocated
    engine beside them; yields their URLs, the engines and the coordinator."""
    runners, urls = [], []
    engines = [
        LLMEngine(EngineConfig(kv_cache_tokens=CACHE_TOKENS, kv_transfer_dir=str(tmp_path)), tiny) for _ in range(2)
    ]
    colocated = LLMEngine(EngineConfig(kv_cache_tokens=CACHE_TOKENS), tiny)
    for engine in [*engines, colocated]:
        runner, port = await start_server(engine, "127.0.0.1", 0)
        runners.append(runner)
        urls.append(f"http://127.0.0.1:{port}")
    coordinator = Disaggregator(DisaggregationSpec(1, 1), urls[:2], str(tmp_path))
    runner, port = await start_router(coordinator)
    runners.append(runner)
    async with aiohttp.ClientSession() as http:
        yield http, f"http://127.0.0.1:{port}", urls[2], engines, coordinator
    for runner in reversed(runners):
        await runner.cleanup()


def request_cases():
    greedy = {"temperature": 0, "ignore_eos": True}
    return [
        ("/v1/completions", {"prompt": "hi", "max_tokens": 8, **greedy}),
        ("/v1/completions", {"prompt": DOC * 2 + "question 1", "max_tokens": 10, **greedy}),  # > 256: two chunks
        ("/v1/completions", {"prompt": DOC * 2 + "question 2", "max_tokens": 10, **greedy}),  # prefix cache hit
        ("/v1/completions", {"prompt": DOC, "max_tokens": 1, **greedy}),  # all on the prefill side
        ("/v1/completions", {"prompt": DOC, "max_tokens": 12, "temperature": 0.9, "seed": 7}),  # seeded sampling
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": DOC}], "max_tokens": 8, **greedy}),
    ]


def answer_text(body: dict) -> str:
    choice = body["choices"][0]
    return choice["text"] if "text" in choice else choice["message"]["content"]


async def test_disaggregated_output_equals_the_colocated_engines(disaggregated):
    http, url, colocated, engines, _ = disaggregated
    prefill, decode = engines
    for path, body in request_cases():
        status, alone = await post(http, colocated + path, body)
        assert status == 200, alone
        status, handed = await post(http, url + path, body)
        assert status == 200, handed
        assert answer_text(handed) == answer_text(alone)
        assert handed["usage"] == alone["usage"]  # cached_tokens: the prefill worker's prefix-cache hits
        assert handed["choices"][0]["finish_reason"] == alone["choices"][0]["finish_reason"]
        status, events = await post(http, url + path, {**body, "stream": True})
        assert status == 200 and events[-1] == "[DONE]" and streamed_text(events) == answer_text(alone)
    # the prompts really went in two legs: prefill worker prefills, decode worker only decodes
    assert prefill.block_manager.prefix_cache_hits_tokens > 0
    assert await metric(http, url, "native_router:requests_total", replica="prefill-0") == 12
    assert await metric(http, url, "native_router:requests_total", replica="decode-0") == 12
    page = decode.metrics.render().decode()
    assert re.search(r'native:prompt_tokens_total\{model_name="smollm2"\} 0\.0', page)
    assert re.search(r'native:kv_transfer_blocks_total\{direction="receive",model_name="smollm2"\} [1-9]', page)


async def test_transfer_cost_is_whole_blocks_and_the_same_on_every_page(disaggregated):
    http, url, _, engines, _ = disaggregated
    per_block = block_bytes(cache_shape(engines[0].runner))
    total_blocks = 0
    for _i, prompt in enumerate(["hi", DOC, DOC * 3 + "more"]):
        status, events = await post(
            http,
            url + "/v1/completions",
            {
                "prompt": prompt,
                "max_tokens": 4,
                "stream": True,
                "temperature": 0,
                "stream_options": {"include_usage": True},
            },
        )
        assert status == 200
        chunks = [json.loads(e) for e in events if e != "[DONE]"]
        timings = next(c["timings"] for c in chunks if "timings" in c)
        prompt_tokens = chunks[-1]["usage"]["prompt_tokens"]
        blocks = math.ceil(prompt_tokens / 16)
        assert timings["kv_transfer_blocks"] == blocks and timings["kv_transfer_bytes"] == blocks * per_block
        assert timings["kv_export_ms"] > 0 and timings["kv_import_ms"] > 0
        assert timings["prefill_ms"] > 0 and timings["prompt_n"] + timings["cache_n"] == prompt_tokens
        total_blocks += blocks
    want = total_blocks * per_block
    assert await metric(http, url, "native_router:kv_transfer_bytes_total") == want
    assert await metric(http, url, "native_router:kv_transfer_blocks_total") == total_blocks
    assert await metric(http, url, "native_router:kv_transfer_seconds_count") == 3
    for engine, direction in zip(engines, ("send", "receive")):
        page = engine.metrics.render().decode()
        assert f'native:kv_transfer_bytes_total{{direction="{direction}",model_name="smollm2"}} {float(want)}' in page
        assert f'native:kv_transfer_seconds_count{{direction="{direction}",model_name="smollm2"}} 3.0' in page
    assert os.listdir(engines[0].config.kv_transfer_dir) == []  # each file deleted once read


@pytest.mark.faults
async def test_bad_kv_transfer_requests_get_a_clear_error(disaggregated, tiny):
    http, url, colocated, engines, _ = disaggregated
    decode = [u for u in (await (await http.get(url + "/replicas")).json())["replicas"] if u["role"] == "decode"][0]
    cases = [
        (colocated, {"kv_transfer": {"role": "prefill"}}, "only for the workers of a disaggregated"),
        (decode["url"], {"kv_transfer": {"kv_file": "../../etc/passwd"}}, "must be a file name"),
        (decode["url"], {"kv_transfer": {"kv_file": "gone.kv"}}, "does not exist"),
        (decode["url"], {"kv_transfer": {"what": 1}}, 'must be {"role": "prefill"}'),
        (url, {"kv_transfer": {"role": "prefill"}}, "set by the coordinator"),
    ]
    for target, extra, message in cases:
        status, body = await post(http, target + "/v1/completions", {"prompt": "hi", "max_tokens": 2, **extra})
        assert status == 400 and message in body["error"]["message"], body
    status, body = await post(http, url + "/v1/completions", {"prompt": "hi", "max_tokens": 0})
    assert status == 400 and body["error"]["param"] == "max_tokens"  # the prefill worker's own check


@pytest.mark.faults
def test_a_transfer_file_from_another_shape_or_version_is_refused_by_name(tiny, tmp_path):
    engine = LLMEngine(EngineConfig(kv_cache_tokens=1024), tiny)
    shape = cache_shape(engine.runner)
    path = tmp_path / "a.kv"
    cost = export_blocks(str(path), engine.runner, [3, 1], list(range(20)), 5, {"state": 1})
    assert cost["blocks"] == 2 and cost["bytes"] == 2 * block_bytes(shape) < path.stat().st_size
    handoff = read_handoff(str(path), shape)
    assert handoff.prompt_token_ids == list(range(20)) and handoff.first_token_id == 5
    assert (handoff.k_blocks[:, 1] == engine.runner.k_cache[:, 1]).all()
    with pytest.raises(KVTransferError, match="block_size is 16 in the transfer but 32 here.*--block-size"):
        read_handoff(str(path), {**shape, "block_size": 32})
    with pytest.raises(KVTransferError, match="n_layers .* give the prefill and decode workers the same --model"):
        read_handoff(str(path), {**shape, "n_layers": shape["n_layers"] + 1})
    raw = path.read_bytes()
    (tmp_path / "v2.kv").write_bytes(raw[:8] + struct.pack("<I", 2) + raw[12:])
    with pytest.raises(KVTransferError, match="version 2; this engine reads version 1"):
        read_handoff(str(tmp_path / "v2.kv"), shape)
    (tmp_path / "short.kv").write_bytes(raw[:-100])
    with pytest.raises(KVTransferError, match="truncated"):
        read_handoff(str(tmp_path / "short.kv"), shape)
    (tmp_path / "junk.kv").write_bytes(b"hello" * 20)
    with pytest.raises(KVTransferError, match="not a KV transfer file"):
        read_handoff(str(tmp_path / "junk.kv"), shape)


@pytest.mark.parametrize("value", ["prefill=0,decode=1", "1,1", "prefill=1", "decode=1,prefill=1", ""])
def test_a_bad_disaggregate_value_names_the_flag_and_the_form(value):
    with pytest.raises(ValueError, match="--disaggregate: .*prefill=P,decode=D"):
        DisaggregationSpec.parse(value)


# ---- real processes -----------------------------------------------------------------------------
async def start_deployment(tiny_path, *flags):
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "native_engine",
        "serve",
        "--model",
        str(tiny_path),
        "--port",
        "0",
        "--kv-cache-tokens",
        "4096",
        "--disaggregate",
        "prefill=1,decode=1",
        *flags,
        stdout=asyncio.subprocess.PIPE,
    )
    line = (await asyncio.wait_for(proc.stdout.readline(), timeout=120)).decode()
    url = re.search(r"serving on (http://127\.0\.0\.1:\d+)", line).group(1)
    pids = dict((role, int(pid)) for role, pid in re.findall(r"(\w+)-0=\S+ \(pid (\d+)", line))
    with open(f"/proc/{pids['decode']}/cmdline", "rb") as f:
        args = f.read().split(b"\0")
    return proc, url, pids, args[args.index(b"--kv-transfer-dir") + 1].decode()


def test_the_cli_refuses_a_bad_disaggregate_before_starting_anything(tiny_path):
    import subprocess

    for flags, message in (
        (["--disaggregate", "prefill=2"], "prefill=P,decode=D"),
        (["--disaggregate", "prefill=1,decode=1", "--data-parallel", "2"], "not both"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "native_engine", "serve", "--model", str(tiny_path), *flags],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2 and "--disaggregate" in done.stderr and message in done.stderr


@pytest.mark.faults
async def test_killed_workers_fail_requests_clearly_and_stopping_leaves_nothing(tiny_path):
    proc, url, pids, transfer_dir = await start_deployment(tiny_path)
    try:
        assert os.path.isdir(transfer_dir) and transfer_dir.startswith("/dev/shm/")
        async with aiohttp.ClientSession() as http:
            status, body = await post(http, url + "/v1/completions", {"prompt": DOC, "max_tokens": 3})
            assert status == 200 and body["timings"]["kv_transfer_bytes"] > 0
            long = {"prompt": DOC, "max_tokens": 1500, "ignore_eos": True, "stream": True}
            stream = asyncio.create_task(post(http, url + "/v1/completions", long))
            while await metric(http, url, "native_router:replica_requests_in_flight", replica="decode-0") < 1:
                assert not stream.done(), stream.result()
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)
            os.kill(pids["decode"], signal.SIGKILL)
            status, events = await asyncio.wait_for(stream, timeout=60)
            error = json.loads(events[-2])["error"]
            assert events[-1] == "[DONE]" and "decode-0" in error["message"] and error["code"] == 502
            status, body = await post(http, url + "/v1/completions", {"prompt": "after", "max_tokens": 2})
            assert status == 503 and "no decode worker is up" in body["error"]["message"]
            os.kill(pids["prefill"], signal.SIGKILL)
            status, body = await asyncio.wait_for(
                post(http, url + "/v1/completions", {"prompt": "x", "max_tokens": 2}), timeout=30
            )
            # reset while it dies (502, naming it), or refused once gone: then no prefill worker is left (503)
            assert (status, body["error"]["message"].split(" (")[0]) in (
                (502, "prefill worker replica prefill-0"),
                (503, "no prefill worker is up; see the coordinator's log"),
            ), body
            status, body = await post(http, url + "/v1/completions", {"prompt": "y", "max_tokens": 2})
            assert status == 503 and "no prefill worker is up" in body["error"]["message"]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=60) == 0
    assert wait_gone(pids.values()) == [] and not os.path.exists(transfer_dir)


@pytest.mark.faults
async def test_no_worker_or_transfer_file_outlives_a_killed_coordinator(tiny_path):
    proc, url, pids, transfer_dir = await start_deployment(tiny_path, "--pin-cpus")
    cores = sorted(os.sched_getaffinity(0))
    assert [os.sched_getaffinity(pids[role]) for role in ("prefill", "decode")] == [{cores[0]}, {cores[1 % len(cores)]}]
    async with aiohttp.ClientSession() as http:
        assert (await post(http, url + "/v1/completions", {"prompt": DOC, "max_tokens": 2}))[0] == 200
    assert all(alive(p) for p in pids.values())
    proc.send_signal(signal.SIGKILL)  # the workers learn of it by PR_SET_PDEATHSIG, and remove the directory
    await asyncio.wait_for(proc.wait(), timeout=60)
    assert wait_gone(pids.values()) == []
    deadline = time.monotonic() + 10
    while os.path.exists(transfer_dir) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert not os.path.exists(transfer_dir)


def test_a_worker_whose_coordinator_is_gone_still_removes_the_transfer_directory(tmp_path, tiny_path):
    """A worker's output is a pipe to its coordinator; when the coordinator dies that pipe has no reader,
    and the worker's goodbye line on it must not stop it from removing the transfer directory."""
    import subprocess

    transfer_dir = tmp_path / "kv"
    transfer_dir.mkdir()
    (transfer_dir / "left.kv").write_bytes(b"x")
    command = [sys.executable, "-m", "native_engine", "serve", "--model", str(tiny_path), "--port", "0"]
    worker = subprocess.Popen(
        [*command, "--kv-transfer-dir", str(transfer_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert "serving" in worker.stdout.readline()
    worker.stdout.close()  # what the coordinator's death does to the pipe
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0
    assert not transfer_dir.exists()


@pytest.mark.faults
def test_bench_run_on_a_disaggregated_deployment_records_the_handoff_and_ctrl_c_leaves_nothing(tmp_path, tiny_path):
    """`bench run` launching `serve --disaggregate prefill=1,decode=1`, interrupted mid-run: the finished
    requests carry the handoff's cost in their server timings, the workers are scraped with their role
    in the replica label, and no process or transfer file is left."""
    import csv

    from bench_process import bench_started, interrupt_once_written

    from harness.results.folder import read_records

    prompts = tmp_path / "prompts.jsonl"  # a file: random prompts would need a real vocabulary (slow to load)
    prompts.write_text("".join(json.dumps({"prompt": f"{DOC} {i}", "output_tokens": 400}) + "\n" for i in range(40)))
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        f"name: pd\nbackend: {{kind: native, launch: {{args: [--model, '{tiny_path}', --disaggregate, "
        "'prefill=1,decode=1'], ready_timeout_s: 120}}\n"
        f"workload: {{kind: file, path: '{prompts}'}}\n"
        "load: {arrival: poisson, rate: 4, num_requests: 40}\n"
        "telemetry: {interval_ms: 200, gpu: false}\n"
    )
    out = tmp_path / "out"
    transfer_dirs = set(glob.glob("/dev/shm/native-kv-*"))
    proc = bench_started("run", scenario, "--output", out, "--allow-client-bound")
    interrupt_once_written(proc, out / "requests.jsonl", 4, timeout_s=120)
    assert proc.returncode != 0
    log = (out / "engine.log").read_text()
    pids = [int(p) for p in re.findall(r"pid (\d+)", re.search(r"serving on .*", log).group(0))]
    assert len(pids) == 2 and wait_gone(pids) == []
    assert set(glob.glob("/dev/shm/native-kv-*")) <= transfer_dirs
    records = [r for r in read_records(out) if r.ok]
    assert records and all(
        r.server_timings["kv_transfer_bytes"] > 0 and r.server_timings["kv_import_ms"] is not None for r in records
    )
    with open(out / "server_metrics.csv") as f:
        labels = {r["labels"] for r in csv.DictReader(f) if r["name"].startswith("native:kv_transfer_bytes")}
    assert any('replica="prefill-0"' in label and "send" in label for label in labels), labels


@pytest.mark.slow
async def test_smollm2_disaggregated_greedy_output_equals_colocated(tmp_path, one_blas_thread):
    """The real model: a prompt over several blocks and the prefill chunk, then one sharing its prefix."""
    model = LoadedModel.load("smollm2")
    runners, urls = [], []
    engines = [LLMEngine(EngineConfig(kv_cache_tokens=2048, kv_transfer_dir=str(tmp_path)), model) for _ in range(2)]
    for engine in [*engines, LLMEngine(EngineConfig(kv_cache_tokens=2048), model)]:
        runner, port = await start_server(engine, "127.0.0.1", 0)
        runners.append(runner)
        urls.append(f"http://127.0.0.1:{port}")
    runner, port = await start_router(Disaggregator(DisaggregationSpec(1, 1), urls[:2], str(tmp_path)))
    runners.append(runner)
    try:
        async with aiohttp.ClientSession() as http:
            for question in ("What do blocks hold?", "Why are blocks shared?"):
                body = {
                    "messages": [{"role": "user", "content": DOC * 6 + question}],
                    "max_tokens": 12,
                    "temperature": 0,
                }
                status, alone = await post(http, urls[2] + "/v1/chat/completions", body)
                assert status == 200 and alone["usage"]["prompt_tokens"] > 256
                status, events = await post(
                    http, f"http://127.0.0.1:{port}/v1/chat/completions", {**body, "stream": True}
                )
                assert status == 200 and streamed_text(events) == alone["choices"][0]["message"]["content"]
        assert engines[0].block_manager.prefix_cache_hits_tokens > 0
    finally:
        for r in reversed(runners):
            await r.cleanup()


def test_the_decode_engine_holds_the_prefill_engines_kv_bit_for_bit(tiny, tmp_path):
    """Engine level, no HTTP: the blocks copied in are the prefill engine's, also past a prefix the decode
    engine already held, and generate-style stepping continues as the colocated engine does."""
    from native_engine.sequence import SamplingParams

    prefill, decode, colocated = (
        LLMEngine(EngineConfig(kv_cache_tokens=CACHE_TOKENS, kv_transfer_dir=str(tmp_path)), tiny) for _ in range(3)
    )
    shape = cache_shape(decode.runner)
    for i, prompt in enumerate([DOC * 2 + "first", DOC * 2 + "second"]):  # the second shares 10+ blocks
        ids = prefill.tokenizer.encode(prompt, add_special=True)
        path = str(tmp_path / f"{i}.kv")
        prefill.add_request(
            f"p{i}", ids, SamplingParams(max_tokens=1, temperature=0, ignore_eos=True), export_kv_to=path
        )
        while not any(o.finished for o in prefill.step()):
            pass
        handoff = read_handoff(path, shape)
        decode.add_request(f"d{i}", ids, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True), handoff=handoff)
        first = decode.step()  # admits the handoff (its first token), then decodes the next one
        seq = decode._seqs[f"d{i}"]
        blocks = seq.block_table[: len(handoff.k_blocks[0])]
        for layer in range(shape["n_layers"]):
            for j, block in enumerate(blocks):
                n = min(16, len(ids) - 16 * j)  # the last block holds the prompt's tail (and later tokens)
                assert (decode.runner.k_cache[layer, block, :n] == handoff.k_blocks[layer, j, :n]).all()
                assert (decode.runner.v_cache[layer, block, :n] == handoff.v_blocks[layer, j, :n]).all()
        tokens = [t for o in first for t in o.new_token_ids]
        while f"d{i}" in decode._seqs:
            tokens += [t for o in decode.step() for t in o.new_token_ids]
        want = colocated.generate([ids], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))[0]
        assert tokens == want.token_ids
    assert decode.block_manager.prefix_cache_hits_tokens >= 10 * 16  # the second import skipped its held prefix
