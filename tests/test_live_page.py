"""The live page (harness/runs/live_page.py) in a real headless Chromium during a run against the ground-truth server:
the page loads with no error and no request off this machine, and its charts grow with the frames as the run goes.

Needs Debian's chromium and Playwright's playwright-core from npm, as tests/test_report_browser.py.
"""

import json
import os
import subprocess

import pytest
from groundtruth_server import GroundTruthConfig, GroundTruthProcess
from test_live_run import write_scenario
from test_report_browser import CHROMIUM, NODE, PLAYWRIGHT_ROOT

from harness.runs.live import LiveSettings
from harness.runs.live_page import LivePage
from harness.runs.run import Reporter, run_scenario
from harness.scenario.scenario import load_scenario

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or PLAYWRIGHT_ROOT is None,
    reason="needs chromium and playwright-core: apt-get install -y chromium && npm install -g playwright-core",
)

# Opens the page, says READY once its charts are drawn and its event stream is open, then waits for the final frame
# and prints what the page holds: each chart's points, the frames drawn, errors, every request's address.
DRIVER = r"""
const { chromium } = require('playwright-core');
const [,, url, profile, exe] = process.argv;
(async () => {
  const browser = await chromium.launchPersistentContext(profile, {
    executablePath: exe, headless: true, viewport: { width: 1280, height: 1000 },
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking',
           '--disable-component-update', '--disable-sync'] });
  const page = await browser.newPage();
  const errors = [], requests = [];
  page.on('console', m => { if (m.type() === 'error') errors.push(m.text()); });
  page.on('pageerror', e => errors.push(String(e)));
  page.on('request', r => requests.push(r.url()));
  await page.goto(url, { waitUntil: 'load' });
  await page.waitForFunction(
      () => [...document.querySelectorAll('.chart')].every(d => d.querySelector('svg.main-svg')));
  console.log('READY');
  await page.waitForFunction(() => document.getElementById('status').textContent.startsWith('final'), null,
                             { timeout: 120000 });
  const charts = await page.$$eval('.chart', divs => divs.map(d => d.data.map(trace => trace.x.length)));
  const frames = await page.evaluate(() => window.liveFrames);
  console.log(JSON.stringify({ errors, requests, charts, frames }));
  await browser.close();
})().catch(e => { console.error(e); process.exit(2); });
"""


def test_the_live_page_charts_grow_during_a_run(tmp_path):
    page = LivePage(0)
    driver = tmp_path / "driver.js"
    driver.write_text(DRIVER)
    browser = subprocess.Popen(
        [NODE, str(driver), page.url, str(tmp_path / "profile"), CHROMIUM],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NODE_PATH": PLAYWRIGHT_ROOT, "HOME": str(tmp_path)},
    )
    try:
        assert browser.stdout.readline().strip() == "READY", browser.stderr.read()[-2000:]
        with GroundTruthProcess(GroundTruthConfig(ttft_ms=20, itl_ms=5)) as gt:
            reporter = Reporter()
            reporter.live = LiveSettings(display="off", page=page, refresh_s=0.25)
            scenario = load_scenario(write_scenario(tmp_path, gt.url, rate=10, requests=30))  # a 3 s run
            run_scenario(scenario, tmp_path / "out", reporter=reporter)
        out, err = browser.communicate(timeout=150)
    finally:
        browser.kill()
        page.close()
    assert browser.returncode == 0, err[-2000:]
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["errors"] == []
    assert all(url.startswith(page.url) for url in seen["requests"]), seen["requests"]  # plotly.js served locally
    # every frame pushed was drawn (a frame every 0.25 s of a 3 s run: about 12, and the final one), and each
    # chart's every trace has a point per frame: at least two updates during the run
    assert seen["frames"] == page.frames_pushed >= 3
    assert all(points == [seen["frames"]] * len(points) for points in seen["charts"]), seen["charts"]
