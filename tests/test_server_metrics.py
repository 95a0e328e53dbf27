"""Prometheus pages of each engine mapped to one schema; the scraper thread on the run's clock."""
import csv
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from harness.server_metrics import ServerMetricsScraper, parse_page

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
    assert s["bench:generation_tokens"] == 1468 and s["bench:prompt_tokens"] == 125
    # llama.cpp's prompt_tokens_total excludes the cached ones: 140 cached of 125 + 140; no KV usage gauge any more
    assert s["bench:prefix_cache_hit_rate"] == pytest.approx(140 / 265) and "bench:kv_usage_fraction" not in s
    assert s["bench:running"] == 0 and s["bench:waiting"] == 0
    native = ('native:num_requests_running{model_name="m"} 2\n'
              'native:weight_bytes_read_total{model_name="m"} 100\nnative:kv_bytes_read_total{model_name="m"} 5\n'
              'native:prefix_cache_hits_total{model_name="m"} 3\nnative:prefix_cache_queries_total{model_name="m"} 4\n')
    s = schema(native)
    assert s["bench:running"] == 2 and s["bench:read_bytes"] == 105 and s["bench:prefix_cache_hit_rate"] == 0.75


def test_fractions_average_and_counts_sum_over_label_sets():
    page = ('vllm:kv_cache_usage_perc{engine="0"} 0.2\nvllm:kv_cache_usage_perc{engine="1"} 0.4\n'
            'vllm:num_requests_running{engine="0"} 3\nvllm:num_requests_running{engine="1"} 4\n')
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
    assert status["sampled"] and status["failures"] == 0 and status["scrapes"] == len(rows) >= 4
    times = [float(r["t_s"]) for r in rows]
    assert times == sorted(times) and 0 <= times[0] < 0.2 and times[-1] <= elapsed_s
    assert [float(r["value"]) for r in rows] == sorted(float(r["value"]) for r in rows)  # each scrape is fresh


def test_scraper_gives_up_on_404_and_says_why(page_server, tmp_path):
    scraper = ServerMetricsScraper(page_server + "/nope", time.perf_counter_ns(), tmp_path / "sm.csv", 0.05)
    scraper.begin()
    time.sleep(0.2)
    status = scraper.stop()
    assert status["sampled"] is False and "404" in status["reason"] and status["scrapes"] == 1
    none = ServerMetricsScraper(None, 0, tmp_path / "x.csv", why_none="ollama has no Prometheus page").stop()
    assert none == {"sampled": False, "reason": "ollama has no Prometheus page"}


def test_named_replica_pages_are_scraped_even_where_the_router_has_no_page(page_server, tmp_path):
    """backend.replica_metrics: a router without /metrics (404) still leaves each replica's rows, labelled."""
    pages = [("a", page_server + "/metrics"), ("b", page_server + "/metrics")]
    scraper = ServerMetricsScraper(page_server + "/nope", time.perf_counter_ns(), tmp_path / "sm.csv", 0.05,
                                   replica_pages=pages)
    scraper.begin()
    time.sleep(0.3)
    status = scraper.stop()
    with open(tmp_path / "sm.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["name"] == "bench:running"]
    assert status["sampled"] and status["replicas"] == 2 and "404" in status["last_error"]
    assert {r["labels"] for r in rows} == {'replica="a"', 'replica="b"'}
    assert len(rows) >= 4 and scraper.scrapes == 1   # the router's page was asked once, then left alone
    only_replicas = ServerMetricsScraper(None, time.perf_counter_ns(), tmp_path / "r.csv", 0.05, replica_pages=pages)
    only_replicas.begin()
    time.sleep(0.15)
    assert only_replicas.stop()["sampled"]
    with open(tmp_path / "r.csv") as f:
        labels = {r["labels"] for r in csv.DictReader(f) if r["name"] == "bench:running"}
    assert labels == {'replica="a"', 'replica="b"'}
