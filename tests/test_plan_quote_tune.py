"""`bench tune` before it launches anything (issue 39): it checks once that the engine can start here and says so
(a missing engine stops it with one line, not six launches and "no configuration met the SLOs"), and `--dry-run`
prints bench plan's predicted capacity of each configuration."""

import importlib.util
import re

import pytest
from typer.testing import CliRunner

from harness.cli.app import app
from harness.scenario.scenario import load_scenario
from harness.tune.preflight import check_engine

TUNE_VLLM = """
name: tune-vllm
backend: {kind: vllm, model: meta-llama/Llama-3.1-8B-Instruct, launch: {}}
workload: {kind: random, input_tokens: 256, output_tokens: 32, ignore_eos: true}
load: {arrival: poisson, num_requests: 40}
slo: {ttft_ms: 500, tpot_ms: 50}
plan: {model: llama-3.1-8b, step_model: roofline, hardware: H100}
tune:
  space: {--max-num-seqs: [4, 64]}
  load: {rate: {min: 1, max: 200}}
"""

VLLM_HERE = importlib.util.find_spec("vllm") is not None


def write(tmp_path, text: str, name: str = "s.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.skipif(VLLM_HERE, reason="vLLM is importable here: the engine could start")
def test_a_missing_engine_stops_tune_before_any_launch(tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["tune", str(write(tmp_path, TUNE_VLLM)), "--output", str(out)])
    assert result.exit_code == 4, result.output
    text = " ".join(result.output.split())
    assert "python -m vllm.entrypoints.openai.api_server` cannot start: 'vllm' is not importable" in text
    assert "no configuration was launched" in text
    assert not out.exists()  # no tune.json, no configuration folder: nothing was tried


def test_the_check_names_a_program_not_on_path_and_passes_the_native_engine(tmp_path):
    trtllm = TUNE_VLLM.replace("kind: vllm", "kind: trtllm").replace("launch: {}", "launch: {program: trtllm-nowhere}")
    check = check_engine(load_scenario(write(tmp_path, trtllm)))
    assert not check.startable and "'trtllm-nowhere' is not on PATH" in check.line
    rest = "workload: {input_tokens: 8}\nload: {rate: 1, num_requests: 2}\n"
    native = "name: n\nbackend: {kind: native, model: smollm2, launch: {}}\n" + rest
    check = check_engine(load_scenario(write(tmp_path, native, "n.yaml")))
    assert check.startable and check.line.startswith("engine: native_engine importable")
    url = "name: u\nbackend: {kind: vllm, model: m, url: 'http://127.0.0.1:9'}\n" + rest
    assert check_engine(load_scenario(write(tmp_path, url, "u.yaml"))) is None  # launches nothing: nothing to check


def test_dry_run_prints_the_predicted_capacity_of_each_configuration(tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["tune", str(write(tmp_path, TUNE_VLLM)), "--output", str(out), "--dry-run"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "predicted capacity of each configuration (simulated, nothing launched)" in text
    predicted = re.findall(r"(max-num-seqs-\d+): bench plan predicts (?:at least )?([\d.]+) requests/s", text)
    assert [name for name, _ in predicted] == ["max-num-seqs-4", "max-num-seqs-64"]
    # 4 sequences at a time cap the batch: the 64-sequence configuration carries more on the same H100
    rates = [float(rate) for _, rate in predicted]
    assert rates[1] > rates[0]
    assert not out.exists()
