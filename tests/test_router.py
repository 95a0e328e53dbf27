"""The data-parallel router on 127.0.0.1: in front of tiny engines in this process (outputs, policies,
metrics), and `serve --data-parallel` as real processes (a replica killed mid-load, nothing left behind)."""

import asyncio
import json
import os
import re
import signal
import sys
import time
import urllib.request

import aiohttp
import pytest
from helpers import alive, metric, post, streamed_text, wait_gone

from native_engine.llm_engine import EngineConfig, LLMEngine
from native_engine.router import Router, start_router
from native_engine.routing_policy import Policy
from native_engine.server import start_server

DOC = "Paged attention stores the key and value cache in fixed-size blocks shared between requests. " * 3


@pytest.fixture
async def deployment(tiny):
    """start(policy, n): n tiny engines in this process behind a router; yields the router's URL and parts."""
    runners, http = [], aiohttp.ClientSession()

    async def start(policy="round_robin", n=2):
        engines, urls = [], []
        for _ in range(n):
            engines.append(LLMEngine(EngineConfig(kv_cache_tokens=4096), tiny))
            runner, port = await start_server(engines[-1], "127.0.0.1", 0)
            runners.append(runner)
            urls.append(f"http://127.0.0.1:{port}")
        router = Router(urls, Policy(policy, [str(i) for i in range(n)]))
        runner, port = await start_router(router)
        runners.append(runner)
        return f"http://127.0.0.1:{port}", router, engines, runners[-1 - n : -1]

    yield start, http
    await http.close()
    for runner in reversed(runners):
        await runner.cleanup()


async def test_greedy_outputs_through_the_router_equal_one_engines(deployment, tiny):
    start, http = deployment
    url, router, engines, _ = await start("round_robin", 2)
    alone = LLMEngine(EngineConfig(kv_cache_tokens=4096), tiny)
    single_runner, port = await start_server(alone, "127.0.0.1", 0)
    single = f"http://127.0.0.1:{port}"
    try:
        for i in range(4):  # round robin: two on each replica
            completion = {"prompt": f"{DOC} question {i}", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
            chat = {"messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": 6, "temperature": 0}
            status, direct = await post(http, single + "/v1/completions", completion)
            assert status == 200
            status, routed = await post(http, url + "/v1/completions", completion)
            assert status == 200 and routed["choices"][0]["text"] == direct["choices"][0]["text"]
            status, events = await post(http, url + "/v1/completions", {**completion, "stream": True})
            assert status == 200 and events[-1] == "[DONE]" and streamed_text(events) == direct["choices"][0]["text"]
            _, direct_chat = await post(http, single + "/v1/chat/completions", chat)
            status, events = await post(http, url + "/v1/chat/completions", {**chat, "stream": True})
            assert streamed_text(events) == direct_chat["choices"][0]["message"]["content"]
    finally:
        await single_runner.cleanup()
    assert await metric(http, url, "native_router:requests_total", replica="0") == 6
    assert await metric(http, url, "native_router:requests_total", replica="1") == 6
    assert await metric(http, url, "native_router:routing_decisions_total", reason="round_robin") == 12
    # each replica really ran its share: 4 completions of 6 tokens and 2 chats
    for engine in engines:
        counts = re.findall(rb"native:time_to_first_token_seconds_count\{.*\} (\S+)", engine.metrics.render())
        assert [float(c) for c in counts] == [6.0]


async def test_other_endpoints_pass_through_and_errors_keep_their_status(deployment):
    start, http = deployment
    url, router, *_ = await start("least_load", 2)
    async with http.get(url + "/v1/models") as resp:
        assert resp.status == 200 and (await resp.json())["data"][0]["id"] == "smollm2"
    status, tokens = await post(http, url + "/tokenize", {"prompt": "hello"})
    assert status == 200 and tokens["count"] > 0
    status, body = await post(http, url + "/v1/completions", {"prompt": "hi", "max_tokens": 0})
    assert status == 400 and body["error"]["param"] == "max_tokens"
    async with http.get(url + "/replicas") as resp:
        listing = await resp.json()
    assert listing["policy"] == "least_load" and [r["id"] for r in listing["replicas"]] == ["0", "1"]
    assert all(r["up"] and r["url"].startswith("http://127.0.0.1:") for r in listing["replicas"])


async def test_cache_aware_keeps_a_shared_document_on_one_replica(deployment):
    start, http = deployment
    url, router, engines, _ = await start("cache_aware", 2)
    for i in range(6):
        status, _ = await post(http, url + "/v1/completions", {"prompt": f"{DOC} question {i}", "max_tokens": 2})
        assert status == 200
    counts = [await metric(http, url, "native_router:requests_total", replica=r) for r in ("0", "1")]
    assert sorted(counts) == [0, 6]
    assert await metric(http, url, "native_router:routing_decisions_total", reason="cache_hit") == 5
    assert await metric(http, url, "native_router:prefix_match_chars_sum") >= 5 * len(DOC)
    busy = engines[counts.index(6)]
    assert busy.block_manager.prefix_cache_hits_tokens > 0


async def test_a_replica_gone_is_reported_and_new_requests_go_to_the_other(deployment):
    start, http = deployment
    url, router, engines, replica_runners = await start("round_robin", 2)
    await replica_runners[0].cleanup()  # replica 0 stops listening
    for i in range(4):
        status, body = await post(http, url + "/v1/completions", {"prompt": f"q{i}", "max_tokens": 2})
        assert status == 200, body
    assert await metric(http, url, "native_router:replica_up", replica="0") == 0
    assert await metric(http, url, "native_router:replica_up", replica="1") == 1
    # found down by its /health probe or by a refused connection (then that request went to replica 1)
    assert await metric(http, url, "native_router:requests_total", replica="1") == 4
    async with http.get(url + "/health") as resp:
        assert resp.status == 200
    await replica_runners[1].cleanup()
    status, body = await post(http, url + "/v1/completions", {"prompt": "q", "max_tokens": 2})
    assert status == 503 and "no engine replica is up" in body["error"]["message"]
    async with http.get(url + "/health") as resp:
        assert resp.status == 503


async def test_a_client_gone_mid_stream_aborts_its_request_on_the_replica(deployment):
    start, http = deployment
    url, router, engines, _ = await start("round_robin", 1)
    async with http.post(
        url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1800, "ignore_eos": True, "stream": True}
    ) as resp:
        await resp.content.readline()  # the stream has started; then the client goes away
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (router.replicas["0"].in_flight or engines[0].scheduler.running):
        await asyncio.sleep(0.05)
    assert router.replicas["0"].in_flight == 0 and not engines[0].scheduler.running
    generated = await metric(http, router.replicas["0"].url, "native:generation_tokens_total")
    assert 0 < generated < 1800  # aborted, not run to the end


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
        *flags,
        stdout=asyncio.subprocess.PIPE,
    )
    line = (await asyncio.wait_for(proc.stdout.readline(), timeout=120)).decode()
    url = re.search(r"serving on (http://127\.0\.0\.1:\d+)", line).group(1)
    return proc, url, [int(p) for p in re.findall(r"pid (\d+)", line)]


