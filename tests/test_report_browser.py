"""The HTML reports in a real headless Chromium: no console errors, every plot drawn as SVG, offline.

Needs Debian's chromium and Playwright's playwright-core from npm (CI:
`sudo apt-get install -y chromium nodejs npm && sudo npm install -g playwright-core`).
The browser runs with networking off, so a report that needs the internet fails here.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import synthetic_records, write_run, write_sweep

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NODE = shutil.which("node")


def _playwright_root() -> str | None:
    if NODE is None or shutil.which("npm") is None:
        return None
    root = subprocess.run(["npm", "root", "-g"], capture_output=True, text=True).stdout.strip()
    return root if (Path(root) / "playwright-core").is_dir() else None


PLAYWRIGHT_ROOT = _playwright_root()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or PLAYWRIGHT_ROOT is None,
    reason="needs chromium and playwright-core: apt-get install -y chromium && npm install -g playwright-core",
)

DRIVER = r"""
const { chromium } = require('playwright-core');
const [,, page_path, shot_path, profile, exe] = process.argv;
(async () => {
  const browser = await chromium.launchPersistentContext(profile, {
    executablePath: exe, headless: true, offline: true, viewport: { width: 1280, height: 900 },
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
           '--disable-background-networking', '--disable-component-update', '--disable-sync'] });
  const page = await browser.newPage();
  const errors = [], requests = [];
  page.on('console', m => { if (m.type() === 'error') errors.push(m.text()); });
  page.on('pageerror', e => errors.push(String(e)));
  page.on('request', r => { if (!r.url().startsWith('file:')) requests.push(r.url()); });
  await page.goto('file://' + page_path, { waitUntil: 'load' });
  await page.waitForFunction(() => [...document.querySelectorAll('.plotly-graph-div')]
      .every(d => d.querySelector('svg.main-svg')), null, { timeout: 60000 });
  const plots = await page.$$eval('.plotly-graph-div', divs => divs.map(d => ({
      svg: d.querySelectorAll('svg.main-svg').length,
      traces: d.querySelectorAll('g.trace').length,
      title: (d.querySelector('.gtitle') || {}).textContent || '' })));
  await page.screenshot({ path: shot_path, fullPage: true });
  console.log(JSON.stringify({ errors, requests, plots, title: await page.title() }));
  await browser.close();
})().catch(e => { console.error(e); process.exit(2); });
"""


def open_in_chromium(html: Path, tmp_path: Path) -> dict:
    script = tmp_path / "driver.js"
    script.write_text(DRIVER)
    shot = tmp_path / f"{html.stem}.png"
    proc = subprocess.run(
        [NODE, str(script), str(html.resolve()), str(shot), str(tmp_path / "profile"), CHROMIUM],
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, "NODE_PATH": PLAYWRIGHT_ROOT, "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert shot.stat().st_size > 10_000  # kept in tmp_path to look at
    return result


def test_run_and_sweep_report_renders_every_plot(tmp_path):
    from reports.report import write_report

    a = write_run(tmp_path / "run-a", synthetic_records(seed=1), server_metrics=True, telemetry=True, explain=True)
    b = write_run(tmp_path / "run-b", synthetic_records(seed=2, ttft_s=0.08, fail_every=12))
    sweep = write_sweep(tmp_path / "sweep")
    content = write_report([a, b, sweep], tmp_path / "report.html")
    result = open_in_chromium(tmp_path / "report.html", tmp_path)
    assert result["errors"] == [] and result["requests"] == []
    assert len(result["plots"]) == len(content.figures) == 11
    headings = [heading for heading, _ in content.figures]
    assert "Where TTFT goes" in headings and "Engine steps: run-a" in headings  # phase bars, step timeline
    phase_plot = result["plots"][headings.index("Where TTFT goes")]
    assert phase_plot["traces"] >= 7  # six parts of TTFT stacked, and decode
    html = (tmp_path / "report.html").read_text()
    assert "<h2>Diagnosis</h2>" in html and "queueing is 60% of TTFT" in html
    for plot, (heading, fig) in zip(result["plots"], content.figures):
        assert plot["svg"] >= 1, heading
        assert plot["traces"] >= len(fig.data), (heading, plot)  # every trace drawn
    assert result["title"].startswith("Benchmark report")


def test_selection_report_renders(tmp_path):
    from reports.select import write_selection

    fast = write_sweep(tmp_path / "fast", capacity_rps=6)
    slow = write_sweep(tmp_path / "slow", capacity_rps=2, seed=5)
    write_selection(
        [fast, slow], tmp_path / "select.html", slo={"ttft_ms": 200.0, "tpot_ms": 50.0}, gpu_cost_per_hour=2.0
    )
    result = open_in_chromium(tmp_path / "select.html", tmp_path)
    assert result["errors"] == [] and result["requests"] == []
    assert result["plots"] and all(p["svg"] >= 1 and p["traces"] >= 1 for p in result["plots"])


def test_trend_report_renders_with_change_points_marked(tmp_path):
    """`bench report --history`: a series with a 15% step at night 20, one panel per gate metric."""
    import numpy as np

    from reports.gate import load_rules
    from reports.history import add_runs
    from reports.trends import write_trend_report

    rules = load_rules(None)
    for k in range(26):
        itl_s = 0.01 * (1.15 if k >= 20 else 1.0) * np.exp(np.random.default_rng(k).normal(0, 0.01))
        run = write_run(tmp_path / f"night-{k:02d}", synthetic_records(n=40, itl_s=itl_s, seed=k))
        add_runs(tmp_path / "h.db", [run], commit=f"{k:02d}abcdef", branch="main", rules=rules)
    content = write_trend_report(tmp_path / "h.db", tmp_path / "trends.html", rules)
    (row,) = content.rows  # one finding: the step, at the first commit after it
    assert (row[1], row[4]) == ("tpot_p50", "20abcdef") and row[2].startswith("step +1")
    result = open_in_chromium(tmp_path / "trends.html", tmp_path)
    assert result["errors"] == [] and result["requests"] == []
    assert len(result["plots"]) == len(content.figures) == 1
    fig = content.figures[0][1]
    assert result["plots"][0]["traces"] >= len(fig.data) and result["plots"][0]["svg"] >= 1
    assert [s.line.dash for s in fig.layout.shapes] == ["dash"]  # the step, marked once
    assert result["title"].startswith("Benchmark trends")


def test_report_of_two_deployments_draws_the_replicas(tmp_path):
    """The recorded cache_aware and round_robin deployment runs (tests/fixtures/deployment)."""
    from reports.report import write_report

    fixtures = Path(__file__).parent / "fixtures" / "deployment"
    content = write_report([fixtures / "cache_aware", fixtures / "round_robin"], tmp_path / "deploy.html")
    result = open_in_chromium(tmp_path / "deploy.html", tmp_path)
    assert result["errors"] == [] and result["requests"] == []
    headings = [heading for heading, _ in content.figures]
    for heading in ("Replicas compared", "Load per replica: cache_aware", "Load per replica: round_robin"):
        plot = result["plots"][headings.index(heading)]
        assert plot["svg"] >= 1 and plot["traces"] >= len(dict(content.figures)[heading].data), heading


def test_tune_report_draws_the_pareto_front_and_the_capacity_table(tmp_path):
    """A real `bench tune` search (two configurations of the ground-truth server, whose capacity is set by
    --max-streams) and its report: the capacity table in the page, the Pareto chart and the attainment chart drawn."""
    import sys

    from groundtruth_server import __file__ as gt_server

    from harness.runs.run import Reporter
    from harness.scenario.scenario import Scenario
    from harness.tune.tune import Tuner
    from reports.tune_report import write_tune_report

    command = f"{sys.executable} {gt_server} --port {{port}} --ttft-ms 10 --itl-ms 10"
    scenario = Scenario.model_validate(
        {
            "name": "gt-tune",
            "backend": {
                "kind": "openai",
                "model": "gt",
                "tokenizer": "smollm2",
                "launch": {"command": command, "ready_timeout_s": 30},
            },
            "workload": {"input_tokens": 8, "output_tokens": 5},
            "slo": {"ttft_ms": 150},
            "load": {"arrival": "constant", "num_requests": 20, "workers": 1},
            "tune": {"space": {"--max-streams": [1, 3]}, "load": {"rate": {"min": 2, "max": 100}}, "precision": 0.5},
        }
    )
    doc = Tuner(scenario, tmp_path / "tune", Reporter(), resume=False, workers="1").run()
    report = write_tune_report(tmp_path / "tune", tmp_path / "tune.html")
    result = open_in_chromium(tmp_path / "tune.html", tmp_path)
    assert result["errors"] == [] and result["requests"] == []
    pareto, attainment = result["plots"]
    assert "Pareto" in pareto["title"] or "tokens/s per user" in pareto["title"]
    assert pareto["svg"] >= 1 and pareto["traces"] >= 3  # a trace per configuration and the front
    assert attainment["svg"] >= 1 and attainment["traces"] >= 2
    html = (tmp_path / "tune.html").read_text()
    table = html[html.index('<div id="capacity-table">') :]
    assert all(f"<td>{c.name}</td>" in table for c in doc.configurations)
    assert report.front and doc.recommended.name == "max-streams-3"
