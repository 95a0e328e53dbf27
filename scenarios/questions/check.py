"""Runs the question scenarios against the native engine and checks the diagnosis answers them:
Q1 names queueing as the main share of TTFT (with its percentage); Q7 with chunked prefill off
names prefill interference, and with it on that line is gone; Q9 finds SmolLM2's file a Q4_1 mix
with one Q8_0 tensor; Q11 probes the native engine (n > 1 refused, vLLM's /tokenize shape, native:
metric names); Q13 finds a launched engine's start-up and first request in run.json. Minutes of
real-model runs, so a script to run by hand or nightly, not part of the test suite.

    python scenarios/questions/check.py [OUT_DIR]
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def diagnosis(name: str, out_root: Path) -> list[dict]:
    out = out_root / name
    subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "run",
            str(HERE / f"{name}.yaml"),
            "--output",
            str(out),
            "--allow-client-bound",
        ],
        check=True,
        cwd=HERE.parents[1],
    )
    return json.loads((out / "summary.json").read_text())["diagnosis"]


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args], check=True, cwd=HERE.parents[1], capture_output=True, text=True
    )


def check_q9() -> list[str]:
    info = json.loads(bench("inspect-model", "smollm2", "--json").stdout)
    types = {t["type"]: t["tensors"] for t in info["types"]}
    if info["file_type"] != "Q4_1" or types.get("Q8_0") != 1 or not 5.0 < info["bits_per_weight"] < 6.0:
        return [f"Q9: SmolLM2 is not a Q4_1 mix with one Q8_0 tensor: {info['file_type']}, {types}"]
    return []


def check_q11(out_root: Path) -> list[str]:
    sys.path.insert(0, str(HERE.parents[1]))
    from harness.launcher import launch
    from harness.scenario import LaunchConfig

    out = out_root / "q11_probe_native"
    engine = launch("native", LaunchConfig(), None, "smollm2", out / "engine.log")
    try:
        bench("probe", engine.url, "--output", str(out))
    finally:
        engine.stop()
    rows = {r["check"]: r for r in json.loads((out / "probe.json").read_text())["rows"]}
    wanted = {"n > 1": "UNSUPPORTED", "chat completions": "PASS", "usage in the stream": "PASS", "stop strings": "PASS"}
    failures = [f"Q11: {c} is {rows[c]['verdict']}, not {v}" for c, v in wanted.items() if rows[c]["verdict"] != v]
    if not rows["/tokenize"]["evidence"].startswith("vLLM shape") or not rows["/metrics"]["evidence"].startswith(
        "native names"
    ):
        failures.append(f"Q11: /tokenize or /metrics not recognised: {rows['/tokenize']}, {rows['/metrics']}")
    return failures


def check_q13(out_root: Path) -> list[str]:
    out = out_root / "q13_startup"
    bench("run", str(HERE / "q13_startup.yaml"), "--output", str(out), "--allow-client-bound", "--overwrite")
    startup = json.loads((out / "run.json").read_text()).get("startup") or {}
    first = startup.get("first_request") or {}
    if not startup.get("launch_to_ready_s", 0) > 0 or not first.get("ok") or first.get("ttft_ms") is None:
        return [f"Q13: run.json has no start-up and first request: {startup}"]
    return []


def main() -> int:
    out_root = Path(sys.argv[1] if len(sys.argv) > 1 else "results/questions")
    failures = []
    q1 = {f["rule"]: f["message"] for f in diagnosis("q1_first_token_slow", out_root)}
    if not re.search(r"queueing is \d+% of TTFT \(its main share\)", q1.get("saturation", "")):
        failures.append(f"Q1: no 'queueing ... main share' line: {q1}")
    stall = {f["rule"] for f in diagnosis("q7_long_document_stall", out_root)}
    chunked = {f["rule"] for f in diagnosis("q7_long_document_chunked", out_root)}
    if "prefill_interference" not in stall:
        failures.append(f"Q7 chunked prefill off: no prefill_interference finding ({sorted(stall)})")
    if "prefill_interference" in chunked:
        failures.append("Q7 chunked prefill on: prefill_interference still found")
    failures += check_q9() + check_q11(out_root) + check_q13(out_root)
    print("\n".join(failures) or "Q1, Q7, Q9, Q11 and Q13 answered as expected")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