@pytest.mark.faults
async def test_replica_killed_mid_load_fails_its_streams_clearly_and_the_rest_carry_on(tiny_path):
    proc, url, pids = await start_deployment(tiny_path, "--data-parallel", "2", "--router-policy", "round_robin")
    try:
        assert len(pids) == 2
        async with aiohttp.ClientSession() as http:
            long = {"prompt": "long", "max_tokens": 1500, "ignore_eos": True, "stream": True}
            streams = [asyncio.create_task(post(http, url + "/v1/completions", long)) for _ in range(4)]
            while await metric(http, url, "native_router:replica_requests_in_flight") < 4:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)
            os.kill(pids[0], signal.SIGKILL)
            results = await asyncio.wait_for(asyncio.gather(*streams), timeout=120)
            errors = [json.loads(e[-2])["error"] for _, e in results if "error" in e[-2]]
            assert len(errors) == 2 and all("replica 0" in e["message"] and e["code"] == 502 for e in errors)
            assert all(e[-1] == "[DONE]" for _, e in results)
            for i in range(4):  # new requests: all to replica 1
                status, body = await post(http, url + "/v1/completions", {"prompt": f"after {i}", "max_tokens": 3})
                assert status == 200, body
            assert await metric(http, url, "native_router:replica_up", replica="0") == 0
            failures = await metric(http, url, "native_router:request_failures_total", replica="0", reason="mid_stream")
            assert failures == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=60) == 0
    assert wait_gone(pids) == []


@pytest.mark.faults
async def test_no_replica_outlives_the_deployment_even_if_killed(tiny_path):
    proc, url, pids = await start_deployment(tiny_path, "--data-parallel", "2")
    async with aiohttp.ClientSession() as http:
        async with http.get(url + "/health") as resp:
            assert resp.status == 200
    assert all(alive(p) for p in pids)
    proc.send_signal(signal.SIGKILL)  # the replicas learn of it by PR_SET_PDEATHSIG only
    await asyncio.wait_for(proc.wait(), timeout=60)
    assert wait_gone(pids) == []


