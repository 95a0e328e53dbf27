"""What a record keeps of the engine's answer, and how a known answer scores it (docs/quality.md).

`workload.record_outputs`: `text` keeps the answer, `hash` (the default) a SHA-256 of it (enough to tell two
runs' answers equal or not), `none` nothing. Every kept answer comes with a hash of the request's own prompt
(its text or messages, before any earlier turn's history), so two runs are compared only on the same prompts.

Known answers, scored as each record completes:
- `copy` (the `repeat` workload): the answer, leading whitespace dropped, begins with the passage it was asked
  to repeat (what follows the copy, when the answer runs on to its output_tokens, is not judged);
- `exact` (a `file` row's `expected`): the answer equals it, leading and trailing whitespace dropped;
- `regex` (a row with `"match": "regex"`): Python's re.search finds the pattern in the answer.
The summary's `accuracy` is the share of completed measured answers scored correct, with its exact
(Clopper-Pearson) interval.
"""

from __future__ import annotations

import hashlib
import json
import re

from scipy.stats import beta

from harness.results.schema import Accuracy


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def prompt_sha256(prompt: str | None, messages: list[dict] | None) -> str:
    return text_sha256(json.dumps([prompt, messages], sort_keys=True, ensure_ascii=False))


def keep_answer(rec, spec, text: str, record_outputs: str) -> None:
    """Fills the record's output fields as workload.record_outputs asks, and scores a known answer."""
    if record_outputs == "none":
        return
    rec.prompt_sha256 = prompt_sha256(spec.prompt, spec.messages)
    if not rec.ok:
        return
    rec.output_sha256 = text_sha256(text)
    if record_outputs == "text":
        rec.output_text = text
    if spec.expected is not None:
        rec.answer_correct = is_correct(text, spec.expected, spec.expected_match)


def is_correct(text: str, expected: str, match: str) -> bool:
    if match == "copy":
        return text.lstrip().startswith(expected.strip())
    if match == "regex":
        return re.search(expected, text) is not None
    return text.strip() == expected.strip()


def share_interval(successes: int, trials: int, confidence: float) -> tuple[float, float]:
    """The two-sided exact (Clopper-Pearson) interval of a share: it holds the true share with at least
    `confidence`, whatever that share is."""
    tail = (1 - confidence) / 2
    low = 0.0 if successes == 0 else float(beta.ppf(tail, successes, trials - successes + 1))
    high = 1.0 if successes == trials else float(beta.ppf(1 - tail, successes + 1, trials - successes))
    return low, high


def accuracy(records, confidence: float = 0.95) -> Accuracy | None:
    """summary.json's `accuracy`: of the completed measured answers that had a known answer; None without any."""
    scored = [r for r in records if r.ok and not r.is_warmup and r.answer_correct is not None]
    if not scored:
        return None
    correct = sum(r.answer_correct for r in scored)
    low, high = share_interval(correct, len(scored), confidence)
    return Accuracy(
        scored=len(scored),
        correct=correct,
        share=correct / len(scored),
        low=low,
        high=high,
        confidence=confidence,
        method="Clopper-Pearson (exact binomial)",
    )


def accuracy_line(acc: Accuracy | None, task: str | None = None) -> str | None:
    if acc is None:
        return None
    what = f" ({task})" if task else ""
    return (
        f"accuracy{what}: {acc.correct} of {acc.scored} answers correct, {acc.share:.1%} "
        f"({acc.confidence:.0%} interval {acc.low:.1%} – {acc.high:.1%})"
    )
