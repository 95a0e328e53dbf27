"""A run's run.json and summary.json read as their models (harness/results/schema.py RunInfo and Summary), from a folder
of any schema version or from a peer tool's file (reports/peers); and the views of run.json's open sections.

A summary.json that names its schema_version is read as written: a field that does not fit is a ResultsError naming
it. One from before the schema (no schema_version: "0") may predate some fields too (the steady window, run_span_s,
the percentile intervals, the partial, reasoning and mismatch counts): each required field it lacks is what
harness.metrics.latencies.summarize computes from the folder's own requests over the whole run, as those runs were
summarized; the figures it holds are kept as written. A run killed before its summary is summarized from its requests
alone, as interrupted. A peer tool's file becomes a run the same way: the tool's figures where it gives them
(docs/peers.md), ours from the requests it rebuilt elsewhere, but no per-token ITL where the tool's chunks were not
one token each (its records cannot tell the tokens apart). Those of ours run on the rebuilt requests' timeline, not
over the tool's duration (SGLang's file has no send times), so the report shows no goodput or intervals for a peer.
The run's account summarize does not give (client_bound, interrupted, incomplete, lost workers) is unflagged where no
file says otherwise.

run.json's resolved scenario is a dict (schema.py): validating an old one with harness.scenario.scenario.Scenario is
not safe (it looks for the prompt and trace files, which rarely outlive the run), so the fields reports read are read
through ScenarioView, and the scenario stays a dict for hashing and comparing (reports/run_identity.py,
reports/repeats.py). Each open section of run.json has one accessor here (scenario, harness_version,
telemetry_sampled): when schema.py gives a section its own model, its accessor is the one place to change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from harness.metrics.latencies import summarize
from harness.results.folder import RequestRecord, ResultsError, read_json, read_model
from harness.results.schema import RunInfo, SchemaError, Stats, Summary, validate
from reports.peers import PeerRun

REQUIRED = [name for name, spec in Summary.model_fields.items() if spec.is_required()]
WHOLE_RUN_BEFORE = "written before runs were cut to a steady window"  # the note of a window an old folder lacked
# what a peer's file stands in for run.json's required fields with: none of ours ran, the tool counted and timed
PEER_RUN_INFO = {
    "token_count_method": "the tool's own count",
    "tokenizer": "the tool's",
    "time_unit": "seconds from the tool's first send",
}


class View(BaseModel):
    """The fields reports read of an open section; the rest ignored."""

    model_config = ConfigDict(extra="ignore")


class LoadView(View):
    arrival: str | None = None
    rate: int | float | None = None  # as written: a report prints "rate 4/s", not "rate 4.0/s"
    concurrency: int | float | None = None
    num_requests: int | None = None


class LaunchView(View):
    args: list[Any] | None = None


class ScenarioBackendView(View):
    launch: LaunchView | None = None


class ScenarioView(View):
    """run.json's resolved scenario, as far as reports read it."""

    name: str | None = None
    load: LoadView | None = None
    workload: Any = None  # compared whole: two runs of other workloads are not like for like
    slo: dict[str, Any] | None = None
    backend: ScenarioBackendView = ScenarioBackendView()


def scenario(resolved: dict[str, Any]) -> ScenarioView:
    """A resolved scenario as run.json and the manifests hold it."""
    return ScenarioView.model_validate(resolved)


def harness_version(run_info: RunInfo) -> str | None:
    return run_info.versions.get("harness")


def telemetry_sampled(run_info: RunInfo) -> list[str] | None:
    """The telemetry sources the run sampled ("gpu", "host", "engine_process", ...); None when its run.json does not
    say."""
    return run_info.telemetry.sampled if run_info.telemetry is not None else None


@dataclass
class PeerNote:
    """Which tool wrote a peer run's file, and where its definitions are not ours (docs/peers.md)."""

    tool: str
    differences: list[str] = field(default_factory=list)


def read_run_info(path: Path) -> RunInfo:
    run_info = read_model(path / "run.json")
    if run_info is None:
        raise ResultsError(f"{path}: no run.json; pass a folder written by `bench run --output`")
    return run_info


def read_summary(path: Path, run_info: RunInfo, records: list[RequestRecord]) -> Summary:
    """The run's summary.json; `records`: its measured requests, for a summary from before the schema or none."""
    written = read_json(path / "summary.json")
    if not written:  # a run killed before its summary: what reached the disk
        written = {"interrupted": True}
    missing = [name for name in REQUIRED if name not in written]
    if missing and "schema_version" not in written:
        ours = _ours(records, run_info)
        ours["window"]["note"] = WHOLE_RUN_BEFORE
        written = {**{name: ours[name] for name in missing}, **written}
    return _validated(path / "summary.json", written)


def peer_run_info(peer: PeerRun) -> RunInfo:
    """A peer's run as run.json holds it: the scenario and engine its file names, the tool's version."""
    return _validated(
        peer.path,
        {
            "scenario": peer.run_info["scenario"],
            "backend": peer.run_info["backend"],
            "versions": {peer.tool: peer.version},
            **PEER_RUN_INFO,
        },
        "run.json",
    )


def peer_summary(peer: PeerRun, records: list[RequestRecord], run_info: RunInfo) -> Summary:
    """The tool's figures over ours from its rebuilt `records`: a latency's statistics whole (one the tool does not
    give stays unknown), other sections figure by figure."""
    ours = _ours(records, run_info)
    if "itl_ms" not in peer.summary:  # chunks of several tokens: per-chunk gaps are no per-token ITL
        unmeasured = summarize([]).model_dump()
        ours["itl_ms"] = unmeasured["itl_ms"]
        ours["percentile_ci"]["itl_ms"] = unmeasured["percentile_ci"]["itl_ms"]
    for name, value in peer.summary.items():
        if name not in ours or value is None:
            continue  # not one of our figures (GuideLLM's own TPOT), or one the tool has no value for
        if isinstance(value, dict) and Summary.model_fields[name].annotation is not Stats:
            value = ours[name] | {k: v for k, v in value.items() if v is not None}
        ours[name] = value
    return _validated(peer.path, ours)


def _ours(records: list[RequestRecord], run_info: RunInfo) -> dict:
    """summary.json's fields as summarize gives them for `records` over the whole run, unflagged."""
    return Summary.of_requests(summarize(records, scenario(run_info.scenario).slo)).model_dump(exclude_unset=True)


def _validated(path: Path, doc: dict, name: str = "summary.json") -> Any:
    try:
        return validate(name, doc)
    except SchemaError as e:
        raise ResultsError(f"{path}: {e}") from None