async def test_the_harness_scrapes_the_router_and_each_replica_with_its_label(deployment, tmp_path):
    import csv

    from backends.native import NativeBackend
    from harness.engine.server_metrics import ServerMetricsScraper

    start, http = deployment
    url, router, engines, replica_runners = await start("round_robin", 2)
    for i in range(4):
        assert (await post(http, url + "/v1/completions", {"prompt": f"{DOC} {i}", "max_tokens": 2}))[0] == 200
    scraper = ServerMetricsScraper(
        url + "/metrics",
        time.perf_counter_ns(),
        tmp_path / "sm.csv",
        interval_s=0.1,
        replicas_url=url + NativeBackend.replicas_path,
    )
    scraper.begin()
    await asyncio.sleep(0.5)
    status = await asyncio.to_thread(scraper.stop)
    assert status.sampled and status.replicas == 2 and status.replica_failures == 0
    with open(tmp_path / "sm.csv") as f:
        rows = list(csv.DictReader(f))
    last = {(r["name"], r["labels"]): float(r["value"]) for r in rows}
    for replica in ("0", "1"):
        assert last[("native_router:requests_total", f'replica="{replica}"')] == 2
        assert last[("bench:prompt_tokens", f'replica="{replica}"')] > 0
        assert any(
            n == "native:generation_tokens_total" and f'replica="{replica}"' in labels and v == 4
            for (n, labels), v in last.items()
        )
    # one time stamp per round for all replicas: a counter summed over a t_s is the deployment's total
    per_t = {}
    for r in rows:
        if r["name"] == "bench:generation_tokens":
            per_t.setdefault(r["t_s"], []).append(float(r["value"]))
    assert per_t and all(len(v) == 2 and sum(v) == 8 for v in per_t.values())


