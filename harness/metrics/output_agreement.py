"""Do two runs answer the same? `bench compare-outputs A B` and the agreement section of `bench report A B`.

Pairs the completed measured requests of two runs by their plan index, refuses when a pair's prompts differ
(each record's prompt_sha256: the runs must share workload and seed), and reports:
- exact-match share: answers equal character for character (from the kept text or its SHA-256), with its exact
  (Clopper-Pearson) interval;
- with `record_outputs: text` in both runs, the answers re-tokenized with one tokenizer: the position of the first
  token where each differing pair parts (its distribution), and token-level agreement (the share of positions,
  up to the longer answer of each pair, where both hold the same token). Re-tokenizing the text, not the
  engine's own ids, can put a divergence one token early or late where the two texts part inside a token.
At temperature 0 (both runs greedy) any difference is the engine's (kernels, quantization, speculation), and is
flagged; sampled runs differ by design, and their figures are stated as sampled.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import BaseModel, Field

from harness.results.folder import ResultsError, read_model, read_records
from harness.results.schema import RunInfo, Sampling, ScenarioRecord
from harness.scenario.answers import share_interval, text_sha256

CONFIDENCE = 0.95


class FirstDivergence(BaseModel):
    """Where the differing answers part: the first token position of each, and its distribution."""

    count: int
    min: int
    p10: float
    p50: float
    p90: float
    max: int
    positions: list[int]


class Agreement(BaseModel):
    """The agreement of two runs' answers (`bench compare-outputs --json` prints it as it is); the token-level
    figures only when both runs kept their answers' text."""

    pairs: int
    exact: int
    exact_share: float
    exact_share_low: float
    exact_share_high: float
    confidence: float
    greedy: bool
    sampling: list[dict | None] = Field(description="each run's sampling fields, A then B")
    left_out: int
    flagged: bool = Field(description="greedy runs that answered differently")
    tokenizer: str | None = None
    token_agreement: float | None = None
    tokens_compared: int | None = None
    first_divergence: FirstDivergence | None = None


def compare_runs(dir_a: Path, dir_b: Path, tokenizer=None) -> Agreement:
    """The agreement of two run folders' answers (module docstring); `tokenizer`: a TokenizerSource, else the
    runs' own (run_tokenizer). ResultsError when they cannot be compared."""
    a, b = _answers(Path(dir_a)), _answers(Path(dir_b))
    pairs = _pairs(a, b, dir_a, dir_b)
    same = [x["sha"] == y["sha"] for x, y in pairs]
    low, high = share_interval(sum(same), len(pairs), CONFIDENCE)
    sampling_a, sampling_b = _sampling(Path(dir_a)), _sampling(Path(dir_b))
    greedy = sampling_a.greedy and sampling_b.greedy
    out = Agreement(
        pairs=len(pairs),
        exact=sum(same),
        exact_share=sum(same) / len(pairs),
        exact_share_low=low,
        exact_share_high=high,
        confidence=CONFIDENCE,
        greedy=greedy,
        sampling=[sampling_a.fields, sampling_b.fields],
        left_out=len(set(a) ^ set(b)) + sum(1 for i in set(a) & set(b) if a[i] is None or b[i] is None),
        flagged=greedy and not all(same),
    )
    if all(x["text"] is not None and y["text"] is not None for x, y in pairs):
        tokenizer = tokenizer or run_tokenizer(Path(dir_a))
        _token_agreement(out, pairs, tokenizer)
    return out


def _answers(run_dir: Path) -> dict[int, dict | None]:
    """index -> {prompt, sha, text} of each measured request (None where it failed)."""
    records = [r for r in read_records(run_dir) if not r.is_warmup]
    if records and all(r.prompt_sha256 is None for r in records):
        raise ResultsError(
            f"{run_dir}: its records kept no answers (workload.record_outputs: none, or a run from before it); "
            "rerun with workload.record_outputs: hash or text"
        )
    out: dict[int, dict | None] = {}
    for r in records:
        sha = r.output_sha256 or (text_sha256(r.output_text) if r.output_text is not None else None)
        out[r.index] = {"prompt": r.prompt_sha256, "sha": sha, "text": r.output_text} if r.ok and sha else None
    return out


