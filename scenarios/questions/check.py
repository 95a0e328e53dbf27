"""Runs the question scenarios against the native engine and checks the diagnosis answers them:
Q1 names queueing as the main share of TTFT (with its percentage); Q7 with chunked prefill off
names prefill interference, and with it on that line is gone. Minutes of real-model runs, so a
script to run by hand or nightly, not part of the test suite.

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
    print("\n".join(failures) or "Q1 and Q7 answered as expected")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