async def test_a_single_engine_has_no_replicas_to_scrape(tiny, tmp_path):
    from harness.engine.server_metrics import ServerMetricsScraper

    runner, port = await start_server(LLMEngine(EngineConfig(kv_cache_tokens=1024), tiny), "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{port}"
        scraper = ServerMetricsScraper(
            url + "/metrics",
            time.perf_counter_ns(),
            tmp_path / "sm.csv",
            interval_s=0.1,
            replicas_url=url + "/replicas",
        )
        scraper.begin()
        await asyncio.sleep(0.3)
        status = await asyncio.to_thread(scraper.stop)
    finally:
        await runner.cleanup()
    assert status.sampled and status.replicas is None and scraper.replica_pages == []
    assert "replica=" not in (tmp_path / "sm.csv").read_text()


def descendants(root: int) -> set[int]:
    """Every live process below `root` (children, theirs, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:  # it ended meanwhile
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, stack = set(), [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.add(child)
            stack.append(child)
    return found


def deployment_run(tmp_path, tiny_path, n_requests: int, rate: float, output_tokens: int):
    """`bench run` launching `serve --data-parallel 2` (round robin) on the tiny model, left running until the
    router is up. Returns (bench process, results folder, router URL, replica pids, every process below bench)."""
    from bench_process import bench_started

    prompts = tmp_path / "prompts.jsonl"  # a file: random prompts would need a real vocabulary (slow to load)
    prompts.write_text(
        "".join(json.dumps({"prompt": f"{DOC} {i}", "output_tokens": output_tokens}) + "\n" for i in range(n_requests))
    )
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        f"name: dp\nbackend: {{kind: native, launch: {{args: [--model, '{tiny_path}', --data-parallel, 2, "
        "--router-policy, round_robin], ready_timeout_s: 120}}\n"
        f"workload: {{kind: file, path: '{prompts}'}}\n"
        f"load: {{arrival: poisson, rate: {rate:g}, num_requests: {n_requests:d}}}\n"
        "telemetry: {interval_ms: 200, gpu: false}\n"
    )
    out = tmp_path / "out"
    proc = bench_started("run", scenario, "--output", out, "--allow-client-bound")
    deadline = time.monotonic() + 120
    ready = None
    while time.monotonic() < deadline and not ready and proc.poll() is None:
        log = (out / "engine.log").read_text() if (out / "engine.log").exists() else ""
        ready = re.search(r"serving on (http://\S+) .*", log)
        time.sleep(0.1)
    assert ready, proc.communicate()[1]
    pids = [int(p) for p in re.findall(r"pid (\d+)", ready.group(0))]
    family = descendants(proc.pid)  # the router, its replicas, the launcher's guard
    assert len(pids) == 2 and set(pids) < family
    return proc, out, ready.group(1), pids, family


def in_flight(url: str, replica: str) -> int:
    """Requests the router has sent to `replica` and not yet finished relaying."""
    with urllib.request.urlopen(url + "/replicas", timeout=5) as resp:
        return next(r["in_flight"] for r in json.load(resp)["replicas"] if r["id"] == replica)


def stop_with_requests_stuck(pid: int, url: str, replica: str, deadline: float) -> int:
    """SIGSTOPs the replica while the router shows it has requests in flight, and leaves it stopped once they
    stay in flight (what it had already written has reached its clients by then): a stopped replica finishes
    nothing, so each of them is still in flight when it is killed. Returns how many are stuck."""
    while time.monotonic() < deadline:
        if in_flight(url, replica):
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.3)
            stuck = in_flight(url, replica)
            if stuck:
                return stuck
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.01)
    raise AssertionError(f"replica {replica} never had a request in flight")


@pytest.mark.faults
def test_bench_run_against_a_deployment_survives_a_killed_replica_and_leaves_no_process(tmp_path, tiny_path):
    """`bench run` launching `serve --data-parallel 2`: replica 0 SIGKILLed with requests in flight, the run
    completes, every planned request is a record (completed or failed with a reason naming the replica), the
    exit code follows the completed share, per-replica metrics are scraped, nothing is left."""
    import csv

    from harness.results.folder import read_records

    proc, out, url, pids, family = deployment_run(tmp_path, tiny_path, n_requests=16, rate=20, output_tokens=400)
    stuck = stop_with_requests_stuck(pids[0], url, "0", time.monotonic() + 60)
    os.kill(pids[0], signal.SIGKILL)
    _, stderr = proc.communicate(timeout=180)
    records = read_records(out)
    summary = json.loads((out / "summary.json").read_text())
    req = summary["requests"]
    assert len(records) == req["measured"] == req["completed"] + req["failed"] == 16
    failed = [r for r in records if not r.ok]
    assert len(failed) == req["failed"] == sum(summary["failures"].values()) >= stuck >= 1
    # cut off mid-stream (an SSE error event) or before its first byte (a 502), each naming the replica
    assert all(
        r.error_reason in ("server_error_event", "http_5xx") and "replica 0" in str(r.error_detail) for r in failed
    ), [(r.error_reason, r.error_detail) for r in failed]
    assert not summary["incomplete"] and "engine_exited" not in summary
    # round robin gave replica 0 at most half the requests, and after its death none: at least half completed,
    # so the run is not failed (exit 4 only below half, or with records missing)
    assert req["completed"] >= 8 and proc.returncode == 0, stderr
    with open(out / "server_metrics.csv") as f:
        labels = {r["labels"] for r in csv.DictReader(f) if r["name"] == "bench:generation_tokens"}
    assert labels >= {'replica="0"', 'replica="1"'}
    assert wait_gone(family) == []
    # the report's per-replica view: the requests the router lost with replica 0 are those the client saw fail
    from reports.load import load_run
    from reports.replicas import replica_view

    view = replica_view(load_run(out))
    by = {r.replica: r for r in view.replicas}
    assert by["0"].lost == len(failed) and by["1"].lost == 0
    assert by["0"].requests + by["1"].requests >= len(records)


@pytest.mark.faults
@pytest.mark.parametrize(
    "sig, code", [(None, 0), (signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ends", "SIGINT", "SIGTERM"]
)
def test_no_process_of_a_launched_deployment_outlives_bench_run(tmp_path, tiny_path, sig, code):
    """The router, both replicas and the launcher's guard are gone once `bench run` has exited, whether the run
    ended or bench was interrupted mid-run; so is the router's process group."""
    proc, out, url, pids, family = deployment_run(tmp_path, tiny_path, n_requests=12, rate=4, output_tokens=40)
    with open(f"/proc/{pids[0]}/stat") as f:
        router = int(f.read().rsplit(")", 1)[1].split()[1])  # the replicas' parent, leader of their group
    assert router in family and os.getpgid(router) == router == os.getpgid(pids[0])
    if sig is not None:
        from bench_process import wait_until_written

        wait_until_written(out / "requests.jsonl", 2)
        assert proc.poll() is None
        proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stderr
    assert wait_gone(family) == []
    with pytest.raises(ProcessLookupError):
        os.killpg(router, 0)
