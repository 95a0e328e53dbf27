"""The report's tables of a run's request groups: a workload.mix's models (or adapters), from summary.json's
`by_model`, an agentic workload's turn kinds, from `by_turn_kind`, and a workload.images run's text and image
requests, from `by_modality`; a row per run and group."""

from __future__ import annotations

MIX_COLUMNS = (
    "run",
    "model",
    "requests",
    "failed",
    "req/s",
    "TTFT p50",
    "TTFT p99",
    "TPOT p50",
    "TPOT p99",
    "E2E p50",
    "E2E p99",
)


MIX_NOTE = "Each model's requests over the run's own measured window; latencies in ms from the intended send time."


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


TURN_KIND_COLUMNS = ("run", "turn kind", *MIX_COLUMNS[2:])
TURN_KIND_NOTE = (
    "Each kind of an agent session's turns (user, tool_result, subagent, merge; subagent_task: a sub-agent's first) "
    "over the run's own measured window; latencies in ms from the intended send time."
)


MODALITY_COLUMNS = ("run", "modality", "prompt tokens", "images", *MIX_COLUMNS[2:])
MODALITY_NOTE = (
    "The requests that sent images (workload.images) and those that sent text only, over the run's own measured "
    "window; prompt tokens: the mean the server's usage counted (a vision engine counts each image's tokens in it); "
    "latencies in ms from the intended send time."
)


def mix_rows(labelled) -> list[list[str]]:
    return _group_rows(labelled, lambda run: run.summary.by_model)


def turn_kind_rows(labelled) -> list[list[str]]:
    return _group_rows(labelled, lambda run: run.summary.by_turn_kind)


def modality_rows(labelled) -> list[list[str]]:
    rows = []
    for label, run in labelled:
        for name, f in (run.summary.by_modality or {}).items():
            prompt = "-" if f.prompt_tokens_mean is None else f"{f.prompt_tokens_mean:,.0f}"
            rows.append([label, name, prompt, str(f.images), *_figure_cells(f)])
    return rows


def _group_rows(labelled, groups) -> list[list[str]]:
    return [[label, name, *_figure_cells(f)] for label, run in labelled for name, f in (groups(run) or {}).items()]


def _figure_cells(f) -> list[str]:
    """A group's requests, failures, req/s and latency percentiles, as the tables show them."""
    return [
        str(f.requests),
        str(f.failed),
        f"{f.requests_per_s:.2f}",
        _ms(f.ttft_ms.p50),
        _ms(f.ttft_ms.p99),
        _ms(f.tpot_ms.p50),
        _ms(f.tpot_ms.p99),
        _ms(f.e2e_ms.p50),
        _ms(f.e2e_ms.p99),
    ]