def _pairs(a: dict, b: dict, dir_a, dir_b) -> list[tuple[dict, dict]]:
    differ = [i for i in sorted(set(a) & set(b)) if a[i] and b[i] and a[i]["prompt"] != b[i]["prompt"]]
    if differ:
        raise ResultsError(
            f"{dir_a} and {dir_b} were not sent the same prompts ({len(differ)} requests differ, the first is "
            f"request {differ[0]}): compare runs of one scenario's workload and seed"
        )
    pairs = [(a[i], b[i]) for i in sorted(set(a) & set(b)) if a[i] and b[i]]
    if not pairs:
        raise ResultsError(f"{dir_a} and {dir_b} have no request completed in both: nothing to compare")
    return pairs


class SamplingSent(BaseModel):
    fields: dict | None = None
    greedy: bool = False


def _sampling(run_dir: Path) -> Sampling | SamplingSent:
    """run.json's sampling; a run from before it sent none: the engine's default, most likely sampled."""
    run: RunInfo | None = read_model(run_dir / "run.json")
    return run.sampling if run is not None and run.sampling is not None else SamplingSent()


def run_tokenizer(run_dir: Path):
    """The tokenizer the run's scenario names (backend.tokenizer, else its GGUF model), else about a token a word."""
    from harness.scenario.tokenizer_source import ApproximateTokenizer, local_tokenizer

    run: RunInfo | None = read_model(run_dir / "run.json")
    backend = ScenarioRecord.model_validate(run.scenario if run is not None else {}).backend
    model = backend.model or ""
    source = backend.tokenizer or (model if model == "smollm2" or model.endswith(".gguf") else None)
    return local_tokenizer(source) if source else ApproximateTokenizer()


def _token_agreement(out: Agreement, pairs: list[tuple[dict, dict]], tokenizer) -> None:
    """Fills the token-level figures of `out`: the answers re-tokenized with one tokenizer."""
    skip = tokenizer.added_tokens  # a BOS the encoding adds to every text
    diverged, agree, positions = [], 0, 0
    for x, y in pairs:
        ta, tb = tokenizer.encode(x["text"])[skip:], tokenizer.encode(y["text"])[skip:]
        common = sum(1 for p, q in zip(ta, tb) if p == q)
        agree, positions = agree + common, positions + max(len(ta), len(tb))
        if ta != tb:
            diverged.append(next((i for i, (p, q) in enumerate(zip(ta, tb)) if p != q), min(len(ta), len(tb))))
    out.tokenizer = tokenizer.name
    out.token_agreement = agree / positions if positions else 1.0
    out.tokens_compared = positions
    out.first_divergence = None
    if diverged:
        arr = np.asarray(diverged)
        out.first_divergence = FirstDivergence(
            count=len(diverged),
            min=int(arr.min()),
            p10=float(np.percentile(arr, 10)),
            p50=float(np.percentile(arr, 50)),
            p90=float(np.percentile(arr, 90)),
            max=int(arr.max()),
            positions=sorted(diverged),
        )


def agreement_lines(result: Agreement) -> list[str]:
    """The comparison as the console and the reports say it."""
    kind = "greedy (temperature 0)" if result.greedy else "SAMPLED (differences are expected)"
    lines = [
        f"{result.pairs} answers compared, {kind}; sampling A {result.sampling[0]}, B {result.sampling[1]}",
        f"exact match: {result.exact} of {result.pairs} ({result.exact_share:.1%}; "
        f"{result.confidence:.0%} interval {result.exact_share_low:.1%} – {result.exact_share_high:.1%})",
    ]
    if result.token_agreement is not None:
        lines.append(
            f"token agreement: {result.token_agreement:.1%} of {result.tokens_compared} token positions "
            f"(re-tokenized by {result.tokenizer})"
        )
        first = result.first_divergence
        if first:
            lines.append(
                f"first diverging token of the {first.count} differing answers: min {first.min}, p10 "
                f"{first.p10:g}, median {first.p50:g}, p90 {first.p90:g}, max {first.max}"
            )
    else:
        lines.append("divergence positions need the answers' text: workload.record_outputs: text in both runs")
    if result.left_out:
        lines.append(f"{result.left_out} requests left out (failed, or in one run only)")
    if result.flagged:
        lines.append(
            f"FLAGGED: at temperature 0 the runs answered differently in {result.pairs - result.exact} of "
            f"{result.pairs} requests"
        )
    return lines
