"""Prometheus pages of each engine mapped to one schema; the scraper thread on the run's clock."""

import csv
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from harness.engine.server_metrics import ServerMetricsScraper, parse_page, read_schema, window_hit_rate
from harness.engine.telemetry.engine_bytes import engine_counters
from harness.metrics.explain import explain
from harness.metrics.latencies import summarize
from harness.metrics.phases import histogram_means
from harness.results.folder import RequestRecord
from harness.results.schema import PrefixCache, Summary

FIXTURES = Path(__file__).parent / "fixtures" / "engines"


def schema(text: str) -> dict:
    return {name: value for name, value, labels in parse_page(text)[1] if not labels}


def test_vllm_real_page():
    raw, _ = parse_page((FIXTURES / "vllm_metrics.txt").read_text())
    names = {name for name, _, _ in raw}
    assert "vllm:num_requests_running" in names
    assert not any(n.startswith(("process_", "python_", "http_")) or n.endswith("_created") for n in names)
    s = schema((FIXTURES / "vllm_metrics.txt").read_text())
    assert s["bench:prompt_tokens"] == 47 and s["bench:generation_tokens"] == 56
    assert s["bench:ttft_s_count"] == 3 and s["bench:itl_s_count"] == 53 and s["bench:tpot_s_count"] == 3
    assert s["bench:prefix_cache_hit_rate"] == 0.0  # hits/queries: queries were made, none hit


def test_llama_server_and_native_names():
    raw, _ = parse_page((FIXTURES / "llamacpp_metrics.txt").read_text())
    # a counter written without _total keeps the name the engine gave it, not the parser's <name>_total
    names = {name for name, _, _ in raw}
    assert "llamacpp:n_tokens_max" in names and "llamacpp:n_tokens_max_total" not in names
    assert "llamacpp:n_decode_total" in names
    s = schema((FIXTURES / "llamacpp_metrics.txt").read_text())
    # every prompt token, as the other engines count them: 125 computed + 140 cached
    assert s["bench:generation_tokens"] == 1468 and s["bench:prompt_tokens"] == 265
    # llama.cpp's prompt_tokens_total excludes the cached ones: 140 cached of 125 + 140; no KV usage gauge any more
    assert s["bench:prefix_cache_hit_rate"] == pytest.approx(140 / 265) and "bench:kv_usage_fraction" not in s
    assert s["bench:running"] == 0 and s["bench:waiting"] == 0
    native = (
        'native:num_requests_running{model_name="m"} 2\n'
        'native:weight_bytes_read_total{model_name="m"} 100\nnative:kv_bytes_read_total{model_name="m"} 5\n'
        'native:prefix_cache_hits_total{model_name="m"} 3\nnative:prefix_cache_queries_total{model_name="m"} 4\n'
    )
    s = schema(native)
    assert s["bench:running"] == 2 and s["bench:read_bytes"] == 105 and s["bench:prefix_cache_hit_rate"] == 0.75


def test_native_prefix_cache_memory_reaches_the_schema():
    from native_engine.metrics import EngineMetrics

    metrics = EngineMetrics("m")
    metrics.record_prefix_cache(0, 0, cached_blocks=7, evictions=3)
    metrics.record_prefix_cache(0, 0, cached_blocks=5, evictions=4)  # running totals: the counter adds 1
    s = schema(metrics.render().decode())
    assert s["bench:prefix_cache_blocks"] == 5 and s["bench:prefix_cache_evictions"] == 4


def test_fractions_average_and_counts_sum_over_label_sets():
    page = (
        'vllm:kv_cache_usage_perc{engine="0"} 0.2\nvllm:kv_cache_usage_perc{engine="1"} 0.4\n'
        'vllm:num_requests_running{engine="0"} 3\nvllm:num_requests_running{engine="1"} 4\n'
    )
    s = schema(page)
    assert s["bench:kv_usage_fraction"] == pytest.approx(0.3) and s["bench:running"] == 7


