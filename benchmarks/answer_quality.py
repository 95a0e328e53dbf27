"""Speed and answer agreement side by side: scenarios/quality/*.yaml, each candidate against the first.

    python benchmarks/answer_quality.py [--output results/quality] [--only spec_decode,runtimes,chunked_prefill]

Runs each scenario (`bench run`: its candidates one after another, the real SmolLM2 on the native engine), then
compares every candidate's answers with the first candidate's (harness/metrics/output_agreement.py) and prints one
Markdown table: output tokens/s and TPOT p50 as ratios to the reference run (the candidates run in turn on
the same machine, so the ratio carries the machine's drift between them: the load average is printed), the
exact-match share, token agreement, where the answers first part, and the known-answer accuracy.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.metrics.output_agreement import compare_runs  # noqa: E402
from harness.results.folder import read_candidates, read_model  # noqa: E402
from harness.results.schema import Summary  # noqa: E402

SCENARIOS = ("spec_decode", "runtimes", "chunked_prefill")
COLUMNS = (
    "scenario",
    "candidate",
    "output tok/s",
    "vs reference",
    "TPOT p50 ms",
    "exact match",
    "token agreement",
    "first divergence (median)",
    "accuracy",
)


def run(name: str, out: Path) -> list[tuple[str, Path]]:
    """`bench run` of one scenario; its candidates' folders, in order."""
    command = [sys.executable, "-m", "harness", "run", str(ROOT / "scenarios" / "quality" / f"{name}.yaml")]
    subprocess.run([*command, "--output", str(out), "--overwrite", "--allow-client-bound"], check=True)
    return [(c.name, out / c.dir) for c in read_candidates(out)]


def rows(name: str, candidates: list[tuple[str, Path]]) -> list[list[str]]:
    (_, ref_dir), out = candidates[0], []
    ref_tps = summary(ref_dir).throughput.output_tokens_per_s
    for cand, cand_dir in candidates:
        s = summary(cand_dir)
        tps = s.throughput.output_tokens_per_s
        agreement = compare_runs(ref_dir, cand_dir) if cand_dir != ref_dir else None
        acc = s.accuracy
        first = agreement.first_divergence if agreement else None
        out.append(
            [
                name,
                cand,
                f"{tps:.1f}",
                f"{tps / ref_tps:.2f}x",
                f"{s.tpot_ms.p50:.1f}",
                "reference" if agreement is None else f"{agreement.exact}/{agreement.pairs}",
                "-" if agreement is None or agreement.token_agreement is None else f"{agreement.token_agreement:.1%}",
                "-" if not first else f"{first.p50:g} (of {first.count})",
                "-" if not acc else f"{acc.share:.0%} ({acc.low:.0%}-{acc.high:.0%})",
            ]
        )
    return out


def summary(run_dir: Path) -> Summary:
    return read_model(run_dir / "summary.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path("results/quality"))
    parser.add_argument("--only", default=",".join(SCENARIOS))
    args = parser.parse_args()
    table = []
    for name in args.only.split(","):
        before = os.getloadavg()[0]
        table += rows(name, run(name, args.output / name))
        print(f"{name}: load average {before:.1f} before, {os.getloadavg()[0]:.1f} after", flush=True)
    print("| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS))
    for row in table:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
