"""One verdict per run: are its numbers a measurement of the engine, or of something else? (docs/confidence.md)

summary.json's `validity` = {valid, reasons[], thresholds}. Each reason is one line naming what went wrong
and its numbers; a run with none is valid. The history store and the gate skip an invalid run (naming the
reasons) unless told to keep it (`--keep-invalid`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from harness.results.folder import RequestRecord
from harness.results.schema import Summary, Thresholds, Validity

MAX_FAILED_SHARE = 0.01  # failed requests are often the slow ones: past 1% the survivors' percentiles flatter
MAX_TOKEN_MISMATCH_SHARE = 0.01  # of the output tokens, counted chunks vs usage: past it ITL/TPOT are off
# a run that cannot bound even its p90 (fewer than 36 samples at 95%) says little about its distribution
REQUIRED_PERCENTILES = ("p50", "p90")
JUDGED_LATENCIES = ("ttft_ms", "tpot_ms", "e2e_ms")
MIN_WINDOW_E2E = 5.0  # a window shorter than 5 median E2Es is mostly ramp-up and drain: no steady state


def thresholds() -> Thresholds:
    return Thresholds(
        max_failed_share=MAX_FAILED_SHARE,
        max_token_mismatch_share=MAX_TOKEN_MISMATCH_SHARE,
        required_percentiles=list(REQUIRED_PERCENTILES),
        judged_latencies=list(JUDGED_LATENCIES),
        min_window_e2e=MIN_WINDOW_E2E,
    )


def run_validity(
    summary: Summary, restarted_counters: list[str] | None = None, models_served: dict[str, int] | None = None
) -> Validity:
    """The verdict of a finished run's summary (after client_bound, interrupted, incomplete and engine_exited
    are set); `restarted_counters`: engine counters that fell during the run (server_metrics.counter_resets);
    `models_served`: how many measured requests each model served (served_models)."""
    reasons = [
        *_client_and_completeness(summary),
        *_failures(summary),
        *_not_established(summary),
        *_short_window(summary),
    ]
    if restarted_counters:
        reasons.append(
            f"engine restarted: its counters fell during the run ({', '.join(restarted_counters)}); the run "
            f"measured two engine lives"
        )
    if models_served and len(models_served) > 1:
        named = ", ".join(f"{model!r} {count}" for model, count in models_served.items())
        reasons.append(
            f"model switch: {len(models_served)} models served the measured requests ({named}, by the `model` "
            f"of their streams); the figures mix them"
        )
    return Validity(valid=not reasons, reasons=reasons, thresholds=thresholds())


def served_models(records: Iterable[RequestRecord]) -> dict[str, int]:
    """{model: measured requests} by the `model` each request's stream named (RequestRecord.served_model), the
    most served first; requests whose stream named none are left out. With workload.mix each model asked for is
    judged apart (it is answered under its own name, or the engine's): the group answered under the most names is
    returned, so a switch within one side is caught and the mix itself is not one."""
    groups: dict[str | None, Counter] = {}
    for r in records:
        if not r.is_warmup and r.served_model is not None:
            groups.setdefault(r.model, Counter())[r.served_model] += 1
    worst = max(groups.values(), key=lambda served: (len(served), sum(served.values())), default=Counter())
    return dict(worst.most_common())


def _client_and_completeness(summary: Summary) -> list[str]:
    reasons = []
    if summary.client_bound:
        reasons.append("client-bound: " + "; ".join(summary.client_bound_reasons or ["the client fell behind"]))
    if summary.interrupted_by or (summary.interrupted and not summary.incomplete):  # else incomplete says why
        reasons.append(f"incomplete: interrupted by {summary.interrupted_by or 'a signal'}")
    if summary.incomplete:
        reasons.append("incomplete: " + "; ".join(summary.incomplete_reasons or ["records are missing"]))
    if summary.engine_exited:
        reasons.append(f"engine restarted: it exited during the run ({summary.engine_exited})")
    return reasons


def _failures(summary: Summary) -> list[str]:
    measured, completed = summary.requests.measured, summary.requests.completed
    reasons = []
    if not measured:
        return ["incomplete: no measured request"]
    failed_share = (measured - completed) / measured
    if failed_share > MAX_FAILED_SHARE:
        top = ", ".join(f"{k}={v}" for k, v in sorted(summary.failures.items()))
        reasons.append(
            f"failure share: {measured - completed} of {measured} measured requests failed "
            f"({failed_share:.1%} > {MAX_FAILED_SHARE:.0%}: {top})"
        )
    mismatches = summary.token_count_mismatches
    off_tokens, out_tokens = summary.token_count_mismatch_tokens, summary.output_tokens
    if not out_tokens:  # no output token counted: judge by requests
        off_tokens, out_tokens = mismatches, completed
    if mismatches and out_tokens and off_tokens / out_tokens > MAX_TOKEN_MISMATCH_SHARE:
        reasons.append(
            f"token-count mismatches: the chunks counted and the server's usage differ by {off_tokens} of "
            f"{out_tokens} output tokens ({off_tokens / out_tokens:.1%} > {MAX_TOKEN_MISMATCH_SHARE:.0%}) "
            f"in {mismatches} of {completed} completed requests"
        )
    return reasons


def _not_established(summary: Summary) -> list[str]:
    ci = summary.percentile_ci
    missing = []
    for metric in JUDGED_LATENCIES:
        for key in REQUIRED_PERCENTILES:
            interval = getattr(getattr(ci, metric), key)  # by the names the thresholds list
            if interval.samples and not interval.established:
                missing.append(
                    f"{metric.removesuffix('_ms')} {key} ({interval.samples} samples, needs {interval.samples_needed})"
                )
    if not missing:
        return []
    return [f"percentiles not established at {ci.confidence:.0%}: " + ", ".join(missing)]


def _short_window(summary: Summary) -> list[str]:
    window_s, e2e_p50_ms = summary.window_s, summary.e2e_ms.p50
    if e2e_p50_ms is None or window_s * 1e3 >= MIN_WINDOW_E2E * e2e_p50_ms:
        return []
    return [
        f"too short a window: {window_s:.2f} s is under {MIN_WINDOW_E2E:g} median E2Es "
        f"({MIN_WINDOW_E2E:g} x {e2e_p50_ms / 1e3:.2f} s): the load never reached a steady state"
    ]


def skip_reason(summary: Summary) -> str | None:
    """Why a consumer (the history, the gate) should skip this run: its reasons, or None when valid. A summary
    from before the verdict existed has no `validity` and is taken as valid."""
    verdict = summary.validity
    if verdict is None or verdict.valid:
        return None
    return "; ".join(verdict.reasons or ["marked invalid"])