class _Page(BaseHTTPRequestHandler):
    count = 0

    def do_GET(self):
        if self.path != "/metrics":
            self.send_response(404)
            self.end_headers()
            return
        type(self).count += 1
        body = f'vllm:num_requests_running{{m="x"}} {type(self).count}\n'.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def page_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_scraper_samples_on_the_run_clock(page_server, tmp_path):
    t0_ns = time.perf_counter_ns()
    scraper = ServerMetricsScraper(page_server + "/metrics", t0_ns, tmp_path / "sm.csv", interval_s=0.1)
    scraper.begin()
    time.sleep(0.55)
    status = scraper.stop()
    elapsed_s = (time.perf_counter_ns() - t0_ns) / 1e9
    with open(tmp_path / "sm.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["name"] == "bench:running"]
    assert status.sampled and status.failures == 0 and status.scrapes == len(rows) >= 4
    times = [float(r["t_s"]) for r in rows]
    assert times == sorted(times) and 0 <= times[0] < 0.2 and times[-1] <= elapsed_s
    assert [float(r["value"]) for r in rows] == sorted(float(r["value"]) for r in rows)  # each scrape is fresh


def test_scraper_gives_up_on_404_and_says_why(page_server, tmp_path):
    scraper = ServerMetricsScraper(page_server + "/nope", time.perf_counter_ns(), tmp_path / "sm.csv", 0.05)
    scraper.begin()
    time.sleep(0.2)
    status = scraper.stop()
    assert status.sampled is False and "404" in status.reason and status.scrapes == 1
    none = ServerMetricsScraper(None, 0, tmp_path / "x.csv", why_none="ollama has no Prometheus page").stop()
    assert none.model_dump(exclude_unset=True) == {"sampled": False, "reason": "ollama has no Prometheus page"}


def test_named_replica_pages_are_scraped_even_where_the_router_has_no_page(page_server, tmp_path):
    """backend.replica_metrics: a router without /metrics (404) still leaves each replica's rows, labelled."""
    pages = [("a", page_server + "/metrics"), ("b", page_server + "/metrics")]
    scraper = ServerMetricsScraper(
        page_server + "/nope", time.perf_counter_ns(), tmp_path / "sm.csv", 0.05, replica_pages=pages
    )
    scraper.begin()
    time.sleep(0.3)
    status = scraper.stop()
    with open(tmp_path / "sm.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["name"] == "bench:running"]
    assert status.sampled and status.replicas == 2 and "404" in status.last_error
    assert {r["labels"] for r in rows} == {'replica="a"', 'replica="b"'}
    assert len(rows) >= 4 and scraper.scrapes == 1  # the router's page was asked once, then left alone
    only_replicas = ServerMetricsScraper(None, time.perf_counter_ns(), tmp_path / "r.csv", 0.05, replica_pages=pages)
    only_replicas.begin()
    time.sleep(0.15)
    assert only_replicas.stop().sampled
    with open(tmp_path / "r.csv") as f:
        labels = {r["labels"] for r in csv.DictReader(f) if r["name"] == "bench:running"}
    assert labels == {'replica="a"', 'replica="b"'}


class _TwoPages(BaseHTTPRequestHandler):
    """SGLang's page at the start of the window for the first scrape, the page at its end for every later one."""

    pages: tuple[bytes, bytes] = (b"", b"")
    served = 0

    def do_GET(self):
        body = self.pages[min(type(self).served, 1)]
        type(self).served += 1
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def scrape_sglang_window(tmp_path) -> Path:
    _TwoPages.pages = tuple((FIXTURES / f"sglang_metrics_window_{when}.txt").read_bytes() for when in ("start", "end"))
    _TwoPages.served = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _TwoPages)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        scraper = ServerMetricsScraper(
            f"http://127.0.0.1:{server.server_address[1]}/metrics",
            time.perf_counter_ns(),
            tmp_path / "server_metrics.csv",
            interval_s=0.05,
        )
        scraper.begin()
        while scraper.scrapes < 3:
            time.sleep(0.02)
        assert scraper.stop().sampled
    finally:
        server.shutdown()
    return tmp_path / "server_metrics.csv"


def test_sglang_window_hit_rate_is_the_counters_delta_not_the_last_batch_gauge(tmp_path):
    csv_path = scrape_sglang_window(tmp_path)
    series = read_schema(csv_path)
    start_s, end_s = series["bench:running"][0][0], series["bench:running"][-1][0]
    with open(csv_path) as f:
        gauge = [float(r["value"]) for r in csv.DictReader(f) if r["name"] == "sglang:cache_hit_rate"]
    assert gauge[0] == 0.1 and gauge[-1] == 0.9  # SGLang's own figure: the last prefill batch only
    # cached (device + host) over prompt tokens: (560 + 40 - 200) / (1800 - 1000) over the window ...
    window = window_hit_rate(series, start_s, end_s)
    assert window.hit_rate == pytest.approx(0.5) and window.queried_tokens == 800
    # ... and 600 / 1800 since the engine started, which is what the per-scrape rate says
    assert series["bench:prefix_cache_hit_rate"][-1][1] == pytest.approx(1 / 3)


def test_sglang_prefill_phase_from_per_stage_latency_and_waiting_with_the_grammar_queue(tmp_path):
    csv_path = scrape_sglang_window(tmp_path)
    series = read_schema(csv_path)
    start_s, end_s = series["bench:running"][0][0], series["bench:running"][-1][0]
    # prefill_forward: 10 more requests, 3.0 s more (decode_loop's 600 steps and request_process are not phases)
    assert histogram_means(csv_path, start_s, end_s) == pytest.approx({"queue": 150.0, "prefill": 300.0})
    assert series["bench:waiting"][-1][1] == 5  # 2 in the waiting queue + 3 compiling their grammar


def test_sglang_waiting_counts_the_disaggregation_queues_but_not_inflight_transfers():
    labels = '{engine_type="prefill",model_name="m",tp_rank="0"}'
    queues = {
        "num_queue_reqs": 1,
        "num_grammar_queue_reqs": 2,
        "num_prefill_prealloc_queue_reqs": 3,
        "num_prefill_inflight_queue_reqs": 4,
        "num_decode_prealloc_queue_reqs": 5,
        "num_decode_transfer_queue_reqs": 6,
    }
    s = schema("".join(f"sglang:{name}{labels} {n}\n" for name, n in queues.items()))
    assert s["bench:waiting"] == 1 + 2 + 3 + 5 + 6


def test_per_gpu_counters_are_averaged_here_as_in_engine_bytes():
    """Two data-parallel vLLM engines: per-GPU estimates stay per GPU (the mean) in both modules."""
    page = "".join(
        f'vllm:estimated_{what}_per_gpu_total{{engine="{e}",model_name="m"}} {v}\n'
        for what, values in (("read_bytes", (1e11, 3e11)), ("write_bytes", (1e9, 3e9)), ("flops", (4e12, 6e12)))
        for e, v in enumerate(values)
    )
    s = schema(page)
    assert (s["bench:read_bytes"], s["bench:write_bytes"], s["bench:flops"]) == (2e11, 2e9, 5e12)
    polled = engine_counters(page, {"vllm:estimated_read_bytes_per_gpu_total"})
    assert polled["vllm:estimated_read_bytes_per_gpu_total"] == s["bench:read_bytes"]


def _summary(records) -> Summary:
    """The summary of `records` as a run's, nothing flagged."""
    account = {"client_bound": False, "client_bound_reasons": [], "interrupted": False}
    account |= {"incomplete": False, "incomplete_reasons": [], "lost_workers": []}
    return Summary(**dict(summarize(records)), **account)


def test_the_run_summary_takes_the_window_rate(tmp_path):
    """explain() (summary.json's prefix_cache) over requests that span the two scrapes."""
    csv_path = scrape_sglang_window(tmp_path)
    times = [t for t, _ in read_schema(csv_path)["bench:running"]]
    done = RequestRecord(
        index=0,
        intended_send_s=times[0],
        actual_send_s=times[0],
        token_times_s=[times[-1]],
        tokens_per_chunk=[1],
        end_s=times[-1],
        output_tokens=1,
    )
    summary = _summary([done])
    explain(summary, [done], tmp_path, [], {"backend": {"kind": "sglang"}, "workload": {}})
    assert summary.prefix_cache.hit_rate == pytest.approx(0.5)


def test_the_console_prints_the_window_rate(tmp_path, monkeypatch):
    from rich.console import Console

    import harness.cli.console

    done = RequestRecord(
        index=0, intended_send_s=0.0, token_times_s=[0.1], tokens_per_chunk=[1], end_s=0.1, output_tokens=1
    )
    summary = _summary([done])
    summary.prefix_cache = PrefixCache(hit_rate=0.5, hit_tokens=400.0, queried_tokens=800.0, source="counters")
    monkeypatch.setattr(harness.cli.console, "console", Console(record=True, width=200))
    harness.cli.console.print_summary(summary, tmp_path)
    assert (
        "prefix cache: 50.0% of the 800 prompt tokens looked up over the window"
        in harness.cli.console.console.export_text()
    )
