"""The per-replica view of a deployment run (reports/replicas.py), from two recorded runs of
`serve --data-parallel 2` (tests/fixtures/deployment/README.md: cache_aware and round_robin on the
same 3-document prompts). The router's and replicas' counters are checked against what the client
recorded, an independent count."""

from pathlib import Path

import pytest

from harness.results.folder import read_records
from reports.load import load_run
from reports.replicas import replica_view
from reports.report import build_report, write_report

FIXTURES = Path(__file__).parent / "fixtures" / "deployment"
CACHE_AWARE, ROUND_ROBIN = FIXTURES / "cache_aware", FIXTURES / "round_robin"
DOCUMENTS = 3  # prompts.jsonl: `doc 0|1|2: ...`


@pytest.mark.parametrize("run_dir", [CACHE_AWARE, ROUND_ROBIN], ids=lambda p: p.name)
def test_replica_counts_add_up_to_what_the_client_sent_and_received(run_dir):
    view = replica_view(load_run(run_dir))
    records = read_records(run_dir)  # warm-ups too: the scrape spans the whole load
    assert [r.replica for r in view.replicas] == ["0", "1"]
    assert sum(r.requests for r in view.replicas) == len(records)
    assert sum(view.decisions.values()) == len(records)
    assert sum(r.generation_tokens for r in view.replicas) == sum(r.output_tokens for r in records)
    assert sum(r.request_share for r in view.replicas) == pytest.approx(1.0)
    assert sum(r.lost for r in view.replicas) == sum(not r.ok for r in records) == 0
    assert {"requests running", "requests waiting", "KV cache in use (fraction)"} <= set(view.series["panel"])


def test_round_robin_splits_evenly_and_cache_aware_keeps_each_document_on_one_replica():
    rr, ca = replica_view(load_run(ROUND_ROBIN)), replica_view(load_run(CACHE_AWARE))
    assert rr.policy == "round_robin" and rr.replicas[0].requests == rr.replicas[1].requests
    assert "requests were split evenly (50% / 50%)" in rr.imbalance()
    # cache_aware: only each document's first request misses; round_robin sends every document to both
    assert ca.policy == "cache_aware" and ca.decisions["cache_miss"] == DOCUMENTS
    assert min(r.hit_rate for r in ca.replicas) > max(r.hit_rate for r in rr.replicas)
    busiest = max(ca.replicas, key=lambda r: r.requests)
    assert busiest.request_share > 0.6  # two documents on one replica, one on the other
    assert f"replica {busiest.replica} served {busiest.request_share:.0%} of requests" in ca.imbalance()
    assert f"prefix-cache hit rate {ca.replicas[0].hit_rate:.2f} on replica 0" in ca.imbalance()


def test_report_of_two_deployments_shows_the_replicas_side_by_side(tmp_path):
    content = write_report([CACHE_AWARE, ROUND_ROBIN], tmp_path / "r.html", labels=["ca", "rr"])
    headings = [h for h, _ in content.figures]
    assert "Replicas compared" in headings and {"Load per replica: ca", "Load per replica: rr"} <= set(headings)
    assert [row[:2] for row in content.replica_rows] == [["ca", "0"], ["ca", "1"], ["rr", "0"], ["rr", "1"]]
    md = (tmp_path / "r.md").read_text()
    assert "## Replicas" in md and "- rr: requests were split evenly" in md
    assert "| ca | cache_aware | cache_miss | 3 |" in md
    html = (tmp_path / "r.html").read_text()
    assert "<h2>Replicas</h2>" in html and html.count("Plotly.newPlot") == len(content.figures)
    comparison = dict(content.figures)["Replicas compared"]
    assert {t.name for t in comparison.data} == {"ca", "rr"}  # a colour per run, the replicas on the x axis


def test_a_run_without_replica_labels_has_no_replica_section(tmp_path):
    single = tmp_path / "single"
    single.mkdir()
    for name in ("requests.jsonl", "run.json", "summary.json"):
        (single / name).write_text((CACHE_AWARE / name).read_text())
    lines = (CACHE_AWARE / "server_metrics.csv").read_text().splitlines()
    (single / "server_metrics.csv").write_text("\n".join(line for line in lines if "replica=" not in line) + "\n")
    assert replica_view(load_run(single)) is None
    content = build_report([single])
    assert not content.replica_rows and not any(h.startswith("Replicas") for h, _ in content.figures)


def test_prefill_and_decode_replicas_are_told_apart_by_role():
    """1 prefill + 1 decode (P/D disaggregation, a recorded run): every request passes both, so neither
    'served a share': the sentence says one replica per role, and each one's count is every request."""
    run_dir = FIXTURES / "pd_1p1d"
    view = replica_view(load_run(run_dir))
    records = read_records(run_dir)
    assert [r.replica for r in view.replicas] == ["decode-0", "prefill-0"]
    assert all(r.requests == len(records) for r in view.replicas)
    by = {r.replica: r for r in view.replicas}
    assert by["decode-0"].generation_tokens == sum(r.output_tokens for r in records)
    assert by["prefill-0"].generation_tokens == len(records)  # the prefill replica samples each first token
    assert "one replica per role (decode-0, prefill-0)" in view.imbalance() and "split evenly" not in view.imbalance()
