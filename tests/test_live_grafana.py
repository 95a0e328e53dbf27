"""The Grafana board in the repo (docs/grafana/bench_live.json) reads only series the harness's endpoint serves
(harness/runs/live_metrics.py): a renamed series would leave a panel empty without a word."""

import json
import re
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from harness.metrics.latencies import request_latency
from harness.results.folder import RequestRecord
from harness.runs.live_metrics import MetricsEndpoint

BOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana" / "bench_live.json"


def board_series(board: dict) -> set[str]:
    """Every bench_ series a panel's query names."""
    exprs = [target["expr"] for panel in board["panels"] for target in panel["targets"]]
    exprs += [var["query"] for var in board["templating"]["list"] if var["type"] == "query"]
    return {name for expr in exprs for name in re.findall(r"\bbench_[a-z0-9_]+", expr)}


def served_series() -> set[str]:
    """The sample names the endpoint serves once a run has one completed record."""
    endpoint = MetricsEndpoint(0)
    try:
        rec = RequestRecord(index=0, intended_send_s=0.0, actual_send_s=0.0, end_s=0.3)
        rec.token_times_s, rec.output_tokens = [0.1, 0.2, 0.3], 3
        key = endpoint.begin_run("run-1", "scenario-1")
        endpoint.observe(key, rec, request_latency(rec))
        text = urllib.request.urlopen(endpoint.url, timeout=5).read().decode()
    finally:
        endpoint.close()
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


def test_the_board_reads_only_series_the_endpoint_serves():
    board = json.loads(BOARD.read_text())
    wanted = board_series(board)
    # the four histograms' buckets, the two counters, the two gauges
    assert len(wanted) == 8, wanted
    assert wanted <= served_series(), wanted - served_series()


def test_the_check_finds_a_renamed_series():
    board = {"panels": [{"targets": [{"expr": "rate(bench_ttft_secs_bucket[1m])"}]}], "templating": {"list": []}}
    assert board_series(board) - served_series() == {"bench_ttft_secs_bucket"}
